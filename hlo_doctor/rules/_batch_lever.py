"""Where a program sets its batch sharding, for ``replicated-batch``'s fix: the traced function's
argument and the program's own constraints that pin the batch dim (JAX), the input marks (torch_xla)."""

from __future__ import annotations

import dataclasses

from hlo_doctor.findings import SourceEdit
from hlo_doctor.program.levers import jax_argument_constraint
from hlo_doctor.program.records import user_line
from hlo_doctor.program.spec_sites import axes_site, parameter_axes_site, parse_spec_text, spec_site
from hlo_doctor.rules._regroup import torch_batch_lever
from hlo_doctor.rules.base import Finding
from hlo_doctor.rules.context import RuleContext, short_path

__all__ = ["at_batch_lever", "pinning_constraints"]


def at_batch_lever(ctx: RuleContext, finding: Finding, spec: list, variable: str, batch_axes: tuple[str, ...],
              rows: int) -> Finding:
    """The batch sharding where the program sets it: torch_xla marks the model's inputs before the
    call (and FSDPv2 wrappers get a shard_output); JAX constrains the traced function's argument,
    and rewrites the program's own constraints that pin the batch dim to fewer axes."""
    if ctx.framework == "torch_xla":
        return torch_batch_lever(ctx, finding, spec, batch_axes)
    if ctx.framework != "jax" or finding.suggestion is None:
        return finding
    suggestion = finding.suggestion
    edit = jax_argument_constraint(ctx.program_path, ctx.traced_function, variable, spec)
    if edit is None:
        return dataclasses.replace(finding, suggestion=dataclasses.replace(
            suggestion, no_edit=f"the program's traced function with the argument {variable} was not found"))
    pinned = pinning_constraints(ctx.sharding_calls, batch_axes, rows)
    if not pinned:
        return dataclasses.replace(finding, suggestion=dataclasses.replace(suggestion, edits=(edit,)))
    combined = spec[0]
    edits, unresolved, shared = [edit], [], []
    for (file, line), old in pinned.items():
        site = spec_site(file, line, old)
        if site is not None:
            edits.append(SourceEdit("respec", "jax", spec=(tuple(combined), *old[1:]), old_spec=old, file=file,
                                    line=site.line))
            continue
        axes = axes_site(file, line, 0, batch_axes)
        if axes is None:
            unresolved.append(f"{short_path(file)}:{line}")
            continue
        shared.append(axes)
        edits.append(SourceEdit("axes", "jax", spec=(tuple(combined),), old_spec=(batch_axes,), file=file,
                                line=axes.line, details={"variable": axes.variable}))
    if ctx.program_path and parameter_axes_site(ctx.program_path, variable, 0, batch_axes) in shared:
        edits.remove(edit)  # the input's sharding reads the same axes: the one edit there shards it too
    where = ", ".join(f"{short_path(f)}:{n}" for f, n in pinned)
    written = "(" + ", ".join(repr(a) for a in combined) + ")"
    summary = (f"{suggestion.summary} The program's own constraints at {where} also put the batch dim on "
               f"{'/'.join(repr(a) for a in batch_axes)} alone: write {written} for their batch dim too, or "
               "they split it again after the input.")
    for shared_site in dict.fromkeys(shared):
        readers = "the input's sharding and those constraints" if edit not in edits else "those constraints"
        summary += (f" They read it from line {shared_site.line} ({shared_site.variable} = ...{shared_site.text}...), "
                    f"which {readers} "
                    f"share: write {written} there.")
    if unresolved:
        return dataclasses.replace(finding, suggestion=dataclasses.replace(
            suggestion, summary=summary, edits=(),
            no_edit=(f"the specs of the constraints at {', '.join(unresolved)} are not written as literals there: "
                     f"write {written} for their batch dim by hand")))
    return dataclasses.replace(finding, suggestion=dataclasses.replace(suggestion, summary=summary,
                                                                       edits=tuple(edits)))


def pinning_constraints(calls, batch_axes: tuple[str, ...], rows: int) -> dict[tuple[str, int], tuple]:
    """The user's lines whose ``with_sharding_constraint`` (``calls``: :attr:`RuleContext.sharding_calls`)
    puts a ``rows``-long dim 0 on exactly ``batch_axes`` (the axes the batch is split over today), with
    the spec they write."""
    found: dict[tuple[str, int], tuple] = {}
    if not batch_axes:
        return found
    for call in calls:
        spec = parse_spec_text(str(call.get("spec", "")))
        shape = call.get("shape") or ()
        where = user_line(call)
        if spec and where and shape and shape[0] == rows and spec[0] == batch_axes \
                and call.get("function") == "with_sharding_constraint":
            found.setdefault(where, spec)
    return found
