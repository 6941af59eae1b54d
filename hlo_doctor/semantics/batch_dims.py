"""Which values are activations, and where their batch dimension is.

Part of the analysis layer (:mod:`hlo_doctor.semantics`): the collective roles,
``activation-all-gather`` and ``non-batch-dim-sharding`` read it.

**Batch inputs.** A candidate is an entry parameter of rank >= 1 whose
sharding splits dim 0 (in a torch_xla training step, one that is not in the
header's ``buffer_donor``: those are the weights). Each candidate's dim 0 is
followed forward (below) to the dots and convolutions it reaches directly
(not through another dot); a candidate is a *batch input* when its dim
reaches one of them as a free (or batch) dim of the lhs / input operand
while the other operand does not derive from it: data flows through the
layer with its batch dim kept. A weight reaches its dots as the rhs (its
dim 0 contracted, or free as the output features), so it is not one; and
as the search stops at the first dots, a weight's output features (which
become head dims, batch dims of the attention dots) never count.

**Batch dims.** Every value gets the set of ``(parameter, dim)`` pairs: which
candidate's dim 0 each of its dims carries. The pairs move through
elementwise and other position-keeping ops (collectives, slices, pads,
concatenates, selects, converts), ``transpose`` (by the permutation),
``broadcast`` (by ``dimensions``), ``reshape``/``bitcast`` (a bitcast on
the physical, major-to-minor dims; a dim kept, merged
into one output dim, or split: then into its largest piece, which is how the
partitioner's all-to-all reshards read), ``reduce`` (kept dims), dots
and convolutions (free and batch dims map to the output, contracting dims
end), ``gather`` (index dims to the output's batch dims), tuples, fusions,
calls, while loops (to a fixpoint) and async pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from hlo_doctor.dump import Role
from hlo_doctor.graph.dataflow import NO_NODE, PARAM_KINDS, ROOT_KINDS, DataflowGraph, NodeKey, propagate_forward
from hlo_doctor.graph.dots import dot_dims
from hlo_doctor.graph.sharding import tiles_per_dim
from hlo_doctor.hlo.attributes import parse_int_list
from hlo_doctor.hlo.ir import HloModule, Instruction, Shape, Sharding, ShardingKind
from hlo_doctor.semantics.view import ModuleView

__all__ = ["BatchAnalysis", "analyze_batch", "analyze_data_batch", "buffer_donors", "parameter_sharding"]

_DONOR = re.compile(r"\(\s*(\d+)\s*,")

# Ops whose value carries no dims of its operands.
_SOURCES = frozenset({"constant", "iota", "partition-id", "replica-id", "rng", "rng-bit-generator",
                      "rng-get-and-update-state", "after-all", "get-dimension-size"})
_CALLERS = frozenset({"fusion", "while", "call", "conditional", "async-done"})
_DONE = frozenset({"all-gather-done", "all-reduce-done", "collective-permute-done", "copy-done", "send-done",
                   "recv-done"})
_START = frozenset({"all-gather-start", "all-reduce-start", "collective-permute-start", "copy-start"})
_DOTS = frozenset({"dot", "convolution"})
# Ops whose one array operand's dims move to output dims by a fixed map.
_MAPPED = frozenset({"transpose", "broadcast", "reshape", "bitcast", "dynamic-reshape", "reduce"})
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
_EMPTY: Pairs = frozenset()


def _flatten(value) -> Pairs:
    if isinstance(value, frozenset):
        return value
    out: set = set()
    for element in value:
        out |= _flatten(element)
    return frozenset(out)


def _join(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_join(x, y) for x, y in zip(a, b, strict=False))
    if a == _EMPTY:
        return b
    if b == _EMPTY:
        return a
    return _flatten(a) | _flatten(b)


@dataclass
class BatchAnalysis:
    """The batch inputs of a module and the batch dims of every value."""

    module: HloModule
    graph: DataflowGraph
    batch_inputs: frozenset[int]
    weights: frozenset[int]  # buffer donors (torch_xla training steps), else empty
    global_batch: dict[int, int]  # batch input -> its global dim-0 size
    values: list  # node id -> its pairs (a frozenset, or a tuple of values for a tuple)
    inputs: dict[int, Instruction]
    # The batch inputs whose dim 0 reaches a matmul as the activation's free dim (all of them,
    # for analyze_batch; a subset of the data inputs for analyze_data_batch).
    matmul_inputs: frozenset[int] = frozenset()

    def batch_dims(self, key: NodeKey) -> dict[int, int]:
        """dim -> the batch input it carries, for an array value (empty: not an activation)."""
        node = self.graph.id_of(key)
        value = self.values[node] if node is not None else _EMPTY
        if not isinstance(value, frozenset):
            return {}
        return {dim: param for param, dim in sorted(value) if param in self.batch_inputs}

    def derives_from_batch(self, key: NodeKey) -> bool:
        node = self.graph.id_of(key)
        if node is None:
            return False
        bits = self.graph.parameter_bits(node)
        return any(bits >> p & 1 for p in self.batch_inputs)

    def batch_replicated(self, key: NodeKey, dim: int, param: int) -> bool:
        """Whether the value holds the whole global batch along ``dim`` (per-device shapes)."""
        shape = self.graph.instruction(key).shape
        return not shape.is_tuple and dim < shape.rank and shape.dims[dim] >= self.global_batch.get(param, 1 << 62)


def buffer_donors(ctx: ModuleView) -> frozenset[int]:
    """Parameter numbers in the header's ``buffer_donor`` (torch_xla: the weights of a training step)."""
    if ctx.framework != "torch_xla":
        return frozenset()
    # Read from the snapshots' header lines: no snapshot is parsed for it.
    for role in (Role.AFTER_PROPAGATION, Role.BEFORE_OPTIMIZATIONS, Role.AFTER_PARTITIONING,
                 Role.AFTER_OPTIMIZATIONS):
        snapshot = ctx.module.snapshot(role)
        text = snapshot.header_attribute("buffer_donor") if snapshot is not None else None
        if text:
            return frozenset(int(x) for x in _DONOR.findall(text))
    return frozenset()


