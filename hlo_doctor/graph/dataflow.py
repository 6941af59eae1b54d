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
``operand_ids[i]`` are node ``i``'s operands in operand order (``-1`` for a
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

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from hlo_doctor._gc import paused_gc
from hlo_doctor.hlo.ir import (
    Computation,
    HloModule,
    Instruction,
    Shape,
    Sharding,
    SourceLocation,
)

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["NO_NODE", "DataflowGraph", "NodeInfo", "NodeKey", "build_graph", "propagate_forward"]

NodeKey = tuple[str, str]  # (computation name, instruction name)
NO_NODE = -1  # an operand name its computation does not define

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

# Tuple-shaped ops whose result element i is computed from operand i alone.
_ELEMENTWISE_TUPLE = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"})


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
    """A module's dataflow graph and the queries rules ask of it (see the module docstring)."""

    def __init__(
        self,
        module: HloModule,
        spans: list[tuple[int, str]],
        instruction_at: list[Instruction],
        operand_ids: list[tuple[int, ...]],
        user_ids: list[list[int]],
        calls_into: dict[int, list[tuple[int, str]]],
        calls_out_of: dict[int, list[tuple[int, str]]],
        ids: dict[str, dict[str, int]],
    ) -> None:
        self.module = module
        self._spans = spans
        self.instruction_at = instruction_at
        self.operand_ids = operand_ids
        self.user_ids = user_ids
        self.calls_into = calls_into
        self.calls_out_of = calls_out_of
        self._ids = ids
        self._params: list | None = None

    # ---- ids -----------------------------------------------------------
    @cached_property
    def keys(self) -> list[NodeKey]:
        """Node id -> key (made on first use)."""
        keys: list[NodeKey] = []
        instruction_at = self.instruction_at
        for (first, name), end in zip(self._spans, self._span_ends):
            keys.extend([(name, instruction.name) for instruction in instruction_at[first:end]])
        return keys

    def id_of(self, key: NodeKey) -> int | None:
        """The node id of ``key``, or None."""
        local = self._ids.get(key[0])
        return local.get(key[1]) if local is not None else None

    def computation_range(self, computation: str) -> range:
        """The ids of one computation's instructions (empty when unknown)."""
        return self._ranges.get(computation, range(0))

    @cached_property
    def _span_ends(self) -> list[int]:
        return [first for first, _ in self._spans[1:]] + [len(self.instruction_at)]

    @cached_property
    def _ranges(self) -> dict[str, range]:
        return {name: range(first, end) for (first, name), end in zip(self._spans, self._span_ends)}

    def computation_ids(self, computation: str) -> dict[str, int]:
        """Instruction name -> node id, for one computation (empty when unknown)."""
        return self._ids.get(computation, {})

    def sources_of(self, node: int) -> list[int]:
        """Ids of what node ``node`` reads: its operands, then cross-computation sources."""
        found = [o for o in self.operand_ids[node] if o != NO_NODE]
        extra = self.calls_into.get(node)
        if extra:
            found.extend(source for source, _ in extra)
        return found

    def targets_of(self, node: int) -> list[int]:
        """Ids of where node ``node``'s value goes: its users, then cross-computation targets."""
        extra = self.calls_out_of.get(node)
        if not extra:
            return self.user_ids[node]
        return self.user_ids[node] + [target for target, _ in extra]

    @cached_property
    def dataflow_order(self) -> list[int]:
        """Node ids in dataflow order (see :func:`dataflow_order`), made once."""
        return dataflow_order(self)

    @cached_property
    def dataflow_position(self) -> list[int]:
        """Node id -> its index in :attr:`dataflow_order`."""
        position = [0] * len(self.instruction_at)
        for index, node in enumerate(self.dataflow_order):
            position[node] = index
        return position

    # ---- key-level views -------------------------------------------------
    # The views hold the graph's lists (_Arrays), never the graph itself: a
    # view cached on the graph that pointed back at it would make a reference
    # cycle, and the whole module would then wait for the cyclic collector.
    @cached_property
    def _arrays(self) -> _Arrays:
        return _Arrays(self.keys, self._ids, self.instruction_at, self.operand_ids, self.user_ids,
                       self.calls_into, self.calls_out_of)

    @cached_property
    def pred(self) -> Mapping[NodeKey, dict[NodeKey, dict]]:
        """node -> {the node it reads: edge data}, made per node on first use."""
        return _PerNode(self._arrays, _incoming)

    @cached_property
    def succ(self) -> Mapping[NodeKey, dict[NodeKey, dict]]:
        """node -> {the node reading it: edge data}, made per node on first use."""
        return _PerNode(self._arrays, _outgoing)

    @cached_property
    def nx(self) -> nx.DiGraph:
        """The graph as a read-only ``networkx.DiGraph`` over the on-demand views."""
        import networkx  # imported on first use: most analyses never need it

        graph = networkx.DiGraph(module=self.module.name, path=self.module.path)
        graph._node = _PerNode(self._arrays, _attributes)
        graph._adj = graph._succ = self.succ
        graph._pred = self.pred
        return graph

    # ---- lookups -------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.id_of(key) is not None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.instruction_at)

    def __iter__(self) -> Iterator[NodeKey]:
        return iter(self.keys)

    def instruction(self, key: NodeKey) -> Instruction:
        node = self.id_of(key)
        if node is None:
            raise KeyError(key)
        return self.instruction_at[node]

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
            return [key] if key in self else []
        return [
            (c.name, name) for c in self.module.computations if c.get(name) is not None
        ]

    def entry_key(self, name: str) -> NodeKey:
        entry = self.module.entry
        assert entry is not None
        return (entry.name, name.lstrip("%"))

    def _require(self, key: NodeKey) -> int:
        node = self.id_of(key)
        if node is None:
            raise KeyError(key)
        return node

    # ---- neighbours ----------------------------------------------------
    def producers(self, key: NodeKey) -> list[tuple[NodeKey, str]]:
        """The values ``key`` reads, with the edge kind, across computations."""
        return [(p, data["kind"]) for p, data in self.pred[key].items()]

    def consumers(self, key: NodeKey) -> list[tuple[NodeKey, str]]:
        """Where ``key``'s value goes, with the edge kind, across computations."""
        return [(s, data["kind"]) for s, data in self.succ[key].items()]

    def upstream(self, key: NodeKey) -> set[NodeKey]:
        """Every node ``key`` transitively reads (not ``key`` itself unless in a loop)."""
        keys = self.keys
        return {keys[i] for i in self.reach_ids((self._require(key),), forward=False)}

    def downstream(self, key: NodeKey) -> set[NodeKey]:
        keys = self.keys
        return {keys[i] for i in self.reach_ids((self._require(key),), forward=True)}

    def downstream_of_any(self, keys: Iterable[NodeKey]) -> set[NodeKey]:
        """Everything reachable from any of ``keys`` (one walk, not one per key)."""
        names = self.keys
        return {names[i] for i in self.reach_ids([self._require(k) for k in keys], forward=True)}

    def reach_ids(self, starts: Iterable[int], *, forward: bool) -> set[int]:
        """Ids reachable (one or more steps) from any of ``starts``, along or against the edges."""
        step = self.targets_of if forward else self.sources_of
        seen: set[int] = set()
        stack = [node for start in starts for node in step(start)]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(step(node))
        return seen

    # ---- entry parameters a value derives from ------------------------
    def entry_parameters(self, key: NodeKey) -> frozenset[int]:
        """Numbers of the entry parameters ``key``'s value derives from."""
        return frozenset(_bits_to_indices(self.parameter_bits(self._require(key))))

    def derives_from_parameter(self, key: NodeKey, number: int) -> bool:
        """Whether ``key``'s value depends on entry parameter ``number``."""
        return bool(self.parameter_bits(self._require(key)) >> number & 1)

    def parameter_bits(self, node: int) -> int:
        """Node ``node``'s entry parameters as a bitset (bit k: parameter k)."""
        if self._params is None:
            self._params = _propagate_params(self)
        return _flatten(self._params[node])


