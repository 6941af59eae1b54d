"""The :class:`DataflowGraph` of one module and its networkx views (built by :mod:`.dataflow`)."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, overload

from hlo_doctor.hlo.ir import (
    HloModule,
    Instruction,
    Shape,
    Sharding,
    SourceLocation,
)

if TYPE_CHECKING:
    import networkx as nx

    from hlo_doctor.graph.dim_maps import DimMap, DimMaps
    from hlo_doctor.graph.dots import DotDims

from hlo_doctor.graph.dataflow_propagate import dataflow_order, set_bits
from hlo_doctor.graph.parameter_bits import ParameterBits

__all__ = ["NO_NODE", "PARAM_KINDS", "ROOT_KINDS", "DataflowGraph", "IdRows", "NodeInfo", "NodeKey", "NodeKeys"]


NodeKey = tuple[str, str]  # (computation name, instruction name)
NO_NODE = -1  # an operand name its computation does not define

# Cross-computation edges that carry a value into a callee's parameter.
PARAM_KINDS = frozenset(
    {"fusion_param", "while_init", "loop_carried", "call_param", "branch_param", "async_param"}
)
# ... and out of a callee's root into the caller.
ROOT_KINDS = frozenset({"fusion_root", "while_result", "call_root", "branch_root", "async_root"})


@lru_cache(maxsize=4096)
def _edge(kind: str, indices: tuple[int, ...] = ()) -> dict:
    """The attribute dict of an edge, one shared (read-only) dict per (kind, operand slots)."""
    return {"kind": kind, "indices": indices} if indices else {"kind": kind}


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


class IdRows:
    """Node id -> a row of node ids (operands, or users), kept as two flat int32 arrays
    (compressed rows): a module of millions of instructions costs 8 bytes an edge and 4 a
    node here, not a tuple or list object per node. A row comes out as a new tuple."""

    __slots__ = ("_flat", "_starts")

    def __init__(self, rows: Iterable[Sequence[int]]) -> None:
        flat = array("i")
        starts = array("i", [0])
        extend, append = flat.extend, starts.append
        for row in rows:
            if row:
                extend(row)
            append(len(flat))
        self._flat = flat
        self._starts = starts

    @classmethod
    def from_arrays(cls, flat: array[int], starts: array[int]) -> IdRows:
        """Rows already flattened: row ``i`` is ``flat[starts[i]:starts[i + 1]]``."""
        rows = cls(())
        rows._flat, rows._starts = flat, starts
        return rows

    def __len__(self) -> int:
        return len(self._starts) - 1

    @property
    def arrays(self) -> tuple[array[int], array[int]]:
        """The flat ids and the row starts (row ``i`` is ``flat[starts[i]:starts[i + 1]]``), for a
        loop over many rows that should not make a tuple per row."""
        return self._flat, self._starts

    def __getitem__(self, node: int) -> tuple[int, ...]:
        starts = self._starts
        if node < 0:
            node += len(starts) - 1
        start = starts[node]
        count = starts[node + 1] - start
        if count == 1:  # most rows are one or two ids: index them, no slice array in between
            return (self._flat[start],)
        if count == 2:
            flat = self._flat
            return (flat[start], flat[start + 1])
        return tuple(self._flat[start : start + count])

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        flat, starts = self._flat, self._starts
        for node in range(len(starts) - 1):
            yield tuple(flat[starts[node] : starts[node + 1]])


class NodeKeys(Sequence[NodeKey]):
    """Node id -> key, each key made when read (from the computation spans and the instruction's
    name): a list of them would be one tuple per node, kept as long as the graph."""

    __slots__ = ("_instruction_at", "_names", "_starts")

    def __init__(self, spans: list[tuple[int, str]], instruction_at: list[Instruction]) -> None:
        self._starts = [first for first, _ in spans]
        self._names = [name for _, name in spans]
        self._instruction_at = instruction_at

    def __len__(self) -> int:
        return len(self._instruction_at)

    @overload
    def __getitem__(self, node: int) -> NodeKey: ...

    @overload
    def __getitem__(self, node: slice) -> list[NodeKey]: ...

    def __getitem__(self, node: int | slice) -> NodeKey | list[NodeKey]:
        if isinstance(node, slice):
            return [self[i] for i in range(*node.indices(len(self)))]
        if node < 0:
            node += len(self)
        if not 0 <= node < len(self):
            raise IndexError(node)
        # The last span starting at or before the node: earlier spans of the same start are empty.
        return (self._names[bisect_right(self._starts, node) - 1], self._instruction_at[node].name)

    def __iter__(self) -> Iterator[NodeKey]:
        instruction_at = self._instruction_at
        ends = [*self._starts[1:], len(instruction_at)]
        for first, end, name in zip(self._starts, ends, self._names, strict=True):
            for instruction in instruction_at[first:end]:
                yield (name, instruction.name)


class DataflowGraph:
    """A module's dataflow graph and the queries rules ask of it (see the module docstring)."""

    def __init__(
        self,
        module: HloModule,
        spans: list[tuple[int, str]],
        instruction_at: list[Instruction],
        operand_ids: IdRows,
        user_ids: IdRows,
        calls_into: dict[int, list[tuple[int, str]]],
        calls_out_of: dict[int, list[tuple[int, str]]],
        ids: dict[str, dict[str, int]],
        dim_maps: DimMaps,
    ) -> None:
        self.module = module
        self._spans = spans
        self.instruction_at = instruction_at
        self.operand_ids = operand_ids
        self.user_ids = user_ids
        self.calls_into = calls_into
        self.calls_out_of = calls_out_of
        self._ids = ids
        self._params: ParameterBits | None = None
        self._dim_maps = dim_maps

    # ---- ids -----------------------------------------------------------
    @cached_property
    def keys(self) -> NodeKeys:
        """Node id -> key (each made when read)."""
        return NodeKeys(self._spans, self.instruction_at)

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
        return {name: range(first, end) for (first, name), end in zip(self._spans, self._span_ends, strict=False)}

    @cached_property
    def linked_ranges(self) -> list[range]:
        """The ids of the entry computation and of every computation that exchanges values with
        another (fusions, loop bodies, callees, branches, async wrappers), computation by
        computation. The others (reducers, comparators: ``to_apply`` of a reduce, an all-reduce
        or a sort) have no edge out of themselves, and nothing derives from their values."""
        entry = self.module.entry
        linked = {entry.name} if entry is not None else set()
        starts = [first for first, _ in self._spans]
        for node in (*self.calls_into, *self.calls_out_of):
            linked.add(self._spans[bisect_right(starts, node) - 1][1])
        return [self._ranges[name] for _, name in self._spans if name in linked]

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
            return list(self.user_ids[node])
        return [*self.user_ids[node], *(target for target, _ in extra)]

    @cached_property
    def ranks(self) -> array[int]:
        """Node id -> the rank of its value, -1 for a tuple (4 bytes a node: the propagations ask
        it of every operand they read, and a shape's ``rank`` is a property call)."""
        return array("i", [-1 if i.shape.element_type == "tuple" else len(i.shape.dims) for i in self.instruction_at])

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
        return isinstance(key, tuple) and len(key) == 2 and self.id_of(key) is not None

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
        # The rows themselves in the walk (a whole graph's worth of nodes): the same steps as
        # ``step``, without a list made per node. An operand row's NO_NODE is never followed.
        rows = self.user_ids if forward else self.operand_ids
        cross = self.calls_out_of if forward else self.calls_into
        seen: set[int] = {NO_NODE}
        stack = [node for start in starts for node in step(start)]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(rows[node])
                more = cross.get(node)
                if more:
                    stack.extend([target for target, _ in more])
        seen.discard(NO_NODE)
        return seen

    # ---- how ops move dims ------------------------------------------------
    def dim_map(self, node: int) -> DimMap | None:
        """Per operand of node ``node``, the output dim each of its dims goes to (-1: none); None
        for an op with no such map (see :mod:`hlo_doctor.graph.dim_maps`). Made once per node."""
        return self._dim_maps.of(self, node)

    def dot_dims(self, node: int) -> DotDims | None:
        """The operand dims' roles of the dot or convolution ``node`` (None: fewer than two
        operands, or dims that do not read); made once per node."""
        return self._dim_maps.dot_dims(self, node)

    # ---- entry parameters a value derives from ------------------------
    def entry_parameters(self, key: NodeKey) -> frozenset[int]:
        """Numbers of the entry parameters ``key``'s value derives from."""
        return frozenset(set_bits(self.parameter_bits(self._require(key))))

    def derives_from_parameter(self, key: NodeKey, number: int) -> bool:
        """Whether ``key``'s value depends on entry parameter ``number``."""
        return bool(self.parameter_bits(self._require(key)) >> number & 1)

    def parameter_bits(self, node: int) -> int:
        """Node ``node``'s entry parameters as a bitset (bit k: parameter k)."""
        if self._params is None:
            self._params = ParameterBits(len(self.instruction_at))
        return self._params.of(self, node)


@dataclass(frozen=True, slots=True)
class _Arrays:
    """What the key-level views read: the graph's lists, without the graph."""

    keys: NodeKeys
    ids: dict[str, dict[str, int]]
    instruction_at: list[Instruction]
    operand_ids: IdRows
    user_ids: IdRows
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
