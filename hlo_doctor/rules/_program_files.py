"""The user's program of a dump whose module names none: another module of the same dump may.

torch_xla compiles a step as several modules (the inputs' placement, then the training step);
the step's ops often carry only library frames, while a small module the program compiled first
names the program's file. The first module (smallest first) whose ops name a user file gives it.
"""

from __future__ import annotations

from hlo_doctor.program.source import program_mesh_axes
from hlo_doctor.program.terms import mesh_axes_of_shape
from hlo_doctor.rules.context import RuleContext

__all__ = ["dump_program", "program_axis_names"]

_MAX_BYTES = 20_000_000  # do not parse a big module only to find a file name


def dump_program(ctx: RuleContext) -> str | None:
    """``ctx.program_path``, else the user file another module of the dump names (None: none does)."""
    if ctx.program_path is not None:
        return ctx.program_path
    cache = ctx.dump.__dict__.setdefault("_hlo_doctor_program", {})
    if "path" in cache:
        return cache["path"]
    found = None
    others = [m for m in ctx.dump.modules if m is not ctx.module]
    for module in sorted(others, key=_size):
        if _size(module) > _MAX_BYTES:
            break
        try:
            found = RuleContext(ctx.dump, module, ctx.options).program_path
        except Exception:  # noqa: BLE001 - a module that cannot be read names no file
            found = None
        if found is not None:
            break
    cache["path"] = found
    return found


def _size(module) -> int:  # noqa: ANN001 - a DumpModule
    return sum(snapshot.size for snapshot in module.snapshots)


def program_axis_names(ctx: RuleContext, program: str | None) -> dict[str, str]:
    """Each positional axis name of a mesh the dump does not name (``axis_0``) -> the name the
    program's own mesh construction gives it; empty when the mesh is named or the program does
    not say."""
    mesh = ctx.mesh
    if mesh is None or not mesh.is_inferred:
        return {}
    names = program_mesh_axes(program, mesh.axis_sizes) or mesh_axes_of_shape(program, mesh.axis_sizes)
    return dict(zip(mesh.axis_names, names, strict=True)) if names else {}