@dataclass(frozen=True, slots=True)
class _Arrays:
    """What the key-level views read: the graph's lists, without the graph."""

    keys: list[NodeKey]
    ids: dict[str, dict[str, int]]
    instruction_at: list[Instruction]
    operand_ids: list[tuple[int, ...]]
    user_ids: list[list[int]]
    calls_into: dict[int, list[tuple[int, str]]]
    calls_out_of: dict[int, list[tuple[int, str]]]

    def id_of(self, key: object) -> int | None:
        if not isinstance(key, tuple) or len(key) != 2:
            return None
        local = self.ids.get(key[0])
        return local.get(key[1]) if local is not None else None


class _PerNode(Mapping):
    """A read-only mapping node key -> ``make(arrays, node id)``, made on first read and kept."""

    def __init__(self, arrays: _Arrays, make: Callable[[_Arrays, int], dict]) -> None:
        self._arrays = arrays
        self._make = make
        self._made: dict[NodeKey, dict] = {}

    def __getitem__(self, key: NodeKey) -> dict:
        made = self._made.get(key)
        if made is None:
            node = self._arrays.id_of(key)
            if node is None:
                raise KeyError(key)
            made = self._made[key] = self._make(self._arrays, node)
        return made

    def __contains__(self, key: object) -> bool:
        return self._arrays.id_of(key) is not None

    def __iter__(self) -> Iterator[NodeKey]:
        return iter(self._arrays.keys)

    def __len__(self) -> int:
        return len(self._arrays.instruction_at)


