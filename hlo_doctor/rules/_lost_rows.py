"""Where the partitioner gathers the batch's rows on its own (for ``replicated-batch``).

No constraint of the program asks for it, yet the partitioned module holds
more rows of the batch on each device than the batch input's shard: XLA's
propagation chose a layout that leaves the batch whole somewhere (a scan's
carry split on its features because the weights inside are, an FSDP weight
gradient computed on every row), and the partitioner gathers the rows to get
there. From that collective on, each row is computed by more devices than the
batch split asks for: the same work repeated where the weights are whole, split
on the weights' dims where they are not (and put together again by activation
collectives).

The site is read in the partitioned module, where the rows grow: a collective
(an all-gather, or a collective-permute / all-to-all that hands each device
other rows) whose result holds more rows of a batch input than its shard, on
a dim that carries the batch, while its operand holds no more than the shard.
Of those, the one that reaches the most repeated matmul FLOPs downstream is
where the batch is lost (the first in dataflow order among equals); the other
collectives on the repeated rows are its symptoms. When that one is a plain
all-gather of an activation (not a reshard), the partitioner gathered the
rows for a matmul instead of its weight: ``activation-all-gather`` reports it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hlo_doctor.graph.mesh import Mesh
from hlo_doctor.hlo.ir import HloModule, Instruction
from hlo_doctor.program.suggest import constraint_code, constraint_edit, jax_spec, with_user_variable
from hlo_doctor.rules._batch import activation_matmuls, parameter_name, with_torch_source
from hlo_doctor.rules._program_layouts import constraint_layouts, dot_losing_batch
from hlo_doctor.rules.base import Finding, Rule, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics import ACTIVATION_ROLES
from hlo_doctor.semantics.batch_dims import BatchAnalysis
from hlo_doctor.semantics.opclasses import MATMULS
from hlo_doctor.semantics.parameters import EntryParameters

__all__ = ["RepeatedRows", "RowsLost", "asked_or_judged", "batch_shards", "held_rows", "partitioner_regroup",
           "rows_lost", "rows_repeated"]


_MOVES = ACTIVATION_ROLES | {"reshard"}


@dataclass(frozen=True, slots=True)
class RowsLost:
    """The collective of the partitioned module where the batch's rows grow past the input's shard."""

    computation: str
    collective: Instruction
    batch_dim: int
    parameter: int  # the batch input whose rows grow (its parameter number)
    rows_before: int  # the batch input's shard (rows per device)
    rows_after: int  # rows of the batch each device holds after the collective
    axes: tuple[str, ...]  # the mesh axes the collective moves the rows over
    repeated_flops: float  # per device: the repeated matmuls the collective's rows reach
    dots: tuple[tuple[str, Instruction], ...]  # those matmuls, largest first
    symptoms: tuple[str, ...]  # the other activation collectives on the repeated rows


def held_rows(batch: BatchAnalysis, shards: dict[int, int], computation: str, instruction: Instruction
              ) -> tuple[int, int, int, int] | None:
    """(dim, rows held, the input's shard, the input's parameter number) when ``instruction`` holds more rows of a batch input
    than its shard, up to the whole batch, on a dim that carries it; else None."""
    if instruction.shape.is_tuple:
        return None
    for dim, param in sorted(batch.batch_dims((computation, instruction.name)).items()):
        shard, whole = shards.get(param), batch.global_batch.get(param)
        held = instruction.shape.dims[dim] if dim < instruction.shape.rank else 0
        if shard and whole and shard < held <= whole and whole % held == 0 and held % shard == 0:
            return dim, held, shard, param
    return None


@dataclass(frozen=True, slots=True)
class RepeatedRows:
    """Per device: the activation matmuls' FLOPs, and those of the matmuls whose operands hold more
    rows of the batch than the batch input's shard."""

    device_flops: float
    repeated_flops: float
    dots: tuple[tuple[str, Instruction], ...]  # the repeated matmuls, largest first
    flops: dict[str, float]  # each repeated matmul's FLOPs, by name


