"""replicated-large-parameter: a large entry parameter left fully replicated."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.graph.sharding import layout
from hlo_doctor.hlo.ir import HloModule, Instruction
from hlo_doctor.rules._batch import buffer_donors
from hlo_doctor.rules._suggest import argument_name, parameter_code, python_identifier
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.units import format_bytes


@dataclass(frozen=True, slots=True)
class ReplicatedLargeParameterOptions:
    min_bytes: int = 1024 * 1024
    """Only parameters of at least this many bytes (the whole value) are judged."""


class ReplicatedLargeParameter(Rule):
    """A large entry parameter is fully replicated while comparable parameters are sharded.

    **What it finds**

    An entry parameter of at least ``min_bytes`` whose sharding after
    propagation is replicated on every device, in a module where at least
    one other parameter of at least ``min_bytes`` is sharded (so the program
    does shard its weights, FSDP-style, and this one was missed). Scalars are
    never judged (torch_xla passes Python scalars as replicated ``f32[]``
    parameters), and in a torch_xla training step only the weights (the
    header's ``buffer_donor`` entries) are.

    **Why it hurts**

    Every device keeps the whole tensor, its gradient and its optimizer
    state: ``(1 - 1/n)`` of that memory is wasted on each of the *n* devices.
    Because nothing ever needs to all-gather it, the program runs without
    any visible communication cost, so it goes unnoticed until memory runs out.

    **Example**

    ```
    %w_in.0 = f32[512,2048] parameter(1), sharding={devices=[4,1]<=[4]}
    %unembed.0 = f32[512,8192] parameter(3), sharding={replicated}
    ```

    **Fix**

    Shard it like the other weights: over the FSDP axis, on its largest
    dimension that the axis size divides.

    ```python
    # JAX
    unembed = jax.device_put(unembed, NamedSharding(mesh, P('fsdp', None)))
    # torch_xla
    xs.mark_sharding(model.unembed.weight, mesh, ('fsdp', None))
    ```

    **Options**

    * ``min_bytes`` (int, default 1048576): only parameters at least this
      big are flagged, and only sharded parameters at least this big count
      as comparable.
    """

    id = "replicated-large-parameter"
    severity = Severity.WARNING
    reads = frozenset({"sharded"})
    summary = "A large parameter is fully replicated while comparable parameters are sharded."
    Options = ReplicatedLargeParameterOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.after_propagation or ctx.before_optimizations
        if module is None or module.entry is None:
            raise RuleSkipped("no snapshot with propagated shardings (after propagation or before optimizations)")
        n = ctx.num_partitions
        if n <= 1:
            return
        params = module.entry.parameters()
        donors = buffer_donors(ctx)
        if donors:
            params = [p for p in params if p.parameter_number in donors]
        replicated: list[Instruction] = []
        sharded: list[tuple[Instruction, tuple[int, ...]]] = []
        for param in params:
            sharding = param.sharding
            shape = param.shape
            if sharding is None or shape.is_tuple or sharding.is_tuple or shape.rank == 0:
                continue
            if shape.byte_size < self.options.min_bytes:
                continue
            try:
                lay = layout(sharding, shape, n)
            except ValueError:
                continue
            if lay.is_replicated:
                replicated.append(param)
            elif lay.num_shards > 1 and not lay.is_manual:
                sharded.append((param, lay.tiles_per_dim))
        if not replicated or not sharded:
            return
        shard_count, axes = _weight_axes(ctx, sharded)
        for param in replicated:
            yield self._finding(ctx, module, param, sharded, shard_count, axes)

    def _finding(self, ctx, module: HloModule, param, sharded, shard_count, axes) -> Finding:
        shape = param.shape
        name = argument_name(param)
        dims = sorted(range(shape.rank), key=lambda d: (-shape.dims[d], d))
        dim = next((d for d in dims if shape.dims[d] % shard_count == 0), None)
        per_device = shape.byte_size // shard_count if shard_count else shape.byte_size
        spec: list = [None] * shape.rank
        axis_names = tuple(axes) if axes else (f"<axis of size {shard_count}>",)
        if dim is not None:
            spec[dim] = axis_names
        jax_code, torch_code = parameter_code(spec, python_identifier(name))
        examples = ", ".join(argument_name(p) for p, _ in sharded[:3])
        anchor = _partitioned_param(ctx, param) or param
        message = (
            f"parameter {name} ({shape}, {format_bytes(shape.byte_size)}) is replicated on all {ctx.num_partitions} devices "
            f"while {len(sharded)} comparable parameter{'s are' if len(sharded) != 1 else ' is'} sharded "
            f"({examples}); sharding it {shard_count} ways would save {format_bytes(shape.byte_size - per_device)} per device"
        )
        if dim is None:
            summary = (f"Shard {name} over {'/'.join(axis_names)}: no dimension divides by {shard_count}, "
                       "so pad one or pick an axis that divides it.")
        else:
            summary = f"Shard {name} on dimension {dim} (size {shape.dims[dim]}) over {'/'.join(axis_names)}, like the other weights."
        return self.finding(
            ctx,
            message,
            instruction=anchor,
            related=(param.name, *(p.name for p, _ in sharded[:5])),
            source_from=_first_user_with_source(ctx, module, param),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code),
            evidence={
                "bytes": shape.byte_size,
                "bytes_per_device_if_sharded": per_device,
                "bytes_saved_per_device": shape.byte_size - per_device,
                "num_partitions": ctx.num_partitions,
                "shards_suggested": shard_count,
                "comparable_sharded_parameters": len(sharded),
                "suggested_dim": -1 if dim is None else dim,
            },
        )


def _weight_axes(ctx: RuleContext, sharded) -> tuple[int, tuple[str, ...] | None]:
    """The shard count the other weights use on their sharded dim, and its mesh axes."""
    counts: dict[int, int] = {}
    for _, tiles in sharded:
        for t in tiles:
            if t > 1:
                counts[t] = counts.get(t, 0) + 1
    shard_count = max(counts, key=lambda c: (counts[c], c)) if counts else ctx.num_partitions
    mesh = ctx.mesh
    axes = None
    if mesh is not None:
        fsdp = mesh.fsdp_axes()
        if fsdp and math.prod(mesh.axis_size(a) for a in fsdp) == shard_count:
            axes = fsdp
        else:
            axes = mesh.axes_for(shard_count)
        # torch_xla meshes like ('fsdp', 'replica') with replica=1: name both, as users write them
        if axes and len(axes) == 1 and len(mesh.axis_names) > 1 and mesh.num_devices == shard_count:
            axes = mesh.axis_names if all(
                s == 1 for a, s in zip(mesh.axis_names, mesh.axis_sizes) if a not in axes
            ) else axes
    return shard_count, axes


def _partitioned_param(ctx: RuleContext, param: Instruction) -> Instruction | None:
    module = ctx.partitioned
    if module is None or module.entry is None:
        return None
    for candidate in module.entry.parameters():
        if candidate.parameter_number == param.parameter_number:
            return candidate
    return None


def _first_user_with_source(ctx: RuleContext, module: HloModule, param: Instruction) -> Instruction:
    entry = module.entry
    if ctx.user_source(param)[0] is not None or entry is None:
        return param
    frontier = {param.name}
    for _ in range(4):  # follow a few copies/reshapes to the first op with a user line
        users = [i for i in entry.instructions if frontier.intersection(i.operands)]
        for user in users:
            if ctx.user_source(user)[0] is not None:
                return user
        frontier = {u.name for u in users}
        if not frontier:
            break
    return param




