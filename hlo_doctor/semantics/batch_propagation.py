"""The dataflow pass behind :mod:`hlo_doctor.semantics.batch_dims`: which (parameter, dim) pairs
each value carries, op by op.

While it runs, a value's pairs are the bits of one int (:class:`PairBits`), and equal values are
one object: in a deep network each activation carries the batch dims of the inputs of every
layer before it (norm scales count as data), so sets of pairs per node would grow with
nodes x layers. :class:`PairValues` gives them back as sets of pairs when read.
"""

from __future__ import annotations

from collections.abc import Iterable

from hlo_doctor.graph.dataflow import (
    NO_NODE,
    PARAM_KINDS,
    ROOT_KINDS,
    DataflowGraph,
    bitset_interner,
    propagate_forward,
    set_bits,
)
from hlo_doctor.graph.dim_maps import DOTS, MAPPED
from hlo_doctor.hlo.attributes import parse_int_list
from hlo_doctor.hlo.ir import Instruction

__all__ = ["PairBits", "PairValues", "Pairs"]

# Ops whose value carries no dims of its operands.
_SOURCES = frozenset({"constant", "iota", "partition-id", "replica-id", "rng", "rng-bit-generator",
                      "rng-get-and-update-state", "after-all", "get-dimension-size"})
_CALLERS = frozenset({"fusion", "while", "call", "conditional", "async-done"})
_DONE = frozenset({"all-gather-done", "all-reduce-done", "collective-permute-done", "copy-done", "send-done",
                   "recv-done"})
_START = frozenset({"all-gather-start", "all-reduce-start", "collective-permute-start", "copy-start"})
_MISSING = object()
# Ops whose array value keeps the positions of its operands of the same rank.
_SIMPLE = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "complex", "convert", "copy", "cosine",
    "divide", "erf", "exponential", "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one",
    "logistic", "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt", "power", "real",
    "reduce-precision", "remainder", "round-nearest-afz", "round-nearest-even", "rsqrt", "select",
    "shift-left", "shift-right-arithmetic", "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan",
    "tanh", "xor", "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
    "collective-broadcast", "slice", "dynamic-slice", "pad", "concatenate", "bitcast-convert", "optimization-barrier",
    "stochastic-convert", "clz", "custom-call",
})

Pairs = frozenset  # of (parameter number, dim)
_NONE = 0  # no pairs, as bits


