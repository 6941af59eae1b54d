"""activation-all-gather and non-batch-dim-sharding on the pytorch/xla#6778 seed (JAX and torch_xla)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.rules.base import Severity
from tests.conftest import program_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEED = FIXTURES / "fsdp-activation-gather"
RULES = ["activation-all-gather", "non-batch-dim-sharding"]
JAX_FIX = "h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(('fsdp', 'replica'), None)))"
TORCH_FIX = "xs.mark_sharding(h, mesh, (('fsdp', 'replica'), None))"


def _in_program(code: str, variant: str) -> str:
    """The torch_xla program's forward() reaches its mesh as self.mesh (MLP.__init__ stores it)."""
    return code.replace("(mesh,", "(self.mesh,").replace("(h, mesh,", "(h, self.mesh,") if "torch" in variant else code


def _named(code: str, value: str) -> str:
    """The fix code constraining ``value`` instead of ``h``."""
    return code.replace("h = ", f"{value} = ", 1).replace("(h,", f"({value},")


def _findings(folder: Path, rule: str):
    report = analyze_dump(folder, select=[rule])
    assert not report.errors, report.errors
    return {f.instruction: f for f in report.findings}


def _rule_findings(folder: Path, rule: str):
    """The rule's own findings on the dump's module, before findings with one fix at one line fold."""
    from hlo_doctor.dump import load_dump
    from hlo_doctor.rules.context import RuleContext
    from hlo_doctor.rules.engine import run_rule
    from hlo_doctor.rules.registry import discover

    dump = load_dump(folder)
    (module,) = [m for m in dump.modules if RuleContext(dump, m).per_device is not None]
    checker = discover().get(rule).rule()
    findings, skip = run_rule(RuleContext(dump, module), checker)
    assert skip is None, skip
    return {f.instruction: f for f in findings}


@pytest.mark.parametrize("variant", ["jax-shardy-bad", "jax-gspmd-bad", "torch_xla-bad"])
def test_seed_activation_gathers(variant):
    found = _rule_findings(SEED / variant, "activation-all-gather")
    assert sorted(found) == ["all-gather", "all-gather.1"]
    x, h = found["all-gather"], found["all-gather.1"]
    assert x.severity is Severity.WARNING
    # x: f32[40,1280] per device gathered over the batch (dim 0) into f32[160,1280]
    assert {k: x.evidence[k] for k in (
        "gather", "dimension", "batch_dim", "operand_shape", "result_shape", "bytes_in_per_device",
        "bytes_out_per_device", "wire_bytes_per_device", "group_size", "mesh_axes", "consuming_dot",
        "global_batch", "batch_axes", "weight_sharded", "form",
    )} == {
        "gather": "batch", "dimension": 0, "batch_dim": 0, "operand_shape": "f32[40,1280]",
        "result_shape": "f32[160,1280]", "bytes_in_per_device": 40 * 1280 * 4,
        "bytes_out_per_device": 160 * 1280 * 4, "wire_bytes_per_device": 3 * 40 * 1280 * 4, "group_size": 4,
        "mesh_axes": ["fsdp"], "consuming_dot": "dot", "global_batch": 160, "batch_axes": ["fsdp", "replica"],
        "weight_sharded": True, "form": "sync",
    }
    assert x.evidence["weight_bytes"] == 960 * 1280 * 4
    # the hidden activation f32[160,240] re-gathered on its feature dim 1 into f32[160,960]
    assert {k: h.evidence[k] for k in (
        "gather", "dimension", "batch_dim", "operand_shape", "result_shape", "bytes_in_per_device",
        "bytes_out_per_device", "wire_bytes_per_device", "consuming_dot",
    )} == {
        "gather": "feature", "dimension": 1, "batch_dim": 0, "operand_shape": "f32[160,240]",
        "result_shape": "f32[160,960]", "bytes_in_per_device": 160 * 240 * 4,
        "bytes_out_per_device": 160 * 960 * 4, "wire_bytes_per_device": 3 * 160 * 240 * 4,
        "consuming_dot": "dot.1",
    }
    assert h.evidence["weight_bytes"] == 128 * 960 * 4
    # x's fix constrains h, the output of the layer x feeds; h's fix constrains h too: in JAX at the line
    # that makes it (``h = x @ w1.T + b1``); the torch_xla dump records no line for add.19, so the fix is
    # at the gather's line (``return h @ w2.T + b2``), which assigns nothing: a placeholder, never a
    # made-up name
    for finding, value in ((x, "h"), (h, "<activation>" if "torch" in variant else "h")):
        assert finding.suggestion.jax == _named(_in_program(JAX_FIX, variant), value)
        assert finding.suggestion.torch_xla == _named(_in_program(TORCH_FIX, variant), value)
        assert "('fsdp', 'replica')" in finding.suggestion.summary


