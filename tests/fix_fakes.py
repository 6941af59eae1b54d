"""A stand-in for :func:`hlo_doctor.fix.plan_fixes`: inserts a given line after each finding's source line.

It tests the loop of ``hlo-doctor fix --verify`` (run, diagnose, patch a copy, recompile, match)
apart from the edit library, which has its own tests.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path

from hlo_doctor.findings import Finding, SourceEdit
from hlo_doctor.fix import FixPlan, PlannedEdit, Refusal


class FakePlan(FixPlan):
    def diff(self) -> str:
        return "".join(
            "".join(difflib.unified_diff(self.originals[path].splitlines(keepends=True),
                                         text.splitlines(keepends=True), f"a/{path}", f"b/{path}"))
            for path, text in sorted(self.patched.items()))


def fake_planner(code: Callable[[Finding], str | None], *, file: str | None = None, before: bool = False):
    """A ``plan_fixes`` that inserts ``code(finding)`` after the finding's line (None: refused).

    ``file``: patch this file instead of the one the finding names (a test's copy of the program);
    ``before``: insert above the line instead (which moves the finding's own line down).
    """

    def plan_fixes(findings, *, program=None, select=(), path_map=None, readable=None):  # noqa: ANN001, ANN202
        plan = FakePlan()
        inserts: dict[str, list[tuple[int, str, Finding]]] = {}
        for finding in findings:
            if select and finding.rule not in select:
                continue
            line = code(finding)
            if line is None or finding.source is None:
                plan.refused.append(Refusal(finding, "the fake planner has no edit for it"))
                continue
            path = file or finding.source.file
            if readable is not None and not readable(path):
                plan.refused.append(Refusal(finding, f"{path} is outside the project root and the dump: not read"))
                continue
            inserts.setdefault(path, []).append((finding.source.line, line, finding))
        for path, edits in inserts.items():
            original = Path(path).read_text()
            lines = original.splitlines(keepends=True)
            for number, text, finding in sorted(edits, key=lambda e: -e[0]):
                indent = lines[number - 1][: len(lines[number - 1]) - len(lines[number - 1].lstrip())]
                lines.insert(number - 1 if before else number, f"{indent}{text}\n")
                edit = SourceEdit("constrain", "jax", target="h", file=path, line=number)
                plan.applied.append(PlannedEdit(finding, edit, f"insert `{text}` after line {number}"))
            plan.originals[path] = original
            plan.patched[path] = "".join(lines)
        return plan

    return plan_fixes
