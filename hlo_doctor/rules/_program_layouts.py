"""The layouts a program asks for with its own sharding constraints (for ``non-batch-dim-sharding``).

A matmul whose batch dim is whole while another dim is split over the batch's
axes is the partitioner's doing only when nothing in the program asked for
that move. A constraint that puts the batch's axes on the sequence dim
(``P(None, 'data', None)`` on ``[B, S, D]``), or a link of a chain of
constraints that move them dim to dim, is the program's own layout:
propagation carries it to the matmuls around it (and JAX constrains the
cotangent of a constrained value alike, so the backward matmuls take it too).
Such a move is judged at the constraints (``reshard-churn`` when they
disagree), not at every matmul it reaches.

A move is (the mesh axes of the batch input that sit on another dim, whether
one of those dims carries a weight's dim): what a constraint asks for and what
a matmul shows are compared by it, since a reshape between them (heads split
off the hidden dim) renumbers the dims but keeps the axes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.graph.sharding import tiles_per_dim
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction, Sharding, ShardingKind
from hlo_doctor.program.records import sharding_call_of
from hlo_doctor.semantics.batch_dims import BatchAnalysis

__all__ = ["BatchMove", "LostBatch", "batch_move", "carry_losing_batch", "constraint_layouts", "dot_losing_batch",
           "is_program_constraint", "lookup_losing_batch", "program_constraints", "requested_batch_moves", "tiles"]

BatchMove = tuple[frozenset[str], bool]
"""The batch input's axes that sit on other dims of a value, and whether one of those dims is a feature dim."""

_CHAIN_STEPS = 6


def is_program_constraint(instruction: Instruction) -> bool:
    """A sharding constraint of the program in the propagated module: its ``with_sharding_constraint``
    or ``mark_sharding`` (which GSPMD's propagation leaves as a copy with torch_xla's op type)."""
    if sharding_call_of(instruction) is not None:
        return True
    metadata = instruction.metadata
    return instruction.opcode == "copy" and metadata is not None and metadata.op_type == "xla__custom_sharding"


def program_constraints(module: HloModule, analysis: BatchAnalysis) -> list[tuple[Computation, Instruction]]:
    """The program's own sharding constraints on values that carry the batch."""
    return [(computation, instruction) for computation in module.computations
            for instruction in computation.instructions
            if is_program_constraint(instruction) and not instruction.shape.is_tuple and instruction.operands
            and analysis.batch_dims((computation.name, instruction.name))]


def constraint_layouts(module: HloModule, analysis: BatchAnalysis, mesh: Mesh
                       ) -> Iterator[tuple[tuple[frozenset[str], ...], dict[int, int]]]:
    """Each of the program's constraints on values that carry the batch (:func:`program_constraints`)
    whose layout reads: the axes on each of its dims, and its batch dims (dim -> the batch input)."""
    for computation, constraint in program_constraints(module, analysis):
        layout = axes_per_dim(constraint, mesh)
        if layout is not None:
            yield layout, analysis.batch_dims((computation.name, constraint.name))


def axes_per_dim(instruction: Instruction, mesh: Mesh) -> tuple[frozenset[str], ...] | None:
    """The mesh axes that split each dim of ``instruction`` (empty for a whole dim), or None."""
    sharding = instruction.sharding
    if sharding is None or instruction.shape.is_tuple:
        return None
    if sharding.kind is ShardingKind.REPLICATED:
        return (frozenset(),) * instruction.shape.rank
    if sharding.kind is not ShardingKind.TILED:
        return None
    try:
        per_dim = dim_axes(sharding, instruction.shape.rank, mesh)
    except (ValueError, KeyError):
        return None
    return None if per_dim is None else tuple(frozenset(a.split(":(")[0] for a in axes) for axes in per_dim)