def test_seed_source_lines_jax():
    found = _rule_findings(SEED / "jax-shardy-bad", "activation-all-gather")
    assert found["all-gather"].source.file.endswith("fsdp_activation_gather.py")
    # both fixes constrain h where the program makes it: the line of the layer x feeds, whose output is
    # the hidden activation that is re-gathered
    making_h = program_line("fsdp_activation_gather.py", "h = x @ w1.T + b1")
    assert (found["all-gather"].source.line, found["all-gather.1"].source.line) == (making_h, making_h)
    assert "batch input x" in found["all-gather"].message and "weight w1" in found["all-gather"].message
    # one fix at one line: the report gives one finding, the re-gather in its related ops
    (reported,) = _findings(SEED / "jax-shardy-bad", "activation-all-gather").values()
    assert reported.instruction == "all-gather" and "all-gather.1" in reported.related


def test_seed_source_lines_torch_xla_from_module_calls():
    found = _findings(SEED / "torch_xla-bad", "activation-all-gather")
    x, h = found["all-gather"], found["all-gather.1"]
    # metadata names only torch/nn/modules/linear.py; the runner's module_calls give fc1 / fc2
    assert x.source.file.endswith("fsdp_activation_gather_torch_xla.py") and x.source.line == program_line(
        "fsdp_activation_gather_torch_xla.py", "h = self.fc1(x)"
    )
    assert h.source.file.endswith("fsdp_activation_gather_torch_xla.py") and h.source.line == program_line(
        "fsdp_activation_gather_torch_xla.py", "return self.fc2(h)"
    )
    assert "nn.Module calls" in x.message and "only library frames" not in x.message


@pytest.mark.parametrize("variant", ["jax-shardy-bad", "jax-gspmd-bad", "torch_xla-bad"])
def test_seed_non_batch_dim_sharding(variant):
    found = _findings(SEED / variant, "non-batch-dim-sharding")
    assert list(found) == ["dot"]  # the first layer only: the second inherits the layout
    finding = found["dot"]
    assert finding.evidence["shape"] == "f32[160,960]"
    assert (finding.evidence["batch_dim"], finding.evidence["sharded_dims"]) == (0, [1])
    assert finding.evidence["sharded_axes"] == [["fsdp"]]
    assert finding.evidence["input_batch_shards"] == 4
    assert finding.suggestion.jax == _in_program(JAX_FIX, variant)
    assert finding.suggestion.torch_xla == _in_program(TORCH_FIX, variant)
    assert finding.source is not None and finding.source.line == (
        program_line("fsdp_activation_gather_torch_xla.py", "h = self.fc1(x)") if variant.startswith("torch")
        else program_line("fsdp_activation_gather.py", "h = x @ w1.T + b1")
    )


def test_non_batch_dim_sharding_fixture():
    found = _findings(FIXTURES / "non-batch-dim-sharding" / "jax-shardy-bad", "non-batch-dim-sharding")
    finding = found["dot"]
    assert finding.evidence["dot"] == "dot_general.2"
    assert finding.evidence["sharded_axes"] == [["data"]]
    # the program's own constraint at line 41 writes P(None, "data") (the hidden sharding, line 33):
    # the fix is that spec, where the program writes it
    assert finding.suggestion.jax == "hidden = batch if args.variant == \"fixed\" else NamedSharding(mesh, P('data', None))"
    (edit,) = finding.suggestion.edits
    assert (edit.kind, edit.line, edit.old_spec, edit.spec) == ("respec", 33, (None, ("data",)), (("data",), None))
    assert finding.source.line == 40


def test_a100_seed_diagnosed_like_cpu():
    folder = SEED / "jax-a100_2x8-bad"
    found = _rule_findings(folder, "activation-all-gather")
    assert sorted(found) == ["all-gather", "all-gather.1"]
    x = found["all-gather"]
    assert (x.evidence["gather"], x.evidence["result_shape"], x.evidence["group_size"]) == ("batch", "f32[640,1280]", 16)
    assert found["all-gather.1"].evidence["gather"] == "feature"
    assert x.suggestion.jax == JAX_FIX
    assert list(_findings(folder, "non-batch-dim-sharding")) == ["dot"]