def rows_repeated(ctx: RuleContext, params: EntryParameters) -> RepeatedRows:
    """The matmuls whose operands hold more rows of the batch than the batch input's shard (a dim that
    carries the batch, up to the global batch), read where the work happens, in the partitioned module.

    A constraint that regroups the batch can be undone by propagation in the propagated module (its ops
    split again), while the partitioner still all-gathers the rows for a matmul (a weight gradient over
    the whole batch); and the partitioner can gather the rows with no constraint asking (:func:`rows_lost`).
    """
    semantics = ctx.semantics
    module, graph, batch = ctx.per_device, semantics.view.graph, semantics.batch
    entry = module.entry if module is not None else None
    if module is None or entry is None or graph is None or batch is None:
        return RepeatedRows(0.0, 0.0, (), {})
    shards = batch_shards(entry, params)
    total = repeated = 0.0
    found: list[tuple[float, str, Instruction]] = []
    for computation, dot, flops in activation_matmuls(module, graph, params):
        total += flops
        operands = [computation.get(name) for name in dot.operands[:2]]
        if any(o is not None and held_rows(batch, shards, computation.name, o) for o in operands):
            repeated += flops
            found.append((flops, computation.name, dot))
    found.sort(key=lambda f: (-f[0], f[2].name))
    return RepeatedRows(total, repeated, tuple((c, d) for _, c, d in found), {d.name: f for f, _, d in found})


def batch_shards(entry, params: EntryParameters) -> dict[int, int]:  # noqa: ANN001 - a Computation
    """Each data input's rows per device (dim 0 of its per-device shape), by parameter number."""
    return {p.parameter_number: p.shape.dims[0] for p in entry.parameters()
            if p.parameter_number in params.data and not p.shape.is_tuple and p.shape.rank >= 1}


def rows_lost(ctx: RuleContext, params: EntryParameters, repeated: RepeatedRows) -> RowsLost | None:
    """The collective where the batch's rows grow past the input's shard, reaching the most of the
    ``repeated`` matmuls; None when no collective does (the rows were never split, or grow by a computation, not a collective)."""
    semantics = ctx.semantics
    module, graph, batch = ctx.per_device, semantics.view.graph, semantics.batch
    entry = module.entry if module is not None else None
    if module is None or entry is None or graph is None or batch is None:
        return None
    shards = batch_shards(entry, params)
    flops_of = repeated.flops
    dot_ids = {}
    for computation, dot in repeated.dots:
        node = graph.id_of((computation, dot.name))
        if node is not None:
            dot_ids[node] = (computation, dot)
    position = graph.dataflow_position
    candidates: list[tuple[float, int, RowsLost]] = []
    symptoms: list[str] = []
    gathered: set[str] = set()
    for role in semantics.roles:
        if role.role not in _MOVES:
            continue
        facts = role.facts
        body = module.computation(facts.computation)
        instruction = body.get(facts.instruction) if body is not None else None
        if body is None or instruction is None:
            continue
        grown = held_rows(batch, shards, facts.computation, instruction)
        if grown is None:
            continue
        symptoms.append(instruction.name)
        if role.role == "activation-gather":
            gathered.add(instruction.name)
        operands = [body.get(name) for name in instruction.operands]
        if any(o is not None and held_rows(batch, shards, facts.computation, o) for o in operands):
            continue  # the rows were already grown before it: a symptom, not the site
        node = graph.id_of((facts.computation, instruction.name))
        if node is None:
            continue
        reached = sorted((dot_ids[i] for i in graph.reach_ids([node], forward=True) if i in dot_ids),
                         key=lambda d: (-flops_of.get(d[1].name, 0.0), d[1].name))
        if not reached:
            continue
        dim, held, shard, param = grown
        axes = tuple(dict.fromkeys(a.split(":(")[0] for a in facts.op.mesh_axes or ()))
        found = RowsLost(facts.computation, instruction, dim, param, shard, held, axes,
                         sum(flops_of.get(d.name, 0.0) for _, d in reached), tuple(reached), ())
        candidates.append((-found.repeated_flops, position[node], found))
    if not candidates:
        return None
    best = min(candidates, key=lambda c: (c[0], c[1]))[2]
    if best.collective.name in gathered:
        return None  # an activation all-gathered for a matmul instead of its weight: activation-all-gather's
    others = tuple(name for name in dict.fromkeys(symptoms) if name != best.collective.name)
    return dataclasses.replace(best, symptoms=others)


