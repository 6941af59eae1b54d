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
end), ``gather`` (index dims to the output's batch dims), batch norms (the
values keep their dims; the per-feature results the ``feature_index`` dim,
the tokens where torch_xla lowers a layer norm over ``[1, B * S, D]``),
tuples, fusions, calls, while loops (to a fixpoint) and async pairs. Up to
the first dots (finding the batch inputs), a vector broadcast along the
rows carries no pairs: a bias's dim that becomes heads folded in with the
batch (``[B, H] -> [B * H]``) is not the attention dot's batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from hlo_doctor.dump import Role
from hlo_doctor.graph.dataflow import NO_NODE, DataflowGraph, NodeKey, set_bits
from hlo_doctor.graph.dim_maps import DOTS
from hlo_doctor.graph.sharding import tiles_per_dim
from hlo_doctor.hlo.ir import HloModule, Instruction, Sharding, ShardingKind
from hlo_doctor.semantics.batch_propagation import (  # noqa: F401 - _Propagation: re-exported (rules/_batch reads it here)
    PairBits,
    Pairs,
    PairValues,
    _Propagation,
)
from hlo_doctor.semantics.view import ModuleView

__all__ = ["BatchAnalysis", "analyze_batch", "analyze_data_batch", "buffer_donors", "contracted_inputs", "gathered_weight_dim", "meets_batch", "parameter_sharding",
           "weight_dims"]

_DONOR = re.compile(r"\(\s*(\d+)\s*,")


