"""Every fixture was made from the gallery program as it is now.

The runner records the program's sha256 in each dump's sidecar. When a
gallery program changes (even a comment: source lines move), its fixtures
must be regenerated with ``python scripts/regen_fixtures.py --only NAME``,
or the findings' source lines would point at the wrong code.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDECARS = sorted((ROOT / "fixtures").glob("*/*/hlo_doctor_run.json"))
PROGRAMS = ROOT / "hlo_doctor" / "examples" / "programs"


@pytest.mark.parametrize("sidecar", SIDECARS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_fixture_matches_the_current_program(sidecar: Path) -> None:
    record = json.loads(sidecar.read_text())
    script = record.get("script")
    assert script and script.get("sha256"), "fixture made before the runner recorded its program: regenerate it"
    program = PROGRAMS / Path(script["path"]).name
    assert program.is_file(), f"{program} is gone"
    assert hashlib.sha256(program.read_bytes()).hexdigest() == script["sha256"], (
        f"{program.name} changed since this fixture was made: python scripts/regen_fixtures.py "
        f"--only {sidecar.parent.parent.name}"
    )