def parameter_sharding(param: Instruction, ctx: ModuleView | None) -> Sharding | None:
    """The parameter's sharding; when it has none, that of the same parameter in ``ctx.sharded``.

    ``ctx.sharded`` is read only then: the per-device side of an analysis must not parse the
    global-shape snapshot for nothing (it may be another process's).
    """
    sharding = param.sharding
    if sharding is not None or ctx is None:
        return sharding
    fallback = ctx.sharded
    if fallback is not None and fallback.entry is not None:
        for other in fallback.entry.parameters():
            if other.parameter_number == param.parameter_number:
                return other.sharding
    return None


def analyze_batch(
    ctx: ModuleView,
    module: HloModule,
    graph: DataflowGraph,
    *,
    per_device: bool,
    require_sharded: bool = True,
    exclude: frozenset[int] = frozenset(),
    follow: bool = True,
) -> BatchAnalysis:
    """Find the batch inputs of ``module`` and follow their batch dim (see the module docstring).

    With ``require_sharded=False`` an unsharded parameter may be a batch input too (used to
    tell data from weights); parameters in ``exclude`` never are. With ``follow=False`` only
    the batch inputs are found (``values`` stay empty).
    """
    entry = module.entry
    donors = buffer_donors(ctx) | exclude
    candidates: dict[int, Instruction] = {}
    global_batch: dict[int, int] = {}
    if entry is not None:
        for param in entry.parameters():
            number = param.parameter_number
            shape = param.shape
            if number is None or shape.is_tuple or shape.rank == 0 or number in donors:
                continue
            sharding = parameter_sharding(param, ctx if per_device else None)
            tiles: tuple[int, ...] = (1,)
            if sharding is not None and sharding.kind is ShardingKind.TILED:
                try:
                    tiles = tiles_per_dim(sharding, shape.rank)
                except ValueError:
                    continue
            elif require_sharded:
                continue
            if tiles[0] > 1 or not require_sharded:
                candidates[number] = param
                global_batch[number] = shape.dims[0] * tiles[0] if per_device else shape.dims[0]
    return _follow_batch(module, graph, candidates, global_batch, donors, follow=follow)


