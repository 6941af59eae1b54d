"""Data-driven rule tests: a dump folder plus an ``expected_findings.json``.

The same loader runs hlo-doctor's own fixtures and a plugin's, so plugin
authors test their rules the same way::

    import pytest
    from hlo_doctor.testing import assert_case, find_cases

    @pytest.mark.parametrize("folder", find_cases("tests/cases"), ids=str)
    def test_case(folder):
        assert_case(folder)

``expected_findings.json``::

    {
      "rules": ["uneven-sharding-padding"],          // optional: run only these; default all registered
      "options": {"hardware": "h100"},               // optional: analyze_dump keyword arguments
      "findings": [
        {"rule": "uneven-sharding-padding", "instruction": "pad", "source_line": 44}
      ]
    }

A case fails on a missing finding **and** on an extra one, compared by
(rule, instruction, source line); an empty list means "no findings".
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlo_doctor.rules.base import Finding
from hlo_doctor.rules.registry import Registry

EXPECTED = "expected_findings.json"

__all__ = ["EXPECTED", "Case", "CaseResult", "Key", "assert_case", "find_cases", "finding_key", "load_case", "run_case"]

Key = tuple[str, "str | None", "int | None"]


def finding_key(finding: Finding) -> Key:
    """(rule, instruction, source line) of a finding, as cases compare them."""
    return (finding.rule, finding.instruction, finding.source.line if finding.source is not None else None)


@dataclass(frozen=True)
class Case:
    folder: Path
    expected: tuple[Key, ...]
    rules: tuple[str, ...] | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class CaseResult:
    case: Case
    missing: list[Key]
    extra: list[Key]
    findings: tuple[Finding, ...]
    errors: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.missing and not self.extra

    def explain(self) -> str:
        lines = [f"{self.case.folder}:"]
        lines += [f"  missing: {k}" for k in self.missing]
        lines += [f"  extra:   {k}" for k in self.extra]
        for finding in self.findings:
            if finding_key(finding) in self.extra:
                lines.append(f"    {finding.rule} {finding.instruction}: {finding.message}")
        lines += [f"  error: {e.path}: {e.message}" for e in self.errors]
        return "\n".join(lines)


def find_cases(root: str | os.PathLike[str]) -> list[Path]:
    """Every folder under ``root`` holding an ``expected_findings.json``, sorted."""
    return sorted(p.parent for p in Path(root).rglob(EXPECTED))


def load_case(folder: str | os.PathLike[str]) -> Case:
    folder = Path(folder)
    path = folder / EXPECTED
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
        raise TypeError(f"{path}: expected an object with a 'findings' list")
    expected = []
    for item in data["findings"]:
        unknown = set(item) - {"rule", "instruction", "source_line", "note"}
        if "rule" not in item or unknown:
            raise ValueError(f"{path}: each finding needs 'rule' (and may have instruction, source_line, note); got {item}")
        expected.append((item["rule"], item.get("instruction"), item.get("source_line")))
    rules = data.get("rules")
    return Case(folder, tuple(expected), tuple(rules) if rules is not None else None, dict(data.get("options") or {}))


def run_case(case: Case | str | os.PathLike[str], *, registry: Registry | None = None) -> CaseResult:
    """Analyze the case's dump with its rules (all registered when none are listed) and compare."""
    from hlo_doctor.analysis import analyze_dump

    if not isinstance(case, Case):
        case = load_case(case)
    report = analyze_dump(case.folder, select=case.rules, registry=registry, **case.options)
    got = Counter(finding_key(f) for f in report.findings)
    want = Counter(case.expected)
    missing = sorted((want - got).elements(), key=repr)
    extra = sorted((got - want).elements(), key=repr)
    return CaseResult(case, missing, extra, report.findings, report.errors)


def assert_case(case: Case | str | os.PathLike[str], *, registry: Registry | None = None) -> CaseResult:
    """:func:`run_case`, raising AssertionError on a missing or extra finding."""
    result = run_case(case, registry=registry)
    if not result.ok:
        raise AssertionError(result.explain())
    return result
