"""Where the user's program made what the runner recorded: the file:line of a mesh, a rules list, a wrapper.

The runner's sidecar (:mod:`hlo_doctor.runner.sidecar`) keeps, for each mesh the
program built, each Flax logical axis rules context, each Keras ``LayoutMap``
entry and each ``nn.Module`` call, the Python stack where it happened. A fix
that changes one of those goes at the innermost frame of the user's own code
(the outermost frames are the runner's bootstrap; library frames are skipped).

A dump made without the runner holds the program's own sharding calls too:
:func:`sharding_calls_in` reads them from the ops a ``with_sharding_constraint``
or ``mark_sharding`` leaves in the module, in the record's form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.graph.source import is_library_file
from hlo_doctor.hlo.ir import HloModule, Instruction, ShardingKind

__all__ = ["made_by_sharding_call", "record_entries", "recorded_program", "sharding_call_of", "sharding_calls_in", "user_line"]


def user_line(entry: Mapping[str, Any]) -> tuple[str, int] | None:
    """The innermost frame of the user's own code in a recorded ``stack`` (file, line), or None."""
    stack = entry.get("stack")
    if not isinstance(stack, list):
        return None
    for frame in stack:
        if not isinstance(frame, Mapping):
            continue
        file, line = frame.get("file"), frame.get("line")
        if isinstance(file, str) and isinstance(line, int) and not is_library_file(file):
            return file, line
    return None


def record_entries(record: Mapping[str, Any] | None, *path: str) -> Iterable[Mapping[str, Any]]:
    """The list at ``record[path[0]][path[1]]...`` of the run record, its mapping entries only."""
    value: Any = record
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return [e for e in value if isinstance(e, Mapping)] if isinstance(value, list) else []


def recorded_program(record: Mapping[str, Any] | None) -> str | None:
    """The script the runner ran, as its record names it (``script.path``), or None.

    The record is part of the dump: trust it to widen what may be read only when the runner
    wrote it in this same invocation (``run``, ``fix --verify``).
    """
    script = record.get("script") if isinstance(record, Mapping) else None
    path = script.get("path") if isinstance(script, Mapping) else None
    return path if isinstance(path, str) else None


def sharding_calls_in(module: HloModule, mesh: Mesh | None) -> list[dict[str, Any]]:
    """The program's own sharding calls as ``module`` (a global-shape module: after propagation)
    keeps them, in the runner's record form (``function``, ``spec``, ``shape``, ``stack``): each op
    JAX's ``with_sharding_constraint`` leaves (its op_name ends in ``sharding_constraint``) or
    torch_xla's ``mark_sharding`` (a ``Sharding`` custom-call of op type ``xla__custom_sharding``),
    with its sharding written over the mesh's axes. None when the mesh's axis names are made up."""
    if mesh is None or mesh.is_inferred:
        return []
    calls: dict[str, dict[str, Any]] = {}
    for _, instruction in module.instructions():
        function = sharding_call_of(instruction)
        sharding = instruction.sharding
        source = instruction.source
        if function is None or sharding is None or sharding.kind is not ShardingKind.TILED or source is None \
                or instruction.shape.is_tuple:
            continue
        try:
            per_dim = dim_axes(sharding, instruction.shape.rank, mesh)
        except (ValueError, KeyError):  # a tile assignment the mesh cannot hold (a damaged dump)
            continue
        if per_dim is None:
            continue
        entries = ["None" if not axes else repr(axes[0]) if len(axes) == 1 else repr(tuple(axes)) for axes in per_dim]
        written = ", ".join(entries) + ("," if len(entries) == 1 else "")
        call = {"function": function, "spec": f"P({written})" if function == "with_sharding_constraint" else f"({written})",
                "shape": list(instruction.shape.dims),
                "stack": [{"file": f.file, "line": f.line} for f in source.frames or ()]}
        calls.setdefault(repr(call), call)
    return list(calls.values())


def made_by_sharding_call(instruction: Instruction) -> bool:
    """Whether a sharding call of the program made ``instruction``, by its metadata: an op of
    ``with_sharding_constraint`` (its op_name's last part, the reshards of its lowering included) or
    of torch_xla's ``mark_sharding`` (its op type, the custom-call and the copy propagation makes)."""
    metadata = instruction.metadata
    if metadata is None:
        return False
    return (metadata.op_name or "").rsplit("/", 1)[-1] == "sharding_constraint" or \
        metadata.op_type == "xla__custom_sharding"


def sharding_call_of(instruction: Instruction) -> str | None:
    """``with_sharding_constraint`` or ``mark_sharding`` when ``instruction`` is what that call of the
    program left in the module (by its metadata), else None."""
    metadata = instruction.metadata
    if metadata is None:
        return None
    if (metadata.op_name or "").rsplit("/", 1)[-1] == "sharding_constraint":
        return "with_sharding_constraint"
    if metadata.op_type == "xla__custom_sharding" and instruction.opcode == "custom-call" \
            and instruction.attribute("custom_call_target") == '"Sharding"':
        return "mark_sharding"
    return None
