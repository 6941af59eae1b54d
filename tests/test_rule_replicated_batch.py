"""replicated-batch on real fixtures (the gallery's replicated-batch and replicated-batch-regrouped pairs)
and hand-written probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from tests.conftest import probe_dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAIR = FIXTURES / "replicated-batch"
REGROUPED = FIXTURES / "replicated-batch-regrouped"
REGROUPED_PROGRAM = Path(__file__).resolve().parents[1] / "hlo_doctor/examples/programs/replicated_batch_regrouped.py"


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_the_axis_that_splits_nothing_repeats_the_work(partitioner):
    (finding,) = analyze_dump(PAIR / f"jax-{partitioner}-bad", select=["replicated-batch"]).findings
    evidence = finding.evidence
    assert evidence["replicated_axes"] == ["data"] and evidence["redundancy_factor"] == 2
    assert evidence["batch_axes"] == ["fsdp"] and evidence["batch_input"] == "tokens"
    # the partitioned matmuls hold 4 of the 16 rows (f32[4,128,1024]); split over both axes, 2
    assert (evidence["global_batch"], evidence["rows_per_device"], evidence["healthy_rows_per_device"]) == (16, 4, 2)
    assert evidence["repeated_flops_fraction"] == 1.0
    assert finding.suggestion.jax.startswith(
        "tokens = jax.lax.with_sharding_constraint(tokens, NamedSharding(mesh, P(('data', 'fsdp'), None)))")
    assert "reduced over 'data'" in finding.suggestion.summary  # what the fix costs in a training step
    assert analyze_dump(PAIR / f"jax-{partitioner}-fixed", select=["replicated-batch"]).findings == ()



def _program_line(needle: str) -> int:
    """The one line of the regrouped example's program holding ``needle`` (1-based)."""
    (line,) = [n for n, text in enumerate(REGROUPED_PROGRAM.read_text().splitlines(), 1) if needle in text]
    return line


@pytest.mark.parametrize("devices_per_host", [4, 8])
@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_a_batch_regrouped_by_a_layer_output_constraint_is_found_there(partitioner, devices_per_host):
    # tokens over ('data', 'fsdp'); layer 0 runs on that split, its output constraint P('fsdp', None, None)
    # takes the batch off 'data' for layer 1 and the unembedding (see the fixtures' expected_findings notes)
    bad = REGROUPED / f"jax-{partitioner}-bad"
    (finding,) = analyze_dump(bad, select=["replicated-batch"], devices_per_host=devices_per_host).findings
    evidence = finding.evidence
    assert evidence["regrouped"] is True and evidence["replicated_axes"] == ["data"]
    assert evidence["batch_axes"] == ["data", "fsdp"] and evidence["batch_input"] == "tokens"
    assert evidence["constraint_spec"] == [["fsdp"], [], []]
    # anchored at layer 0's output constraint: the partitioned op of the propagated module's constraint
    assert (evidence["constraint"], finding.instruction) == {
        "shardy": ("sharding_constraint.2", "sharding_constraint.10"), "gspmd": ("copy.1", "copy.6")}[partitioner]
    assert 0 < evidence["repeated_flops_fraction"] < 1  # layer 0's matmuls kept the split
    assert Path(finding.source.file).name == REGROUPED_PROGRAM.name
    assert finding.source.line == _program_line("NamedSharding(mesh, layer_output))")
    (edit,) = finding.suggestion.edits
    assert edit.kind == "respec" and Path(edit.file).name == REGROUPED_PROGRAM.name
    assert edit.line == _program_line('layer_output = P("fsdp", None, None)')
    assert edit.old_spec == (("fsdp",), None, None) and edit.spec == (("data", "fsdp"), None, None)
    fixed = REGROUPED / f"jax-{partitioner}-fixed"
    assert analyze_dump(fixed, select=["replicated-batch"], devices_per_host=devices_per_host).findings == ()