def _attributes(arrays: _Arrays, node: int) -> dict:
    """networkx's node attribute dict."""
    instruction = arrays.instruction_at[node]
    return {"instruction": instruction, "computation": arrays.keys[node][0], "shape": instruction.shape}


def _incoming(arrays: _Arrays, node: int) -> dict[NodeKey, dict]:
    """networkx's ``pred[key]``: each node ``node`` reads, with the edge data."""
    keys = arrays.keys
    slots: dict[int, tuple[int, ...]] = {}
    for slot, source in enumerate(arrays.operand_ids[node]):
        if source != NO_NODE:
            slots[source] = slots.get(source, ()) + (slot,)
    made = {keys[source]: _edge("operand", indices) for source, indices in slots.items()}
    for source, kind in arrays.calls_into.get(node, ()):
        made[keys[source]] = _edge(kind)
    return made


def _outgoing(arrays: _Arrays, node: int) -> dict[NodeKey, dict]:
    """networkx's ``succ[key]``: each node reading ``node``, with the edge data."""
    keys = arrays.keys
    made = {}
    for user in arrays.user_ids[node]:
        indices = tuple(slot for slot, source in enumerate(arrays.operand_ids[user]) if source == node)
        made[keys[user]] = _edge("operand", indices)
    for target, kind in arrays.calls_out_of.get(node, ()):
        made[keys[target]] = _edge(kind)
    return made


def build_graph(module: HloModule) -> DataflowGraph:
    """Build the dataflow graph of ``module`` (see the module docstring)."""
    with paused_gc():  # see hlo_doctor._gc
        return _build(module)


def _build(module: HloModule) -> DataflowGraph:
    instruction_at: list[Instruction] = []
    spans: list[tuple[int, str]] = []  # (first id, computation name)
    ids: dict[str, dict[str, int]] = {}
    operand_ids: list[tuple[int, ...]] = []
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
            count = len(operands)
            if count == 0:
                operand_ids.append(())
            elif count == 1:
                operand_ids.append((get(operands[0], NO_NODE),))
            elif count == 2:
                operand_ids.append((get(operands[0], NO_NODE), get(operands[1], NO_NODE)))
            else:
                operand_ids.append(tuple([get(o, NO_NODE) for o in operands]))
    user_ids: list[list[int]] = [[] for _ in instruction_at]
    for node, sources in enumerate(operand_ids):
        for source in sources:
            if source != NO_NODE:
                users = user_ids[source]
                if not users or users[-1] != node:
                    users.append(node)

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
    return DataflowGraph(module, spans, instruction_at, operand_ids, user_ids, calls_into, calls_out_of, ids)


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