@dataclass
class BatchAnalysis:
    """The batch inputs of a module and the batch dims of every value."""

    module: HloModule
    graph: DataflowGraph
    batch_inputs: frozenset[int]
    weights: frozenset[int]  # buffer donors (torch_xla training steps), else empty
    global_batch: dict[int, int]  # batch input -> its global dim-0 size
    values: PairValues  # node id -> its pairs (a frozenset, or a tuple of values for a tuple)
    inputs: dict[int, Instruction]
    # The batch inputs whose dim 0 reaches a matmul as the activation's free dim (all of them,
    # for analyze_batch; a subset of the data inputs for analyze_data_batch).
    matmul_inputs: frozenset[int] = frozenset()

    def batch_dims(self, key: NodeKey) -> dict[int, int]:
        """dim -> the batch input it carries, for an array value (empty: not an activation).

        A dim that carries several batch inputs gives the largest; the dims come in the order of
        the smallest batch input each carries (then by dim): that of the pairs sorted.
        """
        node = self.graph.id_of(key)
        bits = self.values.bits[node] if node is not None else 0
        if not isinstance(bits, int):
            return {}
        coding, mask = self.values.coding, self._batch_mask
        found = []
        for dim, part in coding.blocks(bits):
            part &= mask
            if part:
                found.append(((part & -part).bit_length(), dim, coding.numbers[part.bit_length() - 1]))
        return {dim: param for _, dim, param in sorted(found)}

    @cached_property
    def _batch_mask(self) -> int:
        """The batch inputs' bits in one block of :attr:`values`' coding."""
        return self.values.coding.mask(self.batch_inputs)

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
    weights: frozenset[int] = frozenset(),
) -> BatchAnalysis:
    """Find the batch inputs of ``module`` and follow their batch dim (see the module docstring).

    With ``require_sharded=False`` an unsharded parameter may be a batch input too (used to
    tell data from weights); parameters in ``exclude`` never are. With ``follow=False`` only
    the batch inputs are found (``values`` stay empty). ``weights`` are parameters known to be
    weights (the step updates them): a candidate that meets one of them in a dot on a free dim
    is a batch input on either side of the dot (``w @ x.T``, as a per-example layer under
    ``vmap`` writes it), not only as its lhs.
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
    return _follow_batch(module, graph, candidates, global_batch, donors, follow=follow, weights=weights)


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
    weights: frozenset[int] = frozenset(),
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
        batch = _batch_inputs(graph, first, touched, set(candidates), weights)
    kept = set(candidates) if keep_all else batch
    if follow:
        values, _ = propagation.run({k: v for k, v in seeds.items() if next(iter(v))[0] in kept},
                                    through_dots=True)
    else:
        values = PairValues([0] * (len(graph.instruction_at) + 1), PairBits(()))
    result = BatchAnalysis(module, graph, frozenset(kept), donors,
                           {p: global_batch[p] for p in kept}, values, {p: candidates[p] for p in kept})
    result.matmul_inputs = frozenset(batch)
    return result


def _batch_inputs(graph: DataflowGraph, values: PairValues, touched: list[int], candidates: set[int],
                  weights: frozenset[int] = frozenset()) -> set[int]:
    """The candidates whose pairs reach a dot's lhs on a free or batch dim while the rhs does not
    derive from them; or its rhs so, while the lhs derives from a known weight (``w @ x.T``). Read
    from the bits (one block of parameters per dim), not from decoded sets of pairs: a deep
    activation carries pairs of the data inputs of every layer before it."""
    weight_bits = 0
    for number in weights:
        weight_bits |= 1 << number
    found: set[int] = set()
    instruction_at = graph.instruction_at
    coding, bits = values.coding, values.bits
    numbers = coding.numbers
    for node in touched:
        if len(found) == len(candidates):
            break
        instruction = instruction_at[node]
        if instruction.opcode not in DOTS or len(instruction.operands) < 2:
            continue
        lhs, rhs = graph.operand_ids[node][:2]
        if NO_NODE in (lhs, rhs):
            continue
        roles = graph.dot_dims(node)
        if roles is None:
            continue
        sides = [(lhs, rhs, 0)]
        if weight_bits and graph.parameter_bits(lhs) & weight_bits:
            sides.append((rhs, lhs, 1))
        for side, other, position in sides:
            side_bits = bits[side]
            if side_bits.__class__ is not int or not side_bits:  # a tuple, or no pairs
                continue
            side_roles = roles.roles[position]
            for dim, block in coding.blocks(side_bits):
                if dim >= len(side_roles) or side_roles[dim].role not in ("free", "batch"):
                    continue
                for index in set_bits(block):
                    param = numbers[index]
                    if param not in found and param in candidates and not graph.parameter_bits(other) >> param & 1:
                        found.add(param)
    return found


def contracted_inputs(module: HloModule, graph: DataflowGraph, inputs: frozenset[int]) -> frozenset[int]:
    """The entry parameters in ``inputs`` whose dim 0, followed through every op (dots included),
    reaches some dot or convolution as a contracting dim.

    A forward pass never contracts its batch; a weight's free dim (``w @ x.T`` makes the weight's
    output features the lhs's free dim 0) is contracted by the next layer."""
    if module.entry is None or not inputs:
        return frozenset()
    values, touched = _followed(module, graph, inputs)
    coding, bits = values.coding, values.bits
    found: set[int] = set()
    for node in touched:
        if graph.instruction_at[node].opcode not in DOTS:
            continue
        roles = graph.dot_dims(node)
        if roles is None:
            continue
        for side, operand in enumerate(graph.operand_ids[node][:2]):
            operand_bits = bits[operand] if operand != NO_NODE else 0
            if operand_bits.__class__ is not int or not operand_bits:
                continue
            for dim, block in coding.blocks(operand_bits):
                if dim < len(roles.roles[side]) and roles.role(side, dim).role == "contracting":
                    found.update(coding.numbers[index] for index in set_bits(block))
    return frozenset(found)


def _followed(module: HloModule, graph: DataflowGraph, numbers: frozenset[int], *,
              every_dim: bool = False) -> tuple[PairValues, list[int]]:
    """The pairs of every value from dim 0 (``every_dim``: each dim) of the entry's array parameters
    numbered in ``numbers``, followed through every op (dots included), and the nodes reached."""
    entry = module.entry
    local = graph.computation_ids(entry.name) if entry is not None else {}
    seeds = {local[p.name]: frozenset((p.parameter_number, d) for d in range(p.shape.rank if every_dim else 1))
             for p in (entry.parameters() if entry is not None else ())
             if p.parameter_number in numbers and not p.shape.is_tuple and p.shape.rank >= 1 and p.name in local}
    return _Propagation(graph).run(seeds, through_dots=True)


