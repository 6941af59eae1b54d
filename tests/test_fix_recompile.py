"""The patch plan_fixes writes removes the finding: the patched gallery program, recompiled through
the runner with ``--variant bad``, is diagnosed clean (one JAX and one torch_xla program; the
``hlo-doctor fix --verify`` loop does this for every program)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.runner.run import run_script
from hlo_doctor.testing import builtin_rule_ids
from tests.test_fix_snapshots import FIXTURES, ROOT, fix_plan

pytestmark = pytest.mark.slow
CASES = {
    "fsdp-activation-gather/jax-shardy-bad": "jax",
    "cross-host-tp/jax-gspmd-bad": "jax",
    "fsdp-activation-gather/torch_xla-bad": "torch_xla",
}


@pytest.mark.parametrize("case", CASES)
def test_patched_program_recompiles_clean(case: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(CASES[case]) is None:
        pytest.skip(f"{CASES[case]} is not installed")
    folder = FIXTURES / case
    sidecar = json.loads((folder / "hlo_doctor_run.json").read_text())
    plan, _ = fix_plan(folder)
    assert plan is not None and plan.applied and not plan.refused
    programs = tmp_path / "programs"
    shutil.copytree(ROOT / "hlo_doctor" / "examples" / "programs", programs)
    (path, text), = plan.patched.items()
    script = programs / Path(path).name
    script.write_text(text)
    partitioner = sidecar.get("partitioner") if sidecar.get("framework") == "jax" else None
    run_script(script, ["--variant", "bad"], dump_dir=tmp_path / "dump", devices=sidecar.get("device_count"),
               partitioner=partitioner, devices_per_host=sidecar.get("devices_per_host"), timeout=600)
    after = analyze_dump(tmp_path / "dump", select=builtin_rule_ids(), devices_per_host=sidecar.get("devices_per_host"))
    assert [f.rule for f in after.findings] == []
