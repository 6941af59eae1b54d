"""The program's files and mesh axis names as the rules write fixes with them."""

from __future__ import annotations

from collections.abc import Iterable

from hlo_doctor.program.terms import mesh_axes_in
from hlo_doctor.rules.context import RuleContext

__all__ = ["dump_program_files", "program_axis_names"]


def dump_program_files(ctx: RuleContext) -> tuple[str, ...]:
    """The user's program files of this module, the program's own file first
    (:attr:`RuleContext.program_files`)."""
    return ctx.program_files


def program_axis_names(ctx: RuleContext, programs: Iterable[str | None]) -> dict[str, str]:
    """Each positional axis name of a mesh the dump does not name (``axis_0``) -> the name the
    program's own mesh construction (in one of the files ``programs``) gives it; empty when the
    mesh is named or the program does not say."""
    mesh = ctx.mesh
    if mesh is None or not mesh.is_inferred:
        return {}
    names = mesh_axes_in(programs, mesh.axis_sizes)
    return dict(zip(mesh.axis_names, names, strict=True)) if names else {}
