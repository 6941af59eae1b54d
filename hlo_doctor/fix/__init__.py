"""``hlo-doctor fix``: findings' suggestions turned into edits of the user's program.

Each finding's :class:`~hlo_doctor.findings.Suggestion` carries
:class:`~hlo_doctor.findings.SourceEdit` records: what to change, in the program's
terms (the variable on the line, the mesh's axis names, the lever the user holds).
:func:`plan_fixes` turns them into source edits with libcst, which keeps the
program's formatting and comments; a finding whose edit cannot be made safely is
listed with the reason, never guessed. :mod:`hlo_doctor.fix.verify` closes the loop:
it recompiles the patched copy through the runner and diagnoses it again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from hlo_doctor.findings import Finding, SourceEdit

__all__ = ["FixPlan", "PlannedEdit", "Refusal", "plan_fixes"]


@dataclass(frozen=True, slots=True)
class PlannedEdit:
    """One edit made: the finding it answers, the edit and a one-line description."""

    finding: Finding
    edit: SourceEdit
    description: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """A finding whose fix could not be made into a safe edit, and why."""

    finding: Finding
    reason: str


@dataclass
class FixPlan:
    """The edits for a set of findings: each file's text before and after, what was done and refused.

    ``originals``/``patched``: path read -> text (every file an edit was tried on; unchanged when all
    its edits were refused). ``applied``: one :class:`PlannedEdit` per finding and edit made (an
    edit several findings share is made once and listed for each). ``refused``: one
    :class:`Refusal` per finding without edits and per edit that could not be made; a finding
    whose suggestion has several edits can be in both lists.
    """

    originals: dict[str, str] = field(default_factory=dict)
    patched: dict[str, str] = field(default_factory=dict)
    applied: list[PlannedEdit] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)

    def diff(self, relative_to: str | None = None) -> str:
        """A unified diff (difflib) of every patched file, ``a/<path>`` and ``b/<path>``, the path
        relative to ``relative_to`` (default: the current folder) when the file is under it."""
        from hlo_doctor.fix.apply import diff

        return diff(self, relative_to)

    @property
    def changed(self) -> list[str]:
        """The files whose patched text differs from the original, sorted."""
        return sorted(path for path, text in self.patched.items() if self.originals.get(path) != text)

    def write(self) -> list[str]:
        """Write every changed file in place (``hlo-doctor fix --write``); the paths written."""
        from pathlib import Path

        for path in self.changed:
            Path(path).write_text(self.patched[path], encoding="utf-8")
        return self.changed


def plan_fixes(findings: Sequence[Finding], *, program: str | None = None,
               select: Collection[str] = (), path_map: Mapping[str, str] | None = None,
               sources: Mapping[str, str] | None = None,
               readable: Callable[[str], bool] | None = None) -> FixPlan:
    """The edits for ``findings`` (only the rules in ``select`` when given) to the files their
    edits name; ``program``: the script the dump came from (the runner's record), for edits
    whose file the finding does not name.

    ``path_map``: where to read a recorded path instead, for dumps made on another machine or in
    another clone: a recorded file -> a file, or a recorded folder -> a folder (the longest
    matching folder wins), e.g. ``{"/work/main": "/home/me/hlo-doctor"}``. The plan's
    ``originals``/``patched`` are keyed by the path read. ``sources``: the text of a file (by the
    path read) instead of reading it from disk. A recorded path that is neither mapped nor on this
    machine, but names a gallery program (``.../hlo_doctor/examples/programs/x.py``, as fixtures
    made by another checkout do), is read from this package's copy.

    ``readable``: whether a file (by the path read) may be read at all; one it refuses is a
    :class:`Refusal` (the dump names the files, and a dump is untrusted input: ``hlo-doctor fix``
    reads only files below the project root, the dump's folder and the ``path_map`` targets).

    Nothing is written: ``plan.patched`` holds the new texts. A finding without an edit, or whose
    edit cannot be made safely, becomes a :class:`Refusal` with the reason. Applying the plan's
    edits to a program they were already made to is a refusal ("already applied?"), never a
    second copy of the edit.
    """
    from hlo_doctor.fix.apply import plan_fixes as plan

    return plan(findings, program=program, select=select, path_map=path_map, sources=sources, readable=readable)
