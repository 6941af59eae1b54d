"""Flax linen rules, Keras LayoutMap keys, NNX partitioning, FSDPv2 shard_output and XLA flags,
on small hand-written programs (not gallery programs)."""

from __future__ import annotations

import ast

from hlo_doctor.findings import SourceEdit
from tests.fix_cases import PATH, finding, patched, plan, refused

RULES = '''\
BAD_RULES = [("embed", "data"), ("batch", "data"), ("mlp", None)]
rules = BAD_RULES


def main():
    with nn.logical_axis_rules(rules):
        pass
'''


def _rule(logical, mesh_axes) -> SourceEdit:
    return SourceEdit("logical-rule", "jax", details={"logical": logical, "mesh_axes": mesh_axes})


def test_logical_rule_moved_before_the_rule_that_takes_its_mesh_axis():
    out = patched(RULES, _rule("batch", "data"), line=1)
    assert out.splitlines()[0] == 'BAD_RULES = [("batch", "data"), ("embed", "data"), ("mlp", None)]'


def test_logical_rule_found_through_the_names_the_line_uses():
    out = patched(RULES, _rule("mlp", ("model",)), line=6)
    assert out.splitlines()[0] == 'BAD_RULES = [("embed", "data"), ("batch", "data"), ("mlp", "model")]'


def test_logical_rule_inserted_first_when_missing():
    out = patched(RULES, _rule("length", None), line=1)
    assert out.splitlines()[0] == 'BAD_RULES = [("length", None), ("embed", "data"), ("batch", "data"), ("mlp", None)]'


def test_logical_rule_refusals():
    assert "already map" in refused(RULES, _rule("embed", "data"), line=1)
    assert "uses no literal logical axis rules" in refused(RULES.replace("rules = BAD_RULES", "rules = load()"),
                                                           _rule("batch", "data"), line=6)


def test_logical_rules_chosen_at_run_time_each_made_to_say_so():
    """``rules = BAD if bad else GOOD``: the literal that does not say so yet is edited, the other kept."""
    chosen = RULES.replace("rules = BAD_RULES", 'GOOD_RULES = [("batch", "data"), ("embed", "data")]\n'
                                                "rules = BAD_RULES if bad else GOOD_RULES")
    edit = SourceEdit("logical-rule", "jax", details={"logical": "batch", "mesh_axes": ("data",), "before": ("embed",)})
    out = patched(chosen, edit, line=7)
    assert out.splitlines()[:2] == ['BAD_RULES = [("batch", "data"), ("embed", "data"), ("mlp", None)]',
                                    'GOOD_RULES = [("batch", "data"), ("embed", "data")]']
    assert "already" in refused(out, edit, line=7)


LAYOUT = '''\
def layout_map(mesh, variant):
    layout = keras.distribution.LayoutMap(mesh)
    layout["token_embedding/embeddings"] = ("model", None)
    if variant == "fixed":
        layout["ffw_gating.kernel"] = (None, "model")
    else:
        layout["feedforward_gate_dense.kernel"] = (None, "model")
    return layout
'''


def test_layout_map_key_added_after_the_last_assignment_of_the_block():
    edit = SourceEdit("layout-map-key", "jax", details={"key": "decoder_block.*ffw_linear.kernel",
                                                        "spec": (("model",), None)})
    out = patched(LAYOUT, edit, line=2)
    assert out == LAYOUT.replace("    return layout\n",
                                 '    layout["decoder_block.*ffw_linear.kernel"] = ("model", None)\n    return layout\n')
    assert "already set" in refused(out, edit, line=2)


def test_layout_map_refused_without_a_layout_map():
    edit = SourceEdit("layout-map-key", "jax", details={"key": "k", "spec": (None,)})
    assert "makes no LayoutMap" in refused(LAYOUT, edit, line=8)


def test_layout_map_key_at_a_key_assignment_goes_in_that_block_with_a_raw_regex():
    edit = SourceEdit("layout-map-key", "jax", details={"key": r"decoder_block_\d+/ffw_linear/kernel"},
                      spec=(("model",), None))
    out = patched(LAYOUT, edit, line=7)
    assert out.splitlines()[6:8] == ['        layout["feedforward_gate_dense.kernel"] = (None, "model")',
                                     r'        layout[r"decoder_block_\d+/ffw_linear/kernel"] = ("model", None)']
    assert "already set" in refused(out, edit, line=7)


