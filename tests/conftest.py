"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The ``shared/`` folder next to the repository; tests skip when it is absent."""
    path = Path(__file__).resolve().parents[1].parent / "shared"
    if not path.is_dir():
        pytest.skip(f"{path} is absent")
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots",
        action="store_true",
        default=False,
        help="rewrite tests/snapshots/* from the current output instead of comparing",
    )


@pytest.fixture
def matches_snapshot(request: pytest.FixtureRequest):
    """``check(snapshot, produced)``: assert ``produced`` is the reviewed text in ``snapshot``
    (with ``--update-snapshots``, write it there instead)."""
    def check(snapshot: Path, produced: str) -> None:
        if request.config.getoption("--update-snapshots"):
            snapshot.write_text(produced)
            return
        assert snapshot.is_file(), f"no snapshot {snapshot.name}: run with --update-snapshots"
        assert produced == snapshot.read_text()
    return check


PROGRAMS = Path(__file__).resolve().parents[1] / "hlo_doctor" / "examples" / "programs"


def program_line(program: str, snippet: str) -> int:
    """The 1-based line of the gallery ``program`` that contains ``snippet`` (exactly once)."""
    lines = [n for n, text in enumerate((PROGRAMS / program).read_text().splitlines(), 1) if snippet in text]
    assert len(lines) == 1, f"{snippet!r} is on lines {lines} of {program}"
    return lines[0]


def probe_dump(folder: Path, propagated: str, partitioned: str | None = None) -> Path:
    """A dump folder of one hand-written module: its after-propagation snapshot, and its partitioned
    one (the same text when not given: the rules read the batch axes from the partitioned entry's
    shardings and the matmuls' from the propagated module)."""
    (folder / "module_0000.probe.0000.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt"
     ).write_text(propagated)
    (folder / "module_0000.probe.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt").write_text(
        propagated if partitioned is None else partitioned)
    return folder
