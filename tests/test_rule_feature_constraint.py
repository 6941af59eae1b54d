"""non-batch-dim-sharding on the program's own constraint that splits an activation's features over the
batch axes (torch_xla's mark on a layer's output, which propagation turns into a reshard, not a
feature-sharded matmul). Hand-written HLO probes (small modules written for these tests, not compiler
output): the propagated module, also standing for the partitioned one."""

from __future__ import annotations

import pytest

from hlo_doctor.analysis import analyze_dump
from tests.conftest import probe_dump

# x is split over the 4 devices; h = x @ w arrives batch-sharded at torch_xla's two copies of a mark
# (the value's sharding, then the mark's), and y = tanh(c) @ w2 contracts c's dim 1.
_MARKED = """\
HloModule probe_feature_mark, num_partitions=4

ENTRY %main (x: f32[8,16], w: f32[16,32], w2: f32[32,16]) -> f32[8,16] {
  %x = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
  %w = f32[16,32]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w"}
  %w2 = f32[32,16]{1,0} parameter(2), sharding={devices=[4,1]<=[4]}, metadata={op_name="w2"}
  %h = f32[8,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
  %kept = f32[8,32]{1,0} copy(%h), sharding={devices=[4,1]<=[4]}, metadata={op_type="xla__custom_sharding" op_name="mlp/xla__custom_sharding"}
  %c = f32[8,32]{1,0} copy(%kept), sharding=SHARDING, metadata={op_type="xla__custom_sharding" op_name="mlp/xla__custom_sharding"}
  %g = f32[8,32]{1,0} tanh(%c), sharding=SHARDING
  ROOT %y = f32[8,16]{1,0} dot(%g, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
}
"""


def test_a_mark_that_splits_the_features_over_the_batch_axis_is_found_there(tmp_path):
    (finding,) = analyze_dump(probe_dump(tmp_path, _MARKED.replace("SHARDING", "{devices=[1,4]<=[4]}")),
                              select=["non-batch-dim-sharding"]).findings
    assert finding.instruction == "c"
    evidence = finding.evidence
    assert (evidence["batch_dim"], evidence["sharded_dims"], evidence["input"], evidence["input_batch_shards"]) == (
        0, [1], "kept", 4)
    assert "leaves its batch dimension 0 unsplit" in finding.message
    # the fix: the batch dim on the batch input's axis, the features whole
    assert "P(<axis 0>, None)" in finding.suggestion.jax


@pytest.mark.parametrize("sharding", [
    "{devices=[4,1]<=[4]}",  # the mark keeps the batch split: nothing lost
    "{replicated}",  # replicated, no feature split: the batch regrouped (replicated-batch's concern)
])
def test_a_mark_that_keeps_the_batch_or_splits_no_feature_is_not_this(tmp_path, sharding):
    assert analyze_dump(probe_dump(tmp_path, _MARKED.replace("SHARDING", sharding)),
                        select=["non-batch-dim-sharding"]).findings == ()


def test_features_split_over_a_tensor_axis_are_tensor_parallelism(tmp_path):
    # a 2x2 mesh: the batch on axis 0, the mark's features on axis 1 (not an axis the batch is split over)
    text = _MARKED.replace("{devices=[4,1]<=[4]}", "{devices=[2,1,2]<=[4] last_tile_dim_replicate}").replace(
        "SHARDING", "{devices=[2,2]<=[4]}")
    assert analyze_dump(probe_dump(tmp_path, text), select=["non-batch-dim-sharding"]).findings == ()


def test_a_sequence_split_over_the_batch_axis_is_not_a_feature_split(tmp_path):
    # [B, S, D] marked with S (no dim of a weight) on the batch axis: a layout conflict, not features
    text = """\
HloModule probe_sequence_mark, num_partitions=4

ENTRY %main (x: f32[8,4,16], w: f32[16,32]) -> f32[8,4,32] {
  %x = f32[8,4,16]{2,1,0} parameter(0), sharding={devices=[4,1,1]<=[4]}, metadata={op_name="x"}
  %w = f32[16,32]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w"}
  %kept = f32[8,4,16]{2,1,0} copy(%x), sharding={devices=[4,1,1]<=[4]}, metadata={op_type="xla__custom_sharding" op_name="xla__custom_sharding"}
  %c = f32[8,4,16]{2,1,0} copy(%kept), sharding={devices=[1,4,1]<=[4]}, metadata={op_type="xla__custom_sharding" op_name="xla__custom_sharding"}
  ROOT %y = f32[8,4,32]{2,1,0} dot(%c, %w), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[4,1,1]<=[4]}
}
"""
    assert analyze_dump(probe_dump(tmp_path, text), select=["non-batch-dim-sharding"]).findings == ()


# A matmul whose batch dim is whole and whose sequence dim is split over the batch's axis, after the
# program's own constraint that asks for that layout (the link of a chain such as
# P(None, 'data', None) on [B, S, D]): propagation carried the program's layout there, not a choice of
# the partitioner's. SEQUENCE_MARK is the constraint on h (JAX's sharding custom-call); without it the
# matmul's layout is the partitioner's, and the dot is judged.
_SEQUENCE_LAYOUT = """\
HloModule probe_sequence_layout, num_partitions=4

ENTRY %main (x: f32[8,4,16], w: f32[16,32], w2: f32[32,16]) -> f32[8,4,16] {
  %x = f32[8,4,16]{2,1,0} parameter(0), sharding={devices=[4,1,1]<=[4]}, metadata={op_name="x"}
  %w = f32[16,32]{1,0} parameter(1), sharding={replicated}, metadata={op_name="w"}
  %w2 = f32[32,16]{1,0} parameter(2), sharding={replicated}, metadata={op_name="w2"}
  %h = f32[8,4,32]{2,1,0} dot(%x, %w), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,4,1]<=[4]}
  %t = f32[8,4,32]{2,1,0} tanh(%h), sharding={devices=[1,4,1]<=[4]}
SEQUENCE_MARK
  ROOT %y = f32[8,4,16]{2,1,0} dot(%c, %w2), lhs_contracting_dims={2}, rhs_contracting_dims={0}, sharding={devices=[1,4,1]<=[4]}
}
"""
_MARK = ('  %c = f32[8,4,32]{2,1,0} custom-call(%t), custom_call_target="Sharding", '
         'sharding={devices=[1,4,1]<=[4]}, metadata={op_name="jit(step)/sharding_constraint"}')
_NO_MARK = '  %c = f32[8,4,32]{2,1,0} negate(%t), sharding={devices=[1,4,1]<=[4]}'


def test_a_sequence_split_the_program_asks_for_is_not_judged_at_its_matmuls(tmp_path):
    found = analyze_dump(probe_dump(tmp_path, _SEQUENCE_LAYOUT.replace("SEQUENCE_MARK", _MARK)),
                         select=["non-batch-dim-sharding"]).findings
    assert found == ()


def test_the_same_sequence_split_without_a_constraint_is_the_partitioners(tmp_path):
    (finding,) = analyze_dump(probe_dump(tmp_path, _SEQUENCE_LAYOUT.replace("SEQUENCE_MARK", _NO_MARK)),
                              select=["non-batch-dim-sharding"]).findings
    assert finding.instruction == "h"
    assert (finding.evidence["batch_dim"], finding.evidence["sharded_dims"]) == (0, [1])
