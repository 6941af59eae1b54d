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

Node data is kept small so that building stays cheap (a fraction of the
parse time): ``instruction``, ``computation`` and ``shape``. Sharding,
source location and the ``file:line`` in the snapshot are read through
:meth:`DataflowGraph.info` (computed on demand from the instruction).
Edge attribute dicts are shared between edges of the same kind and slots:
treat the graph as read-only.

Which entry parameters a value derives from (:meth:`DataflowGraph.entry_parameters`)
is computed once, on first use, by propagating bitsets to a fixpoint (so
while loops, whose back edges make cycles, are handled); tuples keep one set
per element so a loop's weights and activations stay apart.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import networkx as nx

from hlo_doctor.hlo.ir import (
    Computation,
    HloModule,
    Instruction,
    Shape,
    Sharding,
    SourceLocation,
)

__all__ = ["DataflowGraph", "NodeInfo", "NodeKey", "build_graph"]

NodeKey = tuple[str, str]  # (computation name, instruction name)

# Opcodes whose called computations exchange values with the caller.
_CALLERS = frozenset(
    {"fusion", "while", "call", "conditional", "async-start", "async-update", "async-done"}
)

# Cross-computation edges that carry a value into a callee's parameter.
PARAM_KINDS = frozenset(
    {"fusion_param", "while_init", "loop_carried", "call_param", "branch_param", "async_param"}
)
# ... and out of a callee's root into the caller.
ROOT_KINDS = frozenset({"fusion_root", "while_result", "call_root", "branch_root", "async_root"})

_EDGE_DATA: dict[tuple, dict] = {}


def _edge(kind: str, indices: tuple[int, ...] = ()) -> dict:
    key = (kind, indices)
    data = _EDGE_DATA.get(key)
    if data is None:
        data = {"kind": kind, "indices": indices} if indices else {"kind": kind}
        _EDGE_DATA[key] = data
    return data


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node carries, for display and rules."""

    key: NodeKey
    instruction: Instruction
    shape: Shape
    sharding: Sharding | None
    source: SourceLocation | None
    file: str | None  # the snapshot file
    line: int

    @property
    def location(self) -> str:
        return f"{self.file or '<text>'}:{self.line}"


class DataflowGraph:
    """A module's dataflow graph (``.nx``) and the queries rules ask of it."""

    def __init__(self, module: HloModule, graph: nx.DiGraph) -> None:
        self.module = module
        self.nx = graph
        self._params: dict[NodeKey, object] | None = None
        self._entry_param_index: dict[int, NodeKey] = {}

    # ---- lookups -------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self.nx

    def __len__(self) -> int:
        return self.nx.number_of_nodes()

    def instruction(self, key: NodeKey) -> Instruction:
        return self.nx.nodes[key]["instruction"]

    def info(self, key: NodeKey) -> NodeInfo:
        instruction = self.instruction(key)
        return NodeInfo(
            key,
            instruction,
            instruction.shape,
            instruction.sharding,
            instruction.source,
            self.module.path,
            instruction.position.line,
        )

    def find(self, name: str, computation: str | None = None) -> list[NodeKey]:
        """Nodes whose instruction is called ``name`` (``%`` optional)."""
        name = name.lstrip("%")
        if computation is not None:
            key = (computation, name)
            return [key] if key in self.nx else []
        return [
            (c.name, name) for c in self.module.computations if c.get(name) is not None
        ]

    def entry_key(self, name: str) -> NodeKey:
        entry = self.module.entry
        assert entry is not None
        return (entry.name, name.lstrip("%"))

    # ---- neighbours ----------------------------------------------------
    def producers(self, key: NodeKey) -> list[tuple[NodeKey, str]]:
        """The values ``key`` reads, with the edge kind, across computations."""
        return [(p, data["kind"]) for p, data in self.nx.pred[key].items()]

    def consumers(self, key: NodeKey) -> list[tuple[NodeKey, str]]:
        """Where ``key``'s value goes, with the edge kind, across computations."""
        return [(s, data["kind"]) for s, data in self.nx.succ[key].items()]

    def upstream(self, key: NodeKey) -> set[NodeKey]:
        """Every node ``key`` transitively reads (not ``key`` itself unless in a loop)."""
        return _reach(key, self.nx.pred)

    def downstream(self, key: NodeKey) -> set[NodeKey]:
        return _reach(key, self.nx.succ)

    def downstream_of_any(self, keys: Iterable[NodeKey]) -> set[NodeKey]:
        """Everything reachable from any of ``keys`` (one walk, not one per key)."""
        return _reach_all(keys, self.nx.succ)

    # ---- entry parameters a value derives from ------------------------
    def entry_parameters(self, key: NodeKey) -> frozenset[int]:
        """Numbers of the entry parameters ``key``'s value derives from."""
        if self._params is None:
            self._params = _propagate_params(self)
        return frozenset(_bits_to_indices(_flatten(self._params.get(key, 0))))

    def derives_from_parameter(self, key: NodeKey, number: int) -> bool:
        """Whether ``key``'s value depends on entry parameter ``number``."""
        if self._params is None:
            self._params = _propagate_params(self)
        return bool(_flatten(self._params.get(key, 0)) >> number & 1)


