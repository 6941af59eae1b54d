"""Rules split over two processes, and modules analysed in worker processes, give the
report a serial run gives.

``run_module_rules`` forks only for modules of 8 MB or more, and
``map_modules`` only for dumps of two or more modules and 4 MB or more; here
the thresholds are lowered so that every fixture takes each parallel path.
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
from hlo_doctor.rules import module_workers, parallel

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


@pytest.fixture
def module_workers_always(monkeypatch):
    """Every dump, even of one module, has its modules analysed in worker processes; lists the
    module indexes handed to workers."""
    monkeypatch.setattr(module_workers, "MODULES_MIN_BYTES", 0)
    monkeypatch.setattr(module_workers, "MODULES_MIN_COUNT", 1)
    sent = []
    real = module_workers._Worker.send
    monkeypatch.setattr(module_workers._Worker, "send", lambda self, index, share: sent.append(index) or real(self, index, share))
    return sent


@pytest.fixture
def worker_forks(monkeypatch):
    """The pids of the module workers forked."""
    pids = []
    real = module_workers.fork_server

    def counting(*args, **kwargs):
        requests, answers, pid = real(*args, **kwargs)
        pids.append(pid)
        return requests, answers, pid

    monkeypatch.setattr(module_workers, "fork_server", counting)
    return pids


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parallel_runs_report_what_a_serial_one_does(folder, always_split, monkeypatch, request):
    """On every fixture: the JSON report (findings with evidence and fingerprints, their order,
    errors, skips, module summaries) of one process, of rules split over two, and of modules
    analysed in worker processes, all the same."""
    serial = _report(folder, jobs=1)
    monkeypatch.setattr(module_workers, "MODULES_MIN_COUNT", 10**9)  # the modules one after another
    assert _report(folder, jobs=2) == serial
    assert always_split and "non-batch-dim-sharding" in always_split[0]
    forks = request.getfixturevalue("module_workers_always")
    assert _report(folder, jobs=2) == serial
    assert sorted(forks) == list(range(len(load_dump(folder).modules)))


def test_names_after_partitioning_come_back_from_the_worker(always_split):
    """non-batch-dim-sharding runs in the worker; the finding still names the partitioned dot."""
    folder = FIXTURES / "fsdp-activation-gather" / "jax-shardy-bad"
    report = analyze_dump(folder, jobs=2, select=["non-batch-dim-sharding"] + ["activation-all-gather"])
    names = [f.instruction for f in report.findings if f.rule == "non-batch-dim-sharding"]
    serial = analyze_dump(folder, jobs=1, select=["non-batch-dim-sharding"])
    assert names == [f.instruction for f in serial.findings] and names
    assert not any(parallel.PENDING_NAME in (f.instruction or "") for f in report.findings)


def test_the_main_process_parses_only_the_partitioned_snapshot(always_split):
    # A healthy step: no rule of the main process needs the propagated module (replicated-batch
    # reads it only where activations move over a batch axis, to look for a regroup).
    dump = load_dump(FIXTURES / "fsdp-activation-gather" / "jax-shardy-fixed")
    analyze_dump(dump, jobs=2)
    parsed = {s.role for s in dump.modules[0].snapshots if s.parsed}
    assert Role.AFTER_PARTITIONING in parsed and Role.AFTER_PROPAGATION not in parsed


def test_a_worker_that_dies_has_its_rules_run_here(always_split, monkeypatch):
    monkeypatch.setattr(parallel, "_worker_result", lambda ctx, rules: os._exit(3))
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


def test_modules_come_back_in_order_and_a_dead_worker_is_redone_here(module_workers_always, monkeypatch):
    """A worker that dies has its module analysed in this process; the report keeps module order."""
    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"  # 18 modules
    serial = _report(folder, jobs=1)
    real = module_workers._child_answer
    monkeypatch.setattr(module_workers, "_child_answer",
                        lambda work, index, share: os._exit(3) if index % 3 == 0 else real(work, index, share))
    assert _report(folder, jobs=3) == serial
    assert sorted(module_workers_always) == list(range(len(load_dump(folder).modules)))


def test_a_worker_analyses_module_after_module(module_workers_always, worker_forks):
    """Workers are forked once each, not once per module, and each module goes to one of them."""
    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"
    count = len(load_dump(folder).modules)
    assert _report(folder, jobs=2) == _report(folder, jobs=1)
    assert len(worker_forks) == 2 < count
    assert sorted(module_workers_always) == list(range(count))


def test_a_dead_worker_is_replaced_while_modules_are_left(module_workers_always, worker_forks, monkeypatch):
    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"
    serial = _report(folder, jobs=1)
    modules = load_dump(folder).modules
    sizes = [sum(s.size or 0 for s in module.snapshots) for module in modules]
    first_handed_out = sorted(range(len(modules)), key=lambda i: (-sizes[i], i))[:3]
    dying = {first_handed_out[0], first_handed_out[2]}  # modules are left after each
    real = module_workers._child_answer
    monkeypatch.setattr(module_workers, "_child_answer",
                        lambda work, index, share: os._exit(3) if index in dying else real(work, index, share))
    assert _report(folder, jobs=2) == serial
    assert len(worker_forks) == 4  # two, and one for each that died


def test_a_module_a_worker_cannot_answer_is_redone_here(module_workers_always, worker_forks, monkeypatch):
    """work raising in the worker: that module is redone here, and the worker goes on."""
    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"
    serial = _report(folder, jobs=1)
    real = module_workers._child_answer

    def failing(work, index, share):
        if index == 1:
            raise RuntimeError("cannot answer")
        return real(work, index, share)

    monkeypatch.setattr(module_workers, "_child_answer", failing)
    assert _report(folder, jobs=2) == serial
    assert len(worker_forks) == 2


def test_the_parent_holds_no_parsed_module_and_learns_what_the_workers_parsed(module_workers_always):
    dump = load_dump(FIXTURES / "keras-layout-map" / "jax-shardy-bad")
    analyze_dump(dump, jobs=2)
    snapshots = [s for module in dump.modules for s in module.snapshots]
    assert not any(s.parsed for s in snapshots)
    assert any(s.parsed_once for s in snapshots)


def test_a_dump_loaded_by_analyze_is_released_module_by_module(monkeypatch):
    """Serially, each module's parsed snapshots are dropped when it is done (a Dump passed in is kept)."""
    from hlo_doctor.dump.snapshot import Snapshot

    released = []
    real = Snapshot.release
    monkeypatch.setattr(Snapshot, "release", lambda self: released.append(self.parsed) or real(self))
    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"
    analyze_dump(folder, jobs=1)
    assert any(released)
    released.clear()
    dump = load_dump(folder)
    analyze_dump(dump, jobs=1)
    assert released == [] and any(s.parsed for m in dump.modules for s in m.snapshots)


