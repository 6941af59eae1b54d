"""`hlo-doctor fix --verify` end to end: run the gallery program, patch a copy, recompile, diagnose again.

The loop tests use the fake planner of tests/fix_fakes.py, so they test the loop whatever the
edit library does; the last two use the real library (hlo_doctor.fix.plan_fixes) on the seed
program in JAX and in torch_xla. Each compiles twice (a few seconds each).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import hlo_doctor.fix as fixlib
from hlo_doctor.cli import main
from tests.fix_fakes import fake_planner

pytestmark = pytest.mark.slow
HAVE_JAX = importlib.util.find_spec("jax") is not None
HAVE_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
PROGRAMS = Path(__file__).resolve().parents[1] / "hlo_doctor" / "examples" / "programs"
JAX_SEED = PROGRAMS / "fsdp_activation_gather.py"
TORCH_SEED = PROGRAMS / "fsdp_activation_gather_torch_xla.py"
# The seed's numbers, per device per step (counted by hand in tests/test_gate.py): bad: the batch x
# f32[160,1280] and the hidden h f32[160,960] gathered (819200 + 614400 B), both on the critical
# path; fixed: the weights w1 f32[1280,960] and w2 f32[960,128] (4915200 + 491520 B), prefetchable.
BAD = {"total": 1433600, "critical_path": 1433600, "prefetchable": 0, "by_role": {"activation-gather": 1433600}}
FIXED = {"total": 5406720, "critical_path": 0, "prefetchable": 5406720, "by_role": {"weight-gather": 5406720}}


def verify(*args: str):
    return CliRunner().invoke(main, ["fix", "--verify", *args])


def real_library() -> None:
    """Skip while the edit library is not built (hlo_doctor.fix.plan_fixes raises NotImplementedError)."""
    try:
        fixlib.plan_fixes(())
    except NotImplementedError:
        pytest.skip("hlo_doctor.fix.plan_fixes is not built yet")


def _traffic(side: dict) -> dict:
    return {key: side[key] for key in ("total", "critical_path", "prefetchable", "by_role")}


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_verify_reports_the_finding_gone_and_the_bytes_moved_off_the_critical_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixlib, "plan_fixes", fake_planner(lambda f: "h = jax.lax.with_sharding_constraint(h, batch)"))
    before = JAX_SEED.read_text()
    result = verify("--devices", "4", "--format", "json", "--", sys.executable, str(JAX_SEED), "--variant", "bad")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["kind"] == "fix-verify" and document["ok"] is True and document["exit_code"] == 0
    assert [(t["rule"], t["status"]) for t in document["targeted"]] == [("non-batch-dim-sharding", "gone")]
    assert document["new_findings"] == [] and document["refused"] == [] and document["problems"] == []
    assert _traffic(document["bytes_per_device"]["before"]) == BAD
    assert _traffic(document["bytes_per_device"]["after"]) == FIXED
    assert [(g["instruction"], g["parameters"], g["bytes"])
            for g in document["bytes_per_device"]["after"]["overlappable_gathers"]] == [
        ("all-gather", ["w1"], 4915200), ("all-gather.1", ["w2"], 491520)]
    assert document["patched_copy"] is None and document["written"] == []
    assert JAX_SEED.read_text() == before  # the original changes only with --write


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_a_finding_the_patch_only_moves_is_still_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The program imports a sibling module, and the patched copy goes to another folder under
    # another name: it must still import the sibling, and the finding, one line further down in a
    # file of another name, must still be recognised.
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    (project / "seed_helpers.py").write_text("BATCH_AXES = ('fsdp', 'replica')\n")
    script = project / "train.py"
    script.write_text(JAX_SEED.read_text().replace("import argparse\n", "import argparse\nimport seed_helpers\n"))
    line = script.read_text().splitlines().index("        h = x @ w1.T + b1") + 1
    monkeypatch.setattr(fixlib, "plan_fixes", fake_planner(lambda f: "x = x + 0.0", before=True))
    copy = elsewhere / "train_patched.py"
    result = verify("--devices", "4", "-o", str(copy), "--", sys.executable, str(script), "--variant", "bad")
    assert result.exit_code == 1, result.output
    assert "+        x = x + 0.0\n" in result.stdout
    assert (f"  still there: non-batch-dim-sharding at {script}:{line} (matched by fingerprint at "
            f"{copy.resolve()}:{line + 1})") in result.stdout
    assert "  no new findings" in result.stdout
    assert "    on the critical path  1.37 MiB -> 1.37 MiB (0%)" in result.stdout
    assert result.stdout.rstrip().endswith("not verified")
    assert copy.is_file() and "x = x + 0.0" in copy.read_text()
    assert "x = x + 0.0" not in script.read_text()


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_the_real_fix_of_the_jax_seed_verifies(tmp_path: Path) -> None:
    real_library()
    script = tmp_path / "fsdp_activation_gather.py"
    shutil.copyfile(JAX_SEED, script)
    result = verify("--devices", "4", "--write", "--", sys.executable, str(script), "--variant", "bad")
    assert result.exit_code == 0, result.output
    assert f"  gone: non-batch-dim-sharding at {script}:49" in result.stdout
    assert "    on the critical path  1.37 MiB -> 0 B (-100%)" in result.stdout
    assert "    weight-gather         0 B -> 5.16 MiB (new)" in result.stdout
    assert "with_sharding_constraint" in script.read_text().splitlines()[49]  # --write, after verifying


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_a_program_whose_finding_has_no_safe_edit_exits_1_with_the_reason() -> None:
    real_library()
    result = verify("--devices", "8", "--", sys.executable, str(PROGRAMS / "uneven_padding.py"), "--variant", "bad")
    assert result.exit_code == 1, result.output
    assert ("  no safe edit: hlo_doctor/examples/programs/uneven_padding.py:44: uneven-sharding-padding: the size "
            "50257 is a model dimension") in result.stdout.replace(str(PROGRAMS.parents[2]) + "/", "")
    assert "    total                 " in result.stdout  # the bytes before, though nothing was recompiled
    assert result.stdout.rstrip().endswith("not verified")


@pytest.mark.skipif(not HAVE_TORCH_XLA, reason="torch_xla is not installed")
def test_the_real_fix_of_the_torch_xla_seed_verifies(tmp_path: Path) -> None:
    real_library()
    result = verify("--devices", "4", "--format", "json", "--", sys.executable, str(TORCH_SEED), "--variant", "bad")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(t["rule"], t["status"]) for t in document["targeted"]] == [("non-batch-dim-sharding", "gone")]
    assert document["new_findings"] == []
    assert "xs.mark_sharding(h, " in document["diff"]
    assert _traffic(document["bytes_per_device"]["before"]) == BAD
    assert _traffic(document["bytes_per_device"]["after"]) == FIXED


HAVE_CUDA_PLUGIN = (HAVE_JAX and importlib.util.find_spec("jax_plugins") is not None
                    and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None)
SYNC_FLAG = "--xla_gpu_disable_async_collectives=allgather,reducescatter,allreduce"


@pytest.mark.skipif(not HAVE_CUDA_PLUGIN, reason="needs jax and the CUDA plugin (the gpu-target extra)")
def test_a_flag_set_in_the_environment_is_verified_by_recompiling_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_library()
    monkeypatch.setenv("XLA_FLAGS", f"--xla_gpu_enable_latency_hiding_scheduler=true {SYNC_FLAG}")
    result = verify("--target", "h100:2x8", "--format", "json", "--", sys.executable,
                    str(PROGRAMS / "sync_collective.py"), "--variant", "bad")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [c["remove_from_xla_flags"] for c in document["environment"]] == [SYNC_FLAG]
    assert document["edits"] == [] and document["refused"] == [] and document["diff"] == ""
    assert [(t["rule"], t["status"]) for t in document["targeted"]] == [("sync-collective", "gone")]
    assert document["new_findings"] == []
    # without the flag in the environment there is nothing to fix: the program itself is healthy
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true")
    clean = verify("--target", "h100:2x8", "--", sys.executable, str(PROGRAMS / "sync_collective.py"), "--variant", "bad")
    assert clean.exit_code == 0 and clean.stdout.rstrip().endswith("nothing to fix"), clean.output