def analyze_data_batch(
    ctx: ModuleView, module: HloModule, graph: DataflowGraph, data: frozenset[int]
) -> BatchAnalysis:
    """The batch dims of every value, seeded at dim 0 of each data input in ``data``.

    Unlike :func:`analyze_batch` the inputs need not be sharded: a replicated batch is still the
    batch. ``batch_inputs`` are the data inputs whose dim 0 reaches a layer's matmul as the
    activation's free dim (see the module docstring) and every other data input (labels, masks),
    so that all values derived from the batch carry it.
    """
    entry = module.entry
    candidates: dict[int, Instruction] = {}
    global_batch: dict[int, int] = {}
    for param in entry.parameters() if entry is not None else ():
        number = param.parameter_number
        shape = param.shape
        if number is None or number not in data or shape.is_tuple or shape.rank == 0:
            continue
        candidates[number] = param
        tiles = 1
        sharding = parameter_sharding(param, ctx)
        if sharding is not None and sharding.kind is ShardingKind.TILED:
            try:
                tiles = tiles_per_dim(sharding, shape.rank)[0]
            except ValueError:
                tiles = 1
        global_batch[number] = shape.dims[0] * tiles
    return _follow_batch(module, graph, candidates, global_batch, frozenset(), keep_all=True, find=False)


def _follow_batch(
    module: HloModule,
    graph: DataflowGraph,
    candidates: dict[int, Instruction],
    global_batch: dict[int, int],
    donors: frozenset[int],
    *,
    keep_all: bool = False,
    follow: bool = True,
    find: bool = True,
) -> BatchAnalysis:
    # First each candidate's dim 0 up to the dots it reaches directly: a weight meets them as the rhs
    # (and its output features, which may be a later dot's head/batch dims, must not count); then the
    # batch inputs' dim through everything.
    entry = module.entry
    seeds: dict[int, Pairs] = {}
    if entry is not None:
        local = graph.computation_ids(entry.name)
        seeds = {local[p.name]: frozenset({(n, 0)}) for n, p in candidates.items() if p.name in local}
    propagation = _Propagation(graph)
    batch: set[int] = set()
    if find:  # the first pass only tells which candidates are batch inputs
        first, touched = propagation.run(seeds, through_dots=False)
        batch = _batch_inputs(graph, first, touched, set(candidates))
    kept = set(candidates) if keep_all else batch
    if follow:
        values, _ = propagation.run({k: v for k, v in seeds.items() if next(iter(v))[0] in kept},
                                    through_dots=True)
    else:
        values = [_EMPTY] * (len(graph.instruction_at) + 1)
    result = BatchAnalysis(module, graph, frozenset(kept), donors,
                           {p: global_batch[p] for p in kept}, values, {p: candidates[p] for p in kept})
    result.matmul_inputs = frozenset(batch)
    return result


def _batch_inputs(graph: DataflowGraph, values: list, touched: list[int], candidates: set[int]) -> set[int]:
    found: set[int] = set()
    instruction_at = graph.instruction_at
    for node in touched:
        if len(found) == len(candidates):
            break
        instruction = instruction_at[node]
        if instruction.opcode not in _DOTS or len(instruction.operands) < 2:
            continue
        lhs, rhs = graph.operand_ids[node][:2]
        if NO_NODE in (lhs, rhs):
            continue
        lhs_value = values[lhs]
        if not isinstance(lhs_value, frozenset) or not lhs_value:
            continue
        try:
            roles = dot_dims(instruction, instruction_at[lhs].shape.rank, instruction_at[rhs].shape.rank)
        except (ValueError, KeyError, IndexError):
            continue
        for param, dim in lhs_value:
            if param in found or param not in candidates or dim >= len(roles.roles[0]):
                continue
            if roles.role(0, dim).role in ("free", "batch") and not graph.parameter_bits(rhs) >> param & 1:
                found.add(param)
    return found


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

    def run(self, seeds: dict[int, Pairs], *, through_dots: bool) -> tuple[list, list[int]]:
        """Every node's value (a list by id, with an always-empty slot for NO_NODE) and the nodes visited."""
        graph = self.graph
        values: list = [_EMPTY] * (len(graph.instruction_at) + 1)
        if not seeds:
            return values, []
        instruction_at = graph.instruction_at
        transfer = self.transfer
        transfer.values = values

        def compute(node: int) -> object:
            if node in seeds:
                return seeds[node]
            instruction = instruction_at[node]
            if not through_dots and instruction.opcode in _DOTS:
                return _EMPTY
            return transfer(node, instruction)

        touched = propagate_forward(graph, compute, values, seeds)
        return values, touched


def _array(value) -> Pairs:
    return value if value.__class__ is frozenset else _flatten(value)


def _keep(value: Pairs, rank: int) -> Pairs:
    return frozenset(p for p in value if p[1] < rank)


