"""The dataflow graph of one HLO module (one pass snapshot).

:func:`build_graph` turns an :class:`~hlo_doctor.hlo.ir.HloModule` into a
:class:`DataflowGraph`: a ``networkx.DiGraph`` (``.nx``) whose nodes are the
module's instructions, keyed ``(computation name, instruction name)``, and
whose edges run from a value to each place that reads it. Every edge has a
``kind``:

``operand``
    producer -> user in the same computation (``indices``: the operand slots).
``fusion_param`` / ``fusion_root``
    fusion operand ``i`` -> fused parameter ``i``; fused root -> fusion.
``while_init`` / ``loop_carried`` / ``while_result``
    while operand -> body and condition parameter; body root -> body and
    condition parameter (the back edge of the loop); body root -> while.
``call_param`` / ``call_root``
    call operand ``i`` -> callee parameter ``i``; callee root -> call.
``branch_param`` / ``branch_root``
    conditional operand ``i + 1`` -> parameter of branch ``i``; branch root ->
    conditional.
``async_param`` / ``async_root``
    async-start operand ``i`` -> wrapped parameter ``i``; wrapped root ->
    async-done.

Reducers (``to_apply`` of reduce, all-reduce, scatter, sort, map ...) get no
cross-computation edges: they combine scalars and carry no sharding.

**Representation.** Building must stay a small fraction of the parse time,
and the analyses that walk every node must be cheap, so the graph is held
as flat lists over node *ids*: the nodes numbered ``0 .. n-1`` in program
order (computations in module order, instructions in order).
``operand_ids[i]`` (a tuple; the rows are kept as int32 arrays, see
:class:`~hlo_doctor.graph.dataflow_graph.IdRows`) are node ``i``'s operands in operand order (``-1`` for a
name the computation does not define), ``user_ids[i]`` the nodes that read
it as an operand, and ``calls_into`` / ``calls_out_of`` the
cross-computation edges with their kind. ``keys[i]`` and
``instruction_at[i]`` give the node's key and instruction; :meth:`DataflowGraph.id_of`
maps back. Analyses index plain lists by id instead of hashing key tuples.

The key-level views are made on demand and cached per node:
``DataflowGraph.pred`` / ``.succ`` (networkx's adjacency layout,
``{node: {neighbour: edge data}}``) and the networkx graph ``.nx``, a
read-only ``networkx.DiGraph`` over those views whose node attribute dicts
(``instruction``, ``computation``, ``shape``) are made when first read.
Sharding, source location and the ``file:line`` in the snapshot are read
through :meth:`DataflowGraph.info`. Edge attribute dicts are shared between
edges of the same kind and slots: treat the graph as read-only.

Which entry parameters a value derives from (:meth:`DataflowGraph.entry_parameters`)
is computed once, on first use, by propagating bitsets to a fixpoint (so
while loops, whose back edges make cycles, are handled); tuples keep one set
per element so a loop's weights and activations stay apart.
"""

from __future__ import annotations

from array import array
from itertools import repeat
from typing import TYPE_CHECKING

from hlo_doctor._gc import paused_gc
from hlo_doctor.hlo.ir import (
    HloModule,
    Instruction,
)

if TYPE_CHECKING:
    pass

from hlo_doctor.graph.dataflow_graph import (
    NO_NODE,
    PARAM_KINDS,
    ROOT_KINDS,
    DataflowGraph,
    IdRows,
    NodeInfo,
    NodeKey,
)
from hlo_doctor.graph.dataflow_propagate import _CALLERS, bitset_interner, dataflow_order, propagate_forward, set_bits
from hlo_doctor.graph.dim_maps import DimMaps

__all__ = [
    "NO_NODE",
    "PARAM_KINDS",
    "ROOT_KINDS",
    "DataflowGraph",
    "NodeInfo",
    "NodeKey",
    "bitset_interner",
    "build_graph",
    "dataflow_order",
    "propagate_forward",
    "set_bits",
]


def build_graph(module: HloModule) -> DataflowGraph:
    """Build the dataflow graph of ``module`` (see the module docstring)."""
    with paused_gc():  # see hlo_doctor._gc
        return _build(module)


