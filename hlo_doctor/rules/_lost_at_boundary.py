"""non-batch-dim-sharding's findings where the batch is lost in part at a boundary of the propagated
module, not at a matmul: an embedding lookup that follows its table's sharding, and a loop's carry
that takes its layout from the loop body (:func:`~hlo_doctor.rules._program_layouts.lookup_losing_batch`,
:func:`~hlo_doctor.rules._program_layouts.carry_losing_batch`)."""

from __future__ import annotations

import dataclasses
import math

from hlo_doctor.hlo.ir import Instruction
from hlo_doctor.program.library_levers import at_flax_rules
from hlo_doctor.program.suggest import constraint_code, constraint_edit, rename_value, scan_carry, with_user_variable
from hlo_doctor.rules._batch import BatchAnalysis, axes_text, batch_axes, parameter_name, with_torch_source
from hlo_doctor.rules._program_layouts import LostBatch, axes_per_dim
from hlo_doctor.rules.base import Finding, Rule, Suggestion
from hlo_doctor.rules.context import RuleContext

__all__ = ["boundary_finding"]

def boundary_finding(rule: Rule, ctx: RuleContext, analysis: BatchAnalysis, computation: str, value: Instruction,
                     found: LostBatch, kind: str) -> Finding:
    """The finding for a lookup (``kind`` "lookup") or a loop's carry ("carry") that drops batch axes."""
    batch_dim, param, split, source, in_dim, dropped = found
    mesh = ctx.mesh
    assert mesh is not None
    out = axes_per_dim(value, mesh) or ()
    kept = tuple(a for a in mesh.axis_names if a in out[batch_dim])
    lost = tuple(a for a in mesh.axis_names if a in dropped)
    factor = math.prod(mesh.axis_size(a) for a in lost)
    axes = batch_axes(ctx, analysis, param)
    input_name = parameter_name(ctx, analysis.inputs[param])
    where = ", ".join(f"dim {d} ({value.shape.dims[d]}) over {axes_text(sorted(out[d]))}" for d in split)
    # what the partitioner moves over the dropped axes to compute on those rows (per-device names): rows
    # turned into features move by gathers, all-to-alls and partial-sum reductions; a permute only
    # reorders whole shards between devices, which a device order does (reshard-churn's)
    traffic = [r for r in ctx.semantics.roles if r.role in ("activation-reduce", "activation-gather", "reshard")
               and r.facts.op.kind != "collective-permute"
               and {a.split(":(")[0] for a in r.facts.op.mesh_axes or ()} & dropped]
    kept_text = f"{axes_text(kept)} only" if kept else "no mesh axis"
    if kind == "lookup":
        table = analysis.graph.instruction((computation, value.operands[0]))
        table_name = parameter_name(ctx, table, with_shape=False) if table.opcode == "parameter" else table.name
        message = (
            f"the embedding lookup {value.name} ({value.shape}) splits its batch dim {batch_dim} over {kept_text} "
            f"and {where}, although its indices {source.name} bring the batch in split over {axes_text(axes)} "
            f"(dim {in_dim}, from the batch input {input_name}): propagation followed the table {table_name}'s "
            f"sharding, so from this lookup on each device holds {factor}x its share of the rows, with the "
            f"features split over {axes_text(lost)} instead"
        )
        summary = (
            f"Constrain the lookup's result (the activation h) to stay batch-sharded over {axes_text(axes)} on "
            f"dim {batch_dim}, as its indices are"
        )
    else:
        message = (
            f"the loop's carry {value.name} ({value.shape}) splits its batch dim {batch_dim} over {kept_text} and "
            f"{where}, although its initial value {source.name} brings the batch in split over {axes_text(axes)} "
            f"(dim {in_dim}, from the batch input {input_name}): propagation took the carry's layout from the loop "
            f"body (the weights' sharding), so in every iteration each device holds {factor}x its share of the "
            f"rows, with the features split over {axes_text(lost)} instead"
        )
        summary = (
            f"Constrain the carry inside the loop body (the scanned function's input or output, written "
            f"<carry> below) to stay batch-sharded over {axes_text(axes)} on dim {batch_dim}, as its initial "
            "value is"
        )
    if traffic:
        # counted in the whole step (the partitioned names cannot be tied to this value in a worker)
        message += (f"; the step moves activations over {axes_text(lost)} in {len(traffic)} collective"
                    f"{'s' if len(traffic) > 1 else ''} (e.g. {traffic[0].facts.instruction})")
    summary += (
        f": each device then computes on its own rows, and the partitioner gathers the weights' features over "
        f"{axes_text(lost)} instead (FSDP's weight all-gathers, about the weights' bytes per step) of moving "
        "activations: a weight gather waits on nothing but the weight, so XLA can overlap it with the layer "
        "before, while the activations' collectives wait on the matmul that makes them."
    )
    spec: list = [None] * value.shape.rank
    spec[batch_dim] = axes or (f"<axes of {input_name}'s batch>",)
    jax_code, torch_code = constraint_code(spec, "h")
    edits = constraint_edit(spec, ctx.framework, "h")
    body = None
    if kind == "carry":  # the line of the loop assigns its output: the carry is the body function's parameter
        line, _ = ctx.user_source(value)
        body = scan_carry(line.file, line.line) if line is not None else None
        carry = body[1] if body is not None else "<carry>"
        jax_code = rename_value(jax_code, "h", carry) or jax_code
        torch_code = rename_value(torch_code, "h", carry) or torch_code
        edits = () if body is None or line is None else tuple(
            dataclasses.replace(e, target=carry, file=line.file, line=body[2], details={"position": "function-start"})
            for e in constraint_edit(spec, ctx.framework, carry))
        if body is not None:
            summary = summary.replace("the carry inside the loop body (the scanned function's input or output, "
                                      "written <carry> below)", f"the carry {carry} at the start of the loop body "
                                      f"{body[0]}()")
    finding = rule.finding(
        ctx, message, instruction=value,
        name=ctx.partitioned_names([(computation, value.name)]).get((computation, value.name)),
        related=(*(r.facts.instruction for r in traffic), source.name),
        suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code, edits=edits,
                              no_edit=None if edits or kind != "carry" else "the constraint goes inside the loop "
                              "body, on the carry, which the dump does not name: write it there by hand"),
        evidence={
            "pattern": kind,
            "shape": str(value.shape),
            "sharding": value.sharding.text if value.sharding is not None else "",
            "batch_dim": batch_dim,
            "sharded_dims": split,
            "dropped_axes": list(lost),
            "input": source.name,
            "input_batch_dim": in_dim,
            "batch_input": input_name,
            "batch_axes": list(axes or ()),
            "rows_factor": factor,
        },
    )
    finding = with_torch_source(ctx, finding, analysis.module, value)
    if kind == "carry":
        return finding
    finding = with_user_variable(finding, "h")
    # a layout the program's logical rules give (Flax): the fix is at the rules, as for a matmul's
    return at_flax_rules(finding, ctx.dump.run_record, spec, ctx.framework, ctx.program_files)