@lru_cache(maxsize=8192)
def _cached_map(key: tuple) -> tuple[tuple[int, ...], ...]:
    """The dim map of an op by what determines it (see _Transfer._dim_maps): a module repeats a few kinds of op."""
    return roles_map(key[1]) if key[0] == "dot" else _dim_map(key)


def roles_map(roles) -> tuple[tuple[int, ...], ...]:
    """Per dot operand: the output dim of each free or batch dim, -1 for the others."""
    return tuple(
        tuple(r.output_dim if r.role in ("free", "batch") and r.output_dim is not None else -1 for r in side)
        for side in roles.roles
    )


def _dim_map(key: tuple) -> tuple[tuple[int, ...], ...]:
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
        _, before_dims, after_dims = key
        moved = [_reshape(frozenset({(0, d)}), before_dims, after_dims) for d in range(len(before_dims))]
    return (tuple(next(iter(out))[1] if out else -1 for out in moved),)


class _Transfer:
    """The value of one node from the values of what it reads (see the module docstring)."""

    def __init__(self, graph: DataflowGraph, entry_ids: range) -> None:
        self.graph = graph
        self.values: list = []
        self.entry_ids = entry_ids
        self.operand_ids = graph.operand_ids
        self.instruction_at = graph.instruction_at
        self.calls_into = graph.calls_into
        # Per node, how its operand's dims map to its own (see _dim_map), made once and
        # kept across runs; and each (map, pairs) result, as unrolled layers repeat them.
        self.maps: dict[int, tuple[tuple[int, ...], ...] | None] = {}
        self.applied: dict[tuple, Pairs] = {}

    def apply(self, mapping: tuple[int, ...], source: Pairs) -> Pairs:
        """``source``'s pairs with dim ``d`` moved to ``mapping[d]`` (dropped where -1)."""
        if not source:
            return _EMPTY
        key = (mapping, source)
        found = self.applied.get(key)
        if found is None:
            size = len(mapping)
            found = self.applied[key] = frozenset(
                (p, mapping[d]) for p, d in source if d < size and mapping[d] >= 0
            )
        return found

    def dim_maps(self, node: int, instruction: Instruction) -> tuple[tuple[int, ...], ...] | None:
        try:
            return self.maps[node]
        except KeyError:
            found = self.maps[node] = self._dim_maps(instruction, self.operand_ids[node])
            return found

    def _dim_maps(self, instruction: Instruction, sources: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
        """Per operand (one; two for a dot), where each of its dims goes in the output (-1: nowhere)."""
        opcode = instruction.opcode
        if not sources or NO_NODE in sources[:2]:
            return None
        operand = self.instruction_at[sources[0]].shape
        if operand.is_tuple:
            return None
        rank = operand.rank
        if opcode in _DOTS:
            if len(sources) < 2:
                return None
            rhs = self.instruction_at[sources[1]].shape
            try:
                roles = dot_dims(instruction, rank, rhs.rank)
            except (ValueError, IndexError, KeyError):
                return None
            key: tuple = ("dot", roles)
        elif opcode in ("transpose", "broadcast", "reduce"):
            key = (opcode, instruction.dimensions or (), rank)
        elif opcode == "bitcast":
            key = (opcode, operand, instruction.shape)
        else:
            key = (opcode, operand.dims, instruction.shape.dims)
        return _cached_map(key)

    def joined(self, node: int, kinds: frozenset[str]):
        value = _EMPTY
        values = self.values
        for source, kind in self.calls_into.get(node, ()):
            if kind in kinds:
                value = _join(value, values[source])
        return value

    def __call__(self, node: int, instruction: Instruction) -> object:
        opcode = instruction.opcode
        values = self.values
        sources = self.operand_ids[node]
        shape = instruction.shape
        if opcode in _SIMPLE and not shape.is_tuple:
            # The commonest ops first (elementwise, converts, copies, collectives,
            # slices, pads, concatenates, selects), as any other op at the end.
            return self.same_rank(sources, shape.rank)
        if opcode in _DOTS:
            maps = self.dim_maps(node, instruction)
            if maps is None:
                return _EMPTY
            lhs, rhs = self.apply(maps[0], _array(values[sources[0]])), self.apply(maps[1], _array(values[sources[1]]))
            return lhs | rhs if lhs and rhs else lhs or rhs
        if opcode in _MAPPED and not shape.is_tuple:
            source = _array(values[sources[0]]) if sources else _EMPTY
            if not source:
                return _EMPTY
            maps = self.dim_maps(node, instruction)
            return _EMPTY if maps is None else self.apply(maps[0], source)
        if opcode in _SOURCES:
            return _EMPTY
        if opcode == "parameter":
            return _EMPTY if node in self.entry_ids else self.joined(node, PARAM_KINDS)
        if opcode in _CALLERS:
            return self.joined(node, ROOT_KINDS)
        if opcode == "tuple":
            return tuple(values[s] for s in sources)
        if opcode == "get-tuple-element":
            source = values[sources[0]] if sources else _EMPTY
            index = instruction.attribute("index")
            if isinstance(source, tuple) and index and index.isdigit() and int(index) < len(source):
                return source[int(index)]
            return _keep(_array(source), shape.rank) if not shape.is_tuple else source
        if opcode in _START or opcode in _DONE or opcode in ("async-start", "async-update"):
            value = _EMPTY
            for s in sources:
                value |= _array(values[s])
            return value if not shape.is_tuple else tuple(value for _ in shape.tuple_shapes)
        if shape.is_tuple:
            # Variadic ops (reduce, sort, all-gather of several operands ...): element i from operand i.
            elements = []
            for i, leaf in enumerate(shape.tuple_shapes):
                value = _array(values[sources[i]]) if i < len(sources) else _EMPTY
                elements.append(_keep(value, leaf.rank) if not leaf.is_tuple else _EMPTY)
            if opcode == "reduce":
                maps = self.dim_maps(node, instruction)
                return tuple(_EMPTY if maps is None else self.apply(maps[0], e) for e in elements)
            return tuple(elements)
        source = _array(values[sources[0]]) if sources else _EMPTY
        if opcode == "gather":
            return self.gather(instruction, sources)
        if opcode in ("scatter", "dynamic-update-slice"):
            return _keep(source, shape.rank)
        # Any other op: the operands of the same rank keep their positions.
        return self.same_rank(sources, shape.rank)

    def same_rank(self, sources: tuple[int, ...], rank: int) -> Pairs:
        """The pairs of the array operands of rank ``rank``, whose dims keep their positions."""
        values = self.values
        instruction_at = self.instruction_at
        found = None
        for source in sources:
            value = values[source]
            if not value or source == NO_NODE:
                continue
            operand_shape = instruction_at[source].shape
            if operand_shape.is_tuple or operand_shape.rank != rank:
                continue
            value = _array(value)
            found = value if found is None or found == value else found | value
        return _EMPTY if found is None else found

    def gather(self, instruction: Instruction, sources: tuple[int, ...]) -> Pairs:
        if len(sources) < 2 or sources[1] == NO_NODE:
            return _EMPTY
        indices = self.instruction_at[sources[1]].shape
        offset_text = instruction.attribute("offset_dims")
        offset = set(parse_int_list(offset_text)) if offset_text else set()
        vector_text = instruction.attribute("index_vector_dim")
        vector = int(vector_text) if vector_text and vector_text.lstrip("-").isdigit() else indices.rank
        batch_out = [d for d in range(instruction.shape.rank) if d not in offset]
        batch_in = [d for d in range(indices.rank) if d != vector]
        out = set()
        for p, d in _array(self.values[sources[1]]):
            if d in batch_in and batch_in.index(d) < len(batch_out):
                out.add((p, batch_out[batch_in.index(d)]))
        return frozenset(out)


def _reshape(source: Pairs, before: tuple[int, ...], after: tuple[int, ...]) -> Pairs:
    out: set = set()
    for before_dims, after_dims in _reshape_groups(before, after):
        if len(before_dims) > 1 and len(after_dims) > 1:
            continue  # dims regrouped: no dim survives
        if len(after_dims) == 1:
            target = after_dims[0]  # kept, or merged into one dim that now holds the batch
        else:
            target = max(after_dims, key=lambda e: (after[e], -e))  # split: the largest piece
        out.update((p, target) for p, d in source if d in before_dims)
    return frozenset(out)


def _bitcast(source: Pairs, before: Shape, after: Shape) -> Pairs:
    """A bitcast reshapes the physical (major-to-minor) dims: it may also transpose the logical ones."""
    major_before, major_after = _major_to_minor(before), _major_to_minor(after)
    if major_before is None or major_after is None:
        return _reshape(source, before.dims, after.dims)
    physical = frozenset((p, major_before.index(d)) for p, d in source if d in major_before)
    moved = _reshape(physical, tuple(before.dims[d] for d in major_before), tuple(after.dims[d] for d in major_after))
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
