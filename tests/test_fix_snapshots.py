"""The patch ``plan_fixes`` writes for every bad fixture whose findings carry edits, against a
checked-in snapshot (``tests/snapshots/fix/<family>-<variant>.diff``).

Each snapshot is the unified diff of the gallery program(s), paths relative to the checkout,
after ``#`` lines naming the findings whose edit was refused and why (``git apply`` and ``patch``
skip them). The fixtures record absolute paths of the machine that made them; ``path_map`` reads
the programs from this checkout instead. Every patched program must still parse.

Regenerate on purpose with ``python -m pytest tests/test_fix_snapshots.py --update-snapshots``
and review each diff by eye: minimal, and what a user would paste.
"""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.fix import FixPlan, plan_fixes
from hlo_doctor.fix.apply import _LineMap, resolve_path
from hlo_doctor.testing import builtin_rule_ids

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
SNAPSHOTS = ROOT / "tests" / "snapshots" / "fix"
MARK = "/hlo_doctor/examples/programs/"
BAD = sorted(p.parent for p in FIXTURES.glob("*/*-bad/hlo_doctor_run.json"))


def gallery_path_map(*paths: str | None) -> dict[str, str]:
    """Each recorded gallery path's checkout prefix -> this checkout."""
    return {path[: path.index(MARK)]: str(ROOT) for path in paths if path and MARK in path}


@functools.cache
def fix_plan(folder: Path) -> tuple[FixPlan | None, str]:
    report = analyze_dump(folder, select=builtin_rule_ids())
    findings = report.findings
    if not any(f.suggestion is not None and f.suggestion.edits for f in findings):
        return None, ""
    recorded = [report.program] + [f.source.file for f in findings if f.source] + [
        e.file for f in findings if f.suggestion for e in f.suggestion.edits]
    plan = plan_fixes(findings, program=report.program, path_map=gallery_path_map(*recorded))
    lines = []
    for refusal in plan.refused:
        source = refusal.finding.source
        where = f" at {Path(source.file).name}:{source.line}" if source else ""
        lines.append(f"# refused: {refusal.finding.rule}{where}: {refusal.reason}\n")
    return plan, "".join(dict.fromkeys(lines)) + plan.diff(relative_to=str(ROOT))


CASES = [folder for folder in BAD if fix_plan(folder)[0] is not None]


@pytest.mark.parametrize("folder", CASES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_fix_diff_matches_snapshot(folder: Path, matches_snapshot) -> None:
    plan, produced = fix_plan(folder)
    assert plan is not None
    for path, text in plan.patched.items():
        ast.parse(text, filename=path)
    matches_snapshot(SNAPSHOTS / f"{folder.parent.name}-{folder.name}.diff", produced)


@pytest.mark.parametrize("folder", CASES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_diff_applies_to_the_checkout(folder: Path, tmp_path: Path) -> None:
    """Paste-able: ``patch -p1`` takes the diff as printed (a dry run on this checkout)."""
    if shutil.which("patch") is None:
        pytest.skip("no patch program")
    _, produced = fix_plan(folder)
    if "\n--- a/" not in "\n" + produced:
        pytest.skip("every edit was refused")
    subprocess.run(["patch", "-p1", "--dry-run", "-s", "-f"], input=produced, text=True, cwd=ROOT, check=True,
                   stdout=subprocess.PIPE)


def test_every_snapshot_has_its_fixture() -> None:
    names = {f"{folder.parent.name}-{folder.name}.diff" for folder in CASES}
    stale = sorted(p.name for p in SNAPSHOTS.glob("*.diff") if p.name not in names)
    assert not stale, f"snapshots without a bad fixture whose findings carry edits: {stale}"


def _moved(findings, plan: FixPlan, path_map: dict[str, str]):
    """The findings with their lines carried into the patched program (as a fresh diagnosis of the
    patched program would give them)."""
    maps = {}
    for path, text in plan.patched.items():
        maps[path] = _LineMap(plan.originals[path])
        maps[path].update(text)

    def line(recorded: str | None, number: int | None) -> int | None:
        path = resolve_path(recorded, path_map) if recorded else None
        return maps[path][number] if path in maps and number is not None else number

    moved = []
    for finding in findings:
        source = finding.source
        suggestion = finding.suggestion
        if suggestion is not None:
            edits = tuple(replace(e, line=line(e.file or (source.file if source else None), e.line))
                          if e.line is not None else e for e in suggestion.edits)
            suggestion = replace(suggestion, edits=edits)
        if source is not None:
            source = replace(source, line=line(source.file, source.line) or source.line)
        moved.append(replace(finding, source=source, suggestion=suggestion))
    return moved


@pytest.mark.parametrize("folder", CASES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_fixing_the_fixed_program_changes_nothing(folder: Path) -> None:
    """The same findings, their lines carried into the patched program, planned on it: every edit
    is refused ("already applied?"), nothing changes."""
    plan, _ = fix_plan(folder)
    assert plan is not None
    report = analyze_dump(folder, select=builtin_rule_ids())
    recorded = [report.program] + [f.source.file for f in report.findings if f.source] + [
        e.file for f in report.findings if f.suggestion for e in f.suggestion.edits]
    path_map = gallery_path_map(*recorded)
    again = plan_fixes(_moved(report.findings, plan, path_map), program=report.program, path_map=path_map,
                       sources=plan.patched)
    assert again.changed == [], [a.description for a in again.applied]
    assert not again.applied
