"""The rule engine: discovery, selection, crash isolation, findings, and each built-in rule's edges."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.errors import InputError
from hlo_doctor.graph.source import is_library_file
from hlo_doctor.rules import (
    Finding,
    Registry,
    Rule,
    RuleContext,
    RuleSkipped,
    Severity,
    discover,
)
from hlo_doctor.rules.docs import missing_sections
from hlo_doctor.rules.hardware import bundled_profiles, load_profile
from hlo_doctor.testing import finding_key

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
UNEVEN_BAD = FIXTURES / "uneven-padding" / "jax-shardy-bad"
REPLICATED_BAD = FIXTURES / "replicated-large-param" / "jax-shardy-bad"
BUILTIN = ("communication-bound", "replicated-large-parameter", "sync-collective", "uneven-sharding-padding")


# -- discovery ----------------------------------------------------------------

def test_builtin_rules_register_through_entry_points():
    registry = discover()
    assert set(BUILTIN) <= set(registry.ids())
    assert registry.ids() == sorted(registry.ids())
    for rule_id in BUILTIN:
        spec = registry.rules[rule_id]
        assert spec.origin == "builtin"
        assert spec.rule.summary and isinstance(spec.rule.severity, Severity)
        assert missing_sections(spec.rule) == [], rule_id
        assert dataclasses.is_dataclass(spec.rule.Options)


class _Good(Rule):
    """x"""

    id = "good-rule"
    severity = Severity.INFO
    summary = "fires once per module"

    def check(self, ctx):
        yield self.finding(ctx, "hello", evidence={"n": 1})


class _Crash(Rule):
    """x"""

    id = "crashing-rule"
    severity = Severity.ERROR
    summary = "always raises"

    def check(self, ctx):
        raise ZeroDivisionError("boom")
        yield  # pragma: no cover


class _Skip(Rule):
    """x"""

    id = "skipping-rule"
    severity = Severity.INFO
    summary = "never judges"

    def check(self, ctx):
        raise RuleSkipped("nothing to judge")


def _registry(*rules) -> Registry:
    registry = Registry()
    for rule in rules:
        registry.add(rule, "plugin test==0")
    return registry


def test_id_clash_and_bad_classes_are_reported_not_fatal():
    class Clash(_Good):
        """x"""

    class NoId(Rule):
        summary = "x"

    registry = _registry(_Good, Clash, NoId, object)
    assert registry.ids() == ["good-rule"]
    messages = " | ".join(e.message for e in registry.errors)
    assert "already registered" in messages and "no valid id" in messages and "not a subclass" in messages


def test_entry_point_that_fails_to_import_is_skipped(monkeypatch):
    from importlib.metadata import EntryPoint

    from hlo_doctor.rules import registry as registry_module

    points = [
        EntryPoint("broken", "no_such_module_xyz:Rule", "hlo_doctor.rules"),
        EntryPoint("uneven-sharding-padding",
                   "hlo_doctor.rules.builtin.uneven_sharding_padding:UnevenShardingPadding", "hlo_doctor.rules"),
    ]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: points)
    registry = registry_module.discover()
    assert registry.ids() == ["uneven-sharding-padding"]
    assert len(registry.errors) == 1 and "no_such_module_xyz" in registry.errors[0].message


def test_crashing_rule_becomes_internal_error_and_others_run():
    report = analyze_dump(UNEVEN_BAD, registry=_registry(_Crash, _Good, _Skip), verbose=True)
    rules = sorted(f.rule for f in report.findings)
    assert rules == ["good-rule", "internal-error"]
    crash = next(f for f in report.findings if f.rule == "internal-error")
    assert "crashing-rule" in crash.message and "ZeroDivisionError" in crash.message
    assert crash.severity is Severity.ERROR
    assert [(s.rule, s.reason) for s in report.skipped] == [("skipping-rule", "nothing to judge")]


def test_select_and_ignore():
    registry = _registry(_Good, _Skip)
    assert analyze_dump(UNEVEN_BAD, registry=registry, select=["skipping-rule"]).rules == ("skipping-rule",)
    assert analyze_dump(UNEVEN_BAD, registry=registry, ignore=["skipping-rule"]).rules == ("good-rule",)
    with pytest.raises(InputError, match="unknown rule id 'nope'"):
        analyze_dump(UNEVEN_BAD, registry=registry, select=["nope"])


def test_findings_are_frozen_and_slotted():
    finding = Finding("r", Severity.INFO, "m", "msg")
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.message = "x"  # type: ignore[misc]
    assert not hasattr(finding, "__dict__")


def test_rule_options_are_typed_fields():
    report = analyze_dump(UNEVEN_BAD, select=["uneven-sharding-padding"],
                          rule_options={"uneven-sharding-padding": {"min_bytes": 10**9}})
    assert report.findings == ()
    with pytest.raises(InputError, match="bad options"):
        analyze_dump(UNEVEN_BAD, select=["uneven-sharding-padding"],
                     rule_options={"uneven-sharding-padding": {"no_such_option": 1}})


def test_snapshots_are_parsed_once_and_analyses_shared():
    from hlo_doctor.dump import load_dump

    dump = load_dump(UNEVEN_BAD)
    ctx = RuleContext(dump, dump.modules[0])
    assert ctx.partitioned is ctx.partitioned
    assert ctx.partitioned is dump.modules[0].partitioned().module()
    assert ctx.collectives is ctx.collectives


def test_library_frames():
    assert is_library_file("/x/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py")
    assert is_library_file("/tmp/hlo-doctor-run-abc/bootstrap/sitecustomize.py")
    assert not is_library_file("/work/main/hlo_doctor/examples/programs/uneven_padding.py")


# -- the four rules on the fixtures --------------------------------------------

def test_uneven_padding_evidence_and_suggestion():
    (finding,) = analyze_dump(UNEVEN_BAD, select=["uneven-sharding-padding"]).findings
    assert finding_key(finding) == ("uneven-sharding-padding", "pad", 44)
    assert finding.evidence["dim_size"] == 50257 and finding.evidence["shards"] == 8
    assert finding.evidence["padded_size"] == 50264 and finding.evidence["suggested_size"] == 50304
    assert finding.evidence["wasted_fraction"] == pytest.approx(7 / 50264, rel=1e-3)
    assert "P(None, 'model')" in finding.suggestion.jax
    assert "(None, 'model')" in finding.suggestion.torch_xla
    assert finding.file.endswith("after_spmd-partitioning.before_control-dep-rewriter.txt")


def test_replicated_large_parameter_names_the_fsdp_axis():
    (finding,) = analyze_dump(REPLICATED_BAD, select=["replicated-large-parameter"]).findings
    assert "unembed" in finding.message
    assert finding.evidence["bytes"] == 16 * 2**20
    assert finding.evidence["bytes_saved_per_device"] == 12 * 2**20
    # the contracting dim: its matmul's activation is batch-sharded over 'fsdp' (rules/_weight_dim.py)
    assert "P('fsdp', None)" in finding.suggestion.jax
    assert finding.suggestion.torch_xla == "xs.mark_sharding(unembed, mesh, ('fsdp', None))"


def test_replicated_large_parameter_threshold_option():
    report = analyze_dump(REPLICATED_BAD, select=["replicated-large-parameter"],
                          rule_options={"replicated-large-parameter": {"min_bytes": 32 * 2**20}})
    assert report.findings == ()


def test_communication_bound_is_silent_without_hardware_and_says_why():
    report = analyze_dump(REPLICATED_BAD, select=["communication-bound"], verbose=True)
    assert report.findings == ()
    assert "--hardware" in report.skipped[0].reason


def test_communication_bound_cross_host_pair():
    # min_compute_seconds 0: judge this toy step although its matmuls take nanoseconds
    options = {"communication-bound": {"threshold": 0.9, "min_compute_seconds": 0.0}}
    bad = analyze_dump(FIXTURES / "cross-host-tp" / "jax-shardy-bad", select=["communication-bound"],
                       hardware="h100", devices_per_host=4, rule_options=options)
    fixed = analyze_dump(FIXTURES / "cross-host-tp" / "jax-shardy-fixed", select=["communication-bound"],
                         hardware="h100", devices_per_host=4, rule_options=options)
    (finding,) = bad.findings
    assert finding.instruction == "all-reduce"
    assert finding.evidence["slow_link_bytes_sent"] > 0
    assert finding.evidence["communication_fraction"] > 0.9
    assert fixed.findings == ()


def test_hardware_profiles():
    profiles = bundled_profiles()
    assert {"h100", "a100", "b200", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"} <= set(profiles)
    assert all(p.platform == "tpu" and p.inter_slice_bandwidth for n, p in profiles.items() if n.startswith("tpu"))
    assert all(p.sources and p.peak_bf16_flops > 1e14 for p in profiles.values())
    with pytest.raises(InputError, match="unknown hardware"):
        load_profile("v100")


# -- sync-collective ------------------------------------------------------------

def _gpu_dump(tmp_path: Path, body: str, debug: str = "", backend: str = "sm_9.0a_gpu") -> Path:
    (tmp_path / f"module_0001.step.{backend}_after_optimizations.txt").write_text(textwrap.dedent(body))
    (tmp_path / "module_0001.step.debug_options").write_text(debug)
    return tmp_path


_SYNC = """\
    HloModule step, is_scheduled=true

    ENTRY %main (p0: f32[1024,1024], p1: f32[1024,1024]) -> (f32[4096,1024], f32[1024,1024]) {
      %p0 = f32[1024,1024]{1,0} parameter(0)
      %p1 = f32[1024,1024]{1,0} parameter(1)
      %ag-start = (f32[1024,1024]{1,0}, f32[4096,1024]{1,0}) all-gather-start(%p0), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true, backend_config={"collective_backend_config":{"is_sync":SYNC}}
      %ag-done = f32[4096,1024]{1,0} all-gather-done(%ag-start)
      %dot = f32[1024,1024]{1,0} dot(%p1, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
      ROOT %t = (f32[4096,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%ag-done, %dot)
    }
    """


def test_sync_collective_is_sync_with_independent_compute(tmp_path):
    dump = _gpu_dump(tmp_path, _SYNC.replace("SYNC", "true"))
    (finding,) = analyze_dump(dump, select=["sync-collective"]).findings
    assert finding.instruction == "ag-start"
    assert finding.evidence["is_sync"] is True and finding.evidence["cause"] == "schedule"
    assert "dot" in finding.related


def test_sync_collective_names_the_flag(tmp_path):
    dump = _gpu_dump(tmp_path, _SYNC.replace("SYNC", "false"), "xla_gpu_enable_latency_hiding_scheduler: false\n")
    findings = analyze_dump(dump, select=["sync-collective"]).findings
    # one finding per flag-caused problem: the flag and every start it left exposed
    (finding,) = findings
    assert finding.instruction == "ag-start"
    assert finding.evidence["cause"] == "flag"
    assert finding.evidence["flag"] == "xla_gpu_enable_latency_hiding_scheduler"
    assert finding.evidence["sync_starts"] == ["ag-start"]
    assert "--xla_gpu_enable_latency_hiding_scheduler=false" in finding.message


def test_sync_collective_flag_without_work_to_hide_is_silent(tmp_path):
    # the only independent op is a constant table: nothing worth overlapping, flag or not
    body = _SYNC.replace("SYNC", "true").replace(
        "dot(%p1, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "iota(), iota_dimension=0")
    for debug in ("", "xla_gpu_disable_async_collectives: ALLGATHER\n"):
        dump = _gpu_dump(tmp_path, body, debug)
        assert analyze_dump(dump, select=["sync-collective"]).findings == ()


def test_sync_collective_small_elementwise_work_does_not_count(tmp_path):
    # 4 KiB of independent elementwise work cannot hide a 16 MiB all-gather (the pair is merely
    # adjacent, not is_sync: with is_sync, elementwise work never counts, see the next test)
    body = _SYNC.replace("SYNC", "false").replace("%p1 = f32[1024,1024]{1,0} parameter(1)",
                                                 "%p1 = f32[32,32]{1,0} parameter(1)").replace(
        "%dot = f32[1024,1024]{1,0} dot(%p1, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "%dot = f32[32,32]{1,0} exponential(%p1)").replace(
        "(f32[4096,1024]{1,0}, f32[1024,1024]{1,0}) tuple", "(f32[4096,1024]{1,0}, f32[32,32]{1,0}) tuple")
    dump = _gpu_dump(tmp_path, body)
    assert analyze_dump(dump, select=["sync-collective"]).findings == ()
    report = analyze_dump(dump, select=["sync-collective"],
                          rule_options={"sync-collective": {"min_work_fraction": 0.0}})
    assert [f.instruction for f in report.findings] == ["ag-start"]


def test_sync_collective_xla_is_sync_needs_a_matmul_or_loop(tmp_path):
    # Hand-written: XLA made the all-gather synchronous itself (no flag); the independent work is
    # a 4 MiB elementwise op, bytes enough for the threshold but no matmul or loop, as around the
    # small steps of deviceless H100 compiles. XLA's choice stands. The same work beside a pair XLA
    # merely left adjacent (no is_sync) is flagged.
    body = _SYNC.replace("dot(%p1, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "exponential(%p1)")
    assert analyze_dump(_gpu_dump(tmp_path, body.replace("SYNC", "true")), select=["sync-collective"]).findings == ()
    report = analyze_dump(_gpu_dump(tmp_path, body.replace("SYNC", "false")), select=["sync-collective"])
    assert [f.instruction for f in report.findings] == ["ag-start"]


def test_sync_collective_not_flagged_when_nothing_could_hide_it(tmp_path):
    body = _SYNC.replace("SYNC", "true").replace("dot(%p1, %p1)", "dot(%ag-done, %p1)").replace(
        "f32[1024,1024]{1,0} dot", "f32[4096,1024]{1,0} dot")
    body = body.replace("tuple(%ag-done, %dot)", "tuple(%ag-done, %dot)").replace(
        "(f32[4096,1024]{1,0}, f32[1024,1024]{1,0}) tuple", "(f32[4096,1024]{1,0}, f32[4096,1024]{1,0}) tuple")
    body = body.replace("-> (f32[4096,1024], f32[1024,1024])", "-> (f32[4096,1024], f32[4096,1024])")
    dump = _gpu_dump(tmp_path, body)
    assert analyze_dump(dump, select=["sync-collective"]).findings == ()


def test_sync_collective_silent_on_cpu_and_says_why(tmp_path):
    dump = _gpu_dump(tmp_path, _SYNC.replace("SYNC", "true"), backend="cpu")
    report = analyze_dump(dump, select=["sync-collective"], verbose=True)
    assert report.findings == ()
    assert "CPU dump" in report.skipped[0].reason


def test_sync_collective_silent_on_cpu_fixtures():
    report = analyze_dump(FIXTURES / "train-step" / "jax-shardy-healthy", select=["sync-collective"])
    assert report.findings == () and report.skipped


# Exact expectations on the scheduled modules of the XLA corpus (read in place, never copied).
# These are the scheduler's test inputs: their starts and dones are adjacent, so every pair with
# independent compute elsewhere in its computation is flagged; plain (synchronous) collectives
# and pairs that nothing could overlap are not.
SYNC_EXPECTED = {
    "latency_hiding_scheduler_test__000": ('ag-start',),
    "latency_hiding_scheduler_test__001": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__002": ('ag-start',),
    "latency_hiding_scheduler_test__003": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__004": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__005": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__007": ('ar-start', 'ar-start.2'),
    "latency_hiding_scheduler_test__010": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__011": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__012": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__013": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__024": ('collective-permute-start.1',),
    "latency_hiding_scheduler_test__031": ('cps.2', 'cps.3'),
    "latency_hiding_scheduler_test__036": ('ags.2',),
    "latency_hiding_scheduler_test__037": ('ata-start', 'ata-start.2'),
    "latency_hiding_scheduler_test__039": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__046": ('ag-start',),
    "latency_hiding_scheduler_test__047": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__048": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__049": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__050": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__051": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__052": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__053": ('cp1s', 'cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__054": ('cp2s', 'cp3s'),
    "latency_hiding_scheduler_test__055": ('cp0s', 'cp1s'),
    "latency_hiding_scheduler_test__056": ('cp0s',),
    "latency_hiding_scheduler_test__057": ('cps',),
    "latency_hiding_scheduler_test__059": ('cp1s', 'cp2s'),
    "latency_hiding_scheduler_test__060": ('cps1',),
    "latency_hiding_scheduler_test__061": ('ra2a-start',),
    "latency_hiding_scheduler_test__062": ('cps1',),
    "latency_hiding_scheduler_test__063": ('cp1s', 'cp2s'),
    "latency_hiding_scheduler_test__065": ('cps0',),
    "latency_hiding_scheduler_test__066": ('cp1s', 'cp3s'),
    "latency_hiding_scheduler_test__068": ('cp1s',),
    "latency_hiding_scheduler_test__069": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__070": ('ag-start', 'ag-start.2'),
    "latency_hiding_scheduler_test__071": ('cp1s',),
    "latency_hiding_scheduler_test__072": ('cp0s', 'cp1s'),
    "latency_hiding_scheduler_test__078": ('ag-start',),
    "latency_hiding_scheduler_test__079": ('ag-start', 'ag-start.1', 'ag-start.2'),
    "latency_hiding_scheduler_test__086": ('ag-start',),
}

CORPUS = ROOT.parent / "shared" / "corpus" / "xla-hlo" / "valid"
CORPUS_FILES = sorted(
    path
    for pattern in ("latency_hiding_scheduler_test__*.hlo", "async_collective_creator_test__*.hlo",
                    "gpu_latency_hiding_scheduler_test__*.hlo")
    for path in CORPUS.glob(pattern)
)


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS_FILES, reason=f"{CORPUS} is absent")
def test_sync_collective_on_the_xla_corpus():
    got = {}
    for path in CORPUS_FILES:
        report = analyze_dump(path, select=["sync-collective"])
        assert not [f for f in report.findings if f.rule == "internal-error"], path.name
        names = tuple(sorted(f.instruction for f in report.findings))
        if names:
            got[path.stem] = names
    assert got == SYNC_EXPECTED
