"""Collective roles against hand labels (expected_roles.json) and hand-written probes.

Every fixture folder with an ``expected_roles.json`` holds, per module, the role
of each collective as labelled by hand against its partitioned HLO (and, under
``scheduled``, against the scheduled after-optimizations module). The test
fails on any collective whose role differs, and on any collective missing or
extra. The probes at the end are small HLO modules written by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.rules.context import AnalysisOptions, RuleContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LABELLED = sorted(p.parent for p in FIXTURES.glob("*/*/expected_roles.json"))


def _roles(folder: Path) -> tuple[dict, dict]:
    dump = load_dump(folder)
    partitioned, scheduled = {}, {}
    for module in dump.modules:
        semantics = RuleContext(dump, module, AnalysisOptions()).semantics
        if semantics.roles:
            partitioned[module.name] = {r.facts.instruction: r.role for r in semantics.roles}
        other = semantics.scheduled
        if other is not None and other is not semantics and other.roles:
            scheduled[module.name] = {r.facts.instruction: r.role for r in other.roles}
    return partitioned, scheduled


def test_enough_fixtures_are_labelled():
    assert len(LABELLED) >= 12
    labels = [json.loads((f / "expected_roles.json").read_text()) for f in LABELLED]
    assert any("scheduled" in label for label in labels)  # a GPU scheduled module
    assert sum(len(r) for label in labels for r in label["modules"].values()) >= 150


@pytest.mark.parametrize("folder", LABELLED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_roles_match_the_hand_labels(folder):
    expected = json.loads((folder / "expected_roles.json").read_text())
    partitioned, scheduled = _roles(folder)
    assert partitioned == expected["modules"]
    assert scheduled == expected.get("scheduled", {})


@pytest.mark.parametrize("folder", LABELLED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_plain_dump_gets_the_same_roles(folder, tmp_path):
    """A dump made with XLA_FLAGS alone has no runner's record (mesh names, hosts, framework,
    parameter paths): the roles come from the dataflow, so they are the hand labels all the same."""
    plain = tmp_path / folder.name
    shutil.copytree(folder, plain)
    (plain / "hlo_doctor_run.json").unlink(missing_ok=True)
    expected = json.loads((folder / "expected_roles.json").read_text())
    partitioned, scheduled = _roles(plain)
    assert partitioned == expected["modules"]
    assert scheduled == expected.get("scheduled", {})


def test_role_accuracy_over_all_labels(capsys):
    right = total = 0
    for folder in LABELLED:
        expected = json.loads((folder / "expected_roles.json").read_text())
        partitioned, _ = _roles(folder)
        for module, labels in expected["modules"].items():
            for name, role in labels.items():
                total += 1
                right += partitioned.get(module, {}).get(name) == role
    with capsys.disabled():
        print(f"\ncollective roles: {right}/{total} right ({right / total:.1%}) in {len(LABELLED)} fixtures")
    assert right == total


# ---------------------------------------------------------------------------
# Hand-written probes (small HLO written for these tests, not compiler output)

_GRADIENT_OVER_X = """\
HloModule probe_gradient, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (w: f32[256,128], x: f32[4,256], dy: f32[4,128]) -> f32[256,128] {
  %w = f32[256,128]{1,0} parameter(0), sharding={replicated}, metadata={op_name="w"}
  %x = f32[4,256]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}, metadata={op_name="x"}
  %dy = f32[4,128]{1,0} parameter(2), sharding={devices=[8,1]<=[8]}, metadata={op_name="dy"}
  %h = f32[4,128]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g = f32[4,128]{1,0} multiply(%h, %dy)
  %dw = f32[256,128]{1,0} dot(%x, %g), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %all-reduce = f32[256,128]{1,0} all-reduce(%dw), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %lr = f32[] constant(0.1)
  %lrb = f32[256,128]{1,0} broadcast(%lr), dimensions={}
  %step = f32[256,128]{1,0} multiply(%all-reduce, %lrb)
  ROOT %new = f32[256,128]{1,0} subtract(%w, %step)
}
"""

_DATA_PARALLEL = """\
HloModule probe_data_parallel, num_partitions=4

