"""Which entry parameters each value of a :class:`~hlo_doctor.graph.dataflow_graph.DataflowGraph`
derives from, as bitsets (bit k: entry parameter k).

A value is an int bitset, or a tuple of values (one per tuple element), so a loop's weights and
activations stay apart. Every node's value is the fixpoint, over the graph, of the transfer
:func:`_transfer_into` makes (while loops' back edges make cycles). Most analyses ask it of many nodes and get the whole
propagation (:func:`~hlo_doctor.graph.dataflow_propagate.propagate_forward`), once per graph;
an analysis that asks it of a few nodes whose ancestors are few and make no cycle (a weight and
the ops that reshape it) gets them from those ancestors alone, in dataflow order: with no cycle
among them each value has one solution, the one the whole propagation reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING

from hlo_doctor._gc import paused_gc
from hlo_doctor.graph.dataflow_propagate import _flatten, _join, bitset_interner, propagate_forward
from hlo_doctor.hlo.ir import Instruction

if TYPE_CHECKING:
    from hlo_doctor.graph.dataflow_graph import DataflowGraph

__all__ = ["ParameterBits"]

# Tuple-shaped ops whose result element i is computed from operand i alone.
_ELEMENTWISE_TUPLE = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"})

ANCESTORS_MAX = 256
"""A node with more ancestors than this gets the whole propagation instead."""

SOLVED_SHARE = 32
"""Once one in this many of the graph's nodes were solved from their ancestors, the rest gets the
whole propagation: an analysis that asks it of many nodes is served more cheaply all at once."""


class ParameterBits:
    """The entry-parameter bitsets of one graph's nodes, made on first use (see the module docstring).

    The graph is passed to each call, not kept: the graph keeps this, and a reference back would
    be a cycle, which only the cyclic collector (paused while analyses run) could free.
    """

    def __init__(self, size: int) -> None:
        self._values: list = [0] * (size + 1)  # the last slot is NO_NODE's: always 0
        self._known = bytearray(size)  # solved from its ancestors
        self._complete = False  # every node solved by the whole propagation
        self._solved = 0  # nodes solved from their ancestors
        self._transfer: Callable[[int], object] | None = None  # into self._values, made on first use

    def of(self, graph: DataflowGraph, node: int) -> int:
        """Node ``node``'s entry parameters as one bitset (a tuple's elements together)."""
        if not self._complete and not self._known[node] and not self._solve_ancestors(graph, node):
            self._propagate_all(graph)
        return _flatten(self._values[node])

    def _solve_ancestors(self, graph: DataflowGraph, node: int) -> bool:
        """Solve ``node`` and its ancestors when they are few and make no cycle; False otherwise."""
        if self._solved * SOLVED_SHARE > len(self._known):
            return False
        order = self._ancestors_in_order(graph, node)
        if order is None:
            return False
        self._solved += len(order)
        values, known = self._values, self._known
        if self._transfer is None:
            self._transfer = _transfer_into(graph, values)
        transfer = self._transfer
        with paused_gc():
            for each in order:
                values[each] = transfer(each)
                known[each] = 1
        return True

    def _ancestors_in_order(self, graph: DataflowGraph, node: int) -> list[int] | None:
        """``node``'s unsolved ancestors and itself, each after what it reads; None when there are
        more than :data:`ANCESTORS_MAX` or they make a cycle."""
        sources_of, known = graph.sources_of, self._known
        order: list[int] = []
        open_: set[int] = {node}  # on the path being walked
        stack: list[tuple[int, list[int]]] = [(node, sources_of(node))]
        done: set[int] = set()
        while stack:
            current, pending = stack[-1]
            while pending:
                source = pending.pop()
                if source in open_:
                    return None  # a cycle: a loop's back edge, or a callee called twice in a chain
                if source not in done and not known[source]:
                    break
            else:
                stack.pop()
                open_.discard(current)
                done.add(current)
                order.append(current)
                continue
            if len(done) + len(stack) > ANCESTORS_MAX:
                return None
            open_.add(source)
            stack.append((source, sources_of(source)))
        return order

    def _propagate_all(self, graph: DataflowGraph) -> None:
        """Every node's value, by the whole propagation from scratch. The nodes of a computation
        that exchanges no value with another (a reducer) derive from no entry parameter and
        give nothing to any other: they keep 0, which is what they would compute."""
        values: list = [0] * (len(graph.instruction_at) + 1)
        transfer = _transfer_into(graph, values)
        with paused_gc():
            propagate_forward(graph, transfer, values, chain.from_iterable(graph.linked_ranges))
        self._values = values
        self._complete = True
        self._known = bytearray()
        self._transfer = None


def _transfer_into(graph: DataflowGraph, values: list) -> Callable[[int], object]:
    """A node's value from the ``values`` of what it reads, one object per distinct bitset."""
    entry = graph.module.entry
    entry_ids = graph.computation_range(entry.name) if entry is not None else range(0)
    instruction_at = graph.instruction_at
    operand_ids = graph.operand_ids
    calls_into = graph.calls_into
    # One int object per distinct bitset: in a deep network most values derive from the same
    # hundreds of parameters (a gradient from every later layer's weights), and a new int of
    # as many bits per node would make the list grow with nodes x parameters.
    intern = bitset_interner()

    def transfer(node: int):  # noqa: ANN202 - an int bitset, or a tuple of values
        instruction: Instruction = instruction_at[node]
        opcode = instruction.opcode
        if opcode == "parameter" and node in entry_ids:
            return intern(1 << (instruction.parameter_number or 0))
        sources = operand_ids[node]
        if opcode == "tuple":
            return intern(tuple(values[s] for s in sources))
        extra = calls_into.get(node)
        if opcode == "get-tuple-element":
            source_value = values[sources[0]] if sources else 0
            for source, _ in extra or ():
                source_value = _join(source_value, values[source])
            index_text = instruction.attribute("index")
            if isinstance(source_value, tuple) and index_text and index_text.isdigit():
                index = int(index_text)
                if index < len(source_value):
                    return intern(source_value[index])
            return intern(_flatten(source_value))
        if not instruction.shape.is_tuple:
            bits = 0
            for source in sources:
                value = values[source]
                bits |= value if value.__class__ is int else _flatten(value)
            for source, _ in extra or ():
                bits |= _flatten(values[source])
            return intern(bits)
        if opcode in _ELEMENTWISE_TUPLE and not extra and len(sources) == len(instruction.shape.tuple_shapes):
            # A combined collective: element i is operand i's.
            return intern(tuple(_flatten(values[s]) for s in sources))
        value = 0
        for source in sources:
            value = _join(value, values[source])
        for source, _ in extra or ():
            value = _join(value, values[source])
        return intern(value)

    return transfer
