"""The generated corpus (corpusgen/): its oracle on hand-written HLO, and a fixed-seed sample scored in CI.

The HLO texts in the unit tests below are hand-written (in the form JAX 0.10.2
prints partitioned modules), small enough to check each role by eye. The
sample test compiles real programs with JAX and scores hlo-doctor on them: it
fails on any disagreement not listed, with its reason, in
``corpusgen/known_disagreements.toml``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from corpusgen.hlo_walk import parse_module
from corpusgen.oracle import (
    axes_of,
    groups_of,
    label_collectives,
    matmul_redundancy,
    natural_rules,
    reorder_rules,
    stray_traffic,
)
from corpusgen.programs import PATHOLOGIES, device_layout, random_spec

ROOT = Path(__file__).resolve().parent.parent

# Hand-written: a data-parallel step of one weight. The forward all-reduce sums a loss; the
# backward one sums the weight's gradient, which reaches the update elementwise; the all-gather
# gathers the activation (derived from the data).
_STEP = """\
HloModule jit_step, entry_computation_layout={(f32[64,32]{1,0}, f32[4,64]{1,0})->(f32[64,32]{1,0}, f32[])}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (w: f32[64,32], x: f32[4,64]) -> (f32[64,32], f32[]) {
  %w = f32[64,32]{1,0} parameter(0), sharding={replicated}, metadata={op_name="params['w']"}
  %x = f32[4,64]{1,0} parameter(1), sharding={devices=[2,1]<=[2]}, metadata={op_name="batch['x']"}
  %h = f32[4,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp()/dot_general"}
  %ag = f32[8,32]{1,0} all-gather(%h), channel_id=1, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(step)/jvp()/dot_general"}
  %zero = f32[] constant(0)
  %local = f32[] reduce(%ag, %zero), dimensions={0,1}, to_apply=%add
  %loss = f32[] all-reduce(%local), channel_id=2, replica_groups=[1,2]<=[2], use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(step)/jvp()/reduce_sum"}
  %g = f32[64,32]{1,0} dot(%x, %h), lhs_contracting_dims={0}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/transpose(jvp())/dot_general"}
  %gs = f32[64,32]{1,0} all-reduce(%g), channel_id=3, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(step)/transpose(jvp())/dot_general"}
  %lr = f32[] constant(0.1)
  %lrb = f32[64,32]{1,0} broadcast(%lr), dimensions={}
  %step = f32[64,32]{1,0} multiply(%gs, %lrb), metadata={op_name="jit(step)/optimizer/mul"}
  %new = f32[64,32]{1,0} subtract(%w, %step), metadata={op_name="jit(step)/optimizer/sub"}
  ROOT %out = (f32[64,32]{1,0}, f32[]) tuple(%new, /*index=1*/%loss)
}
"""


def _roles(text: str) -> dict[str, tuple[str, str]]:
    module = parse_module(text)
    labelled = label_collectives(module, {"params['w']": "weight", "batch['x']": "data"}, ["weight", "scalar"], 2)
    return {c.instruction: (c.role, c.phase) for c in labelled}


def test_oracle_roles_of_a_hand_written_step():
    assert _roles(_STEP) == {
        "ag": ("activation-gather", "forward"),
        "loss": ("scalar-reduce", "forward"),
        "gs": ("gradient-reduce", "backward"),
    }


def test_a_reduction_that_still_needs_a_contraction_is_not_a_gradient():
    # Hand-written variation: the reduced value reaches the update only through a dot (it is an
    # activation's partial sum, not the gradient yet).
    text = _STEP.replace("%g = f32[64,32]{1,0} dot(%x, %h)", "%hs = f32[4,32]{1,0} all-reduce(%h), channel_id=4, "
                         "replica_groups={{0,1}}, to_apply=%add, metadata={op_name=\"jit(step)/transpose(jvp())/x\"}\n"
                         "  %g = f32[64,32]{1,0} dot(%x, %hs)")
    roles = _roles(text)
    assert roles["hs"] == ("activation-reduce", "backward")
    assert roles["gs"] == ("gradient-reduce", "backward")


def test_a_gradient_scattered_onto_is_still_a_gradient_but_scattered_rows_are_not_yet():
    # Hand-written variation of a tied embedding's gradient as TPU lowers it: the reduced head
    # gradient is the base a scatter(-add) adds the lookup's rows to, on its way to the update.
    scatter = ("%zi = s32[4,1]{1,0} constant({{0},{1},{2},{3}})\n"
               "  %sc = f32[64,32]{1,0} scatter(%gs, %zi, %hr), update_window_dims={1}, inserted_window_dims={0}, "
               "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add\n"
               "  %step = f32[64,32]{1,0} multiply(%sc, %lrb)")
    text = _STEP.replace("%step = f32[64,32]{1,0} multiply(%gs, %lrb)", scatter).replace(
        "%lr = f32[] constant(0.1)", "%hr = f32[4,32]{1,0} all-reduce(%h), channel_id=5, replica_groups={{0,1}}, "
        "to_apply=%add, metadata={op_name=\"jit(step)/transpose(jvp())/x\"}\n  %lr = f32[] constant(0.1)")
    roles = _roles(text)
    assert roles["gs"] == ("gradient-reduce", "backward")
    assert roles["hr"][0] != "gradient-reduce"  # the scattered rows still need the scatter to become one


def test_natural_redundant_compute_names_an_activation_gathered_instead_of_a_weight_only_over_a_batch_axis():
    roles = {"data": "data", "fsdp": "fsdp", "model": "tensor"}
    plain = ["replicated-batch", "non-batch-dim-sharding"]
    over_tensor = [{"role": "activation-gather", "axes": ["model"]}, {"role": "weight-gather", "axes": ["fsdp"]}]
    assert natural_rules("natural-redundant-compute", roles, over_tensor) == plain
    over_fsdp = [{"role": "activation-gather", "axes": ["fsdp"]}]
    assert natural_rules("natural-redundant-compute", roles, over_fsdp) == [*plain, "activation-all-gather"]
    # batch traffic already names it: nothing is added twice
    traffic = natural_rules("natural-batch-traffic", roles, over_fsdp)
    assert traffic.count("activation-all-gather") == 1


def test_stray_traffic_is_what_moves_activations_outside_a_lookup():
    """Hand-written labels: the activation collectives over a non-tensor axis are stray traffic, except a
    reshard of a weight or of its gradient, and a table lookup's own gathers and reductions; a lookup's
    permute reorders the batch's rows and counts (and reshard-churn may name it)."""
    def label(role, kind, moves="activation", op="dot_general", axes=("fsdp",)):
        return {"role": role, "kind": kind, "moves": moves, "op": op, "axes": list(axes)}

    counted = [label("reshard", "collective-permute"), label("activation-reduce", "all-reduce"),
               label("reshard", "collective-permute", op="aten__index_select")]
    ignored = [label("reshard", "collective-permute", moves="weight"),
               label("reshard", "collective-permute", moves="gradient"),
               label("activation-reduce", "all-reduce", op="aten__index_select"),
               label("activation-gather", "all-gather", op="scatter-add"),
               label("activation-reduce", "all-reduce", axes=("model",))]
    assert stray_traffic({"model"}, counted + ignored) == counted
    assert stray_traffic({"model"}, [{"role": "reshard", "kind": "all-to-all", "axes": ["fsdp"]}])  # an older truth
    assert reorder_rules(counted) == ["reshard-churn"]
    assert reorder_rules(counted[:2] + ignored) == []


# Hand-written: one dot, before partitioning f32[8,16] x f32[16,4]; partitioned on 4 devices.
_PROGRAM = """ENTRY %m (x: f32[8,16], w: f32[16,4]) -> f32[8,4] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,4]{1,0} parameter(1)
  ROOT %d = f32[8,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.mark.parametrize(("rows", "expected"), [(2, 1.0), (4, 2.0), (8, 4.0)])
def test_matmul_redundancy_is_the_repeated_share_of_the_matmuls(tmp_path, rows, expected):
    (tmp_path / "m.0001.after_sharding-propagation.before_spmd-partitioning.txt").write_text(_PROGRAM)
    (tmp_path / "m.0002.after_spmd-partitioning.txt").write_text(
        _PROGRAM.replace("f32[8,16]", f"f32[{rows},16]").replace("f32[8,4]", f"f32[{rows},4]"))
    assert matmul_redundancy(tmp_path, 4) == expected
    (tmp_path / "m.0002.after_spmd-partitioning.txt").unlink()
    assert matmul_redundancy(tmp_path, 4) is None


def test_groups_in_every_form_and_the_axes_they_span():
    # Hand-written collectives over a mesh ('a'=2, 'b'=4): partition id = 4 * a + b.
    mesh = [("a", 2), ("b", 4)]

    def collective(groups: str) -> str:
        return (f"ENTRY %m (p: f32[8]) -> f32[8] {{\n  %p = f32[8]{{0}} parameter(0)\n"
                f"  ROOT %r = f32[8]{{0}} all-reduce(%p), replica_groups={groups}, to_apply=%add\n}}\n")

    cases = {
        "{{0,1,2,3},{4,5,6,7}}": ["b"],
        "[4,2]<=[2,4]T(1,0)": ["a"],
        "[2,4]<=[8]": ["b"],
        "mesh['axis_0'=2,'axis_1'=4] {'axis_0'}": ["a"],
        "mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_1'}": ["a"],
        "{}": ["a", "b"],
    }
    for groups, axes in cases.items():
        module = parse_module(collective(groups))
        found = groups_of(module.instr(module.entry, "r"), 8)
        assert axes_of(found, mesh) == axes, groups
    permute = parse_module("ENTRY %m (p: f32[8]) -> f32[8] {\n  %p = f32[8]{0} parameter(0)\n"
                           "  ROOT %r = f32[8]{0} collective-permute(%p), source_target_pairs={{0,4},{4,0}}\n}\n")
    assert axes_of(groups_of(permute.instr(permute.entry, "r"), 8), mesh) == ["a"]


def test_loop_state_keeps_its_elements_apart():
    # Hand-written: a while loop carries (counter, weight, activation); only the weight's slot
    # derives from the weight parameter.
    text = """\
%body (t: (s32[], f32[4], f32[4])) -> (s32[], f32[4], f32[4]) {
  %t = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %w = f32[4]{0} get-tuple-element(%t), index=1
  %a = f32[4]{0} get-tuple-element(%t), index=2
  %a2 = f32[4]{0} negate(%a)
  ROOT %o = (s32[], f32[4]{0}, f32[4]{0}) tuple(%i, %w, %a2)
}

%cond (t: (s32[], f32[4], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %m (w: f32[4], x: f32[4]) -> f32[4] {
  %w = f32[4]{0} parameter(0)
  %x = f32[4]{0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}, f32[4]{0}) tuple(%zero, %w, %x)
  %loop = (s32[], f32[4]{0}, f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4]{0} get-tuple-element(%loop), index=1
}
"""
    module = parse_module(text)
    bits = module.taint({(module.entry, "w", 0): 1, (module.entry, "x", 0): 2})
    assert bits[("body", "w", 0)] == 1
    assert bits[("body", "a2", 0)] == 2
    assert bits[(module.entry, "out", 0)] == 1


def test_specs_are_legal_and_the_mistake_is_the_only_difference():
    for seed in range(60):
        spec = random_spec(seed, "any")
        assert spec.injection in PATHOLOGIES
        sizes = [a.size for a in spec.axes]
        assert spec.devices == int(__import__("math").prod(sizes))
        assert sorted(device_layout(spec)) == list(range(spec.devices))
        batch_shards = int(__import__("math").prod(a.size for a in spec.axes if a.role in ("data", "fsdp")))
        assert spec.batch % batch_shards == 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs the jax extra")
def test_a_fixed_seed_sample_scores_with_no_unreviewed_disagreement(tmp_path):
    out = tmp_path / "corpus"
    generated = subprocess.run([sys.executable, str(ROOT / "corpusgen" / "generate.py"), "--n", "40", "--seed", "7",
                                "--out", str(out), "--jobs", "2"], capture_output=True, text=True, timeout=1200)
    assert generated.returncode == 0, generated.stdout[-2000:] + generated.stderr[-2000:]
    programs = list(out.glob("*/truth.json"))
    assert len(programs) >= 40
    scored = subprocess.run([sys.executable, str(ROOT / "corpusgen" / "score.py"), str(out)],
                            capture_output=True, text=True, timeout=1200)
    summary = scored.stdout.strip().splitlines()[-1] if scored.stdout.strip() else ""
    assert summary.startswith("corpus: roles "), scored.stdout[-3000:] + scored.stderr[-3000:]
    assert scored.returncode == 0, "\n".join(
        line for line in scored.stdout.splitlines() if line.startswith("  ") and "known:" not in line)[-6000:]


# -- torch_xla ----------------------------------------------------------------------------------

def test_torch_xla_phase_from_metadata():
    # Hand-written metadata in the form torch_xla 2.9 prints with XLA_HLO_DEBUG=1.
    from corpusgen.hlo_walk import Instr
    from corpusgen.torch_oracle import torch_phase

    def instr(metadata: str) -> Instr:
        return Instr("c", "i", "f32[4]", "all-reduce", ["x"], f", {metadata}", False)

    site = "/venv/lib/python3.11/site-packages/torch"
    assert torch_phase(instr(f'metadata={{op_type="aten__addmm" op_name="aten__addmm" source_file="{site}/nn/'
                             f'modules/linear.py" source_line=134}}')) == "forward"
    assert torch_phase(instr('metadata={op_type="aten__mm" op_name="aten__mm"}')) == "backward"
    assert torch_phase(instr(f'metadata={{op_type="aten__expand" op_name="aten__expand" source_file="{site}/'
                             f'autograd/__init__.py" source_line=221}}')) == "backward"
    assert torch_phase(instr(f'metadata={{op_type="aten__add" op_name="aten__add" source_file="{site}/optim/'
                             f'sgd.py" source_line=10}}')) == "optimizer"
    assert torch_phase(instr("")) == "unknown"


def test_torch_xla_classes_by_parameter_number_and_groups_through_the_mesh_order():
    # Hand-written, in torch_xla's form: every parameter is xla__device_data; classes come by
    # number. The mesh ('a'=2, 'b'=2) lists devices [0, 2, 1, 3], so devices {0,2} differ along b.
    text = _STEP.replace("op_name=\"params['w']\"", 'op_type="xla__device_data" op_name="xla__device_data"').replace(
        "op_name=\"batch['x']\"", 'op_type="xla__device_data" op_name="xla__device_data"').replace(
        "replica_groups={{0,1}}", "replica_groups={{0,2},{1,3}}")
    module = parse_module(text)
    labelled = label_collectives(module, {0: "weight", 1: "data"}, ["weight", "scalar"], 4,
                                 mesh=[("a", 2), ("b", 2)], mesh_index_of=[0, 2, 1, 3],
                                 phase=lambda instr: "backward" if "transpose(" in instr.op_name else "forward")
    roles = {c.instruction: (c.role, c.axes) for c in labelled}
    assert roles["gs"] == ("gradient-reduce", ("b",))
    assert roles["ag"] == ("activation-gather", ("b",))


def test_torch_xla_specs_are_legal():
    from corpusgen.torch_programs import TORCH_PATHOLOGIES
    from corpusgen.torch_programs import device_layout as torch_layout
    from corpusgen.torch_programs import random_spec as torch_spec

    for seed in range(60):
        spec = torch_spec(seed, "any")
        assert spec.injection in TORCH_PATHOLOGIES and spec.injection in PATHOLOGIES
        assert sorted(torch_layout(spec)) == list(range(spec.devices))
        if spec.style != "mark":
            assert spec.axes[0].name == "fsdp"
        batch_shards = int(__import__("math").prod(a.size for a in spec.axes if a.role in ("data", "fsdp")))
        assert spec.batch % batch_shards == 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs the torch_xla extra")
def test_a_fixed_seed_torch_xla_sample_scores_with_no_unreviewed_disagreement(tmp_path):
    out = tmp_path / "corpus"
    generated = subprocess.run([sys.executable, str(ROOT / "corpusgen" / "generate.py"), "--framework", "torch_xla",
                                "--n", "6", "--seed", "3", "--out", str(out), "--jobs", "2"],
                               capture_output=True, text=True, timeout=1800)
    assert generated.returncode == 0, generated.stdout[-2000:] + generated.stderr[-2000:]
    truths = [__import__("json").loads(p.read_text()) for p in out.glob("*/truth.json")]
    assert len(truths) >= 6
    assert {t["framework"] for t in truths} == {"torch_xla"}
    scored = subprocess.run([sys.executable, str(ROOT / "corpusgen" / "score.py"), str(out)],
                            capture_output=True, text=True, timeout=1200)
    summary = scored.stdout.strip().splitlines()[-1] if scored.stdout.strip() else ""
    assert summary.startswith("corpus: roles "), scored.stdout[-3000:] + scored.stderr[-3000:]
    assert scored.returncode == 0, "\n".join(
        line for line in scored.stdout.splitlines() if line.startswith("  ") and "known:" not in line)[-6000:]


# -- deviceless targets ---------------------------------------------------------------------------

_ONE_TARGET_PROGRAM = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from corpusgen import generate
target, out = {target!r}, Path({out!r})
generate._init_worker(str(out), target)
devices, hosts = generate.target_hosts(target)
spec = generate.random_spec({seed}, None, devices=devices, hosts=hosts)
result, _, collectives = generate._compile_labelled(spec, out / "program" / "dump")
generate._write(out / "program", spec, result, collectives, None, "", [], None)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("target", "extra", "optimized"), [
    ("h100:2x8", "jax_plugins.xla_cuda12", "*gpu_after_optimizations.txt"),
    ("v5e:4x4", "libtpu", "*.after_optimizations.txt"),
])
def test_a_deviceless_target_program_is_a_plain_dump_whose_roles_the_analysis_agrees_with(
        tmp_path, target, extra, optimized):
    if importlib.util.find_spec("jax") is None or importlib.util.find_spec(extra.split(".")[0]) is None:
        pytest.skip(f"needs jax and {extra} (the gpu-target / tpu-target extras)")
    script = _ONE_TARGET_PROGRAM.format(root=str(ROOT), target=target, out=str(tmp_path), seed=5)
    made = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    folder = tmp_path / "program"
    truth = __import__("json").loads((folder / "truth.json").read_text())
    assert truth["target"] == target and truth["flops"]["source"] == "cpu"
    dump = folder / "dump"
    assert not list(dump.rglob("hlo_doctor_run.json")), "a plain dump: no runner record"
    (module,) = list(dump.glob(optimized))
    assert "is_scheduled=true" in module.read_text().split("\n", 1)[0]
    assert truth["collectives"], "the oracle labelled the target's partitioned module"
    from corpusgen.score import score_program

    score = score_program(folder)
    roles = [d for d in score.disagreements if d.kind == "role"]
    assert score.roles_agreed == score.roles_total and not roles, [d.line() for d in roles]


# -- a weight split like the batch is no placement to compare with -------------------------------

# fresh seed 61001's tx0004d (reviewed 2026-12-07 in its HLO): a data-parallel torch_xla step on
# ('x', 'batch') whose weights the program leaves replicated; a mark splits the MLP's hidden features
# over both axes, which propagation carries into the up and down weights (the dump is the second
# step's graph: they enter it split 16 ways, never gathered), while the head stays replicated.
_TX0004D = {
    "seed": 61001183409, "devices": 16, "hosts": 2,
    "axes": [{"name": "x", "size": 4, "role": "data"}, {"name": "batch", "size": 4, "role": "data"}],
    "physical": ["batch", "x"], "style": "mark", "model": "mlp", "layers": 1, "batch": 16, "seq": 16,
    "hidden": 256, "ffn": 768, "heads": 4, "head_dim": 32, "vocab": 1024, "features": 64, "norm": "rms",
    "head_fold": True, "tied": False, "bias": True, "train": True, "optimizer": "sgd",
    "constrain_layers": False, "shard_norms": True, "injection": "feature-dim-constraint",
    "injection_axis": None, "framework": "torch_xla", "notes": [],
}


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs the torch-xla extra")
def test_a_weight_that_took_a_marked_feature_split_is_no_placement_to_compare_with(tmp_path):
    from corpusgen.torch_generate import compile_program
    from corpusgen.torch_programs import TorchSpec
    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.testing import builtin_rule_ids

    spec = TorchSpec.from_json(_TX0004D)
    compile_program(spec, tmp_path / "dump")
    report = analyze_dump(tmp_path / "dump", select=builtin_rule_ids())
    rules = {f.rule for f in report.findings}
    # the mark is the finding; the replicated head beside the weights it split is not
    assert rules == {"non-batch-dim-sharding"}, [f.message[:200] for f in report.findings]
