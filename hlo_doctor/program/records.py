"""Where the user's program made what the runner recorded: the file:line of a mesh, a rules list, a wrapper.

The runner's sidecar (:mod:`hlo_doctor.runner.sidecar`) keeps, for each mesh the
program built, each Flax logical axis rules context, each Keras ``LayoutMap``
entry and each ``nn.Module`` call, the Python stack where it happened. A fix
that changes one of those goes at the innermost frame of the user's own code
(the outermost frames are the runner's bootstrap; library frames are skipped).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hlo_doctor.graph.source import is_library_file

__all__ = ["record_entries", "recorded_program", "user_line"]


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