# Hand-written probes (small HLO written for this test, not compiler output).
_REPLICATED = """\
HloModule probe_replicated, num_partitions=4

ENTRY %main (x: f32[8,64], w: f32[64,64]) -> f32[8,64] {
  %x = f32[8,64]{1,0} parameter(0), sharding={replicated}, metadata={op_name="x"}
  %w = f32[64,64]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w"}
  ROOT %y = f32[8,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""

_TENSOR_PARALLEL = """\
HloModule probe_tp, num_partitions=4

ENTRY %main (x: f32[8,64], w: f32[64,64]) -> f32[8,64] {
  %x = f32[8,64]{1,0} parameter(0), sharding={replicated}, metadata={op_name="x"}
  %w = f32[64,64]{1,0} parameter(1), sharding={devices=[1,4]<=[4]}, metadata={op_name="w"}
  ROOT %y = f32[8,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}
}
"""


_HALF_REPLICATED = """\
HloModule probe_half, num_partitions=4

ENTRY %main (x: f32[8,64], w: f32[64,64]) -> f32[8,64] {
  %x = f32[8,64]{1,0} parameter(0), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}, metadata={op_name="x"}
  %w = f32[64,64]{1,0} parameter(1), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}, metadata={op_name="w"}
  ROOT %y = f32[8,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""


def _probe(tmp_path: Path, text: str) -> Path:
    """The same hand-written module as the propagated and the partitioned snapshot."""
    return probe_dump(tmp_path, text)


def test_silent_on_tensor_parallelism(tmp_path):
    assert analyze_dump(_probe(tmp_path, _TENSOR_PARALLEL), select=["replicated-batch"]).findings == ()


def test_a_program_that_shards_nothing_repeats_every_matmul_on_every_device(tmp_path):
    # 4 partitions, the batch input and the weight whole on every device: 4x the work
    (finding,) = analyze_dump(_probe(tmp_path, _REPLICATED), select=["replicated-batch"]).findings
    assert finding.evidence["redundancy_factor"] == 4 and finding.evidence["batch_axes"] == []
    assert "the whole program is replicated" in finding.message and "whole on every device" in finding.message


def test_a_replicated_program_whose_batch_cannot_be_split_is_silent(tmp_path):
    # 6 rows over 4 devices: no even split to suggest (a small replicated helper, not the step)
    text = _REPLICATED.replace("f32[8,64]", "f32[6,64]").replace("x: f32[8,64]", "x: f32[6,64]")
    assert analyze_dump(_probe(tmp_path, text), select=["replicated-batch"]).findings == ()


def test_a_replicated_helper_beside_a_larger_step_is_silent(tmp_path):
    # the replicated probe is not the dump's largest module: a sharded module beside it is bigger
    dump = _probe(tmp_path, _REPLICATED)
    big = _HALF_REPLICATED.replace("HloModule probe_half", "HloModule probe_step") + "\n" + "// padding\n" * 200
    (dump / "module_0001.step.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt").write_text(big)
    findings = analyze_dump(dump, select=["replicated-batch"]).findings
    assert all(f.module != "module_0000.probe" for f in findings), [(f.module, f.message) for f in findings]


def test_a_probe_with_a_replicating_axis_fires_with_positional_names_said_so(tmp_path):
    (finding,) = analyze_dump(_probe(tmp_path, _HALF_REPLICATED), select=["replicated-batch"]).findings
    assert finding.evidence["replicated_axes"] == ["axis_1"] and finding.evidence["rows_per_device"] == 4
    assert "positional" in finding.suggestion.summary  # the dump names no mesh axes


# Hand-written probe: the input split over both axes of a 2x2 mesh, then a sharding constraint
# (GSPMD's custom-call to Sharding) that keeps the batch on the first axis alone, the rows
# all-gathered over the second axis on the way (what a regroup moves).
_REGROUPED = """\
HloModule probe_regroup, num_partitions=4

ENTRY %main (x: f32[8,64], w1: f32[64,64], w2: f32[64,64]) -> f32[8,64] {
  %x = f32[8,64]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
  %w1 = f32[64,64]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w1"}
  %w2 = f32[64,64]{1,0} parameter(2), sharding={replicated}, metadata={op_name="w2"}
  %h = f32[8,64]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
  %hs = f32[4,64]{1,0} slice(%h), slice={[0:4], [0:64]}
  %ag = f32[8,64]{1,0} all-gather(%hs), channel_id=1, replica_groups={{0,1},{2,3}}, dimensions={0}, use_global_device_ids=true
  %c = f32[8,64]{1,0} custom-call(%ag), custom_call_target="Sharding", sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  %h2 = f32[8,64]{1,0} dot(%c, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  ROOT %h3 = f32[8,64]{1,0} dot(%h2, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""


def test_a_batch_regrouped_off_an_axis_mid_graph_is_found_at_its_constraint(tmp_path):
    (finding,) = analyze_dump(_probe(tmp_path, _REGROUPED), select=["replicated-batch"]).findings
    assert finding.instruction == "c" and finding.evidence["regrouped"] is True
    assert finding.evidence["redundancy_factor"] == 2
    assert len(finding.evidence["batch_axes"]) == 2 and finding.evidence["replicated_axes"][0] in finding.evidence["batch_axes"]
    assert finding.evidence["repeated_flops_fraction"] == pytest.approx(2 / 3, abs=1e-3)  # h2 and h3 of 3 dots
    assert "regrouped off mesh axis" in finding.message


def test_a_batch_kept_on_every_axis_is_not_regrouped(tmp_path):
    kept = _REGROUPED.replace("{devices=[2,1,2]<=[4] last_tile_dim_replicate}", "{devices=[4,1]<=[4]}")
    assert analyze_dump(_probe(tmp_path, kept), select=["replicated-batch"]).findings == ()


_WEIGHT_UPDATE_CONSTRAINT = """\
HloModule jit_step, num_partitions=8

ENTRY %main (w: f32[64,32], x: f32[16,32]) -> f32[64,32] {
  %w = f32[64,32]{1,0} parameter(0), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  %x = f32[16,32]{1,0} parameter(1), sharding={devices=[8,1]<=[8]}
  %h = f32[16,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %g = f32[64,32]{1,0} dot(%h, %x), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %lr = f32[] constant(0.001)
  %b = f32[64,32]{1,0} broadcast(%lr), dimensions={}
  %step = f32[64,32]{1,0} multiply(%g, %b)
  %new = f32[64,32]{1,0} subtract(%w, %step)
  ROOT %placed = f32[64,32]{1,0} copy(%new), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}, metadata={op_name="jit(step)/sharding_constraint"}
}
"""


def test_a_weights_update_placed_over_a_batch_axis_is_no_regroup():
    """Hand-written HLO: the step's new weight (w - lr * g, its gradient derived from the batch) is
    constrained over 'fsdp', a batch axis; it carries no batch dim, so it is not where the batch leaves
    'dp' (an Equinox step that re-places its model with eqx.filter_shard was reported so)."""
    from hlo_doctor.graph.dataflow import build_graph
    from hlo_doctor.graph.mesh import Mesh
    from hlo_doctor.hlo import parse_module
    from hlo_doctor.rules._regroup import regroup_site
    from hlo_doctor.semantics.parameters import EntryParameters

    module = parse_module(_WEIGHT_UPDATE_CONSTRAINT)
    mesh = Mesh(("dp", "fsdp"), (2, 4), tuple(range(8)), "program")
    params = EntryParameters(frozenset({0}), frozenset({1}), frozenset(), frozenset({0}), {})
    graph = build_graph(module)
    assert regroup_site(module, graph, params, mesh, "dp", {"dp", "fsdp"}) is None
    # the same constraint on data's value would be a regroup: the guard is the weight, not the op
    as_data = EntryParameters(frozenset(), frozenset({0, 1}), frozenset(), frozenset(), {})
    assert regroup_site(module, graph, as_data, mesh, "dp", {"dp", "fsdp"}) is not None


def test_a_regroup_moved_by_a_reshard_is_found_at_its_constraint(tmp_path):
    """Hand-written HLO: the rows that leave 'axis_1' move by a collective-permute (a reshard), not
    an all-gather: the regroup's traffic is a reshard (an eval step's regroup, seed 2026 0358f)."""
    text = _REGROUPED.replace(
        "  %ag = f32[8,64]{1,0} all-gather(%hs), channel_id=1, replica_groups={{0,1},{2,3}}, dimensions={0}, "
        "use_global_device_ids=true",
        "  %cp = f32[4,64]{1,0} collective-permute(%hs), channel_id=1, source_target_pairs={{0,3},{3,0},{1,2},{2,1}}\n"
        "  %ag = f32[8,64]{1,0} concatenate(%hs, %cp), dimensions={0}")
    assert "collective-permute" in text and "all-gather" not in text
    (finding,) = analyze_dump(_probe(tmp_path, text), select=["replicated-batch"]).findings
    assert finding.instruction == "c" and finding.evidence["regrouped"] is True
    assert "cp" in finding.related  # the reshard is the regroup's symptom


# Hand-written HLO: a constraint takes the batch off 'axis_1' (GSPMD's Sharding custom-call), and
# propagation splits the ops after it again, while the partitioned module all-gathers the rows over
# 'axis_1' for the weight-gradient matmul g: 20% of the matmul FLOPs (under the 25% bar of a regroup
# read in the propagated module; the program's own constraint is the evidence here).
_UNDONE_PROPAGATED = """\
HloModule probe_undone, num_partitions=4

