"""Rules split over two processes give the report a serial run gives.

``run_module_rules`` forks only for modules of 8 MB or more; here the
threshold is lowered so that every fixture takes the two-process path.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump
from hlo_doctor.dump.folder import Role
from hlo_doctor.report.json import render_json
from hlo_doctor.rules import parallel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDERS = sorted(p.parent for p in FIXTURES.glob("*/*/expected_findings.json"))

pytestmark = pytest.mark.skipif(not parallel.can_fork(), reason="needs os.fork")


def _report(path, jobs: int) -> str:
    return render_json(analyze_dump(path, jobs=jobs, devices_per_host=4))


@pytest.fixture
def always_split(monkeypatch):
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    forks = []
    real = parallel._Worker.__init__

    def counting(self, ctx, rules):
        forks.append([rule.id for rule in rules])
        real(self, ctx, rules)

    monkeypatch.setattr(parallel._Worker, "__init__", counting)
    return forks


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_two_processes_report_what_one_does(folder, always_split):
    assert _report(folder, jobs=2) == _report(folder, jobs=1)
    assert always_split and "non-batch-dim-sharding" in always_split[0]


def test_names_after_partitioning_come_back_from_the_worker(always_split):
    """non-batch-dim-sharding runs in the worker; the finding still names the partitioned dot."""
    folder = FIXTURES / "fsdp-activation-gather" / "jax-shardy-bad"
    report = analyze_dump(folder, jobs=2, select=["non-batch-dim-sharding"] + ["activation-all-gather"])
    names = [f.instruction for f in report.findings if f.rule == "non-batch-dim-sharding"]
    serial = analyze_dump(folder, jobs=1, select=["non-batch-dim-sharding"])
    assert names == [f.instruction for f in serial.findings] and names
    assert not any(parallel.PENDING_NAME in (f.instruction or "") for f in report.findings)


def test_the_main_process_parses_only_the_partitioned_snapshot(always_split):
    dump = load_dump(FIXTURES / "fsdp-activation-gather" / "jax-shardy-bad")
    analyze_dump(dump, jobs=2)
    parsed = {s.role for s in dump.modules[0].snapshots if s.parsed}
    assert Role.AFTER_PARTITIONING in parsed and Role.AFTER_PROPAGATION not in parsed


def test_a_worker_that_dies_has_its_rules_run_here(always_split, monkeypatch):
    monkeypatch.setattr(parallel, "_serve", lambda ctx, rules, write_end: os._exit(3))
    folder = FIXTURES / "non-batch-dim-sharding" / "jax-shardy-bad"
    assert _report(folder, jobs=2) == _report(folder, jobs=1)


def test_a_parse_failure_in_the_worker_is_reported_once(always_split, tmp_path):
    folder = tmp_path / "dump"
    shutil.copytree(FIXTURES / "uneven-padding" / "jax-shardy-bad", folder)
    after_propagation = load_dump(folder).modules[0].snapshot(Role.AFTER_PROPAGATION).path
    text = after_propagation.read_text()
    after_propagation.write_text(text.replace(" dot(", " dot((", 1) if " dot(" in text else text + "\n}}}\n")
    two, one = analyze_dump(folder, jobs=2), analyze_dump(folder, jobs=1)
    assert [e.message for e in two.errors] == [e.message for e in one.errors]
    assert [e for e in two.errors if str(after_propagation) in e.path]
    assert render_json(two) == render_json(one)


def test_no_worker_for_one_job_a_small_module_or_parsed_snapshots(monkeypatch):
    forks = []
    monkeypatch.setattr(parallel._Worker, "__init__", lambda self, ctx, rules: forks.append(rules) or 1 / 0)
    folder = FIXTURES / "non-batch-dim-sharding" / "jax-shardy-bad"
    analyze_dump(folder, jobs=2)  # a few hundred kB: below PARALLEL_MIN_BYTES
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    analyze_dump(folder, jobs=1)
    dump = load_dump(folder)
    dump.modules[0].snapshot(Role.AFTER_PROPAGATION).module()
    analyze_dump(dump, jobs=2)  # already in memory here
    assert forks == []
