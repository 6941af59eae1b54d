"""Dataflow graph and dot roles on real fixtures."""

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.dots import dot_dims
from tests.freeing import freed_without_the_collector

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _graph(folder: str, role: str = "after_propagation"):
    module = load_dump(FIXTURES / folder).modules[0]
    return build_graph(getattr(module, role)().module())


def test_operand_edges_and_params():
    graph = _graph("fsdp-activation-gather/jax-shardy-bad")
    entry = graph.module.entry.name
    dot = (entry, "dot_general.0")
    assert sorted(graph.producers(dot)) == [((entry, "transpose.0"), "operand"), ((entry, "x.0"), "operand")]
    assert graph.consumers(dot) == [((entry, "add.3"), "operand")]
    assert graph.entry_parameters(dot) == {0, 1}
    assert graph.entry_parameters((entry, "add.3")) == {0, 1, 2}
    assert graph.derives_from_parameter((entry, "add.7"), 4)
    assert not graph.derives_from_parameter((entry, "transpose.1"), 0)


def test_while_loop_edges_llama_scan():
    graph = _graph("llama-scan/jax-shardy-healthy")
    whiles = [k for k in graph.nx if graph.instruction(k).opcode == "while"]
    assert whiles
    key = whiles[0]
    instruction = graph.instruction(key)
    body = instruction.attribute("body").lstrip("%")
    condition = instruction.attribute("condition").lstrip("%")
    body_comp = graph.module.computation(body)
    body_param = (body, body_comp.parameters()[0].name)
    body_root = (body, body_comp.root.name)
    cond_param = (condition, graph.module.computation(condition).parameters()[0].name)
    init = (key[0], instruction.operands[0])
    kinds = {(u, v): d["kind"] for u, v, d in graph.nx.edges(data=True)}
    assert kinds[(init, body_param)] == "while_init"
    assert kinds[(init, cond_param)] == "while_init"
    assert kinds[(body_root, body_param)] == "loop_carried"
    assert kinds[(body_root, cond_param)] == "loop_carried"
    assert kinds[(body_root, key)] == "while_result"
    # The loop's result derives from what went in (bitsets through the cycle).
    assert graph.entry_parameters(key) >= graph.entry_parameters(init) - {0}
    assert graph.entry_parameters(key)


def test_dot_roles():
    graph = _graph("fsdp-activation-gather/jax-shardy-bad")
    dot = graph.instruction(graph.entry_key("dot_general.0"))
    dims = dot_dims(dot, 2, 2)
    assert dims.lhs_contracting == (1,) and dims.rhs_contracting == (0,)
    assert dims.lhs_free == (0,) and dims.rhs_free == (1,)
    assert [r.role for r in dims.roles[0]] == ["free", "contracting"]
    assert dims.output_dim(0, 0) == 0 and dims.output_dim(1, 1) == 1
    assert dims.output_dim(1, 0) is None
    assert dims.operand_dims(1) == [(1, 1)]


def test_dot_roles_batch_and_convolution():
    from hlo_doctor.hlo import parse_module

    module = parse_module(
        "HloModule m\n\nENTRY e {\n"
        "  a = f32[2,3,4]{2,1,0} parameter(0)\n  b = f32[2,4,5]{2,1,0} parameter(1)\n"
        "  d = f32[2,3,5]{2,1,0} dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},"
        " lhs_contracting_dims={2}, rhs_contracting_dims={1}\n"
        "  i = f32[8,32,32,3]{3,2,1,0} parameter(2)\n  k = f32[3,3,3,16]{3,2,1,0} parameter(3)\n"
        "  ROOT c = f32[8,32,32,16]{3,2,1,0} convolution(i, k), window={size=3x3 pad=1_1x1_1},"
        " dim_labels=b01f_01io->b01f\n}\n"
    )
    entry = module.entry
    dims = dot_dims(entry.get("d"), 3, 3)
    assert [(r.role, r.output_dim) for r in dims.roles[0]] == [("batch", 0), ("free", 1), ("contracting", None)]
    assert [(r.role, r.output_dim) for r in dims.roles[1]] == [("batch", 0), ("contracting", None), ("free", 2)]
    conv = dot_dims(entry.get("c"), 4, 4)
    assert [(r.role, r.output_dim) for r in conv.roles[0]] == [
        ("batch", 0), ("spatial", 1), ("spatial", 2), ("contracting", None)]
    assert [(r.role, r.output_dim) for r in conv.roles[1]] == [
        ("window", None), ("window", None), ("contracting", None), ("free", 3)]
    with pytest.raises(ValueError):
        dot_dims(entry.get("a"), 3, 3)


def test_the_networkx_view_is_the_same_graph():
    """nx algorithms on the on-demand view agree with the id-level queries."""
    import networkx as nx

    module = load_dump(FIXTURES / "llama-scan" / "jax-shardy-healthy").modules[0].partitioned().module()
    graph = build_graph(module)
    view = graph.nx
    assert view.number_of_nodes() == len(graph) == sum(len(c.instructions) for c in module.computations)
    edges = sum(len(graph.sources_of(i)) - (len(graph.operand_ids[i]) - len(set(graph.operand_ids[i])))
                for i in range(len(graph)))
    assert view.number_of_edges() == edges
    entry = module.entry
    root = (entry.name, entry.root.name)
    assert nx.ancestors(view, root) == graph.upstream(root) - {root}
    first = (entry.name, entry.parameters()[0].name)
    assert nx.descendants(view, first) == graph.downstream(first) - {first}
    assert view.nodes[root]["instruction"] is entry.root
    for u, v, data in list(view.edges(data=True))[:500]:
        assert (u, data["kind"]) in graph.producers(v)


def test_the_graph_and_its_views_are_freed_without_the_cyclic_collector():
    """No reference cycle: a dropped graph (and its module) goes at once, not at the next GC pass."""
    module = load_dump(FIXTURES / "llama-scan" / "jax-shardy-healthy").modules[0].partitioned().module()
    graph = build_graph(module)
    entry = module.entry
    root = (entry.name, entry.root.name)
    assert graph.producers(root) and graph.nx.number_of_edges() and graph.succ[graph.producers(root)[0][0]]
    only = [graph]
    del graph
    assert freed_without_the_collector(only)
