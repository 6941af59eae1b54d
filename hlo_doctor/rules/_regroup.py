"""The batch regrouped off a mesh axis in the middle of the graph (for ``replicated-batch``).

The data input is split over axes A and B; a constraint later in the graph (a
``with_sharding_constraint``, a ``mark_sharding``, FSDPv2's default
``shard_output``) puts the batch dim on A alone, so every matmul after it runs
on the rows of A's shard: the devices along B compute the same data from there
on. In the propagated module that shows as activation matmuls whose result and
contracting dims are not split over B although the input is.

Where it happens is the constraint: the first op that XLA marks as a sharding
constraint (GSPMD's ``custom-call`` to ``Sharding``, Shardy's ``copy`` named
``.../sharding_constraint``) whose sharding leaves B out while the batch input
reaches it. A matmul before it keeps the split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hlo_doctor.findings import SourceEdit
from hlo_doctor.graph.dataflow import DataflowGraph
from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.hlo.ir import HloModule, Instruction, ShardingKind
from hlo_doctor.program.levers import with_lever
from hlo_doctor.program.spec_sites import spec_site
from hlo_doctor.program.suggest import constraint_code, constraint_edit, jax_spec, with_user_variable
from hlo_doctor.program.torch_levers import torch_input_marks, torch_static_marks
from hlo_doctor.rules._batch import batch_input, parameter_name, with_torch_source
from hlo_doctor.rules.base import Finding, Rule, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics import ACTIVATION_ROLES
from hlo_doctor.semantics.batch_dims import BatchAnalysis
from hlo_doctor.semantics.parameters import EntryParameters, updates_of

__all__ = ["Regroup", "regroup_site", "regrouped_batch", "torch_batch_lever"]


_SYMPTOM_ROLES = ACTIVATION_ROLES | {"reshard"}


class RepeatedAxis(Protocol):
    """An axis along which activation matmuls repeat (``replicated_batch._Axis``)."""

    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def flops(self) -> float: ...
    @property
    def dots(self) -> tuple[tuple[str, Instruction], ...]: ...


@dataclass(frozen=True, slots=True)
class Regroup:
    """The constraint that takes the batch off ``axis``: its computation, the op and its batch dim."""

    computation: str
    constraint: Instruction
    batch_dim: int
    spec: tuple[tuple[str, ...], ...]  # its sharding per dim, as mesh axes


def is_constraint(instruction: Instruction) -> bool:
    """A sharding constraint of the user's program, as XLA's dump writes it."""
    if instruction.opcode == "custom-call":
        return (instruction.attribute("custom_call_target") or "").strip('"') in ("Sharding", "xla.sdy.ShardingConstraint")
    op_name = instruction.metadata.op_name if instruction.metadata is not None else ""
    return instruction.opcode == "copy" and (op_name or "").rsplit("/", 1)[-1] == "sharding_constraint"


def regroup_site(module: HloModule, graph: DataflowGraph, params: EntryParameters, mesh: Mesh, axis: str,
                 batch_axes: set[str], batch: BatchAnalysis | None = None) -> Regroup | None:
    """The first constraint (program order) that the batch input reaches and that puts the batch dim
    on other batch axes, or on none (replicated), but not on ``axis``: where the batch leaves ``axis``.

    The batch dim is the constraint's dim that carries a data input's dim 0 (``batch``, followed
    through the propagated module); without it, the dim that a constraint shards over other batch axes.
    """
    data_mask = params.data_mask()
    entry = module.entry
    weights = {p.name: p for p in entry.parameters() if p.parameter_number in params.weights} if entry else {}
    for computation, instruction in module.instructions():
        if not is_constraint(instruction) or instruction.shape.is_tuple or instruction.shape.rank < 1:
            continue
        sharding = instruction.sharding
        if sharding is None or sharding.kind not in (ShardingKind.TILED, ShardingKind.REPLICATED):
            continue
        node = graph.id_of((computation.name, instruction.name))
        if node is None or not graph.parameter_bits(node) & data_mask:
            continue
        rank = instruction.shape.rank
        if sharding.kind is ShardingKind.REPLICATED:
            spec: tuple[tuple[str, ...], ...] = tuple(() for _ in range(rank))
        else:
            try:
                per_dim = dim_axes(sharding, rank, mesh)
            except (ValueError, KeyError):
                continue
            if per_dim is None:
                continue
            spec = tuple(tuple(a.split(":(")[0] for a in dims) for dims in per_dim)
        if any(axis in dims for dims in spec):
            continue
        tracked = batch.batch_dims((computation.name, instruction.name)) if batch is not None else {}
        batch_dim: int | None
        if tracked:
            batch_dim = min(tracked)
        elif computation is entry and updates_of(computation, instruction, weights):
            continue  # the step's new weight (w - lr * g), placed over the FSDP axis: no batch in it
        elif sharding.kind is ShardingKind.TILED:
            batch_dim = next((d for d, dims in enumerate(spec) if set(dims) & batch_axes), None)
            if batch_dim is None:
                continue
        else:
            continue
        return Regroup(computation.name, instruction, batch_dim, spec)
    return None


def regrouped_batch(rule: Rule, ctx: RuleContext, module: HloModule, graph: DataflowGraph,
                    params: EntryParameters, mesh: Mesh, batch_axes: set[str], repeated: RepeatedAxis,
                    activation_flops: float, batch: BatchAnalysis) -> Finding | None:
    """The finding for a batch split over ``repeated.name`` at the input and regrouped off it later;
    ``batch``: the batch dim of each value of the propagated ``module`` (:attr:`RuleContext.propagated_batch`)."""
    largest = batch_input(module, params)
    if largest is None or not repeated.dots:
        return None
    input_name = parameter_name(ctx, largest, with_shape=False)
    site = regroup_site(module, graph, params, mesh, repeated.name, batch_axes, batch)
    if site is None:
        return None  # no constraint of the program's regroups it: XLA's own choice, for the batch-traffic rules
    _, top = repeated.dots[0]
    combined = tuple(a for a in mesh.axis_names if a in batch_axes)
    others = tuple(a for a in combined if a != repeated.name)
    share = repeated.flops / activation_flops
    axis = repr(repeated.name)
    old = site.spec
    kept_axes = old[site.batch_dim]
    where = (f"the sharding constraint {site.constraint.name} ({site.constraint.shape}) puts its batch dim "
             f"{site.batch_dim} on {'/'.join(repr(a) for a in kept_axes)} alone" if kept_axes else
             f"the sharding constraint {site.constraint.name} ({site.constraint.shape}) leaves its batch dim "
             f"{site.batch_dim} on no mesh axis")
    anchor, anchor_computation = site.constraint, site.computation
    batch_dim = site.batch_dim
    new: list[tuple[str, ...] | None] = [dims or None for dims in old]
    new[batch_dim] = combined
    message = (
        f"the batch is regrouped off mesh axis {axis} mid-graph: the batch input {input_name} "
        f"({largest.shape}) is split over {'/'.join(repr(a) for a in combined)}, but {where}, so "
        f"{share:.0%} of the matmul FLOPs on activations repeat along {axis}: its {repeated.size} devices "
        f"compute the same rows from there on (e.g. {top.name} {top.shape}, "
        + (f"split over {'/'.join(repr(a) for a in others)} only)" if others else "on every row of the batch)")
    )
    jax_code, torch_code = constraint_code(new, "h")
    summary = (
        f"Keep the batch dim on {'/'.join(repr(a) for a in combined)} there, as at the input ({jax_spec(new)}): "
        f"the matmuls after it then take 1/{repeated.size} of today's rows per device; it moves nothing new "
        "(the batch is already split this way when it arrives)."
    )
    # the activation traffic over the axis, and the reshards of the regrouped rows, are the regroup's
    # symptoms (per-device collective names)
    traffic = tuple(r.facts.instruction for r in ctx.semantics.roles if r.role in _SYMPTOM_ROLES
                    and repeated.name in {a.split(":(")[0] for a in r.facts.op.mesh_axes or ()})
    partitioned = ctx.partitioned_names([(anchor_computation, anchor.name)])
    finding = rule.finding(
        ctx, message, instruction=anchor, name=partitioned.get((anchor_computation, anchor.name)),
        source_from=anchor,
        related=(*traffic, *(d.name for _, d in repeated.dots[:6] if d is not anchor)),
        suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code,
                              edits=constraint_edit(new, ctx.framework, "h")),
        evidence={
            "replicated_axes": [repeated.name],
            "redundancy_factor": repeated.size,
            "batch_axes": sorted(batch_axes),
            "regrouped": True,
            "batch_input": input_name,
            "constraint": site.constraint.name,
            "constraint_spec": [list(d) for d in old],
            "repeated_flops_fraction": round(share, 4),
            "repeated_matmuls": len(repeated.dots),
        },
    )
    finding = with_torch_source(ctx, finding, module, anchor)
    if ctx.framework == "torch_xla":
        return torch_batch_lever(ctx, finding, new, others)
    finding = with_user_variable(finding, "h")
    source = finding.source
    if source is None or finding.suggestion is None:
        return finding
    written = tuple(dims or None for dims in old)  # as the program writes it: P('fsdp', None, None)
    respec = spec_site(source.file, source.line, written)
    if respec is None:
        return finding
    edit = SourceEdit("respec", ctx.framework or "jax", spec=tuple(new), old_spec=written, file=source.file,
                      line=respec.line)
    return dataclasses.replace(finding, suggestion=dataclasses.replace(finding.suggestion, edits=(edit,)))


def torch_batch_lever(ctx: RuleContext, finding: Finding, spec: Sequence, batch_axes: tuple[str, ...]) -> Finding:
    """The batch sharding where a torch_xla program sets it: the marks on the model's inputs (from
    the runner's record) or, on a dump made without the runner, the program's own marks and FSDPv2
    ``shard_output`` read from its source."""
    lever = torch_input_marks(ctx.dump.run_record, list(spec))
    if lever is None and not ctx.dump.run_record:
        levers = [found for program in ctx.program_files
                  for found in [torch_static_marks(program, list(spec), batch_axes)] if found is not None]
        lever = levers[0] if len(levers) == 1 else None
    return with_lever(finding, lever, ctx.framework)