def test_a_worker_that_died_between_modules_has_its_next_one_redone_here(module_workers_always, monkeypatch):
    """The worker is gone when its next module is sent (the write fails): that module is redone here."""
    import signal

    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"
    serial = _report(folder, jobs=1)
    real = module_workers._Worker.send
    sends = []

    def send_to_a_dead_worker(self, index, share):
        sends.append(index)
        if len(sends) == 4:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = os.fork() or os._exit(0)  # reaped here: stop() reaps a stand-in instead
        real(self, index, share)

    monkeypatch.setattr(module_workers._Worker, "send", send_to_a_dead_worker)
    assert _report(folder, jobs=2) == serial


def test_an_answer_is_taken_only_once_it_has_all_come():
    """fork_server's answers are length-framed; what is read so far may end inside a frame."""
    from hlo_doctor.rules._forked import take_answer

    first, second = b"x" * 70_000, b""  # an answer longer than a pipe's buffer, and an empty one
    stream = len(first).to_bytes(8, "little") + first + len(second).to_bytes(8, "little")
    data = bytearray()
    taken = []
    for at in range(0, len(stream), 4099):  # in pieces that split the header and the body
        data += stream[at:at + 4099]
        while (answer := take_answer(data)) is not None:
            taken.append(answer)
    assert taken == [first, second] and not data
    assert take_answer(bytearray(b"\x05\x00\x00")) is None