def _reach(start: NodeKey, adjacency) -> set[NodeKey]:
    return _reach_all((start,), adjacency)


def _reach_all(starts: Iterable[NodeKey], adjacency) -> set[NodeKey]:
    """Nodes reachable (one or more steps) from any of ``starts``."""
    seen: set[NodeKey] = set()
    stack = [node for start in starts for node in adjacency[start]]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(adjacency[node])
    return seen


def build_graph(module: HloModule) -> DataflowGraph:
    """Build the dataflow graph of ``module`` (see the module docstring)."""
    # The parsed module holds millions of objects: a cyclic GC pass over
    # them for every few hundred new dicts would cost more than the build.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(module)
    finally:
        if enabled:
            gc.enable()


def _build(module: HloModule) -> DataflowGraph:
    graph = nx.DiGraph(module=module.name, path=module.path)
    node_data = graph._node
    succ = graph._succ
    pred = graph._pred
    computations = {c.name: c for c in module.computations}
    roots: dict[str, Instruction | None] = {}
    params: dict[str, list[Instruction]] = {}

    # Nodes, and operand edges: written straight into networkx's adjacency
    # dicts (what add_edges_from does, without its per-edge overhead). HLO
    # text defines a value before its uses; an operand defined later (legal,
    # but XLA never prints it) is linked in a second pass.
    first_operand = _edge("operand", (0,))
    late: list[tuple[str, Instruction]] = []
    for computation in module.computations:
        cname = computation.name
        for instruction in computation.instructions:
            key = (cname, instruction.name)
            node_data[key] = {"instruction": instruction, "computation": cname, "shape": instruction.shape}
            succ[key] = {}
            operands = instruction.operands
            if not operands:
                pred[key] = {}
                continue
            if len(operands) == 1:
                source = (cname, operands[0])
                out = succ.get(source)
                if out is None:
                    pred[key] = {}
                    late.append((cname, instruction))
                else:
                    out[key] = first_operand
                    pred[key] = {source: first_operand}
                continue
            into = pred[key] = {}
            for index, operand in enumerate(operands):
                source = (cname, operand)
                out = succ.get(source)
                if out is None:
                    late.append((cname, instruction))
                    break
                data = into.get(source)
                data = _edge("operand", (index,) if data is None else data["indices"] + (index,))
                out[key] = data
                into[source] = data
    for cname, instruction in late:
        key = (cname, instruction.name)
        into = pred[key]
        into.clear()
        for index, operand in enumerate(instruction.operands):
            source = (cname, operand)
            if source in succ and source[0] == cname:
                data = into.get(source)
                data = _edge("operand", (index,) if data is None else data["indices"] + (index,))
                succ[source][key] = data
                into[source] = data

    def add(u: NodeKey, v: NodeKey, data: dict) -> None:
        if u in succ and v in pred:
            succ[u][v] = data
            pred[v][u] = data

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
            opcode = instruction.opcode
            if opcode not in _CALLERS:
                continue
            _link_called(cname, instruction, add, root_of, params_of)
    return DataflowGraph(module, graph)


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
                    add((cname, operands[0]), target, _edge("while_init"))
                if body_root is not None:
                    add((body, body_root.name), target, _edge("loop_carried"))
        if body_root is not None:
            add((body, body_root.name), key, _edge("while_result"))
        return
    called = instruction.called_computations
    if opcode == "conditional":
        for branch_index, callee in enumerate(called):
            for param in params_of(callee)[:1]:
                if branch_index + 1 < len(operands):
                    add((cname, operands[branch_index + 1]), (callee, param.name), _edge("branch_param"))
            root = root_of(callee)
            if root is not None:
                add((callee, root.name), key, _edge("branch_root"))
        return
    if opcode in ("async-update",):
        return  # the chain continues through operand edges
    kind = {"fusion": "fusion", "call": "call"}.get(opcode, "async")
    for callee in called[:1]:
        if opcode != "async-done":
            for param in params_of(callee):
                number = param.parameter_number or 0
                if number < len(operands):
                    add((cname, operands[number]), (callee, param.name), _edge(kind + "_param"))
        if opcode != "async-start":
            root = root_of(callee)
            if root is not None:
                add((callee, root.name), key, _edge(kind + "_root"))


