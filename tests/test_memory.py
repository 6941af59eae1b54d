"""hlo-doctor memory: XLA's own totals, the estimate against them, classes that add up, the CLI and the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli import main
from hlo_doctor.cli.memory import parse_size
from hlo_doctor.dump import Role, load_dump
from hlo_doctor.memory import CLASSES, ESTIMATE, FROM_BUFFER_ASSIGNMENT, module_memory
from hlo_doctor.memory.xla_files import (
    find_memory_files,
    parse_buffer_assignment,
    parse_live_ranges,
    parse_memory_usage_report,
)
from hlo_doctor.rules._memory import memory_of, parameter_classes
from hlo_doctor.rules.builtin.gathered_weights_held import _what_keeps
from hlo_doctor.rules.context import RuleContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Every fixture whose dump kept XLA's buffer assignment of the optimized module.
WITH_ASSIGNMENT = sorted({p.parent for p in FIXTURES.glob("*/*/*after_optimizations-buffer-assignment.txt")})
CPU_REPORTS = [p for p in WITH_ASSIGNMENT if any(p.glob("*.cpu_after_optimizations-memory-usage-report.txt"))]


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _contexts(folder: Path):
    dump = load_dump(folder)
    for module in dump.modules:
        yield RuleContext(dump, module)


# -- the parsers (hand-written excerpts of XLA's files, shortened) -------------------------------

_ASSIGNMENT = """BufferAssignment:
allocation 0: size 1048576, maybe-live-out:
 value: <51 copy_subtract_fusion @0> (size=1048576,offset=0): f32[256,1024]{1,0}
allocation 1: size 262144, parameter 1, shape |f32[64,1024]| at ShapeIndex {}:
 value: <40 param.1 @0> (size=262144,offset=0): f32[64,1024]{1,0}
allocation 2: size 1024, color 6, preallocated-temp:
 value: <60 partition-id.1 @6> (size=512,offset=0): u32[]{:T(128)S(6)}
allocation 3: size 8388752, preallocated-temp:
 value: <41 all-gather @0> (size=4194304,offset=0): f32[1024,1024]{1,0}
 value: <47 all-reduce.2{0} @0> (size=4194304,offset=4194304): f32[1024,1024]{1,0}