NNX = '''\
from flax import nnx


class Model(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.unembed = nnx.Linear(256, 2048, use_bias=False, rngs=rngs, kernel_init=init)
        self.out = nnx.Linear(256, 2048, rngs=rngs)
        self.w = nnx.Param(init(rngs.params(), (4, 4)))
'''


def test_with_partitioning_wraps_the_initializer():
    edit = SourceEdit("with-partitioning", "jax", target="unembed/kernel", spec=(None, ("fsdp",)))
    out = patched(NNX, edit, line=7)
    assert 'kernel_init=nnx.with_partitioning(init, (None, "fsdp")))\n' in out
    assert "already" in refused(out, edit, line=7)


def test_with_partitioning_default_initializer_and_param():
    out = patched(NNX, SourceEdit("with-partitioning", "jax", spec=(("fsdp",), None)), line=8)
    assert ('        self.out = nnx.Linear(256, 2048, rngs=rngs,\n'  # too long for one line: wrapped
            '                              kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), '
            '("fsdp", None)))\n') in out
    out = patched(NNX, SourceEdit("with-partitioning", "jax", spec=(("fsdp",), None)), line=9)
    assert 'self.w = nnx.Param(nnx.with_partitioning(init, ("fsdp", None))(rngs.params(), (4, 4)))' in out


def test_with_partitioning_adds_the_nnx_import():
    program = "import flax\nlayer = flax.nnx.Linear(2, 2, rngs=rngs)\n"
    out = patched(program, SourceEdit("with-partitioning", "jax", spec=(None, ("fsdp",))), line=2)
    assert "flax.nnx.with_partitioning(flax.nnx.initializers.lecun_normal()" in out


FSDP = '''\
import torch_xla.distributed.spmd as xs
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2


def main():
    mesh = xs.Mesh(ids, (2, 8), ("replica", "fsdp"))
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = FSDPv2(layer, mesh=mesh)
    model = FSDPv2(model, mesh=mesh)
'''


def _shard_output(**details) -> SourceEdit:
    return SourceEdit("shard-output", "torch_xla", spec=(("replica", "fsdp"), None, None), details=details)


def test_shard_output_defined_before_the_statement_and_passed():
    out = patched(FSDP, _shard_output(rank=3, attribute="logits"), line=9)
    assert out.splitlines()[8:] == [
        "",
        "    def shard_output(output, mesh):",
        '        real = output.logits if hasattr(output, "logits") else output',
        "        real = real[0] if isinstance(real, tuple) else real",
        '        xs.mark_sharding(real, mesh, (("replica", "fsdp"), None, None))',
        "",
        "    model = FSDPv2(model, mesh=mesh, shard_output=shard_output)"]
    ast.parse(out)
    assert "already passes shard_output" in refused(out, _shard_output(rank=3, attribute="logits"), line=15)


def test_shard_output_in_a_loop_goes_before_the_loop():
    out = patched(FSDP, _shard_output(rank=3), line=8)
    lines = out.splitlines()
    assert lines[6:11] == ["",
                           "    def shard_output(output, mesh):",
                           '        xs.mark_sharding(output, mesh, (("replica", "fsdp"), None, None))',
                           "",
                           "    for i, layer in enumerate(model.model.layers):"]
    assert "FSDPv2(layer, mesh=mesh, shard_output=shard_output)" in out


def test_shard_output_refused_without_a_wrapper():
    assert "no FSDPv2" in refused(FSDP, _shard_output(rank=3), line=6)


def test_xla_flag_removed_from_the_literal_or_refused():
    program = 'import os\n"""--xla_gpu_disable_async_collectives=allreduce in a docstring"""\n' \
              'os.environ["XLA_FLAGS"] = "--xla_dump_to=/tmp/d --xla_gpu_disable_async_collectives=allreduce"\n'
    edit = SourceEdit("xla-flag", "jax", details={"flag": "--xla_gpu_disable_async_collectives=allreduce"})
    out = patched(program, edit, line=1)
    assert out.splitlines()[2] == 'os.environ["XLA_FLAGS"] = "--xla_dump_to=/tmp/d"'
    assert out.splitlines()[1] == program.splitlines()[1]  # the docstring is not a setting
    assert "set outside the program: remove it from your environment" in refused(out, edit, line=1)


def test_shard_output_for_two_wrappers_is_defined_once():
    result = plan(FSDP, finding(_shard_output(rank=3), line=8), finding(_shard_output(rank=3), line=9))
    assert not result.refused
    out = result.patched[PATH]
    assert out.count("def shard_output(") == 1
    assert out.count("shard_output=shard_output)") == 2
