"""Dataflow order and forward propagation over a :class:`~hlo_doctor.graph.dataflow_graph.DataflowGraph`."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from hlo_doctor.hlo.ir import (
    Computation,
)

if TYPE_CHECKING:

    from hlo_doctor.graph.dataflow_graph import DataflowGraph


__all__ = ["bitset_interner", "dataflow_order", "propagate_forward", "set_bits"]

# Opcodes whose called computations exchange values with the caller.
_CALLERS = frozenset(
    {"fusion", "while", "call", "conditional", "async-start", "async-update", "async-done"}
)


# --------------------------------------------------------------------------
# Bitset values: an int bitset, or a tuple of values (one per tuple element).


def _flatten(value) -> int:
    if isinstance(value, int):
        return value
    bits = 0
    for element in value:
        bits |= _flatten(element)
    return bits


def _join(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_join(x, y) for x, y in zip(a, b, strict=False))
    if a == 0:
        return b
    if b == 0:
        return a
    return _flatten(a) | _flatten(b)


def bitset_interner() -> Callable[[object], object]:
    """A function that gives one object per distinct int bitset (and tuples of them, element
    by element), so that a list of values by node holds each distinct bitset once.

    A value that already is the shared object (most are: an elementwise op passes its
    operand's value on) is known by its id, without hashing it: a bitset over the parameters of
    a big module is thousands of bits wide, and hashing it for every node made the
    propagations grow with nodes x parameters. The shared objects stay alive in the table, so
    no other object can have their ids.
    """
    by_value: dict[int, int] = {}
    ids: set[int] = set()
    shared = by_value.setdefault
    known = ids.__contains__
    remember = ids.add

    def intern(value):  # noqa: ANN001, ANN202 - an int bitset, or a tuple of values
        if value.__class__ is int:
            if known(id(value)):
                return value
            found = shared(value, value)
            remember(id(found))
            return found
        return tuple(intern(element) for element in value)

    return intern


def set_bits(bits: int) -> list[int]:
    """The positions of the set bits of ``bits``, ascending: one scan of its binary digits, not
    a big-int operation per bit (a gradient's bitset over a big module's parameters is
    thousands of bits wide)."""
    digits = bin(bits)
    top = len(digits) - 1
    found = []
    index = digits.find("1", 2)
    while index != -1:
        found.append(top - index)
        index = digits.find("1", index + 1)
    found.reverse()
    return found


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
    # A changed value's users, read from the flat rows (a tuple and a list per node would be
    # most of the loop's cost); its cross-computation targets from calls_out_of.
    user_flat, user_starts = graph.user_ids.arrays
    calls_out_of = graph.calls_out_of
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
            for index in range(user_starts[node], user_starts[node + 1]):
                target = user_flat[index]
                if position[target] > here:
                    dirty[target] = 1
                else:
                    back.add(target)
            extra = calls_out_of.get(node)
            if extra:
                for target, _ in extra:
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