@pytest.mark.parametrize("folder", [
    SEED / "jax-shardy-fixed", SEED / "jax-gspmd-fixed", SEED / "torch_xla-fixed", SEED / "jax-a100_2x8-fixed",
    FIXTURES / "non-batch-dim-sharding" / "jax-shardy-fixed",
    FIXTURES / "llama-fsdp" / "jax-shardy-healthy", FIXTURES / "llama-2d" / "jax-shardy-healthy",
    FIXTURES / "llama-scan" / "jax-shardy-healthy", FIXTURES / "train-step" / "jax-shardy-healthy",
], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_silent_on_fixed_and_healthy(folder):
    report = analyze_dump(folder, select=RULES)
    assert [(f.rule, f.instruction) for f in report.findings] == []


def test_start_done_form_in_gpu_after_optimizations_only(tmp_path):
    # only the scheduled GPU module: all-gather-start/-done, split-K gemm fusions, layout bitcasts
    source = SEED / "jax-a100_2x8-bad" / "module_0001.jit_mlp.sm_8.0_gpu_after_optimizations.txt"
    (tmp_path / source.name).write_text(source.read_text())
    found = _findings(tmp_path, "activation-all-gather")
    assert sorted(found) == ["all-gather-start", "all-gather-start.1"]
    x, h = found["all-gather-start"], found["all-gather-start.1"]
    assert (x.evidence["form"], x.evidence["gather"], x.evidence["consuming_dot"]) == ("start-done", "batch", "dot.6")
    assert (h.evidence["form"], h.evidence["gather"], h.evidence["dimension"]) == ("start-done", "feature", 1)
    assert x.evidence["bytes_out_per_device"] == 640 * 1280 * 4
    # no mesh names in a lone module but the replica groups': the spec is still in the input's layout
    assert x.suggestion.jax.endswith("P(('axis_0', 'axis_1'), None)))")


def test_reshape_keeps_merges_and_splits_the_batch_dim():
    from hlo_doctor.graph.dim_maps import reshape_pairs

    batch = frozenset({(0, 0)})
    assert reshape_pairs(batch, (8, 128, 256), (8, 128, 4, 64)) == {(0, 0)}
    assert reshape_pairs(batch, (8, 128, 256), (1024, 256)) == {(0, 0)}  # merged with the sequence
    assert reshape_pairs(frozenset({(0, 0)}), (256, 512), (4, 64, 512)) == {(0, 1)}  # split: the largest piece
    assert reshape_pairs(frozenset({(0, 1)}), (4, 64, 64), (256, 64)) == {(0, 0)}


# Hand-written HLO of a JAX training step: line 2 (``h = x @ w``) makes h in the forward pass; in the
# backward pass the cotangent g is all-gathered along the batch for dx, the backward matmul JAX writes
# with line 2's metadata. Line 2 assigns h, not dx's output.
_BACKWARD_PROGRAM = "def step(x, w):\n    h = x @ w\n    return (h * h).sum()\n"
_BACKWARD_GATHER = """\
HloModule jit_step, num_partitions=4

%add (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %s = f32[] add(%p, %q)
}

ENTRY %main.1_spmd (x: f32[2,16], w: f32[16,32]) -> (f32[], f32[16,32], f32[8,16]) {
  %x = f32[2,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="batch"}
  %w = f32[16,32]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w"}
  %h = f32[2,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/dot_general" source_file="PROGRAM" source_line=2}
  %sq = f32[2,32]{1,0} multiply(%h, %h), metadata={op_name="jit(step)/mul" source_file="PROGRAM" source_line=3}
  %zero = f32[] constant(0)
  %part = f32[] reduce(%sq, %zero), dimensions={0,1}, to_apply=%add, metadata={op_name="jit(step)/reduce_sum" source_file="PROGRAM" source_line=3}
  %loss = f32[] all-reduce(%part), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %two = f32[] constant(2)
  %b2 = f32[2,32]{1,0} broadcast(%two), dimensions={}
  %g = f32[2,32]{1,0} multiply(%h, %b2), metadata={op_name="jit(step)/transpose(jvp(mul))" source_file="PROGRAM" source_line=3}
  %ag = f32[8,32]{1,0} all-gather(%g), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(step)/transpose(jvp(dot_general))" source_file="PROGRAM" source_line=2}
  %dx = f32[8,16]{1,0} dot(%ag, %w), lhs_contracting_dims={1}, rhs_contracting_dims={1}, metadata={op_name="jit(step)/transpose(jvp(dot_general))" source_file="PROGRAM" source_line=2}
  %dwp = f32[16,32]{1,0} dot(%x, %g), lhs_contracting_dims={0}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/transpose(jvp(dot_general))" source_file="PROGRAM" source_line=2}
  %dw = f32[16,32]{1,0} all-reduce(%dwp), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %lr = f32[] constant(0.1)
  %blr = f32[16,32]{1,0} broadcast(%lr), dimensions={}
  %step = f32[16,32]{1,0} multiply(%dw, %blr)
  %nw = f32[16,32]{1,0} subtract(%w, %step)
  ROOT %out = (f32[], f32[16,32]{1,0}, f32[8,16]{1,0}) tuple(%loss, %nw, %dx)
}
"""


@pytest.mark.parametrize("forward_on_the_line", [True, False])
def test_a_backward_gather_is_fixed_at_the_forward_value_of_its_line(tmp_path, forward_on_the_line):
    program = tmp_path / "prog.py"
    program.write_text(_BACKWARD_PROGRAM)
    text = _BACKWARD_GATHER.replace("PROGRAM", str(program))
    if not forward_on_the_line:  # h's forward matmul written on another line: line 2's value is not known
        text = text.replace('%h = f32[2,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, '
                            'metadata={op_name="jit(step)/dot_general" source_file="' + str(program) + '" source_line=2}',
                            '%h = f32[2,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}')
    (tmp_path / "module_0000.jit_step.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt").write_text(text)
    (finding,) = analyze_dump(tmp_path, select=["activation-all-gather"]).findings
    assert finding.instruction == "ag" and finding.source.line == 2
    summary, code = finding.suggestion.summary, finding.suggestion.jax
    if forward_on_the_line:
        assert "the value this line makes in the forward pass (h, f32[2,32])" in summary
        assert "dx, which reads the gathered g, is this line's backward matmul" in summary
        assert code.startswith("h = jax.lax.with_sharding_constraint(h, ") and "P(<axis 0>, None)" in code
    else:
        assert "forward pass" not in summary and "the output of dx" in summary