Total bytes used: 9700496 (9.25MiB)
"""


def test_buffer_assignment_totals_per_memory_space():
    assignment = parse_buffer_assignment(_ASSIGNMENT)
    assert [a.index for a in assignment.allocations] == [0, 1, 2, 3]
    assert assignment.total(0) == 1048576 + 262144 + 8388752
    assert assignment.total(6) == 1024
    temp = assignment.allocations[3]
    assert temp.is_temp and temp.color == 0 and temp.parameter is None
    assert [(v.instruction, v.shape_index, v.offset) for v in temp.values] == [
        ("all-gather", "{}", 0), ("all-reduce.2", "{0}", 4194304)]
    assert assignment.allocations[1].parameter == 1 and assignment.allocations[0].is_output


def test_usage_report_and_live_ranges():
    report = parse_memory_usage_report("Memory Space: default (color=0)\nTotal bytes: 644096 (629.0KiB)\n"
                                       "  cumulative_size; size\n\nMemory Space: vmem (color=1)\nTotal bytes: 8\n")
    assert report == {0: ("default", 644096), 1: ("vmem", 8)}
    ranges = parse_live_ranges("HloLiveRange (max 3):\n  InstructionSequence:\n    0:param\n    1:all-gather-start\n"
                               "  BufferLiveRange:\n    param{}:0-3\n    all-gather-start{1}:1-2\n")
    assert ranges.sequence == ("param", "all-gather-start")
    assert ranges.ranges[("all-gather-start", "{1}")] == (1, 2)


@pytest.mark.parametrize("text", ["16GiB", "16 gib", "17179869184", "16Gi"])
def test_sizes(text):
    assert parse_size(text) == 16 * 2**30


def test_bad_size_is_one_line_exit_2():
    result = CliRunner().invoke(main, ["memory", str(WITH_ASSIGNMENT[0]), "--hbm", "lots"])
    assert result.exit_code == 2 and "not a size" in result.output


# -- XLA's totals on every fixture that has them -----------------------------------------------


def test_there_are_fixtures_with_xla_memory_files():
    assert WITH_ASSIGNMENT and CPU_REPORTS


def _deviceless_fixtures() -> list[Path]:
    """Every fixture compiled for a GPU or TPU target (the runner's record names the target)."""
    found = []
    for sidecar in sorted(FIXTURES.glob("*/*/hlo_doctor_run.json")):
        if json.loads(sidecar.read_text()).get("target"):
            found.append(sidecar.parent)
    return found


def test_every_gpu_and_tpu_fixture_kept_xlas_buffer_assignment():
    # so test_peak_is_xla_total_and_classes_add_up holds the acceptance on every one of them:
    # the peak `memory` reports is XLA's own buffer-assignment total, and the classes add up to it
    deviceless = _deviceless_fixtures()
    assert len(deviceless) >= 20
    assert [_id(f) for f in deviceless if f not in WITH_ASSIGNMENT] == []


@pytest.mark.parametrize("folder", WITH_ASSIGNMENT, ids=_id)
def test_peak_is_xla_total_and_classes_add_up(folder):
    for ctx in _contexts(folder):
        snapshot = ctx.module.snapshot(Role.AFTER_OPTIMIZATIONS)
        files = find_memory_files(Path(snapshot.path))
        total = parse_buffer_assignment(files.buffer_assignment.read_text()).total(0)
        report = parse_memory_usage_report(files.usage_report.read_text())
        memory = memory_of(ctx)
        assert memory.peak_source == FROM_BUFFER_ASSIGNMENT
        assert memory.peak_bytes == total == report[0][1]
        assert sum(memory.classes.values()) == memory.peak_bytes
        assert sum(item.bytes for item in memory.items) == memory.peak_bytes
        assert set(memory.classes) <= set(CLASSES)


# Known gaps of the estimate, each read against XLA's report: the fixed FSDP step of
# embedding-lost-batch (two scans whose bodies all-gather 2 MiB weights) peaks at 15.19 MiB, of
# which 1.88 MiB is heap not in use at the peak (fragmentation around the loop bodies' 2 MiB
# buffers) and 2.5 MiB outputs the CPU backend allocates apart from the temporaries they alias;
# a live-range estimate (12.06 MiB) sees neither.
_ESTIMATE_GAPS = {
    "embedding-lost-batch/jax-shardy-fixed": "heap fragmentation around 2 MiB loop buffers, separate outputs",
    "embedding-lost-batch/jax-gspmd-fixed": "heap fragmentation around 2 MiB loop buffers, separate outputs",
}


@pytest.mark.parametrize("folder", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=_ESTIMATE_GAPS[_id(f)])) if _id(f) in _ESTIMATE_GAPS
    else f for f in CPU_REPORTS], ids=_id)
def test_estimate_is_within_15_percent_of_the_cpu_report(folder):
    for ctx in _contexts(folder):
        snapshot = ctx.module.snapshot(Role.AFTER_OPTIMIZATIONS)
        files = find_memory_files(Path(snapshot.path))
        reported = parse_memory_usage_report(files.usage_report.read_text())[0][1]
        estimate = module_memory(ctx.module.key, ctx.after_optimizations, None, ctx.partitioned,
                                 parameter_classes(ctx), lambda i: (i.name, None))
        assert estimate.peak_source == ESTIMATE
        # within 15%, or, for a helper module of a few hundred bytes (jax's RNG key splitting), within
        # 1 KiB: there XLA's allocation granularity (each temporary at a 64-byte offset, each constant
        # an allocation of its own) is most of the peak
        assert abs(estimate.peak_bytes - reported) <= max(0.15 * reported, 1024), (estimate.peak_bytes, reported)
        assert sum(estimate.classes.values()) == estimate.peak_bytes


# -- the twins ---------------------------------------------------------------------------------


def _memory(folder: Path):
    """The memory of the folder's train step (the largest module: a CPU run also compiles small helpers)."""
    return max((memory_of(ctx) for ctx in _contexts(folder)), key=lambda m: m.peak_bytes)


def test_v5e_twins_do_not_fit_and_fit():
    bad = _memory(FIXTURES / "device-memory" / "jax-v5e_4x4-bad")
    fixed = _memory(FIXTURES / "device-memory" / "jax-v5e_4x4-fixed")
    assert bad.target.hardware == fixed.target.hardware == "tpu-v5e"
    assert bad.headroom_bytes < 0 < fixed.headroom_bytes
    # the bad twin keeps 4x the weights and optimizer state of the fixed one per device
    assert bad.classes["optimizer_state"] == 4 * fixed.classes["optimizer_state"]
    assert bad.classes["weights"] == 4 * fixed.classes["weights"]