def dataflow_order(graph: DataflowGraph) -> list[int]:
    """Node ids in dataflow order: a callee's body comes right before its first caller."""
    module = graph.module
    computations = {c.name: c for c in module.computations}
    order: list[int] = []
    done: set[str] = set()

    def visit(computation: Computation) -> None:
        done.add(computation.name)
        stack: list[tuple[Computation, int]] = [(computation, 0)]
        while stack:
            comp, index = stack.pop()
            instructions = comp.instructions
            local = graph.computation_ids(comp.name)
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
                    order.append(local[instruction.name])
                    index += 1
                    continue
                # A run of instructions that call nothing: in one step.
                end = index + 1
                while end < len(instructions) and instructions[end].opcode not in _CALLERS:
                    end += 1
                first = local[instruction.name]
                order.extend(range(first, first + end - index))
                index = end

    entry = module.entry
    if entry is not None:
        visit(entry)
    for computation in module.computations:
        if computation.name not in done:
            visit(computation)
    return order


def propagate_forward(
    graph: DataflowGraph, compute: Callable[[int], object], values: list, start: Iterable[int] | None = None
) -> list[int]:
    """Fill ``values`` (a list by node id) forward through ``graph`` to a fixpoint.

    The nodes in ``start`` (every node when None), and every node that reads
    a value that changes, get ``values[node] = compute(node)``: once each, in
    dataflow order, after what they read. A value that reaches a node placed
    earlier (a loop's back edge, a callee called from several places) queues
    that node again, in dataflow order, until nothing changes: ``compute``
    must only ever grow values, so this ends. Returns the nodes computed, in
    the order they were (a node computed again appears again).
    """
    position = graph.dataflow_position
    targets_of = graph.targets_of
    count = len(graph.instruction_at)
    if start is None:
        dirty = bytearray(b"\x01") * count
    else:
        dirty = bytearray(count)
        for node in start:
            dirty[node] = 1
    computed: list[int] = []
    back: set[int] = set()
    for node in graph.dataflow_order:
        if not dirty[node]:
            continue
        new = compute(node)
        computed.append(node)
        if new != values[node]:
            values[node] = new
            here = position[node]
            for target in targets_of(node):
                if position[target] > here:
                    dirty[target] = 1
                else:
                    back.add(target)
    heap = [(position[node], node) for node in back]
    heapq.heapify(heap)
    while heap:
        _, node = heapq.heappop(heap)
        back.discard(node)
        new = compute(node)
        computed.append(node)
        if new != values[node]:
            values[node] = new
            for target in targets_of(node):
                if target not in back:
                    back.add(target)
                    heapq.heappush(heap, (position[target], target))
    return computed


def _propagate_params(graph: DataflowGraph) -> list:
    with paused_gc():
        return _propagate(graph)


def _propagate(graph: DataflowGraph) -> list:
    entry = graph.module.entry
    entry_name = entry.name if entry else None
    entry_ids = graph.computation_range(entry_name) if entry_name is not None else range(0)
    instruction_at = graph.instruction_at
    operand_ids = graph.operand_ids
    calls_into = graph.calls_into
    values: list = [0] * (len(instruction_at) + 1)  # the extra last slot is NO_NODE's: always 0

    def transfer(node: int):
        instruction: Instruction = instruction_at[node]
        opcode = instruction.opcode
        if opcode == "parameter" and node in entry_ids:
            return 1 << (instruction.parameter_number or 0)
        sources = operand_ids[node]
        if opcode == "tuple":
            return tuple(values[s] for s in sources)
        extra = calls_into.get(node)
        if opcode == "get-tuple-element":
            source_value = values[sources[0]] if sources else 0
            for source, _ in extra or ():
                source_value = _join(source_value, values[source])
            index_text = instruction.attribute("index")
            if isinstance(source_value, tuple) and index_text and index_text.isdigit():
                index = int(index_text)
                if index < len(source_value):
                    return source_value[index]
            return _flatten(source_value)
        if not instruction.shape.is_tuple:
            bits = 0
            for source in sources:
                value = values[source]
                bits |= value if value.__class__ is int else _flatten(value)
            for source, _ in extra or ():
                bits |= _flatten(values[source])
            return bits
        if opcode in _ELEMENTWISE_TUPLE and not extra and len(sources) == len(instruction.shape.tuple_shapes):
            # A combined collective: element i is operand i's.
            return tuple(_flatten(values[s]) for s in sources)
        value = 0
        for source in sources:
            value = _join(value, values[source])
        for source, _ in extra or ():
            value = _join(value, values[source])
        return value

    propagate_forward(graph, transfer, values)
    return values