# Elementwise ops whose operands line up dim by dim: where an input meets the batch on its own dim.
_MEETING = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "select", "compare", "and",
                      "or", "xor", "atan2", "power", "remainder", "clamp"})


def meets_batch(module: HloModule, graph: DataflowGraph, data: frozenset[int],
                candidates: frozenset[int]) -> frozenset[int]:
    """The entry parameters in ``candidates`` whose dim 0, followed through every op, meets the dim 0
    of a parameter in ``data`` on the same dim of an elementwise op, with the same extent (a float
    mask multiplying the per-token loss; a ``[1, S, D]`` position table added to ``[B, S, D]`` does not:
    its dim 0 is one row)."""
    entry = module.entry
    if entry is None or not data or not candidates:
        return frozenset()
    sizes = {p.parameter_number: p.shape.dims[0] for p in entry.parameters()
             if p.parameter_number in data | candidates and not p.shape.is_tuple and p.shape.rank >= 1}
    values, touched = _followed(module, graph, frozenset(sizes))
    coding, bits = values.coding, values.bits
    data_mask, candidate_mask = coding.mask(data), coding.mask(candidates)
    batch_sizes = {sizes[n] for n in data if n in sizes}
    found: set[int] = set()
    for node in touched:
        if graph.instruction_at[node].opcode not in _MEETING:
            continue
        sides = [bits[o] for o in graph.operand_ids[node] if o != NO_NODE]
        sides = [b for b in sides if b.__class__ is int and b]
        if len(sides) < 2:
            continue
        with_data = {dim for side in sides for dim, block in coding.blocks(side) if block & data_mask}
        for side in sides:
            for dim, block in coding.blocks(side):
                if dim not in with_data or not block & candidate_mask or block & data_mask:
                    continue
                for index in set_bits(block & candidate_mask):
                    number = coding.numbers[index]
                    if sizes.get(number) in batch_sizes:
                        found.add(number)
    return frozenset(found)


def weight_dims(module: HloModule, graph: DataflowGraph, weights: frozenset[int],
                keys: list[NodeKey]) -> dict[NodeKey, set[int]]:
    """For each value (by key), its dims that carry a dim of a weight in ``weights``, followed
    through every op (a dot's output features come from its weight operand's free dim): feature
    dims, not rows or a sequence."""
    if module.entry is None or not weights or not keys:
        return {}
    values, _ = _followed(module, graph, weights, every_dim=True)
    found: dict[NodeKey, set[int]] = {}
    for key in keys:
        node = graph.id_of(key)
        found[key] = _carried(values, node) if node is not None else set()
    return found


def _carried(values: PairValues, node: int) -> set[int]:
    """The dims of ``node`` that carry a followed dim."""
    bits = values.bits[node]
    return {dim for dim, _ in values.coding.blocks(bits)} if bits.__class__ is int else set()


def gathered_weight_dim(module: HloModule, graph: DataflowGraph, weights: frozenset[int],
                        gathers: list[NodeKey]) -> dict[NodeKey, bool]:
    """For each all-gather (by key), whether the dim it gathers carries a dim of a weight in
    ``weights``, followed through every op (a dot's output features come from its weight operand's
    free dim): a layer's output put back together on its feature dim, not rows or a sequence."""
    if module.entry is None or not weights or not gathers:
        return {}
    values, _ = _followed(module, graph, weights, every_dim=True)
    found: dict[NodeKey, bool] = {}
    for key in gathers:
        node = graph.id_of(key)
        instruction = graph.instruction_at[node] if node is not None else None
        operands = graph.operand_ids[node] if node is not None else ()
        dims = instruction.dimensions if instruction is not None else None
        if not operands or operands[0] == NO_NODE or not dims:
            found[key] = False
            continue
        found[key] = dims[0] in _carried(values, operands[0])
    return found
