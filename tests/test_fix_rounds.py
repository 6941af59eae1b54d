"""The rounds of ``hlo-doctor fix --verify``: a recompile's new warnings with edits are patched in
the copy and the copy recompiled again.

A unit test of the loop's bookkeeping: the runner, the diagnosis and the edit library are
replaced by stand-ins (canned findings, hand-written here, and a planner that appends a line), so
no compile runs; the real loop is tested end to end in tests/test_fix_verify.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hlo_doctor.fix as fixlib
from hlo_doctor.findings import Finding, Report, Severity, SourceEdit, SourceRef, Suggestion
from hlo_doctor.fix import FixPlan, PlannedEdit, verify
from hlo_doctor.fix.output import verification_text
from hlo_doctor.fix.verify import Traffic, verify_fix


def _finding(rule: str, file: str, line: int, op: str) -> Finding:
    edit = SourceEdit("constrain", "torch_xla", target="h", line=line)
    return Finding(rule, Severity.WARNING, "module_0000.SyncTensorsGraph.1", "m", source=SourceRef(file, line),
                   suggestion=Suggestion("s", edits=(edit,)), signature=f"x.py:{line}:f\n{op}|dot|f32[8]|{{r}}",
                   fingerprint=f"{rule}:{line}:{op}")


@pytest.fixture
def loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-ins: each run's diagnosis is the next of ``reports``; the planner appends a
    comment naming the finding's rule to the file it is given (the script, then the copy)."""
    script = tmp_path / "train.py"
    script.write_text("model(x)\n")
    reports: list[list] = []
    runs: list[Path] = []

    def run_script(path, args, *, dump_dir, **_):  # noqa: ANN001, ANN202
        runs.append(Path(path))
        return type("Run", (), {"dump_dir": Path(dump_dir)})()

    def diagnose(dump_dir, options):  # noqa: ANN001, ANN202
        findings = reports.pop(0)(str(runs[-1]))
        return Report(str(dump_dir), (), tuple(findings), program=str(script)), Traffic()

    def plan_fixes(findings, *, program=None, select=()):  # noqa: ANN001, ANN202
        plan = FixPlan()
        path = str(program)
        text = Path(path).read_text()
        plan.originals[path] = text
        plan.patched[path] = text + "".join(f"# fix {f.rule}\n" for f in findings)
        plan.applied.extend(PlannedEdit(f, f.suggestion.edits[0], f"fix {f.rule}") for f in findings)
        return plan

    monkeypatch.setattr(verify, "run_script", run_script)
    monkeypatch.setattr(verify, "_diagnose", diagnose)
    monkeypatch.setattr(fixlib, "plan_fixes", plan_fixes)
    return script, reports, runs


def test_a_new_warning_with_an_edit_is_patched_in_a_second_round(loop, tmp_path: Path) -> None:
    script, reports, runs = loop
    first = _finding("replicated-batch", str(script), 1, "input")
    reports.extend([
        lambda ran: [first],                                          # the original
        lambda ran: [_finding("non-batch-dim-sharding", ran, 1, "o_proj")],  # round 1 uncovers it
        lambda ran: [],                                               # round 2: both gone
    ])
    result = verify_fix(script, output=tmp_path / "out" / "train_fixed.py")
    assert len(runs) == 3 and runs[1] == runs[2] == tmp_path / "out" / "train_fixed.py"
    assert result.ok, (result.targeted, result.new, result.problems)
    assert [(o.finding.rule, o.status) for o in result.targeted] == [
        ("replicated-batch", "gone"), ("non-batch-dim-sharding", "gone")]
    assert result.plan.patched[str(script)] == "model(x)\n# fix replicated-batch\n# fix non-batch-dim-sharding\n"
    assert [e.description for e in result.plan.applied] == [
        "fix replicated-batch", "after recompiling (round 2): fix non-batch-dim-sharding"]
    assert script.read_text() == "model(x)\n"  # the original is not written without write=True


def test_rounds_stop_at_the_limit_and_a_warning_left_fails(loop, tmp_path: Path) -> None:
    script, reports, runs = loop
    reports.extend([
        lambda ran: [_finding("replicated-batch", str(script), 1, "input")],
        lambda ran: [_finding("non-batch-dim-sharding", ran, 1, "o_proj")],
    ])
    result = verify_fix(script, rounds=1)
    assert len(runs) == 2 and not result.ok
    assert [f.rule for f in result.new] == ["non-batch-dim-sharding"]
    # the scratch copy the new finding names is gone: the report calls it the patched copy
    assert f"  new: warning non-batch-dim-sharding at {script} (patched copy):1: m" in verification_text(result)


def test_a_new_warning_without_an_edit_is_not_patched_around(loop, tmp_path: Path) -> None:
    script, reports, runs = loop
    no_edit = Finding("reshard-churn", Severity.WARNING, "module_0000.SyncTensorsGraph.1", "m",
                      suggestion=Suggestion("s", no_edit="by hand"), fingerprint="churn")
    reports.extend([
        lambda ran: [_finding("replicated-batch", str(script), 1, "input")],
        lambda ran: [_finding("non-batch-dim-sharding", ran, 1, "o_proj"), no_edit],
    ])
    result = verify_fix(script)
    assert len(runs) == 2 and not result.ok  # no second round: a warning would be left whatever it patched
    assert {f.rule for f in result.new} == {"non-batch-dim-sharding", "reshard-churn"}