def test_replicated_adamw_state_twins():
    bad = _memory(FIXTURES / "replicated-adamw-state" / "jax-shardy-bad")
    fixed = _memory(FIXTURES / "replicated-adamw-state" / "jax-shardy-fixed")
    assert bad.classes["optimizer_state"] > 3 * fixed.classes["optimizer_state"]
    assert bad.peak_bytes > fixed.peak_bytes


def test_remat_twin_gathers_the_weights_again():
    """The lever gathered-weights-held prints, verified: the remat twin keeps no gathered weight from the
    forward for the backward, and its peak is lower (what is still alive at its peak was gathered early)."""
    held = {}
    for variant in ("bad", "fixed"):
        folder = FIXTURES / "fsdp-gathered-weights" / f"jax-h100_2x8-{variant}"
        [ctx] = [c for c in _contexts(folder) if c.after_optimizations is not None]
        memory = memory_of(ctx)
        gathered = [i for i in memory.items if i.cls == "gathered_weights"]
        saved, _early = _what_keeps(ctx.after_optimizations, gathered)
        held[variant] = (memory.peak_bytes, sum(i.bytes for i in saved))
    assert held["fixed"][0] < held["bad"][0] * 0.6
    assert held["bad"][1] >= 0.25 * held["bad"][0] and held["fixed"][1] == 0


# -- the command and the gate ------------------------------------------------------------------