def _build(module: HloModule) -> DataflowGraph:
    instruction_at: list[Instruction] = []
    spans: list[tuple[int, str]] = []  # (first id, computation name)
    ids: dict[str, dict[str, int]] = {}
    operand_flat = array("i")  # compressed rows: node i's operands are operand_flat[starts[i]:starts[i + 1]]
    operand_starts = array("i", [0])
    extend, append = operand_flat.extend, operand_starts.append
    no_node = repeat(NO_NODE)
    for computation in module.computations:
        first = len(instruction_at)
        spans.append((first, computation.name))
        instructions = computation.instructions
        instruction_at.extend(instructions)
        local = ids[computation.name] = {i.name: first + n for n, i in enumerate(instructions)}
        # Operand edges. Names resolve within the computation, whatever the
        # order of definition (XLA prints definitions first, but need not).
        get = local.get
        for instruction in instructions:
            operands = instruction.operands
            if operands:
                extend(map(get, operands, no_node))  # get(o, NO_NODE) for each, in C
            append(len(operand_flat))
    user_lists: list[list[int]] = [[] for _ in instruction_at]
    begin = 0
    for node, end in enumerate(operand_starts[1:]):
        for source in operand_flat[begin:end]:
            if source != NO_NODE:
                users = user_lists[source]
                if not users or users[-1] != node:
                    users.append(node)
        begin = end
    operand_ids = IdRows.from_arrays(operand_flat, operand_starts)
    user_ids = IdRows(user_lists)
    del user_lists

    # Cross-computation edges.
    calls_into: dict[int, list[tuple[int, str]]] = {}
    calls_out_of: dict[int, list[tuple[int, str]]] = {}
    computations = {c.name: c for c in module.computations}
    roots: dict[str, Instruction | None] = {}
    params: dict[str, list[Instruction]] = {}

    def add(u: NodeKey, v: NodeKey, kind: str) -> None:
        source, target = _id(ids, u), _id(ids, v)
        if source is None or target is None:
            return
        into = calls_into.setdefault(target, [])
        if (source, kind) not in into:
            into.append((source, kind))
            calls_out_of.setdefault(source, []).append((target, kind))

    def root_of(name: str) -> Instruction | None:
        if name not in roots:
            computation = computations.get(name)
            roots[name] = computation.root if computation else None
        return roots[name]

    def params_of(name: str) -> list[Instruction]:
        if name not in params:
            computation = computations.get(name)
            params[name] = computation.parameters() if computation else []
        return params[name]

    for computation in module.computations:
        cname = computation.name
        for instruction in computation.instructions:
            if instruction.opcode in _CALLERS:
                _link_called(cname, instruction, add, root_of, params_of)
    return DataflowGraph(module, spans, instruction_at, operand_ids, user_ids, calls_into, calls_out_of, ids,
                         DimMaps())


def _id(ids: dict[str, dict[str, int]], key: NodeKey) -> int | None:
    local = ids.get(key[0])
    return local.get(key[1]) if local is not None else None


def _link_called(cname, instruction: Instruction, add, root_of, params_of) -> None:
    key = (cname, instruction.name)
    opcode = instruction.opcode
    operands = instruction.operands
    if opcode == "while":
        body = instruction.attribute("body")
        condition = instruction.attribute("condition")
        body = body.lstrip("%") if body else None
        condition = condition.lstrip("%") if condition else None
        body_root = root_of(body) if body else None
        for callee in (body, condition):
            if callee is None:
                continue
            for param in params_of(callee)[:1]:
                target = (callee, param.name)
                if operands:
                    add((cname, operands[0]), target, "while_init")
                if body_root is not None:
                    add((body, body_root.name), target, "loop_carried")
        if body_root is not None:
            add((body, body_root.name), key, "while_result")
        return
    called = instruction.called_computations
    if opcode == "conditional":
        for branch_index, callee in enumerate(called):
            for param in params_of(callee)[:1]:
                if branch_index + 1 < len(operands):
                    add((cname, operands[branch_index + 1]), (callee, param.name), "branch_param")
            root = root_of(callee)
            if root is not None:
                add((callee, root.name), key, "branch_root")
        return
    if opcode in ("async-update",):
        return  # the chain continues through operand edges
    kind = {"fusion": "fusion", "call": "call"}.get(opcode, "async")
    for callee in called[:1]:
        if opcode != "async-done":
            for param in params_of(callee):
                number = param.parameter_number or 0
                if number < len(operands):
                    add((cname, operands[number]), (callee, param.name), kind + "_param")
        if opcode != "async-start":
            root = root_of(callee)
            if root is not None:
                add((callee, root.name), key, kind + "_root")