def batch_move(analysis: BatchAnalysis, key: tuple[str, str], batch_dim: int,
               features: Mapping[tuple[str, str], set[int]], mesh: Mesh) -> BatchMove | None:
    """Where the value ``key`` holds the axes its batch input is split over, when its batch dim
    ``batch_dim`` is whole and another dim is split over some of them; else None."""
    if key not in analysis.graph:
        return None
    value = analysis.graph.instruction(key)
    param = analysis.batch_dims(key).get(batch_dim)
    source = analysis.inputs.get(param) if param is not None else None
    layout = axes_per_dim(value, mesh)
    source_layout = axes_per_dim(source, mesh) if source is not None else None
    if layout is None or not source_layout or batch_dim >= len(layout) or layout[batch_dim]:
        return None
    axes = source_layout[0]
    moved = [d for d, split in enumerate(layout) if d != batch_dim and split & axes]
    if not moved:
        return None
    return frozenset().union(*(layout[d] & axes for d in moved)), bool(set(moved) & set(features.get(key, ())))


def requested_batch_moves(analysis: BatchAnalysis, constraints: list[tuple[Computation, Instruction]],
                          features: Mapping[tuple[str, str], set[int]], mesh: Mesh) -> set[BatchMove]:
    """The moves the program's ``constraints`` ask for: onto rows or a sequence, and, by a link of a
    chain of constraints (one that takes a value another constraint moved), onto features as well.
    A lone constraint onto features is not here: it is judged itself."""
    found = set()
    for computation, constraint in constraints:
        key = (computation.name, constraint.name)
        for batch_dim in analysis.batch_dims(key):
            move = batch_move(analysis, key, batch_dim, features, mesh)
            if move is not None and (not move[1] or _chain_link(computation, constraint)):
                found.add(move)
    return found


def _chain_link(computation: Computation, constraint: Instruction) -> bool:
    """Whether ``constraint`` takes, through a few single-operand ops, the value of another of the
    program's constraints that changed its operand's layout (torch_xla's mark leaves two copies, the
    first with its operand's own sharding: that one changes nothing)."""
    name = constraint.operands[0] if constraint.operands else None
    for _ in range(_CHAIN_STEPS):
        op = computation.get(name) if name is not None else None
        if op is None or len(op.operands) != 1:
            return False
        if is_program_constraint(op):
            before = computation.get(op.operands[0])
            return (before is not None and not _same_layout(op.sharding, constraint.sharding)
                    and not _same_layout(before.sharding, op.sharding))
        name = op.operands[0]
    return False


def _same_layout(first: Sharding | None, second: Sharding | None) -> bool:
    """Whether two shardings place the value alike (their metadata aside)."""
    if first is None or second is None:
        return first is second
    return (first.kind, first.tile_assignment, first.last_tile_dim_replicate, first.last_tile_dims) == (
        second.kind, second.tile_assignment, second.last_tile_dim_replicate, second.last_tile_dims)


def dot_losing_batch(analysis: BatchAnalysis, computation: str, dot: Instruction
                     ) -> tuple[int, int, list[int], Instruction, int, int] | None:
    """A matmul of the propagated module that loses the batch: its result leaves a batch dim whole and
    splits another dim, while an operand brings that batch dim in split. Returns (the result's batch
    dim, the batch input's parameter number, the split dims, that operand, its batch dim, its shards)."""
    key = (computation, dot.name)
    batch_dims = analysis.batch_dims(key)
    if not batch_dims:
        return None  # its sharding is not even read
    out_tiles = tiles(dot.sharding, dot.shape.rank)
    if out_tiles is None:
        return None
    for dim, param in batch_dims.items():
        if out_tiles[dim] != 1:
            continue
        sharded = [d for d, t in enumerate(out_tiles) if t > 1 and d != dim]
        if not sharded:
            continue
        # the operand that carries this batch dim in, batch-sharded
        for operand_name in dot.operands[:2]:
            okey = (computation, operand_name)
            operand = analysis.graph.instruction(okey)
            in_dims = [d for d, p in analysis.batch_dims(okey).items() if p == param]
            in_tiles = tiles(operand.sharding, operand.shape.rank) if not operand.shape.is_tuple else None
            if in_tiles is None:
                continue
            for in_dim in in_dims:
                if in_tiles[in_dim] > 1:
                    return dim, param, sharded, operand, in_dim, in_tiles[in_dim]
    return None


