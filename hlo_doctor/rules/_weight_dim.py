"""Which dim of a replicated weight to shard: read from how the program uses it.

Any dim that divides saves the same memory, but not the same traffic, and a wrong
one creates a new problem (an activation split on its features, reshards):

* FSDP: the activation that meets the weight in its matmul is split over the
  weight's mesh axes (the batch is). The weight is gathered before use; split
  on its **contracting** dim, propagation cannot hand the axis to the output's
  features (split on its free dim, the logits of an unembedding come out split
  over the vocabulary with the batch whole).
* Tensor parallelism (the activation is not split over the weight's axes): the
  Megatron pairing, read from the weight's forward matmul (the earliest in the
  module). A matmul whose result flows, through elementwise ops only and not
  normalized on the way (no ``reduce`` of it), into another matmul is the first
  of a pair: split its **free** dim (column parallel); the matmul that ends the
  pair splits its **contracting** dim (row parallel), so the pair needs one
  all-reduce.

The weight's uses are followed through layout ops (convert, copy, bitcast,
transpose, with the dims permuted) to the dots that read it.
"""

from __future__ import annotations

from collections.abc import Sequence

from hlo_doctor.graph.dataflow import DataflowGraph, NodeKey
from hlo_doctor.graph.dots import dot_dims
from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.hlo.ir import Instruction
from hlo_doctor.semantics.opclasses import NOT_ELEMENTWISE

__all__ = ["weight_shard_dim"]

_SAME_DIMS = frozenset({"convert", "copy", "bitcast-convert", "optimization-barrier"})
_MAX_STEPS = 64


def weight_shard_dim(graph: DataflowGraph, param: Instruction, shape: Sequence[int], axes: Sequence[str],
                     shards: int, mesh: Mesh | None) -> int | None:
    """The dim of ``param`` (global ``shape``) to split ``shards`` ways over ``axes``, or None when
    its uses do not decide (no dot reads it, or the dim they prefer does not divide)."""
    try:
        start = graph.entry_key(param.name)
    except KeyError:
        return None
    votes: dict[int, int] = {}
    uses = _dot_uses(graph, start, len(shape))
    # The forward matmul is the earliest in the module's text (topological order); the backward
    # pass reads the weight again in dots whose contracting dim is the forward's free one.
    uses = sorted(uses, key=lambda u: graph.instruction(u[0]).position.line)[:1]
    for dot_key, operand, dims in uses:
        dot = graph.instruction(dot_key)
        operands = [graph.instruction(k) for k, _ in graph.producers(dot_key)]
        if len(operands) < 2 or dot.opcode != "dot":
            continue
        lhs, rhs = dot.operands[0], dot.operands[1]
        by_name = {o.name: o for o in operands}
        if lhs not in by_name or rhs not in by_name:
            continue
        roles = dot_dims(dot, by_name[lhs].shape.rank, by_name[rhs].shape.rank)
        other = by_name[rhs if operand == 0 else lhs]
        contracting = [d for d, od in enumerate(dims) if od is not None
                       and roles.role(operand, od).role == "contracting"]
        free = [d for d, od in enumerate(dims) if od is not None and roles.role(operand, od).role == "free"]
        split_like_weights = bool(_axes_of(other, mesh) & set(axes))
        prefer = contracting if split_like_weights or not _feeds_a_dot(graph, dot_key) else free
        for d in prefer:
            if shape[d] % shards == 0:
                votes[d] = votes.get(d, 0) + 1
    if not votes:
        return None
    return max(votes, key=lambda d: (votes[d], shape[d], -d))


def _axes_of(instruction: Instruction, mesh: Mesh | None) -> set[str]:
    sharding = instruction.sharding
    if sharding is None or mesh is None or instruction.shape.is_tuple:
        return set()
    per_dim = dim_axes(sharding, instruction.shape.rank, mesh)
    return {a for dim in per_dim or () for a in dim}


def _dot_uses(graph: DataflowGraph, start: NodeKey, rank: int) -> list[tuple[NodeKey, int, list[int | None]]]:
    """(dot, operand index, for each weight dim the dot operand's dim) of the dots that read the weight."""
    found = []
    frontier: list[tuple[NodeKey, list[int | None]]] = [(start, list(range(rank)))]
    seen = {start}
    steps = 0
    while frontier and steps < _MAX_STEPS:
        key, dims = frontier.pop()
        steps += 1
        name = graph.instruction(key).name
        for user, _ in graph.consumers(key):
            if user in seen:
                continue
            seen.add(user)
            instruction = graph.instruction(user)
            if instruction.opcode == "dot":
                found.extend((user, i, dims) for i, o in enumerate(instruction.operands[:2]) if o == name)
            elif instruction.opcode in _SAME_DIMS:
                frontier.append((user, dims))
            elif instruction.opcode == "transpose" and instruction.dimensions:
                permutation = list(instruction.dimensions)
                frontier.append((user, [permutation.index(d) if d is not None and d in permutation else None
                                        for d in dims]))
    return found


def _feeds_a_dot(graph: DataflowGraph, dot_key: NodeKey) -> bool:
    """Whether the dot is the first of a pair: its result reaches another dot through elementwise
    and layout ops only, and is not normalized on the way (a ``reduce`` of it: a residual stream
    goes through a norm before the next layer's matmuls, the inside of an MLP does not)."""
    frontier = [dot_key]
    seen = {dot_key}
    steps = 0
    reaches_dot = False
    while frontier and steps < _MAX_STEPS:
        key = frontier.pop()
        steps += 1
        for user, _ in graph.consumers(key):
            if user in seen:
                continue
            seen.add(user)
            opcode = graph.instruction(user).opcode
            if opcode == "reduce":
                return False
            if opcode == "dot":
                reaches_dot = True
            elif opcode not in NOT_ELEMENTWISE:
                frontier.append(user)
    return reaches_dot