def test_json_shape():
    folder = FIXTURES / "device-memory" / "jax-v5e_4x4-bad"
    result = CliRunner().invoke(main, ["memory", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["schema_version"] == 1
    [module] = document["modules"]
    assert set(module) == {"name", "peak_bytes", "peak_source", "classes", "items", "target"}
    assert set(module["items"][0]) == {"class", "name", "bytes", "source"}
    assert module["target"]["headroom_bytes"] == module["target"]["hbm_bytes"] - module["peak_bytes"] < 0
    assert sum(module["classes"].values()) == module["peak_bytes"]


def test_hbm_overrides_the_target():
    folder = FIXTURES / "device-memory" / "jax-v5e_4x4-bad"
    result = CliRunner().invoke(main, ["memory", str(folder), "--hbm", "64GiB"])
    assert result.exit_code == 0, result.output
    assert "headroom" in result.output and "OVER" not in result.output
    result = CliRunner().invoke(main, ["memory", str(folder)])
    assert "OVER by" in result.output and "optimizer_state" in result.output


def test_check_max_memory():
    bad = str(FIXTURES / "device-memory" / "jax-v5e_4x4-bad")
    fixed = str(FIXTURES / "device-memory" / "jax-v5e_4x4-fixed")
    runner = CliRunner()
    quiet = ["--select", "reshard-churn", "--format", "json"]  # a rule that finds nothing here
    result = runner.invoke(main, ["check", bad, *quiet, "--max-memory", "target"])
    assert result.exit_code == 1 and "memory: " in result.output
    assert runner.invoke(main, ["check", fixed, *quiet, "--max-memory", "target"]).exit_code == 0
    assert runner.invoke(main, ["check", fixed, *quiet, "--max-memory", "1GiB"]).exit_code == 1
    assert runner.invoke(main, ["check", fixed, *quiet, "--max-memory", "5%"]).exit_code == 2
    cpu = str(FIXTURES / "replicated-adamw-state" / "jax-shardy-fixed")
    result = runner.invoke(main, ["check", cpu, *quiet, "--max-memory", "target"])
    assert result.exit_code == 2 and "unknown" in result.output
    assert runner.invoke(main, ["check", cpu, *quiet, "--max-memory", "target", "--hardware", "h100"]).exit_code == 0


def test_diff_max_memory():
    bad = str(FIXTURES / "device-memory" / "jax-v5e_4x4-bad")
    fixed = str(FIXTURES / "device-memory" / "jax-v5e_4x4-fixed")
    runner = CliRunner()
    select = ["--select", "reshard-churn", "--format", "json"]
    assert runner.invoke(main, ["diff", bad, fixed, *select, "--max-memory", "5%"]).exit_code == 0
    result = runner.invoke(main, ["diff", fixed, bad, *select, "--max-memory", "5%"])
    assert result.exit_code == 1 and "grew" in result.output


def test_memory_picture_stacks_the_classes_against_the_target(tmp_path):
    from hlo_doctor.memory import MemoryItem, ModuleMemory, Target
    from hlo_doctor.report.memory_svg import memory_svg

    memory = ModuleMemory("jit_<step>", 30, "estimate", {"weights": 20, "activations": 10},
                          (MemoryItem("weights", "<w>", 20), MemoryItem("activations", "x", 10)), Target("v<5e>", 16))
    svg = memory_svg(memory)
    assert svg.count("<rect") == 2 * 2  # a segment and a legend swatch per class
    assert "over by 14 B" in svg and "<5e>" not in svg and "&lt;5e&gt;" in svg
    folder = FIXTURES / "device-memory" / "jax-v5e_4x4-bad"
    out = tmp_path / "memory.html"
    result = CliRunner().invoke(main, ["memory", str(folder), "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "optimizer_state" in page


def test_damaged_memory_files_still_add_up(tmp_path):
    """Hand-damaged copies of XLA's files: values outside their heap, a truncated listing, garbage."""
    import shutil

    folder = tmp_path / "dump"
    shutil.copytree(FIXTURES / "fsdp-gathered-weights" / "jax-h100_2x8-fixed", folder)
    [assignment] = folder.glob("*-buffer-assignment.txt")
    text = assignment.read_text()
    damaged = text.replace(",offset=0)", ",offset=99999999999)", 5)[: len(text) * 2 // 3]
    assignment.write_text(damaged + "\nallocation x: size\n value: <junk\n\x00\x1b[31m")
    [live] = folder.glob("*-live-range.txt")
    live.write_text("garbage\n")
    result = CliRunner().invoke(main, ["memory", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    for module in json.loads(result.output)["modules"]:
        assert sum(module["classes"].values()) == module["peak_bytes"]
        assert sum(item["bytes"] for item in module["items"]) == module["peak_bytes"]


# -- ZeRO-1: a pure data-parallel AdamW step and its twin with the moments sharded over 'data' ------

ZERO1 = FIXTURES / "zero1-adamw-state"


@pytest.mark.parametrize("devices_per_host", [8, 4], ids=["1-host", "2-hosts"])
def test_zero1_twins(devices_per_host):
    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.findings import Severity

    rules = ["replicated-optimizer-state", "replicated-large-parameter"]
    bad = analyze_dump(ZERO1 / "jax-shardy-bad", select=rules, devices_per_host=devices_per_host, jobs=1)
    [finding] = bad.findings
    assert finding.rule == "replicated-optimizer-state" and finding.severity is Severity.INFO
    # 4 moments of 1 MiB, whole on each of the 8 devices; an eighth of them when sharded over 'data'
    assert finding.evidence["optimizer_state_bytes_per_device"] == 4 * 2**20
    assert finding.evidence["bytes_freed_per_device"] == 4 * 2**20 - 4 * 2**20 // 8
    assert (finding.evidence["weight_shards"], finding.evidence["state_shards"]) == (8, 1)
    assert "'data'" in finding.suggestion.jax and "ZeRO-1" in finding.suggestion.summary
    fixed = analyze_dump(ZERO1 / "jax-shardy-fixed", select=rules, devices_per_host=devices_per_host, jobs=1)
    assert fixed.findings == ()


def test_zero1_moments_are_optimizer_state_in_both_twins():
    """Sharded moments reach an all-gather (of the updated weight slices): still optimizer state."""
    bad, fixed = (_memory(ZERO1 / f"jax-shardy-{variant}") for variant in ("bad", "fixed"))
    assert bad.classes["optimizer_state"] == 4 * 2**20
    assert fixed.classes["optimizer_state"] == 4 * 2**20 // 8
    assert bad.classes["weights"] == fixed.classes["weights"] == 2 * 2**20  # replicated in both


# Hand-written HLO (the CPU backend's parallel-call outlining, as torch_xla 2.9's XLA writes it): the
# called computation's result is the call's result, one 4 MiB buffer, not two.
_PARALLEL_CALL = """\
HloModule parallel_call

%parallel_copy (p: f32[1024,1024]) -> f32[1024,1024] {
  %p = f32[1024,1024]{1,0} parameter(0)
  ROOT %copy.clone = f32[1024,1024]{1,0} copy(%p)
}

ENTRY %main (x: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[1024,1024]{1,0} parameter(0)
  ROOT %call = f32[1024,1024]{1,0} call(%x), to_apply=%parallel_copy
}
"""


def test_a_calls_result_is_counted_once():
    from hlo_doctor.hlo import parse_module
    from hlo_doctor.memory.liveness import module_liveness

    liveness = module_liveness(parse_module(_PARALLEL_CALL))
    assert liveness is not None
    assert liveness.peak_bytes == 2 * 4 * 1024 * 1024  # the parameter and the call's result