def tiles(sharding: Sharding | None, rank: int) -> tuple[int, ...] | None:
    """The number of shards of each dim of a tiled or replicated value, else None."""
    if sharding is None or sharding.kind is ShardingKind.TUPLE:
        return None
    if sharding.kind not in (ShardingKind.TILED, ShardingKind.REPLICATED):
        return None
    try:
        return tiles_per_dim(sharding, rank)
    except ValueError:
        return None


# Where a value loses batch axes: (its batch dim, the batch input's parameter number, the dims split over
# the dropped axes, the value that brings the batch in, its batch dim, the dropped axes).
LostBatch = tuple[int, int, list[int], Instruction, int, frozenset[str]]


def lookup_losing_batch(analysis: BatchAnalysis, computation: str, lookup: Instruction, mesh: Mesh
                        ) -> LostBatch | None:
    """An embedding lookup (a ``gather`` from a table by batch-derived indices) of the propagated module
    that loses the batch from some axes: its result splits a batch dim over fewer axes than its indices
    bring it in on, and another dim over the axes it dropped (propagation followed the table's sharding).
    Returns (the result's batch dim, the batch input's parameter number, the dims split over the dropped
    axes, the indices, their batch dim, the dropped axes)."""
    if lookup.opcode != "gather" or lookup.shape.is_tuple or len(lookup.operands) < 2:
        return None
    key = (computation, lookup.name)
    if not analysis.batch_dims(key) or analysis.batch_dims((computation, lookup.operands[0])):
        return None  # no batch in it, or the table itself derives from the batch
    return _dropping(analysis, computation, lookup, analysis.graph.instruction((computation, lookup.operands[1])),
                     mesh)


def carry_losing_batch(analysis: BatchAnalysis, computation: Computation, carry: Instruction, mesh: Mesh
                       ) -> LostBatch | None:
    """A loop's carry (a ``get-tuple-element`` of a ``while``) that loses the batch from some axes: it
    splits a batch dim over fewer axes than its initial value (that element of the loop's input tuple)
    brings it in on, and another dim over the axes it dropped (propagation took the carry's layout from
    the loop body: the weights' sharding). Returns as :func:`lookup_losing_batch`, with the initial value."""
    if carry.opcode != "get-tuple-element" or carry.shape.is_tuple or not carry.operands:
        return None
    loop = computation.get(carry.operands[0])
    start = computation.get(loop.operands[0]) if loop is not None and loop.opcode == "while" and loop.operands else None
    index = carry.attribute("index")
    if start is None or start.opcode != "tuple" or index is None or not index.isdigit() \
            or int(index) >= len(start.operands):
        return None
    initial = computation.get(start.operands[int(index)])
    if initial is None or initial.shape.is_tuple:
        return None
    return _dropping(analysis, computation.name, carry, initial, mesh)


def _dropping(analysis: BatchAnalysis, computation: str, value: Instruction, source: Instruction, mesh: Mesh
              ) -> LostBatch | None:
    """Where ``value`` splits a batch dim of ``source`` over fewer axes than ``source`` does, and another
    dim over the axes it dropped."""
    out = axes_per_dim(value, mesh)
    given = axes_per_dim(source, mesh) if not source.shape.is_tuple else None
    if out is None or given is None:
        return None
    for dim, param in analysis.batch_dims((computation, value.name)).items():
        for in_dim, in_param in analysis.batch_dims((computation, source.name)).items():
            if in_param != param or dim >= len(out) or in_dim >= len(given):
                continue
            dropped = given[in_dim] - out[dim]
            split = [d for d, axes in enumerate(out) if d != dim and axes & dropped]
            if dropped and split:
                return dim, param, split, source, in_dim, frozenset(dropped)
    return None