# --------------------------------------------------------------------------
# Entry-parameter bitsets. A value is an int bitset, or a tuple of values
# (one per tuple element).


def _flatten(value) -> int:
    if isinstance(value, int):
        return value
    bits = 0
    for element in value:
        bits |= _flatten(element)
    return bits


def _join(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_join(x, y) for x, y in zip(a, b))
    if a == 0:
        return b
    if b == 0:
        return a
    return _flatten(a) | _flatten(b)


def _bits_to_indices(bits: int) -> Iterator[int]:
    index = 0
    while bits:
        if bits & 1:
            yield index
        bits >>= 1
        index += 1


def _order(graph: DataflowGraph) -> list[NodeKey]:
    """Instructions in dataflow order: a callee's body comes right before its caller."""
    module = graph.module
    computations = {c.name: c for c in module.computations}
    order: list[NodeKey] = []
    done: set[str] = set()

    def visit(computation: Computation) -> None:
        done.add(computation.name)
        stack: list[tuple[Computation, int]] = [(computation, 0)]
        while stack:
            comp, index = stack.pop()
            instructions = comp.instructions
            while index < len(instructions):
                instruction = instructions[index]
                if instruction.opcode in _CALLERS:
                    pending = [
                        computations[c]
                        for c in instruction.called_computations
                        if c in computations and c not in done
                    ]
                    if pending:
                        stack.append((comp, index))
                        for callee in reversed(pending):
                            done.add(callee.name)
                            stack.append((callee, 0))
                        break
                order.append((comp.name, instruction.name))
                index += 1

    entry = module.entry
    if entry is not None:
        visit(entry)
    for computation in module.computations:
        if computation.name not in done:
            visit(computation)
    return order


def _propagate_params(graph: DataflowGraph) -> dict[NodeKey, object]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _propagate(graph)
    finally:
        if enabled:
            gc.enable()


def _propagate(graph: DataflowGraph) -> dict[NodeKey, object]:
    entry = graph.module.entry
    entry_name = entry.name if entry else None
    pred = graph.nx.pred
    succ = graph.nx.succ
    nodes = graph.nx.nodes
    values: dict[NodeKey, object] = {}

    def transfer(key: NodeKey):
        instruction: Instruction = nodes[key]["instruction"]
        opcode = instruction.opcode
        if opcode == "parameter" and key[0] == entry_name:
            return 1 << (instruction.parameter_number or 0)
        incoming = pred[key]
        if opcode == "tuple":
            elements = [0] * len(instruction.operands)
            for source, data in incoming.items():
                for index in data.get("indices", ()):
                    elements[index] = values.get(source, 0)
            return tuple(elements)
        if opcode == "get-tuple-element":
            index_text = instruction.attribute("index")
            source_value = 0
            for source in incoming:
                source_value = _join(source_value, values.get(source, 0))
            if isinstance(source_value, tuple) and index_text and index_text.isdigit():
                index = int(index_text)
                if index < len(source_value):
                    return source_value[index]
            return _flatten(source_value)
        value = 0
        for source in incoming:
            value = _join(value, values.get(source, 0))
        if not instruction.shape.is_tuple:
            return _flatten(value)
        return value

    order = _order(graph)
    position = {key: i for i, key in enumerate(order)}
    for key in order:
        values[key] = transfer(key)
    # Back edges (loops, computations called from several sites): iterate to
    # the fixpoint; values only grow, so this ends.
    queue: deque[NodeKey] = deque()
    queued: set[NodeKey] = set()
    for key in order:
        here = position[key]
        for target in succ[key]:
            if position.get(target, here + 1) <= here and target not in queued:
                queue.append(target)
                queued.add(target)
    while queue:
        key = queue.popleft()
        queued.discard(key)
        new = transfer(key)
        if new != values.get(key):
            values[key] = new
            for target in succ[key]:
                if target not in queued:
                    queue.append(target)
                    queued.add(target)
    return values


def nodes_of(graph: DataflowGraph, computation: str) -> Iterable[NodeKey]:
    """The nodes of one computation, in program order."""
    comp = graph.module.computation(computation)
    return [] if comp is None else [(computation, i.name) for i in comp.instructions]
