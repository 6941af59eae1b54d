"""Whether a value is already a weight's gradient: it reaches the weight's update elementwise.

A reduction of a value derived from the batch is a gradient reduction when its
result reaches the update of a weight (``w - lr * g``: an elementwise op with
the weight's own value, of its shape) through elementwise ops and moves only,
or is returned as a weight-shaped output (a torch_xla graph returns the
gradients): it is then (a piece of) that weight's gradient, not an
activation's partial sum that a later matmul turns into one. The walk follows
tuples element by element (``tuple``, ``get-tuple-element``, loop state,
``opt-barrier``), so a loop's carried gradient accumulator and its activations
stay apart, and passes a scatter(-add) through its base operand only (a tied
embedding's head gradient is the base its lookup's row gradients are added to). Only a training step (one that updates state) has gradients.

The search from each candidate is a bounded walk (:data:`UPDATE_SEARCH` states).
Most candidates reach no update at all, and their walks used to run to the
bound; one backward pass from every update site (:meth:`UpdateSearch._reaching`)
now marks every state that reaches one with no bound, a superset of those the
bounded walk can succeed from, so a candidate outside it is answered at once
and only the others walk (a few states each), with the same answers as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from hlo_doctor.graph.dataflow import NO_NODE, DataflowGraph
from hlo_doctor.semantics.parameters import EntryParameters

__all__ = ["GRADIENT_PATH", "MOVES", "UPDATES", "UpdateSearch", "degenerate_reduce", "is_parameter_value"]

# Ops a gradient passes through on its way to its weight's update without changing what it is:
# elementwise arithmetic, moves, slices of a shard, collectives, loop and call plumbing.
GRADIENT_PATH = frozenset({
    "add", "subtract", "multiply", "divide", "negate", "sqrt", "rsqrt", "power", "maximum", "minimum", "abs",
    "sign", "select", "clamp", "convert", "copy", "bitcast", "reshape", "transpose", "dynamic-slice",
    "dynamic-update-slice", "slice", "concatenate", "pad", "tuple", "get-tuple-element", "all-reduce",
    "reduce-scatter", "all-gather", "all-to-all", "collective-permute", "all-reduce-start", "all-reduce-done",
    "all-gather-start", "all-gather-done", "collective-permute-start", "collective-permute-done",
    "opt-barrier", "parameter", "fusion", "call", "while", "async-start", "async-done", "reduce",
})
# States a search for a weight's update visits at most (an optimizer's update is a few ops).
UPDATE_SEARCH = 256
# Elementwise ops an optimizer updates a weight with, and ops that move a value unchanged.
UPDATES = frozenset({"add", "subtract", "multiply", "divide", "select", "fusion"})
MOVES = frozenset({"convert", "copy", "bitcast", "reshape", "get-tuple-element", "transpose", "dynamic-slice"})
# Users the walk does not step into (a call's operand reaches its callee by the cross-computation edges).
_CALLS = frozenset({"while", "call", "fusion", "async-start"})
ALL_SLOTS = -2  # in the backward pass: every state of a node (the whole value and each tuple element)


class UpdateSearch:
    """Answers :meth:`reaches_update` for the nodes of one graph, each once."""

    def __init__(self, graph: DataflowGraph, params: EntryParameters,
                 weights_by_dims: Mapping[tuple[int, ...], list[int]]) -> None:
        self.graph = graph
        self.params = params
        self.weights_by_dims = weights_by_dims
        self._found: dict[int, bool] = {}
        self._weight_values: dict[int, bool] = {}  # node -> whether it is a weight's own value
        self._weights = params.weights | params.state
        entry = graph.module.entry
        root = entry.root if entry is not None else None  # found once: Computation.root scans the body
        self._root = graph.id_of((entry.name, root.name)) if entry is not None and root is not None else None
        self._reach: set[tuple[int, int]] | None = None  # the backward pass's states, made on first use

    def reaches_update(self, start: int) -> bool:
        """Whether node ``start``'s value reaches a weight's update (or a weight-shaped output)
        through elementwise ops and moves only."""
        found = self._found.get(start)
        if found is None:
            found = self._found[start] = bool(self.params.state) and self._may_reach(start) \
                and self._search_update(start)
        return found

    def _may_reach(self, start: int) -> bool:
        """Whether the walk from ``start`` could succeed at all (with no bound on its length)."""
        if self._reach is None:
            self._reach = self._reaching()
        return (start, -1) in self._reach or (start, ALL_SLOTS) in self._reach

    def _reaching(self) -> set[tuple[int, int]]:
        """Every state ``(node, tuple element or -1)`` from which :meth:`_search_update`'s walk,
        unbounded, reaches an update: its steps taken backwards from the states where it succeeds.
        ``(node, ALL_SLOTS)`` stands for all of a node's states (a superset: the answer stays exact,
        since a state outside the set never succeeds and one inside it still walks)."""
        graph = self.graph
        at = graph.instruction_at
        operand_ids = graph.operand_ids
        calls_into = graph.calls_into
        stack: list[tuple[int, int]] = []
        root = self._root
        if root is not None and at[root].opcode == "tuple":
            stack.extend((root, slot) for slot in range(len(operand_ids[root]))
                         if self._returns_weight_shaped(root, slot))
        weight_value = self._weight_value
        for node, instruction in enumerate(at):
            if instruction.opcode not in UPDATES or instruction.opcode in _CALLS or instruction.shape.is_tuple:
                continue
            # _updates_weight(node, via) for each operand via, with the weight values found once
            dims = instruction.shape.dims
            sources = set(operand_ids[node])
            sources.discard(NO_NODE)
            weights = [source for source in sources if at[source].shape.dims == dims and weight_value(source)]
            if weights:
                stack.extend((via, -1) for via in sources if len(weights) > 1 or weights[0] != via)
        reached: set[tuple[int, int]] = set()
        while stack:
            state = stack.pop()
            node, slot = state
            if state in reached or (node, ALL_SLOTS) in reached:
                continue
            reached.add(state)
            for source, _ in calls_into.get(node, ()):
                stack.append((source, slot))
            instruction = at[node]
            opcode = instruction.opcode
            operands = operand_ids[node]
            if opcode == "scatter" and slot in (-1, ALL_SLOTS) and operands and operands[0] != NO_NODE:
                stack.append((operands[0], -1))  # the walk passes a scatter's base operand only
                continue
            if opcode not in GRADIENT_PATH or opcode in _CALLS:
                continue  # the walk steps into no such user from its operands
            if opcode == "tuple":  # the walk enters element p from any state of operand p
                positions = range(len(operands)) if slot == ALL_SLOTS else \
                    (slot,) if 0 <= slot < len(operands) else ()
                stack.extend((operands[p], ALL_SLOTS) for p in positions if operands[p] != NO_NODE)
            elif opcode == "opt-barrier":
                stack.extend((source, slot) for source in operands if source != NO_NODE)
            elif slot not in (-1, ALL_SLOTS):
                continue  # the walk enters every other user as a whole value
            elif opcode == "get-tuple-element":
                index = instruction.attribute("index")
                element = ALL_SLOTS if index is None else int(index)
                for source in operands:
                    if source != NO_NODE:
                        stack.extend(((source, -1), (source, element)))
            elif opcode != "reduce" or degenerate_reduce(graph, node):
                stack.extend((source, -1) for source in operands if source != NO_NODE)
        return reached

    def _search_update(self, start: int) -> bool:
        graph = self.graph
        at = graph.instruction_at
        root = self._root
        seen: set[tuple[int, int]] = set()
        queue: deque[tuple[int, int]] = deque([(start, -1)])  # (node, tuple element or -1)
        while queue and len(seen) < UPDATE_SEARCH:
            node, slot = queue.popleft()
            if (node, slot) in seen:
                continue
            seen.add((node, slot))
            for target, _ in graph.calls_out_of.get(node, ()):
                queue.append((target, slot))
            if slot != -1 and node == root and self._returns_weight_shaped(node, slot):
                return True  # the step returns it as a weight's gradient (torch_xla's graphs do)
            for user in graph.user_ids[node]:
                instruction = at[user]
                opcode = instruction.opcode
                if opcode == "scatter":
                    # a gradient a scatter(-add) adds rows onto passes on (a tied embedding's head
                    # gradient, the base the lookup's row gradients are added to); the rows do not
                    operands = graph.operand_ids[user]
                    if slot == -1 and operands and operands[0] == node:
                        queue.append((user, -1))
                    continue
                if opcode not in GRADIENT_PATH or opcode in _CALLS:
                    continue  # a call's operand reaches its callee by the calls_out_of edges above
                if opcode == "tuple":
                    for position, operand in enumerate(graph.operand_ids[user]):
                        if operand == node:
                            queue.append((user, position))
                    continue
                if opcode == "opt-barrier":
                    queue.append((user, slot))  # a tuple passed through as it is
                    continue
                if opcode == "get-tuple-element":
                    index = instruction.attribute("index")
                    if slot == -1 or index is None or int(index) == slot:
                        queue.append((user, -1))
                    continue
                if slot != -1:
                    continue  # a whole tuple read by an array op: not followed
                if opcode == "reduce" and not degenerate_reduce(graph, user):
                    continue
                if opcode in UPDATES and not instruction.shape.is_tuple and self._updates_weight(user, node):
                    return True
                queue.append((user, -1))
        return False

    def _returns_weight_shaped(self, root: int, slot: int) -> bool:
        operands = self.graph.operand_ids[root]
        if self.graph.instruction_at[root].opcode != "tuple" or slot >= len(operands) or operands[slot] == NO_NODE:
            return False
        shape = self.graph.instruction_at[operands[slot]].shape
        return not shape.is_tuple and shape.rank > 0 and shape.dims in self.weights_by_dims

    def _updates_weight(self, node: int, via: int) -> bool:
        """Whether elementwise ``node`` combines ``via`` with a weight's own value of its shape."""
        at = self.graph.instruction_at
        dims = at[node].shape.dims
        return any(source not in (via, NO_NODE) and at[source].shape.dims == dims and self._weight_value(source)
                   for source in self.graph.operand_ids[node])

    def _weight_value(self, node: int) -> bool:
        """Whether ``node`` is one weight's own value (moved, not computed); asked once per node."""
        found = self._weight_values.get(node)
        if found is None:
            # the cheap structural test first: most nodes are computed, and fail it at once
            bits = self.graph.parameter_bits(node) if is_parameter_value(self.graph, node) else 0
            found = self._weight_values[node] = bool(
                bits and bits & (bits - 1) == 0 and bits.bit_length() - 1 in self._weights)
        return found



def degenerate_reduce(graph: DataflowGraph, node: int) -> bool:
    """A reduce over dims of size 1 only: a reshape, not a contraction."""
    instruction = graph.instruction_at[node]
    operand = graph.operand_ids[node][0] if graph.operand_ids[node] else NO_NODE
    text = instruction.attribute("dimensions")
    if operand == NO_NODE or not text:
        return False
    dims = graph.instruction_at[operand].shape.dims
    reduced = [int(d) for d in text.strip("{} ").split(",") if d.strip()]
    return all(d < len(dims) and dims[d] == 1 for d in reduced)


def is_parameter_value(graph: DataflowGraph, node: int) -> bool:
    """Whether ``node`` is a parameter's value, moved but not computed (converts, copies, loop state)."""
    at = graph.instruction_at
    for _ in range(6):
        opcode = at[node].opcode
        if opcode == "parameter":
            return True
        if opcode not in MOVES:
            return False
        sources = [s for s in graph.operand_ids[node] if s != NO_NODE]
        if not sources:
            return False
        node = sources[0]
    return False
