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


@pytest.mark.parametrize("variant", ["jax-shardy-bad", "jax-gspmd-bad", "torch_xla-bad"])
def test_seed_activation_gathers(variant):
    found = _findings(SEED / variant, "activation-all-gather")
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
    # x's line assigns h; h's line (``return h @ w2.T + b2``) assigns nothing: a placeholder, never a
    # made-up name
    for finding, value in ((x, "h"), (h, "<activation>")):
        assert finding.suggestion.jax == _named(_in_program(JAX_FIX, variant), value)
        assert finding.suggestion.torch_xla == _named(_in_program(TORCH_FIX, variant), value)
        assert "('fsdp', 'replica')" in finding.suggestion.summary


def test_seed_source_lines_jax():
    found = _findings(SEED / "jax-shardy-bad", "activation-all-gather")
    assert found["all-gather"].source.file.endswith("fsdp_activation_gather.py")
    assert (found["all-gather"].source.line, found["all-gather.1"].source.line) == (program_line("fsdp_activation_gather.py", "h = x @ w1.T + b1"), program_line("fsdp_activation_gather.py", "return h @ w2.T + b2"))
    assert "batch input x" in found["all-gather"].message and "weight w1" in found["all-gather"].message


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
    found = _findings(folder, "activation-all-gather")
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
