"""Which finding after a change is which finding before it: :func:`match_findings`.

Fingerprints (:mod:`hlo_doctor.fingerprint`) hash the user's line, and an edit moves lines (an
inserted constraint pushes every later line down; a copy written elsewhere has another file
name). So each finding from before is looked for after the change by, in order, first match
wins, each finding after used once:

* ``fingerprint``: its rule, module family and op signature (``op_name | opcode | shape |
  sharding``) with its source line carried through the change (:class:`LineMap`: the diff of the
  file's text before and after, when it is known), the file named as after;
* ``line``: its rule and module family and the user's line carried through the change (the op's
  sharding or shape may change while the problem stays at the same line);
* ``op``: its rule, module family and whole op signature at any line (the same op, the
  problem unchanged, its line moved by an edit whose text is not known, as between two
  commits in ``hlo-doctor diff``); for a finding with no source line, its ``op_name``.

A finding from before with no match is *gone*; a finding after that matches none from before is
*new*. ``hlo-doctor fix --verify`` and ``hlo-doctor diff`` both match this way.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hlo_doctor.findings import Finding
from hlo_doctor.fingerprint import module_family

__all__ = ["FindingOutcome", "LineMap", "match_findings", "op_signature"]


class LineMap:
    """Where each line of a file's text before a patch went in the text after it (1-based).

    A line the patch kept maps to its new number; a replaced line to the line that replaced it
    (the last of a shorter replacement); a deleted line to the line after the deletion.
    """

    def __init__(self, before: str, after: str) -> None:
        self._opcodes = difflib.SequenceMatcher(
            None, before.splitlines(), after.splitlines(), autojunk=False).get_opcodes()

    def __call__(self, line: int) -> int:
        index = line - 1
        for tag, i1, i2, j1, j2 in self._opcodes:
            if i1 <= index < i2:
                if tag == "equal":
                    return j1 + (index - i1) + 1
                if tag == "replace":
                    return j1 + min(index - i1, j2 - j1 - 1) + 1
                return j1 + 1  # delete
        return line


@dataclass(frozen=True, slots=True)
class FindingOutcome:
    """A finding from before the patch: ``gone`` or ``still there`` (``after``, found ``matched_by``)."""

    finding: Finding
    status: str
    after: Finding | None = None
    matched_by: str | None = None


def _op_part(finding: Finding) -> str:
    if finding.signature is not None and "\n" in finding.signature:
        return finding.signature.split("\n", 1)[1]
    return finding.op_name or ""


def op_signature(finding: Finding) -> str | None:
    """The op part of the finding's signature (``op_name | opcode | shape | sharding``), or None
    when it has none: what the ``op`` tier matches a finding with a source line by."""
    if finding.signature is None or "\n" not in finding.signature:
        return None
    op = finding.signature.split("\n", 1)[1]
    return op if "|" in op else None


def _moved_source_key(finding: Finding, maps: Mapping[str, tuple[str, LineMap]]) -> str:
    """The signature's source part (``name:line:function``) carried through the patch."""
    part = finding.signature.split("\n", 1)[0] if finding.signature else ""
    pieces = part.split(":", 2)
    if len(pieces) != 3 or not pieces[1].isdigit():
        return part
    name, line, function = pieces
    if name in maps:
        new_name, line_map = maps[name]
        return f"{new_name}:{line_map(int(line))}:{function}"
    return part


def _moved_line(finding: Finding, maps: Mapping[str, tuple[str, LineMap]]) -> tuple[str, int] | None:
    if finding.source is None:
        return None
    name = finding.source.file.replace("\\", "/").rsplit("/", 1)[-1]
    if name in maps:
        new_name, line_map = maps[name]
        return new_name, line_map(finding.source.line)
    return name, finding.source.line


def _line_of(finding: Finding) -> tuple[str, int] | None:
    if finding.source is None:
        return None
    return finding.source.file.replace("\\", "/").rsplit("/", 1)[-1], finding.source.line


def _op_key(finding: Finding, family: str) -> tuple | None:
    op = _op_part(finding)
    if not op:
        return None
    return (finding.rule, family, op if finding.source is not None and "|" in op else op.split("|", 1)[0])


def match_findings(before: Sequence[Finding], after: Sequence[Finding],
                   maps: Mapping[str, tuple[str, LineMap]]) -> tuple[tuple[FindingOutcome, ...], tuple[Finding, ...]]:
    """Each finding of ``before`` gone or still there in ``after``, and the findings new in ``after``.

    ``maps``: file name before the patch -> (file name after, :class:`LineMap`). The tiers are
    in the module docstring.
    """
    def family(f: Finding) -> str:
        return module_family(f.module)

    tiers = (
        ("fingerprint",  # a finding made without a signature is fingerprinted from its message: that, exactly
         lambda f: (f.rule, family(f), _moved_source_key(f, maps), _op_part(f)) if f.signature else f.fingerprint or None,
         lambda f: (f.rule, family(f), f.signature.split("\n", 1)[0], _op_part(f)) if f.signature
         else f.fingerprint or None),
        ("line",
         lambda f: (f.rule, family(f), _moved_line(f, maps)) if f.source is not None else None,
         lambda f: (f.rule, family(f), _line_of(f)) if f.source is not None else None),
        ("op",
         lambda f: _op_key(f, family(f)),
         lambda f: _op_key(f, family(f))),
    )
    matched: dict[int, tuple[int, str]] = {}
    used: set[int] = set()
    for tier, before_key, after_key in tiers:
        after_keys = [after_key(f) for f in after]
        for i, finding in enumerate(before):
            if i in matched:
                continue
            key = before_key(finding)
            if key is None:
                continue
            for j, other in enumerate(after_keys):
                if j not in used and other == key:
                    matched[i] = (j, tier)
                    used.add(j)
                    break
    outcomes = tuple(
        FindingOutcome(f, "still there", after[matched[i][0]], matched[i][1]) if i in matched
        else FindingOutcome(f, "gone")
        for i, f in enumerate(before))
    new = tuple(f for j, f in enumerate(after) if j not in used)
    return outcomes, new
