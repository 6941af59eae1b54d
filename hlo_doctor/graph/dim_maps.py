"""Where each dim of an op's operand goes in its output: the dim maps dataflow analyses move
per-dim facts by (the batch dim of :mod:`hlo_doctor.semantics.batch_dims`).

A map has one entry per operand dim: the output dim it becomes, or -1 where it ends. Ops with
one mapped operand have one map: ``transpose`` (by the permutation), ``broadcast`` (by
``dimensions``), ``reduce`` (the kept dims), ``reshape`` and ``bitcast`` (a dim kept, merged
into one output dim, or split: then into its major piece, where a program's own fold put it; next
to an all-to-all, and for a bitcast, into its largest piece, which is how the partitioner's
all-to-all reshards read; a bitcast on the physical, major-to-minor dims; unit dims inserted or
dropped beside a fold, ``[B, S] -> [1, B * S]``, do not make it a regroup; a reshape that feeds an
all-to-all gives a dim cut into ``[devices, rows]`` to the rows, one row too). A dot or convolution
has one per operand: free and batch dims map to the output, contracting dims end.

:class:`DimMaps` keeps one graph's maps, each made once: every propagation over the graph
reads them, and a module repeats a few kinds of op, so the maps themselves are shared by what
determines them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from hlo_doctor.graph.dataflow_graph import NO_NODE
from hlo_doctor.graph.dots import DotDims, dot_dims
from hlo_doctor.hlo.ir import Shape

if TYPE_CHECKING:
    from hlo_doctor.graph.dataflow_graph import DataflowGraph

__all__ = ["DOTS", "MAPPED", "DimMap", "DimMaps", "dot_map", "reshape_pairs"]

DOTS = frozenset({"dot", "convolution"})
# Ops whose one array operand's dims move to output dims by a fixed map.
MAPPED = frozenset({"transpose", "broadcast", "reshape", "bitcast", "dynamic-reshape", "reduce"})

DimMap = tuple[tuple[int, ...], ...]  # per operand: each of its dims' output dim, -1 for none
Pairs = frozenset  # of (anything, dim)


class DimMaps:
    """One graph's dim maps by node, each made on first use (None: the op has none to give).

    The graph is passed to each call, not kept: the graph keeps this, and a reference back
    would be a cycle only the cyclic collector could free.
    """

    __slots__ = ("_dots", "_maps")

    def __init__(self) -> None:
        self._maps: dict[int, DimMap | None] = {}
        self._dots: dict[int, DotDims | None] = {}

    def of(self, graph: DataflowGraph, node: int) -> DimMap | None:
        try:
            return self._maps[node]
        except KeyError:
            found = self._maps[node] = _node_map(graph, node, self)
            return found

    def dot_dims(self, graph: DataflowGraph, node: int) -> DotDims | None:
        """The roles of a dot's or convolution's operand dims (:func:`~hlo_doctor.graph.dots.dot_dims`
        for the ranks of its first two operands); None when it has no two operands or its dims
        cannot be read."""
        try:
            return self._dots[node]
        except KeyError:
            found = self._dots[node] = _dot_dims_of(graph, node)
            return found


def _dot_dims_of(graph: DataflowGraph, node: int) -> DotDims | None:
    sources = graph.operand_ids[node]
    if len(sources) < 2 or NO_NODE in sources[:2]:
        return None
    at = graph.instruction_at
    try:
        return dot_dims(at[node], at[sources[0]].shape.rank, at[sources[1]].shape.rank)
    except (ValueError, IndexError, KeyError):
        return None


def _node_map(graph: DataflowGraph, node: int, maps: DimMaps) -> DimMap | None:
    """Per operand (one; two for a dot), where each of its dims goes in the output (-1: nowhere)."""
    instruction = graph.instruction_at[node]
    sources = graph.operand_ids[node]
    opcode = instruction.opcode
    if not sources or NO_NODE in sources[:2]:
        return None
    operand = graph.instruction_at[sources[0]].shape
    if operand.is_tuple:
        return None
    rank = operand.rank
    if opcode in DOTS:
        roles = maps.dot_dims(graph, node)
        if roles is None:
            return None
        key: tuple = ("dot", roles)
    elif opcode in ("transpose", "broadcast", "reduce"):
        key = (opcode, instruction.dimensions or (), rank)
    elif opcode == "bitcast":
        key = (opcode, operand, instruction.shape)
    elif opcode == "reshape":
        key = (opcode, operand.dims, instruction.shape.dims, _next_to_all_to_all(graph, node, sources[0]))
    else:
        key = (opcode, operand.dims, instruction.shape.dims)
    return _cached_map(key)


def _next_to_all_to_all(graph: DataflowGraph, node: int, source: int) -> tuple[str, int | None] | None:
    """Whether a reshape feeds or reads an all-to-all (``("all-to-all", dim)``, else None): the
    partitioner's reshard cuts a dim into [devices, rows] around one, and the batch then stays with
    the larger part; for a reshape that feeds an array all-to-all, ``dim`` is the dim it exchanges:
    after the exchange that dim indexes the devices, so the batch stays with the rows this device keeps."""
    at = graph.instruction_at
    for user in graph.user_ids[node]:
        if at[user].opcode == "all-to-all":
            dims = at[user].dimensions if not at[user].shape.is_tuple else None
            return ("all-to-all", dims[0] if dims else None)
    return ("all-to-all", None) if at[source].opcode == "all-to-all" else None


@lru_cache(maxsize=8192)
def _cached_map(key: tuple) -> DimMap:
    """The dim map of an op by what determines it (see _node_map): a module repeats a few kinds of op."""
    return dot_map(key[1]) if key[0] == "dot" else _dim_map(key)


def dot_map(roles: DotDims) -> DimMap:
    """Per dot operand: the output dim of each free or batch dim, -1 for the others."""
    return tuple(
        tuple(r.output_dim if r.role in ("free", "batch") and r.output_dim is not None else -1 for r in side)
        for side in roles.roles
    )


def _dim_map(key: tuple) -> DimMap:
    opcode = key[0]
    if opcode == "transpose":
        _, perm, rank = key
        return (tuple(perm.index(d) if d in perm else -1 for d in range(rank)),)
    if opcode == "broadcast":
        _, dims, rank = key
        return (tuple(dims[d] if d < len(dims) else -1 for d in range(rank)),)
    if opcode == "reduce":
        _, reduced, rank = key
        kept = [d for d in range(rank) if d not in reduced]
        return (tuple(kept.index(d) if d in kept else -1 for d in range(rank)),)
    # reshape / bitcast: follow each dim alone through the general rule
    if opcode == "bitcast":
        _, before, after = key
        moved = [_bitcast(frozenset({(0, d)}), before, after) for d in range(before.rank)]
    else:
        _, before_dims, after_dims, *context = key
        around = context[0] if context else None
        exchanged = around[1] if around is not None else None
        moved = [reshape_pairs(frozenset({(0, d)}), before_dims, after_dims, split_to_largest=around is not None,
                               exchanged=exchanged)
                 for d in range(len(before_dims))]
        if exchanged is not None and exchanged + 1 < len(after_dims) and after_dims[exchanged + 1] == 1:
            # [k] -> [k, 1]: one row per device, cut off the devices' dim (the shapes alone read it as kept)
            moved = [frozenset((0, exchanged + 1) if e == exchanged else (0, e) for _, e in out) for out in moved]
    return (tuple(next(iter(out))[1] if out else -1 for out in moved),)


def reshape_pairs(source: Pairs, before: tuple[int, ...], after: tuple[int, ...], *,
                  split_to_largest: bool = True, exchanged: int | None = None) -> Pairs:
    """``source``'s (anything, dim) pairs with each dim moved through a reshape ``before`` -> ``after``.

    A dim split into pieces goes to its largest piece with ``split_to_largest`` (the partitioner's
    all-to-all reshards cut ``[k * b]`` into ``[k, b]``), leaving out the ``exchanged`` piece (the dim
    an all-to-all that follows exchanges: after it, that dim indexes devices, and the rows this
    device keeps are the other piece), else to its major piece: a program's own
    reshape that splits a dim it folded (``[B * S] -> [B, S]``, ``[B * H] -> [B, H]``) gives the
    batch back to the major dim, where the fold put it."""
    out: set = set()
    for before_dims, group in _reshape_groups(before, after):
        if split_to_largest and exchanged in group and len(before_dims) == 1 and len(group) > 1:
            # a dim cut into [devices, rows] for an all-to-all: the rows stay, one row per device too
            rows = [e for e in group if e != exchanged]
            target = max(rows, key=lambda e: (after[e], -e))
            out.update((p, target) for p, d in source if d in before_dims)
            continue
        # unit dims inserted or dropped beside a fold ([B, S] -> [1, B * S]) do not regroup it
        after_dims = [e for e in group if after[e] > 1] or group
        if sum(1 for d in before_dims if before[d] > 1) > 1 and len(after_dims) > 1:
            continue  # dims regrouped: no dim survives
        if len(after_dims) == 1:
            target = after_dims[0]  # kept, or merged into one dim that now holds the batch
        elif split_to_largest:
            target = max(after_dims, key=lambda e: (after[e], -e))
        else:
            target = next((e for e in after_dims if after[e] > 1), after_dims[0])
        out.update((p, target) for p, d in source if d in before_dims)
    return frozenset(out)


def _bitcast(source: Pairs, before: Shape, after: Shape) -> Pairs:
    """A bitcast reshapes the physical (major-to-minor) dims: it may also transpose the logical ones."""
    major_before, major_after = _major_to_minor(before), _major_to_minor(after)
    if major_before is None or major_after is None:
        return reshape_pairs(source, before.dims, after.dims)
    physical = frozenset((p, major_before.index(d)) for p, d in source if d in major_before)
    moved = reshape_pairs(physical, tuple(before.dims[d] for d in major_before),
                          tuple(after.dims[d] for d in major_after))
    return frozenset((p, major_after[e]) for p, e in moved)


def _major_to_minor(shape: Shape) -> tuple[int, ...] | None:
    layout = shape.layout
    if layout is None or len(layout.minor_to_major) != shape.rank:
        return None
    return tuple(reversed(layout.minor_to_major))


def _reshape_groups(before: tuple[int, ...], after: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """The smallest runs of input and output dims with equal element counts."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(before) and j < len(after):
        gi, gj = [i], [j]
        pa, pb = before[i], after[j]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                if i >= len(before):
                    return groups
                pa *= before[i]
                gi.append(i)
                i += 1
            else:
                if j >= len(after):
                    return groups
                pb *= after[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups
