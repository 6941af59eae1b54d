"""Data-driven rule tests: a dump folder plus an ``expected_findings.json``.

The same loader runs hlo-doctor's own fixtures and a plugin's, so a plugin's
test suite is a few lines::

    from pathlib import Path

    import pytest
    from hlo_doctor.testing import assert_case, find_cases

    CASES = find_cases(Path(__file__).parent / "cases")

    @pytest.mark.parametrize("folder", CASES, ids=[c.name for c in CASES])
    def test_case(folder):
        assert_case(folder, rules=["expert-weights-not-expert-sharded"])

``expected_findings.json`` (JSON; the ``//`` notes are not part of it)::

    {
      "rules": ["uneven-sharding-padding"],          // optional: run only these
      "options": {"hardware": "h100"},               // optional: analyze_dump keyword arguments
      "findings": [
        {"rule": "uneven-sharding-padding", "instruction": "pad", "source_line": 44,
         "note": "free text for the reader"}
      ]
    }

Which rules run, first match wins: the file's ``"rules"``; else the
``rules`` argument (ids, or :class:`~hlo_doctor.rules.base.Rule` classes,
which need not be installed); else every registered rule. A case fails on a
missing finding **and** on an extra one, compared by (rule, instruction,
source line); ``"findings": []`` means "no findings". ``instruction`` and
``source_line`` may be left out of an expected finding only when the rule's
finding has none.

A dump for a case is made with ``hlo-doctor run --devices N --dump-dir
tests/cases/NAME/bad -- python program.py`` (or
:func:`hlo_doctor.runner.run_script`).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.errors import ConfigurationError
from hlo_doctor.rules.base import Finding, Rule
from hlo_doctor.rules.registry import Registry, discover

EXPECTED = "expected_findings.json"

__all__ = [
    "EXPECTED",
    "Case",
    "CaseResult",
    "Key",
    "assert_case",
    "builtin_rule_ids",
    "find_cases",
    "finding_key",
    "load_case",
    "run_case",
]

Key = tuple[str, "str | None", "int | None"]
RuleChoice = Iterable["str | type[Rule]"]


def finding_key(finding: Finding) -> Key:
    """(rule, instruction, source line) of a finding, as cases compare them."""
    return (finding.rule, finding.instruction, finding.source.line if finding.source is not None else None)


@dataclass(frozen=True)
class Case:
    """One case: its folder, the expected finding keys, and the file's rules and analyze options."""

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
    """Every folder under ``root`` holding an ``expected_findings.json``, sorted.

    Raises FileNotFoundError when ``root`` is not a folder, so a mistyped
    path fails loudly instead of collecting no tests.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder of test cases")
    return sorted(p.parent for p in root.rglob(EXPECTED))


def load_case(folder: str | os.PathLike[str]) -> Case:
    """Read a case folder's ``expected_findings.json``; ValueError/TypeError when it is malformed."""
    folder = Path(folder)
    path = folder / EXPECTED
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
        raise TypeError(f"{path}: expected an object with a 'findings' list")
    unknown_keys = set(data) - {"rules", "options", "findings", "note"}
    if unknown_keys:
        raise ConfigurationError(f"{path}: unknown key {min(unknown_keys)!r} (valid: rules, options, findings, note)")
    expected = []
    for item in data["findings"]:
        unknown = set(item) - {"rule", "instruction", "source_line", "note"}
        if "rule" not in item or unknown:
            raise ConfigurationError(f"{path}: each finding needs 'rule' (and may have instruction, source_line, note); got {item}")
        expected.append((item["rule"], item.get("instruction"), item.get("source_line")))
    rules = data.get("rules")
    if rules is not None and (not isinstance(rules, list) or not all(isinstance(r, str) for r in rules)):
        raise TypeError(f"{path}: 'rules' must be a list of rule ids")
    return Case(folder, tuple(expected), tuple(rules) if rules is not None else None, dict(data.get("options") or {}))


def builtin_rule_ids(registry: Registry | None = None) -> list[str]:
    """The ids of hlo-doctor's built-in rules (not the installed plugins'), sorted."""
    return (registry or discover()).builtin_ids()


def _selection(rules: RuleChoice | None, registry: Registry | None) -> tuple[Registry | None, list[str] | None]:
    """(registry, ids) for a ``rules`` argument of ids and/or Rule classes."""
    if rules is None:
        return registry, None
    ids: list[str] = []
    classes = []
    for rule in rules:
        if isinstance(rule, type) and issubclass(rule, Rule):
            classes.append(rule)
            ids.append(rule.id)
        elif isinstance(rule, str):
            ids.append(rule)
        else:
            raise TypeError(f"rules: expected rule ids or Rule classes, got {rule!r}")
    if classes:
        base = registry or discover()
        registry = Registry()
        for rule_id in base.ids():
            spec = base.rules[rule_id]
            if rule_id not in {c.id for c in classes}:
                registry.add(spec.rule, spec.origin, spec.entry_point)
        for rule in classes:
            error = registry.add(rule, "test", f"{rule.__module__}:{rule.__qualname__}")
            if error is not None:
                raise ConfigurationError(f"rules: {rule.__qualname__} cannot be registered: {error.message}")
    return registry, ids


def run_case(
    case: Case | str | os.PathLike[str],
    *,
    rules: RuleChoice | None = None,
    registry: Registry | None = None,
) -> CaseResult:
    """Analyze the case's dump with its rules (see the module docstring) and compare."""
    if not isinstance(case, Case):
        case = load_case(case)
    registry, ids = _selection(rules, registry)
    select = case.rules if case.rules is not None else ids
    report = analyze_dump(case.folder, select=select, registry=registry, **case.options)
    got = Counter(finding_key(f) for f in report.findings)
    want = Counter(case.expected)
    missing = sorted((want - got).elements(), key=repr)
    extra = sorted((got - want).elements(), key=repr)
    return CaseResult(case, missing, extra, report.findings, report.errors)


def assert_case(
    case: Case | str | os.PathLike[str],
    *,
    rules: RuleChoice | None = None,
    registry: Registry | None = None,
) -> CaseResult:
    """:func:`run_case`, raising AssertionError (listing what is missing and extra) unless it matches."""
    result = run_case(case, rules=rules, registry=registry)
    if not result.ok:
        raise AssertionError(result.explain())
    return result
