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
