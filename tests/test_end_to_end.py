"""Compile and diagnose, end to end: runner -> real dump -> analysis -> findings with fixes."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.cli import main
from hlo_doctor.runner import run_example
from hlo_doctor.testing import builtin_rule_ids

pytestmark = pytest.mark.slow
HAVE_JAX = importlib.util.find_spec("jax") is not None
HAVE_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
# One root cause: the feature-sharded first layer; the two activation gathers it causes are its related ops.
SEED_RULES = ["non-batch-dim-sharding"]
SEED_SYMPTOMS = ["activation-all-gather", "activation-all-gather"]


def diagnose(dump: Path):
    return analyze_dump(dump, select=builtin_rule_ids())


@pytest.mark.skipif(not HAVE_TORCH_XLA, reason="torch_xla is not installed")
def test_torch_xla_seed_is_diagnosed_with_a_mark_sharding_fix(tmp_path: Path) -> None:
    bad = diagnose(run_example("fsdp-activation-gather", framework="torch_xla", variant="bad",
                               dump_dir=tmp_path / "bad").dump_dir)
    assert sorted(f.rule for f in bad.findings) == SEED_RULES
    assert [s["rule"] for s in bad.findings[0].evidence["symptoms"]] == SEED_SYMPTOMS
    for finding in bad.findings:
        assert finding.suggestion is not None
        # the real mesh axis names, recorded by the runner from xs.Mesh(...); forward() reaches the
        # mesh as self.mesh (MLP.__init__ stores it)
        assert finding.suggestion.torch_xla == "xs.mark_sharding(h, self.mesh, (('fsdp', 'replica'), None))"
        assert finding.source is not None and finding.source.file.endswith("fsdp_activation_gather_torch_xla.py")
    fixed = diagnose(run_example("fsdp-activation-gather", framework="torch_xla", variant="fixed",
                                 dump_dir=tmp_path / "fixed").dump_dir)
    assert fixed.findings == ()


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_jax_seed_is_diagnosed_and_its_fix_is_clean(tmp_path: Path, partitioner: str) -> None:
    bad = diagnose(run_example("fsdp-activation-gather", framework="jax", variant="bad",
                               dump_dir=tmp_path / "bad", partitioner=partitioner).dump_dir)
    assert sorted(f.rule for f in bad.findings) == SEED_RULES
    assert [s["rule"] for s in bad.findings[0].evidence["symptoms"]] == SEED_SYMPTOMS
    assert {f.suggestion.jax for f in bad.findings} == {
        "h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(('fsdp', 'replica'), None)))"
    }
    fixed = diagnose(run_example("fsdp-activation-gather", framework="jax", variant="fixed",
                                 dump_dir=tmp_path / "fixed", partitioner=partitioner).dump_dir)
    assert fixed.findings == ()


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_healthy_llama_has_no_findings(tmp_path: Path) -> None:
    report = diagnose(run_example("llama-fsdp", framework="jax", variant="healthy",
                                  dump_dir=tmp_path / "llama").dump_dir)
    assert report.findings == ()
    assert report.modules and report.modules[0].collectives.get("all-gather", (0, 0))[0] > 0


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_run_on_a_user_script_outside_the_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "elsewhere" / "my_script.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent("""
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

        mesh = Mesh(np.array(jax.devices()).reshape(4), ("data",))
        x = jax.ShapeDtypeStruct((64, 50257), jnp.float32, sharding=NamedSharding(mesh, P(None, None)))

        def f(x):
            return jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P(None, "data")))

        jax.jit(f).lower(x).compile()
    """))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        main, ["run", "--devices", "4", "--dump-dir", "dump", "--", sys.executable, str(script)]
    )
    assert result.exit_code == 0, result.output
    sidecar = json.loads((tmp_path / "dump" / "hlo_doctor_run.json").read_text())
    assert sidecar["meshes"][0]["axis_names"] == ["data"]
    assert list((tmp_path / "dump").glob("*after_spmd-partitioning*.txt"))
    # the report: 50257 does not divide over 4 devices
    assert "uneven-sharding-padding" in result.output
    assert "my_script.py:11" in result.output
