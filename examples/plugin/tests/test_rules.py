"""The plugin's rule on its real MoE dumps (tests/cases/*/expected_findings.json).

Runs with the plugin installed (`pip install -e examples/plugin`), so the
rule is found through its entry point, exactly as `hlo-doctor analyze` finds it.
"""

from pathlib import Path

import pytest

pytest.importorskip("hlo_doctor_moe_rules", reason="the example plugin is not installed")

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.rules import discover
from hlo_doctor.testing import assert_case, find_cases

RULE = "expert-weights-not-expert-sharded"
CASES_DIR = Path(__file__).parent / "cases"
CASES = find_cases(CASES_DIR)


@pytest.mark.parametrize("folder", CASES, ids=[str(c.relative_to(CASES_DIR)) for c in CASES])
def test_case(folder):
    assert_case(folder, rules=[RULE])


def test_registered_through_the_entry_point():
    spec = discover().get(RULE)
    assert spec is not None and spec.distribution == "hlo-doctor-moe-rules"


def test_min_experts_option():
    report = analyze_dump(CASES_DIR / "moe" / "bad", select=[RULE], rule_options={RULE: {"min_experts": 16}})
    assert report.findings == ()
