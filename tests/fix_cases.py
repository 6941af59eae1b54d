"""Helpers for the tests of ``hlo_doctor.fix``: a finding carrying edits, planned on a text in memory."""

from __future__ import annotations

import textwrap

from hlo_doctor.findings import Finding, Severity, SourceEdit, SourceRef, Suggestion
from hlo_doctor.fix import FixPlan, plan_fixes

PATH = "/recorded/elsewhere/train.py"


def finding(*edits: SourceEdit, line: int = 1, rule: str = "non-batch-dim-sharding", no_edit: str | None = None,
            path: str = PATH) -> Finding:
    return Finding(rule=rule, severity=Severity.WARNING, module="jit_f", message="m",
                   source=SourceRef(path, line),
                   suggestion=Suggestion("s", edits=tuple(edits), no_edit=no_edit))


def plan(text: str, *findings: Finding, **kwargs) -> FixPlan:
    return plan_fixes(findings, sources={PATH: textwrap.dedent(text)}, **kwargs)


def patched(text: str, *edits: SourceEdit, line: int) -> str:
    """The program after the edits (all made, none refused)."""
    result = plan(text, finding(*edits, line=line))
    assert not result.refused, result.refused
    return result.patched[PATH]


def refused(text: str, *edits: SourceEdit, line: int) -> str:
    """The reason the (one) edit is refused; the program is left as it was."""
    result = plan(text, finding(*edits, line=line))
    assert not result.applied, [a.description for a in result.applied]
    (refusal,) = result.refused
    return refusal.reason


def dedent(text: str) -> str:
    return textwrap.dedent(text)
