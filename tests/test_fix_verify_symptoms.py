"""`fix --verify`: a finding with no safe edit that the other edits removed counts as fixed.

Hand-made findings and plans (no compile): the verdict of :class:`~hlo_doctor.fix.verify.Verification`
and its report, for a symptom that went with its cause and for one still there.
"""

from __future__ import annotations

from pathlib import Path

from hlo_doctor.findings import Finding, Report, Severity, SourceEdit, SourceRef
from hlo_doctor.fix import FixPlan, PlannedEdit, Refusal
from hlo_doctor.fix.output import verification_text
from hlo_doctor.fix.verify import Traffic, Verification, _unedited


def _finding(rule: str, line: int) -> Finding:
    return Finding(rule=rule, severity=Severity.WARNING, module="jit_step", message=f"{rule} at {line}",
                   source=SourceRef("prog.py", line), signature=f"prog.py:{line}\nop-{rule}")


CAUSE = _finding("non-batch-dim-sharding", 10)
SYMPTOM = _finding("non-batch-dim-sharding", 14)


def _verification(after: list[Finding]) -> Verification:
    plan = FixPlan()
    plan.applied.append(PlannedEdit(CAUSE, SourceEdit("constrain", "jax", target="h"), "after line 10: ..."))
    plan.refused.append(Refusal(SYMPTOM, "line 14 assigns no variable to constrain"))
    result = Verification(Path("prog.py"), plan, Report("dump", [], findings=[CAUSE, SYMPTOM]), Traffic())
    result.after, result.after_traffic = Report("dump", [], findings=after), Traffic()
    result.unedited = _unedited(result, {})
    return result


def test_a_symptom_gone_with_its_cause_counts_as_fixed():
    result = _verification(after=[])
    assert [(o.finding, o.status) for o in result.unedited] == [(SYMPTOM, "gone")]
    assert result.went_with_cause and result.ok
    text = verification_text(result)
    assert "  no safe edit: prog.py:14: non-batch-dim-sharding: line 14 assigns no variable" in text
    assert "    gone with its cause: non-batch-dim-sharding at prog.py:14 went with the other edits" in text
    assert text.rstrip().endswith("those without a safe edit went with their cause, and no new warning appeared")


def test_a_finding_without_an_edit_still_there_fails():
    still = _finding("non-batch-dim-sharding", 14)
    result = _verification(after=[still])
    assert [o.status for o in result.unedited] == ["still there"]
    assert not result.ok and verification_text(result).rstrip().endswith("not verified")


def test_nothing_applied_and_something_refused_fails():
    plan = FixPlan()
    plan.refused.append(Refusal(SYMPTOM, "no edit"))
    result = Verification(Path("prog.py"), plan, Report("dump", [], findings=[SYMPTOM]), Traffic())
    assert not result.ok  # nothing recompiled: the refused finding is not known to be gone