ENTRY %main (x: f32[8,64], w1: f32[64,256], w2: f32[256,64]) -> f32[64,64] {
  %x = f32[8,64]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
  %w1 = f32[64,256]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w1"}
  %w2 = f32[256,64]{1,0} parameter(2), sharding={replicated}, metadata={op_name="w2"}
  %h = f32[8,256]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
  %y = f32[8,64]{1,0} dot(%h, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
  %c = f32[8,64]{1,0} custom-call(%y), custom_call_target="Sharding", sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
  %z = f32[8,64]{1,0} multiply(%c, %c), sharding={devices=[4,1]<=[4]}
  ROOT %g = f32[64,64]{1,0} dot(%z, %z), lhs_contracting_dims={0}, rhs_contracting_dims={0}, sharding={replicated}
}
"""

_UNDONE_PARTITIONED = """\
HloModule probe_undone, num_partitions=4

ENTRY %main_spmd (x: f32[2,64], w1: f32[64,256], w2: f32[256,64]) -> f32[64,64] {
  %x = f32[2,64]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
  %w1 = f32[64,256]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w1"}
  %w2 = f32[256,64]{1,0} parameter(2), sharding={replicated}, metadata={op_name="w2"}
  %h = f32[2,256]{1,0} dot(%x, %w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %y = f32[2,64]{1,0} dot(%h, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag = f32[4,64]{1,0} all-gather(%y), channel_id=1, replica_groups={{0,1},{2,3}}, dimensions={0}, use_global_device_ids=true
  %z = f32[4,64]{1,0} multiply(%ag, %ag)
  ROOT %g = f32[64,64]{1,0} dot(%z, %z), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
"""


def test_a_regroup_undone_by_propagation_is_found_at_its_constraint_below_the_propagated_bar(tmp_path):
    (finding,) = analyze_dump(probe_dump(tmp_path, _UNDONE_PROPAGATED, _UNDONE_PARTITIONED),
                              select=["replicated-batch"]).findings
    assert finding.instruction == "c" and finding.evidence["regrouped"] is True
    assert finding.evidence["repeated_flops_fraction"] == pytest.approx(0.2)  # g: 32,768 of 163,840 FLOPs
    assert {"ag", "g"} <= set(finding.related)


def test_without_the_programs_constraint_the_partitioners_regroup_is_left_to_the_traffic_rules(tmp_path):
    # the same partitioned work, but no constraint of the program takes the batch off 'axis_1'
    propagated = _UNDONE_PROPAGATED.replace(
        'custom-call(%y), custom_call_target="Sharding", sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}',
        "copy(%y), sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    assert analyze_dump(probe_dump(tmp_path, propagated, _UNDONE_PARTITIONED),
                        select=["replicated-batch"]).findings == ()


# Hand-written HLO of a tensor-parallel step (one axis of 4, the batch split over none): the MLP is a
# column-parallel w1 feeding a row-parallel w2 with no collective between (a Megatron pair), its
# partial sums all-reduced; the norm scale is sharded, so its output is all-gathered on the feature dim.
_TENSOR_PAIRS = """\
HloModule probe_tp_pairs, num_partitions=4

ENTRY %main (x: s32[8,16], e: f32[64,64], w1: f32[64,256], w2: f32[256,64], s: f32[64], w3: f32[64,64]) -> f32[8,16,64] {
  %x = s32[8,16]{1,0} parameter(0), sharding={replicated}, metadata={op_name="tokens"}
  %e = f32[64,64]{1,0} parameter(1), sharding={replicated}, metadata={op_name="embed"}
  %w1 = f32[64,256]{1,0} parameter(2), sharding={devices=[1,4]<=[4]}, metadata={op_name="w1"}
  %w2 = f32[256,64]{1,0} parameter(3), sharding={devices=[4,1]<=[4]}, metadata={op_name="w2"}
  %s = f32[64]{0} parameter(4), sharding={devices=[4]<=[4]}, metadata={op_name="scale"}
  %w3 = f32[64,64]{1,0} parameter(5), sharding={devices=[1,4]<=[4]}, metadata={op_name="w3"}
  %oh = f32[8,16,64]{2,1,0} convert(%x)
  %a = f32[8,16,64]{2,1,0} dot(%oh, %e), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  %h = f32[8,16,64]{2,1,0} dot(%a, %w1), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  %r = f32[8,16,64]{2,1,0} maximum(%h, %h)
  %y = f32[8,16,64]{2,1,0} dot(%r, %w2), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  %ar = f32[8,16,64]{2,1,0} all-reduce(%y), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %ys = f32[8,16,16]{2,1,0} slice(%ar), slice={[0:8], [0:16], [0:16]}
  %ss = f32[8,16,16]{2,1,0} broadcast(%s), dimensions={2}
  %n = f32[8,16,16]{2,1,0} multiply(%ys, %ss)
  %ag = f32[8,16,64]{2,1,0} all-gather(%n), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={2}, use_global_device_ids=true
  ROOT %o = f32[8,16,64]{2,1,0} dot(%ag, %w3), lhs_contracting_dims={2}, rhs_contracting_dims={0}
}

%add (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %s = f32[] add(%p, %q)
}
"""


def test_tensor_parallel_pairs_of_the_whole_batch_are_by_design(tmp_path):
    """A torch_xla tensor-parallel step of a 4-row batch on 4 devices was reported as the weights-only
    marking of pytorch/xla#6778 (seed 2026 tx0014d): its norm's gather looked like that report's."""
    assert analyze_dump(_probe(tmp_path, _TENSOR_PAIRS), select=["replicated-batch"]).findings == ()


def test_the_same_layers_gathered_between_are_the_weights_only_marking(tmp_path):
    # w1's output all-gathered before w2 (column-parallel everywhere, as all-dim-0 marks make): no pair
    text = _TENSOR_PAIRS.replace(
        "%r = f32[8,16,64]{2,1,0} maximum(%h, %h)",
        "%r = f32[8,16,64]{2,1,0} all-gather(%h), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={2}, "
        "use_global_device_ids=true")
    (finding,) = analyze_dump(_probe(tmp_path, text), select=["replicated-batch"]).findings
    assert "split over no mesh axis" in finding.message and finding.evidence["batch_axes"] == []
