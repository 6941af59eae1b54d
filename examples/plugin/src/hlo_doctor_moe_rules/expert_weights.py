"""expert-weights-not-expert-sharded: MoE expert weights that do not split their experts over the expert axis."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.plugin import (
    Computation,
    Finding,
    Instruction,
    Mesh,
    Rule,
    RuleContext,
    RuleSkipped,
    Severity,
    Suggestion,
    argument_name,
    dim_axes,
    format_bytes,
    jax_spec,
    layout,
    parameter_code,
    python_identifier,
)

# Ops that pass a weight on unchanged in shape (a cast to bf16, a copy).
_SAME_SHAPE = frozenset({"convert", "copy"})


@dataclass(frozen=True, slots=True)
class ExpertWeightsOptions:
    expert_axes: tuple[str, ...] = ("expert", "experts", "ep")
    """Mesh axis names that mean "expert parallelism" (compared case-insensitively)."""
    min_experts: int = 2
    """Only weights with at least this many experts (the leading dim) are judged."""


class ExpertWeightsNotExpertSharded(Rule):
    """MoE expert weights are not sharded on their experts dimension over the expert mesh axis.

    **What it finds**

    An entry parameter of rank 3 or more that is an *expert weight*: its
    leading dimension is a batch dimension of a dot that also contracts
    one of its other dimensions (the per-expert matmul ``etd,edf->etf``),
    in a program whose mesh has an expert axis (named ``expert``,
    ``experts`` or ``ep``). It is flagged when, after sharding propagation,
    that leading experts dimension is not split over the expert axis: the
    weight is replicated, or the axis splits another dimension.

    Modules whose mesh has no expert axis are skipped (``-v`` says so).

    **Why it hurts**

    Expert parallelism works by giving each device group whole experts and
    sending each token to its expert with an all-to-all. A weight sharded
    on another dimension holds a slice of *every* expert on every device,
    so each expert's matmul needs an all-gather of its weight or a
    reduction of partial results; a replicated weight costs every device
    the memory of all experts (and their gradients and optimizer state).

    **Example**

    ```
    %w_in.0 = f32[8,256,512] parameter(2), sharding={devices=[1,1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
    %w_out.0 = f32[8,512,256] parameter(3), sharding={replicated}
    %dot_general.1 = f32[8,256,512] dot(%xe, %w_in.0), lhs_batch_dims={0}, rhs_batch_dims={0}, ...
    ```

    **Fix**

    Shard the experts dimension over the expert axis; keep any other axis
    the weight already uses on its other dims.

    ```python
    # JAX
    w_in = jax.device_put(w_in, NamedSharding(mesh, P('expert', None, None)))
    # torch_xla
    xs.mark_sharding(w_in, mesh, ('expert', None, None))
    ```

    **Options**

    * ``expert_axes`` (list of str, default ``["expert", "experts", "ep"]``):
      the mesh axis names that mean expert parallelism.
    * ``min_experts`` (int, default 2): weights with fewer experts are not judged.
    """

    id = "expert-weights-not-expert-sharded"
    severity = Severity.WARNING
    summary = "MoE expert weights are not sharded on the expert mesh axis."
    Options = ExpertWeightsOptions
    api_version = ">=1.0,<2"
    reads = frozenset({"sharded"})  # API 1.1; an API 1.0 hlo-doctor ignores it

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.sharded
        if module is None or module.entry is None:
            raise RuleSkipped("no snapshot with propagated shardings")
        mesh = ctx.mesh
        if mesh is None or mesh.is_inferred:
            raise RuleSkipped("the mesh axis names are unknown, so no axis can be told apart as the expert axis")
        axis = _expert_axis(mesh, self.options.expert_axes)
        if axis is None:
            raise RuleSkipped(f"{mesh} has no expert axis (named one of {', '.join(self.options.expert_axes)})")
        axis_size = mesh.axis_size(axis)
        entry = module.entry
        users = _users(entry)
        for param in entry.parameters():
            shape = param.shape
            if shape.is_tuple or shape.rank < 3 or param.sharding is None:
                continue
            experts = shape.dims[0]
            if experts < self.options.min_experts or experts % axis_size:
                continue
            dot = _per_expert_dot(param, users)
            if dot is None:
                continue
            axes = dim_axes(param.sharding, shape.rank, mesh)
            if axes is None or axis in axes[0]:
                continue
            yield self._finding(ctx, mesh, param, dot, axes, axis)

    def _finding(self, ctx: RuleContext, mesh: Mesh, param: Instruction, dot: Instruction,
                 axes: tuple[tuple[str, ...], ...], axis: str) -> Finding:
        shape = param.shape
        experts = shape.dims[0]
        name = argument_name(param)
        now = layout(param.sharding, shape, ctx.num_partitions).shard_shape.byte_size
        fixed = [(axis,)] + [tuple(a for a in dim if a != axis) for dim in axes[1:]]
        fixed = [dim if dim else None for dim in fixed]
        shards = math.prod(mesh.axis_size(a) for dim in fixed if dim for a in dim)
        fixed_bytes = shape.byte_size // shards
        current = "replicated" if not any(axes) else f"sharded {jax_spec([d or None for d in axes])}"
        where = [d for d, dim in enumerate(axes) if axis in dim]
        if where:
            detail = f"'{axis}' splits dim {where[0]} instead, so every device holds a slice of all {experts} experts"
        elif any(axes):
            detail = f"every device holds a part of all {experts} experts"
        else:
            detail = f"every device holds all {experts} experts"
        message = (
            f"expert weight {name} ({shape}, {experts} experts) is {current}: its experts dim 0 is not split "
            f"over the expert axis '{axis}' ({mesh.axis_size(axis)}); {detail} "
            f"({format_bytes(now)} per device, {format_bytes(fixed_bytes)} if expert-sharded)"
        )
        jax_code, torch_code = parameter_code(fixed, python_identifier(name, "w"))
        return self.finding(
            ctx,
            message,
            instruction=_partitioned_param(ctx, param) or param,
            source_from=dot,
            related=(param.name, dot.name),
            suggestion=Suggestion(
                summary=(f"Shard {name} on its experts dim over '{axis}', {jax_spec(fixed)}: each device then "
                         f"holds {experts // mesh.axis_size(axis)} whole experts."),
                jax=jax_code,
                torch_xla=torch_code,
            ),
            evidence={
                "num_experts": experts,
                "expert_axis": axis,
                "expert_axis_size": mesh.axis_size(axis),
                "bytes_per_device": now,
                "bytes_per_device_if_expert_sharded": fixed_bytes,
            },
        )


def _expert_axis(mesh: Mesh, names: tuple[str, ...] | list[str]) -> str | None:
    wanted = {n.lower() for n in names}
    for axis, size in zip(mesh.axis_names, mesh.axis_sizes):
        if axis.lower() in wanted and size > 1:
            return axis
    return None


def _users(computation: Computation) -> dict[str, list[Instruction]]:
    users: dict[str, list[Instruction]] = {}
    for instruction in computation.instructions:
        for operand in instruction.operands:
            users.setdefault(operand, []).append(instruction)
    return users


def _dims(text: str | None) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", text or ""))


def _per_expert_dot(param: Instruction, users: dict[str, list[Instruction]]) -> Instruction | None:
    """A dot that batches over ``param``'s dim 0 and contracts another of its dims (through casts/copies)."""
    frontier = [param]
    for _ in range(3):
        following = []
        for value in frontier:
            for user in users.get(value.name, ()):
                if user.opcode == "dot":
                    for side, operand in zip(("lhs", "rhs"), user.operands):
                        if operand != value.name:
                            continue
                        batch = _dims(user.attribute(f"{side}_batch_dims"))
                        contracting = _dims(user.attribute(f"{side}_contracting_dims"))
                        if batch[:1] == (0,) and contracting:
                            return user
                elif user.opcode in _SAME_SHAPE:
                    following.append(user)
        frontier = following
    return None


def _partitioned_param(ctx: RuleContext, param: Instruction) -> Instruction | None:
    module = ctx.partitioned
    if module is None or module.entry is None:
        return None
    for candidate in module.entry.parameters():
        if candidate.parameter_number == param.parameter_number:
            return candidate
    return None




