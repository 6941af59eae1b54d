"""The update search's backward pass (semantics/gradients.py) never changes an answer.

``UpdateSearch.reaches_update`` answers a node outside the backward pass's set at once and walks
from the others. The set must hold every node the bounded walk succeeds from: checked here on
every node of real training steps (with windowed-einsum and pipeline loops, an opt-barrier,
torch_xla graphs that return their gradients), against the walk alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.semantics.roles import _Judge

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("folder", [
    "train-step/jax-shardy-healthy",
    "tpu-v4-llama/jax-v4_4x4x8-bad",
    "pipeline-gpipe/jax-shardy-healthy",
    "fsdp-gathered-weights/jax-h100_2x8-fixed",
    "fsdpv2-torch-xla/torch_xla-healthy",
    "hf-1d-params-torch-xla/torch_xla-bad",
])
def test_backward_pass_holds_every_node_the_walk_succeeds_from(folder):
    dump = load_dump(FIXTURES / folder)
    semantics = RuleContext(dump, dump.modules[0], AnalysisOptions()).semantics
    graph, params, batch = semantics.view.graph, semantics.parameters, semantics.batch
    assert graph is not None and params is not None and batch is not None and params.state
    search = _Judge(graph, params, batch).updates
    walked = {node: search._search_update(node) for node in range(len(graph.instruction_at))}
    assert any(walked.values()) and not all(walked.values())
    missed = [graph.keys[node] for node, found in walked.items() if found and not search._may_reach(node)]
    assert not missed
    assert all(search.reaches_update(node) == found for node, found in walked.items())


def _search_in(tmp_path: Path, text: str):  # noqa: ANN202
    """The graph and the update search of a hand-written step's partitioned module."""
    folder = tmp_path / "dump"
    folder.mkdir()
    (folder / "module_0000.jit_step.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt").write_text(text)
    dump = load_dump(folder)
    semantics = RuleContext(dump, dump.modules[0], AnalysisOptions()).semantics
    graph, params, batch = semantics.view.graph, semantics.parameters, semantics.batch
    assert graph is not None and params is not None and batch is not None and params.state
    return graph, _Judge(graph, params, batch).updates


# Hand-written: a weight's gradient g carried in a tuple inside a tuple on its way to the update
# (the backward pass's state nests tuples so: a loop's carry in a call's result). The walk enters
# the outer tuple from any element of the inner one, so the backward pass must take every element.
_NESTED = """\
HloModule jit_step, input_output_alias={ {0}: (0, {}, may-alias) }, num_partitions=2

ENTRY %main (w: f32[8,4], x: f32[2,8]) -> (f32[8,4]) {
  %w = f32[8,4]{1,0} parameter(0), sharding={replicated}, metadata={op_name="params['w']"}
  %x = f32[2,8]{1,0} parameter(1), sharding={devices=[2,1]<=[2]}, metadata={op_name="batch['x']"}
  %h = f32[2,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g = f32[8,4]{1,0} dot(%x, %h), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %inner = (f32[8,4]{1,0}) tuple(%g)
  %outer = ((f32[8,4]{1,0})) tuple(%inner)
  %gte.0 = (f32[8,4]{1,0}) get-tuple-element(%outer), index=0
  %gte.1 = f32[8,4]{1,0} get-tuple-element(%gte.0), index=0
  %new = f32[8,4]{1,0} subtract(%w, %gte.1)
  ROOT %out = (f32[8,4]{1,0}) tuple(%new)
}
"""


def test_a_gradient_in_nested_tuples_reaches_its_update(tmp_path):
    graph, search = _search_in(tmp_path, _NESTED)
    g = graph.id_of(("main", "g"))
    assert g is not None and search._search_update(g)  # the premise: the walk gets there
    assert search._may_reach(g) and search.reaches_update(g)


# Hand-written: a tied embedding's gradient as deviceless GPU and TPU compiles lower it. The head's
# weight gradient %g is the base a scatter(-add) adds the lookup's row gradients %rows onto, then the
# update; the gradient passes through the scatter's base, the scattered rows do not.
_SCATTERED = """\
HloModule jit_step, input_output_alias={ {0}: (0, {}, may-alias) }, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (w: f32[8,4], x: f32[2,8], i: s32[2,1]) -> (f32[8,4]) {
  %w = f32[8,4]{1,0} parameter(0), sharding={replicated}, metadata={op_name="params['w']"}
  %x = f32[2,8]{1,0} parameter(1), sharding={devices=[2,1]<=[2]}, metadata={op_name="batch['x']"}
  %i = s32[2,1]{1,0} parameter(2), sharding={devices=[2,1]<=[2]}, metadata={op_name="batch['i']"}
  %h = f32[2,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g = f32[8,4]{1,0} dot(%x, %h), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %rows = f32[2,4]{1,0} multiply(%h, %h)
  %sc = f32[8,4]{1,0} scatter(%g, %i, %rows), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
  %new = f32[8,4]{1,0} subtract(%w, %sc)
  ROOT %out = (f32[8,4]{1,0}) tuple(%new)
}
"""


def test_a_gradient_a_scatter_adds_rows_onto_reaches_its_update_and_the_rows_do_not(tmp_path):
    graph, search = _search_in(tmp_path, _SCATTERED)
    g, rows = graph.id_of(("main", "g")), graph.id_of(("main", "rows"))
    assert g is not None and rows is not None
    assert search._may_reach(g) and search.reaches_update(g)
    assert not search.reaches_update(rows)