ENTRY %main (x: f32[8,1024], w1: f32[1024,1024], w2: f32[1024,1024]) -> f32[8,1024] {
  %x = f32[8,1024]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
  %w1 = f32[1024,1024]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w1"}
  %w2 = f32[1024,1024]{1,0} parameter(2), sharding={replicated}, metadata={op_name="w2"}
  %h = f32[8,1024]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %y = f32[8,1024]{1,0} dot(%h, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

_COMBINED_GATHER = """\
HloModule probe_combined, num_partitions=4

ENTRY %main (x: f32[2,64], w1: f32[16,64], w2: f32[16,32]) -> (f32[64,64], f32[64,32], f32[8,64]) {
  %x = f32[2,64]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
  %w1 = f32[16,64]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}, metadata={op_name="w1"}
  %w2 = f32[16,32]{1,0} parameter(2), sharding={devices=[4,1]<=[4]}, metadata={op_name="w2"}
  %ag = (f32[64,64]{1,0}, f32[64,32]{1,0}, f32[8,64]{1,0}) all-gather(%w1, %w2, %x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %g1 = f32[64,64]{1,0} get-tuple-element(%ag), index=0
  %g2 = f32[64,32]{1,0} get-tuple-element(%ag), index=1
  %gx = f32[8,64]{1,0} get-tuple-element(%ag), index=2
  %h = f32[8,64]{1,0} dot(%gx, %g1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %y = f32[8,32]{1,0} dot(%h, %g2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %out = (f32[64,64]{1,0}, f32[64,32]{1,0}, f32[8,64]{1,0}) tuple(%g1, %g2, %gx)
}
"""


def _probe(tmp_path: Path, text: str, name: str = "probe") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"module_0000.{name}.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt").write_text(text)
    return folder


def _context(folder: Path, **options) -> RuleContext:
    dump = load_dump(folder)
    return RuleContext(dump, dump.modules[0], AnalysisOptions(**options))


def test_gradient_all_reduce_over_an_axis_named_x_is_a_gradient_and_no_finding(tmp_path):
    from hlo_doctor.analysis import analyze_dump

    folder = _probe(tmp_path, _GRADIENT_OVER_X)
    ctx = _context(folder, devices_per_host=4)
    [role] = ctx.semantics.roles
    assert role.role == "gradient-reduce"
    assert role.facts.crosses_slow_boundary is True  # 8 devices, 4 per host: it does cross
    assert "the gradient of w" in role.reason
    report = analyze_dump(folder, devices_per_host=4)
    assert [f.rule for f in report.findings] == []


def test_data_parallel_program_with_replicated_weights_is_no_finding(tmp_path):
    from hlo_doctor.analysis import analyze_dump

    folder = _probe(tmp_path, _DATA_PARALLEL)
    params = _context(folder).semantics.parameters
    assert params.data == {0} and params.weights == {1, 2}
    report = analyze_dump(folder, select=["replicated-large-parameter"])
    assert report.findings == ()


def test_combined_gather_gets_a_role_per_operand(tmp_path):
    folder = _probe(tmp_path, _COMBINED_GATHER)
    [role] = _context(folder).semantics.roles
    assert [o.role for o in role.operands] == ["weight-gather", "weight-gather", "activation-gather"]
    assert [o.parameters for o in role.operands] == [(1,), (2,), (0,)]
    assert role.role == "weight-gather"  # the largest operand's (w1)


@pytest.mark.parametrize(("fixture", "framework"), [
    ("fsdp-activation-gather/torch_xla-bad", "torch_xla"),
    ("fsdpv2-torch-xla/torch_xla-healthy", "torch_xla"),
    ("fsdp-activation-gather/jax-shardy-bad", "jax"),
])
def test_the_framework_is_read_from_what_the_lowering_wrote(tmp_path, fixture, framework):
    """Without the runner's record, and with the module renamed: the ops' metadata says who lowered it."""

    source = FIXTURES / fixture
    for path in source.iterdir():
        if path.is_file() and path.name.startswith("module_") and path.suffix == ".txt":
            renamed = path.name.replace("SyncTensorsGraph", "step").replace("jit_mlp", "step")
            text = path.read_text().replace("SyncTensorsGraph", "step").replace("HloModule jit_mlp", "HloModule step")
            (tmp_path / renamed).write_text(text)
    assert not (tmp_path / "hlo_doctor_run.json").exists()
    dump = load_dump(tmp_path)
    assert all("SyncTensorsGraph" not in m.name and not m.name.startswith("jit_") for m in dump.modules)
    assert {RuleContext(dump, m, AnalysisOptions()).framework for m in dump.modules} == {framework}