class PairBits:
    """Sets of (parameter, dim) pairs of the given parameters as the bits of one int.

    Pair ``(p, d)`` is bit ``d * width + i``, ``i`` the index of ``p`` among the parameters in
    ascending order (``width`` of them): the pairs of one dim are one block of bits, so moving a
    dim moves a block, and the highest (lowest) bit of a block is its largest (smallest) parameter.
    """

    __slots__ = ("_block", "_index", "numbers", "width")

    def __init__(self, numbers: Iterable[int]) -> None:
        self.numbers: tuple[int, ...] = tuple(sorted(set(numbers)))
        self._index = {number: index for index, number in enumerate(self.numbers)}
        self.width = max(1, len(self.numbers))
        self._block = (1 << self.width) - 1

    def encode(self, pairs: Iterable[tuple[int, int]]) -> int:
        bits = _NONE
        for number, dim in pairs:
            bits |= 1 << (dim * self.width + self._index[number])
        return bits

    def mask(self, numbers: Iterable[int]) -> int:
        """One block's bits of those of ``numbers`` that are coded here."""
        bits = _NONE
        for number in numbers:
            index = self._index.get(number)
            if index is not None:
                bits |= 1 << index
        return bits

    def blocks(self, bits: int) -> Iterable[tuple[int, int]]:
        """(dim, the block of its parameters) for each dim with pairs."""
        width, block = self.width, self._block
        for dim in range((bits.bit_length() + width - 1) // width):
            part = bits >> (dim * width) & block
            if part:
                yield dim, part

    def pairs(self, bits: int) -> Pairs:
        numbers = self.numbers
        return frozenset((numbers[index], dim) for dim, part in self.blocks(bits) for index in set_bits(part))

    def decode(self, value: int | tuple) -> Pairs | tuple:
        """A value's pairs: a frozenset for bits, a tuple of values for a tuple."""
        if isinstance(value, int):
            return self.pairs(value)
        return tuple(self.decode(element) for element in value)

    def move(self, mapping: tuple[int, ...], bits: int) -> int:
        """``bits`` with the pairs of dim ``d`` moved to dim ``mapping[d]`` (dropped where -1, or past the map)."""
        width, block = self.width, self._block
        moved = _NONE
        for dim, target in enumerate(mapping):
            if target >= 0:
                part = bits >> (dim * width) & block
                if part:
                    moved |= part << (target * width)
        return moved

    def keep(self, bits: int, rank: int) -> int:
        """The pairs of dims below ``rank``."""
        return bits & ((1 << (rank * self.width)) - 1)


class PairValues:
    """Node id -> its pairs (a frozenset, or a tuple of values for a tuple), decoded on each read
    from the propagation's bits (``bits``, coded by ``coding``)."""

    __slots__ = ("bits", "coding")

    def __init__(self, bits: list, coding: PairBits) -> None:
        self.bits = bits
        self.coding = coding

    def __getitem__(self, node: int) -> Pairs | tuple:
        return self.coding.decode(self.bits[node])

    def __len__(self) -> int:
        return len(self.bits)


def _flatten(value) -> int:
    if value.__class__ is int:
        return value
    out = _NONE
    for element in value:
        out |= _flatten(element)
    return out


def _join(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_join(x, y) for x, y in zip(a, b, strict=False))
    if a == _NONE:
        return b
    if b == _NONE:
        return a
    return _flatten(a) | _flatten(b)


# --------------------------------------------------------------------------
# Propagation


class _Propagation:
    """Pairs moved forward from seed values, visiting only nodes a seed reaches.

    The graph's :func:`~hlo_doctor.graph.dataflow.propagate_forward` (one
    sweep in dataflow order, then loops' back edges to a fixpoint), started
    at the seeds.
    """

    def __init__(self, graph: DataflowGraph) -> None:
        self.graph = graph
        entry = graph.module.entry
        self.entry_ids = graph.computation_range(entry.name) if entry is not None else range(0)
        self.transfer = _Transfer(graph, self.entry_ids)

    def run(self, seeds: dict[int, Pairs], *, through_dots: bool) -> tuple[PairValues, list[int]]:
        """Every node's value (by id, with an always-empty slot for NO_NODE) and the nodes visited."""
        graph = self.graph
        coding = PairBits(number for pairs in seeds.values() for number, _ in pairs)
        values: list = [_NONE] * (len(graph.instruction_at) + 1)
        if not seeds:
            return PairValues(values, coding), []
        seed_bits = {node: coding.encode(pairs) for node, pairs in seeds.items()}
        instruction_at = graph.instruction_at
        operand_ids = graph.operand_ids
        ranks = graph.ranks
        transfer = self.transfer
        transfer.values = values
        transfer.coding = coding
        # Up to the first dots (finding the batch inputs), a vector broadcast along the rows carries no
        # pairs: a projection's bias, whose dim becomes heads folded in with the batch ([B, H] -> [B * H]),
        # is not the batch of the attention dot that reads the fold.
        transfer.first_pass = not through_dots
        intern = bitset_interner()  # bits, or a tuple of values: one object per distinct bits

        def compute(node: int) -> object:
            if node in seed_bits:
                return seed_bits[node]
            instruction = instruction_at[node]
            opcode = instruction.opcode
            if opcode in _SIMPLE:
                rank = ranks[node]
                if rank >= 0:
                    # The commonest ops (elementwise, converts, copies, collectives, slices, pads,
                    # concatenates, selects): what _Transfer.same_rank gives, inline.
                    found = None
                    made = False  # a new int: an operand's value flattened, or two joined
                    for source in operand_ids[node]:
                        value = values[source]  # NO_NODE's slot is always empty
                        if not value or ranks[source] != rank:
                            continue
                        if value.__class__ is not int:
                            value = _flatten(value)
                            made = True
                        if found is None or found == value:
                            found = value
                        else:
                            found |= value
                            made = True
                    if found is None:
                        return _NONE
                    return intern(found) if made else found  # an operand's own value is shared already
            elif not through_dots and opcode in DOTS:
                return _NONE
            return intern(transfer(node, instruction))

        touched = propagate_forward(graph, compute, values, seeds)
        return PairValues(values, coding), touched


def _array(value) -> int:
    return value if value.__class__ is int else _flatten(value)


_BATCH_NORMS = frozenset({"batch-norm-training", "batch-norm-grad"})


class _Transfer:
    """The value of one node from the values of what it reads (see the module docstring)."""

    def __init__(self, graph: DataflowGraph, entry_ids: range) -> None:
        self.graph = graph
        self.values: list = []
        self.coding = PairBits(())
        self.entry_ids = entry_ids
        self.operand_ids = graph.operand_ids
        self.instruction_at = graph.instruction_at
        self.ranks = graph.ranks
        self.calls_into = graph.calls_into
        self.first_pass = False

    def apply(self, mapping: tuple[int, ...], source: int) -> int:
        """``source``'s pairs with dim ``d`` moved to ``mapping[d]`` (dropped where -1)."""
        return self.coding.move(mapping, source) if source else _NONE

    def joined(self, node: int, kinds: frozenset[str]):
        value = _NONE
        values = self.values
        for source, kind in self.calls_into.get(node, ()):
            if kind in kinds:
                value = _join(value, values[source])
        return value

    def __call__(self, node: int, instruction: Instruction) -> object:
        opcode = instruction.opcode
        values = self.values
        sources = self.operand_ids[node]
        # The same-rank ops (elementwise, converts, copies, collectives, slices ...) never come
        # here: _Propagation.run computes them inline.
        shape = instruction.shape
        if opcode in DOTS:
            maps = self.graph.dim_map(node)
            if maps is None:
                return _NONE
            move = self.coding.move
            lhs, rhs = _array(values[sources[0]]), _array(values[sources[1]])
            lhs = move(maps[0], lhs) if lhs else _NONE
            rhs = move(maps[1], rhs) if rhs else _NONE
            return lhs | rhs if lhs and rhs else lhs or rhs
        if opcode in MAPPED and not shape.is_tuple:
            source = values[sources[0]] if sources else _NONE
            if source.__class__ is not int:
                source = _flatten(source)
            if not source:
                return _NONE
            maps = self.graph.dim_map(node)
            if maps is None:
                return _NONE
            mapping = maps[0]
            if self.first_pass and opcode == "broadcast" and len(mapping) == 1 and mapping[0] > 0:
                return _NONE  # a vector broadcast along the rows (a bias, a scale): per feature, not a batch
            return self.coding.move(mapping, source)
        if opcode in _SOURCES:
            return _NONE
        if opcode == "parameter":
            return _NONE if node in self.entry_ids else self.joined(node, PARAM_KINDS)
        if opcode in _CALLERS:
            return self.joined(node, ROOT_KINDS)
        if opcode == "tuple":
            return tuple(values[s] for s in sources)
        if opcode == "opt-barrier":
            # the value itself (jax.checkpoint's barrier around what a rematerialized step recomputes)
            return values[sources[0]] if sources else _NONE
        if opcode == "get-tuple-element":
            source = values[sources[0]] if sources else _NONE
            index = instruction.attribute("index")
            if isinstance(source, tuple) and index and index.isdigit() and int(index) < len(source):
                return source[int(index)]
            return self.coding.keep(_array(source), shape.rank) if not shape.is_tuple else source
        if opcode in _START or opcode in _DONE or opcode in ("async-start", "async-update"):
            value = _NONE
            for s in sources:
                value |= _array(values[s])
            return value if not shape.is_tuple else tuple(value for _ in shape.tuple_shapes)
        if opcode in _BATCH_NORMS and shape.is_tuple:
            return self.batch_norm(instruction, sources)
        if shape.is_tuple:
            # Variadic ops (reduce, sort, all-gather of several operands ...): element i from operand i.
            elements = []
            for i, leaf in enumerate(shape.tuple_shapes):
                value = _array(values[sources[i]]) if i < len(sources) else _NONE
                elements.append(self.coding.keep(value, leaf.rank) if not leaf.is_tuple else _NONE)
            if opcode == "reduce":
                maps = self.graph.dim_map(node)
                return tuple(_NONE if maps is None else self.apply(maps[0], e) for e in elements)
            return tuple(elements)
        source = _array(values[sources[0]]) if sources else _NONE
        if opcode == "gather":
            return self.gather(instruction, sources)
        if opcode == "dynamic-update-slice" and len(sources) > 1:
            # the update lands dim for dim in the buffer: a scan's stacked residuals ([L, B * S, K], one
            # layer written per step) hold the batch where each step's update does
            return self.coding.keep(source | _array(values[sources[1]]), shape.rank)
        if opcode in ("scatter", "dynamic-update-slice"):
            return self.coding.keep(source, shape.rank)
        # Any other op: the operands of the same rank keep their positions.
        return self.same_rank(sources, shape.rank)

    def batch_norm(self, instruction: Instruction, sources: tuple[int, ...]) -> tuple:
        """(normalized or its gradient, per-feature, per-feature): the values keep the operand's dims (a
        gradient's those of the output gradient too); the per-feature ones its ``feature_index`` dim,
        which holds the tokens where torch_xla lowers a layer norm as a batch norm of ``[1, tokens, D]``."""
        value = _array(self.values[sources[0]]) if sources else _NONE
        if instruction.opcode == "batch-norm-grad" and len(sources) > 4:
            value |= _array(self.values[sources[4]])
        rank = self.ranks[sources[0]] if sources else 0
        feature_text = instruction.attribute("feature_index")
        feature = int(feature_text) if feature_text and feature_text.isdigit() else -1
        per_feature = self.coding.move(tuple(0 if d == feature else -1 for d in range(max(rank, 0))), value)
        return (value, per_feature, per_feature)

    def same_rank(self, sources: tuple[int, ...], rank: int) -> int:
        """The pairs of the array operands of rank ``rank``, whose dims keep their positions."""
        values = self.values
        ranks = self.ranks
        found = None
        for source in sources:
            value = values[source]  # NO_NODE's slot is always empty
            if not value or ranks[source] != rank:
                continue
            value = _array(value)
            found = value if found is None or found == value else found | value
        return _NONE if found is None else found

    def gather(self, instruction: Instruction, sources: tuple[int, ...]) -> int:
        """The indices' pairs, their index dims moved to the output's batch dims."""
        if len(sources) < 2 or sources[1] == NO_NODE:
            return _NONE
        indices = self.instruction_at[sources[1]].shape
        offset_text = instruction.attribute("offset_dims")
        offset = set(parse_int_list(offset_text)) if offset_text else set()
        vector_text = instruction.attribute("index_vector_dim")
        vector = int(vector_text) if vector_text and vector_text.lstrip("-").isdigit() else indices.rank
        batch_out = [d for d in range(instruction.shape.rank) if d not in offset]
        batch_in = [d for d in range(indices.rank) if d != vector]
        mapping = tuple(
            batch_out[batch_in.index(d)] if d in batch_in and batch_in.index(d) < len(batch_out) else -1
            for d in range(indices.rank)
        )
        return self.apply(mapping, _array(self.values[sources[1]]))