def partitioner_regroup(rule: Rule, ctx: RuleContext, params: EntryParameters, mesh: Mesh,
                        batch_axes: set[str], repeated: RepeatedRows) -> Finding | None:
    """The finding for rows of the batch the partitioner gathers with no constraint asking: at the
    collective where they grow (:func:`rows_lost`), its fix a constraint that keeps them split there."""
    lost = rows_lost(ctx, params, repeated)
    module = ctx.per_device
    if lost is None or module is None:
        return None
    entry = module.entry
    grown = next((p for p in entry.parameters() if p.parameter_number == lost.parameter), None) if entry else None
    if grown is None:
        return None
    input_name = parameter_name(ctx, grown, with_shape=False)
    combined = tuple(a for a in mesh.axis_names if a in batch_axes)
    factor = lost.rows_after // lost.rows_before
    share = lost.repeated_flops / repeated.device_flops
    _, top = lost.dots[0]
    collective = lost.collective
    over = "/".join(repr(a) for a in lost.axes) or "its group"
    message = (
        f"the partitioner puts more of the batch's rows on each device mid-graph with no constraint of the program "
        f"asking: the batch input {input_name} is split over {'/'.join(repr(a) for a in combined)} "
        f"({_rows(lost.rows_before)} per device), but {collective.opcode} {collective.name} ({collective.shape}) puts {_rows(lost.rows_after)} on each "
        f"device along its dim {lost.batch_dim} (over {over}), so {share:.0%} of the matmul FLOPs per device take "
        f"{factor}x the rows of the device's shard from there on (e.g. {top.name} {top.shape}): each row is "
        "computed by more devices than the batch split asks for, repeated where the weights are whole and split "
        "on the weights' dims where they are not (then put together by activation collectives)"
    )
    spec: list[tuple[str, ...] | None] = [None] * collective.shape.rank
    spec[lost.batch_dim] = combined
    jax_code, torch_code = constraint_code(spec, "h")
    summary = (
        f"Constrain the value that {collective.name} gathers to keep its batch dim {lost.batch_dim} on "
        f"{'/'.join(repr(a) for a in combined)}, as at the input ({jax_spec(spec)}), where your code makes it "
        "(in a scan or loop, also at the start of its body): propagation chose the whole batch there for the "
        f"weights' layout, so the partitioner then gathers the weights it needs instead of the rows (about the "
        f"weights' bytes per step) and each device computes 1/{factor} of today's rows in those matmuls."
    )
    finding = rule.finding(
        ctx, message, instruction=collective, name=collective.name,
        related=(*lost.symptoms, *(d.name for _, d in lost.dots[:6])),
        suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code,
                              edits=constraint_edit(spec, ctx.framework, "h")),
        evidence={
            "pattern": "partitioner-regroup",
            "replicated_axes": list(lost.axes),
            "rows_factor": factor,
            "batch_axes": sorted(batch_axes),
            "batch_input": input_name,
            "rows_per_device": lost.rows_after,
            "healthy_rows_per_device": lost.rows_before,
            "repeated_flops_fraction": round(share, 4),
            "repeated_matmuls": len(lost.dots),
        },
    )
    return with_user_variable(with_torch_source(ctx, finding, module, top), "h")


def asked_or_judged(module: HloModule, analysis: BatchAnalysis, mesh: Mesh, batch_axes: set[str]) -> bool:
    """Whether the rows the partitioner gathers are another finding's: a sharding constraint of the
    program (in the propagated ``module``, ``analysis`` its batch dims) leaves a batch dim off some of
    ``batch_axes`` (the program asks for the rows it gets: a feature split, a regroup), or a matmul
    there loses the batch (its result whole on a batch dim its operand brings in split:
    ``non-batch-dim-sharding`` reports that matmul)."""
    if any(dot_losing_batch(analysis, computation.name, instruction) is not None
           for computation in module.computations for instruction in computation.instructions
           if instruction.opcode in MATMULS and not instruction.shape.is_tuple):
        return True
    return any(dim < len(layout) and not batch_axes <= layout[dim]
               for layout, batch_dims in constraint_layouts(module, analysis, mesh) for dim in batch_dims)


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"
