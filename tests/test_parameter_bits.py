"""Entry-parameter bitsets solved from a node's ancestors alone equal the whole propagation's.

The modules written out here are hand-written HLO, each saying what it exercises; the fixtures
are real dumps, and the corpus test reads XLA's own test modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.dataflow_graph import DataflowGraph
from hlo_doctor.graph.parameter_bits import ParameterBits
from hlo_doctor.hlo import parse_module
from hlo_doctor.hlo.errors import ParseError
from tests.corpus import CORPUS, corpus_files
from tests.freeing import freed_without_the_collector

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# A weight reshaped on its way to a dot (a few acyclic ancestors), a loop whose body feeds back
# into its parameter (a cycle), a callee called twice in a chain (a cycle through call edges),
# and a reduce whose reducer exchanges no value with the program.
LOOP_AND_CALLS = """HloModule m

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (f32[4], f32[4])) -> (f32[4], f32[4]) {
  %p = (f32[4], f32[4]) parameter(0)
  %a = f32[4] get-tuple-element(%p), index=0
  %b = f32[4] get-tuple-element(%p), index=1
  %s = f32[4] add(%a, %b)
  ROOT %t = (f32[4], f32[4]) tuple(%s, %b)
}

%cond (p: (f32[4], f32[4])) -> pred[] {
  %p = (f32[4], f32[4]) parameter(0)
  ROOT %c = pred[] constant(true)
}

%twice (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%x)
}

ENTRY %e (w: f32[4,2], x: f32[4], y: f32[4], z: f32[4]) -> (f32[4], f32[2,4], f32[4], f32[]) {
  %w = f32[4,2] parameter(0)
  %x = f32[4] parameter(1)
  %y = f32[4] parameter(2)
  %z = f32[4] parameter(3)
  %wt = f32[2,4] transpose(%w), dimensions={1,0}
  %wc = f32[2,4] copy(%wt)
  %init = (f32[4], f32[4]) tuple(%x, %y)
  %loop = (f32[4], f32[4]) while(%init), body=%body, condition=%cond
  %out = f32[4] get-tuple-element(%loop), index=0
  %first = f32[4] call(%z), to_apply=%twice
  %second = f32[4] call(%first), to_apply=%twice
  %zero = f32[] constant(0)
  %total = f32[] reduce(%x, %zero), dimensions={0}, to_apply=%sum
  ROOT %r = (f32[4], f32[2,4], f32[4], f32[]) tuple(%out, %wc, %second, %total)
}
"""


def _whole(graph: DataflowGraph) -> list[int]:
    bits = ParameterBits(len(graph))
    bits._propagate_all(graph)
    return [bits.of(graph, node) for node in range(len(graph))]


def _each_alone(graph: DataflowGraph, nodes) -> tuple[list[int], int]:
    """Each node's bits from a fresh solver, and how many came from their ancestors alone."""
    found, alone = [], 0
    for node in nodes:
        bits = ParameterBits(len(graph))
        found.append(bits.of(graph, node))
        alone += not bits._complete
    return found, alone


def test_ancestors_alone_where_they_are_few_and_acyclic_the_whole_propagation_elsewhere() -> None:
    graph = build_graph(parse_module(LOOP_AND_CALLS))
    entry = graph.module.entry.name
    whole = _whole(graph)

    def alone(name: str, computation: str = entry) -> tuple[int, bool]:
        bits = ParameterBits(len(graph))
        node = graph.id_of((computation, name))
        return bits.of(graph, node), not bits._complete

    assert alone("wc") == (0b0001, True)  # the weight, transposed and copied
    assert alone("out") == (whole[graph.id_of((entry, "out"))], False)  # through the loop: a cycle
    assert alone("out")[0] == 0b0110
    assert alone("second") == (whole[graph.id_of((entry, "second"))], False)  # the callee's two calls
    assert alone("second")[0] == 0b1000
    assert alone("r") == (0b1111, False)
    assert alone("total") == (0b0010, True)


def test_the_whole_propagation_leaves_out_computations_that_exchange_no_value() -> None:
    graph = build_graph(parse_module(LOOP_AND_CALLS))
    linked = {graph.keys[r.start][0] for r in graph.linked_ranges}
    assert linked == {"body", "cond", "twice", graph.module.entry.name}  # not the reducer
    bits = ParameterBits(len(graph))
    bits._propagate_all(graph)
    assert [bits.of(graph, graph.id_of(("sum", name))) for name in "abs"] == [0, 0, 0]


def test_many_questions_get_the_whole_propagation() -> None:
    graph = build_graph(load_dump(FIXTURES / "train-step/jax-shardy-healthy").modules[0].partitioned().module())
    bits = ParameterBits(len(graph))
    whole = _whole(graph)
    answers = [bits.of(graph, node) for node in range(len(graph))]
    assert answers == whole
    assert bits._complete


@pytest.mark.parametrize("fixture", ["train-step/jax-shardy-healthy", "llama-scan/jax-shardy-healthy",
                                     "hf-fsdpv2-torch-xla/torch_xla-bad", "tpu-v4-llama/jax-v4_4x4x8-bad"])
def test_fixture_nodes_alone_agree_with_the_whole_propagation(fixture: str) -> None:
    module = load_dump(FIXTURES / fixture).modules[0]
    for snapshot in (module.after_propagation(), module.partitioned()):
        graph = build_graph(snapshot.module())
        whole = _whole(graph)
        nodes = range(0, len(graph), 3)
        found, alone = _each_alone(graph, nodes)
        assert found == [whole[node] for node in nodes]
        assert alone  # some were solved from their ancestors


def test_the_solver_keeps_no_reference_to_its_graph() -> None:
    """A graph that has answered is freed at once, without the cyclic collector."""
    graph = build_graph(parse_module(LOOP_AND_CALLS))
    entry = graph.module.entry.name
    graph.parameter_bits(graph.id_of((entry, "wc")))
    graph.dim_map(graph.id_of((entry, "wt")))
    only = [graph]
    del graph
    assert freed_without_the_collector(only)


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/xla-hlo is absent")
def test_corpus_nodes_alone_agree_with_the_whole_propagation() -> None:
    """Every node of every valid corpus module (loops, calls, conditionals, async pairs)."""
    disagree, alone, modules = [], 0, 0
    for path in corpus_files("valid"):
        try:
            graph = build_graph(parse_module(path.read_text(), path=str(path)))
            whole = _whole(graph)
        except (ParseError, RecursionError):
            continue
        modules += 1
        found, solved = _each_alone(graph, range(len(graph)))
        alone += solved
        if found != whole:
            disagree.append(path.name)
    assert modules > 1000
    assert not disagree, disagree[:10]
    assert alone > 10_000
