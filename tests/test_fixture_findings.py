"""Every fixture folder's expected_findings.json, checked by the public case loader.

Each case runs the rules listed under its optional "rules" key, else every
built-in rule: installed plugins (the example plugin in CI) have their own
cases and must not change these. A case fails on a missing finding and on an
extra one, compared by (rule, instruction, source line).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.testing import assert_case, builtin_rule_ids, find_cases

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = find_cases(FIXTURES)
BUILTIN = builtin_rule_ids()


def test_every_fixture_folder_has_expectations():
    folders = sorted(p.parent for p in FIXTURES.glob("*/*/hlo_doctor_run.json"))
    assert folders and set(folders) <= set(CASES), sorted(set(folders) - set(CASES))


@pytest.mark.parametrize("folder", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_findings(folder):
    assert_case(folder, rules=BUILTIN)
