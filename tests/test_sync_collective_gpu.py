"""sync-collective on real XLA:GPU output, and analyze_jax(target=...) end to end.

The fixtures are an FSDP llama train step (value_and_grad + update) compiled
deviceless for 2 hosts x 8 H100s: ``bad`` with
--xla_gpu_disable_async_collectives=allgather,reducescatter,allreduce,
``fixed`` with XLA's default flags. The slow tests compile a tiny FSDP train
step for h100:2x8 in a subprocess (JAX must start with JAX_PLATFORMS=cpu).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "sync-collective"
FLAG = "--xla_gpu_disable_async_collectives=allgather,reducescatter,allreduce"
HAVE_PLUGIN = (importlib.util.find_spec("jax") is not None
               and importlib.util.find_spec("jax_plugins") is not None  # absent: no plugin at all
               and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None)
needs_plugin = pytest.mark.skipif(not HAVE_PLUGIN, reason="jax CUDA plugin not installed "
                                  "(pip install -e .[gpu-target])")

_START = re.compile(r"^\s*%(?P<name>[\w.-]+) = .*? (?:[\w-]+-start|async-start)\(.*$", re.MULTILINE)


def _sync_starts(text: str) -> list[str]:
    """The start instructions marked "is_sync":true, in schedule order (read from the text)."""
    return [m["name"] for m in _START.finditer(text) if '"is_sync":true' in m.group(0)]


def _snapshot(folder: Path) -> str:
    [path] = folder.glob("*.sm_9.0a_gpu_after_optimizations.txt")
    return path.read_text()


def _sync_findings(folder: Path):
    report = analyze_dump(folder, select=["sync-collective"])
    return report.findings


# --- the checked-in GPU fixtures --------------------------------------------------------------


def test_fixtures_are_an_fsdp_train_step_on_2x8_h100():
    for variant in ("bad", "fixed"):
        folder = FIXTURES / f"jax-h100_2x8-{variant}"
        record = json.loads((folder / "hlo_doctor_run.json").read_text())
        assert record["target"]["name"] == "h100" and record["target"]["topology"] == "1x2x8"
        text = _snapshot(folder)
        assert text.startswith("HloModule jit_train_step") and "is_scheduled=true" in text.split("\n", 1)[0]
        # the forward gathers the FSDP shards, the backward reduce-scatters the gradients
        assert " all-gather-start(" in text and "reduce-scatter(" in text
        debug = next(folder.glob("*.debug_options")).read_text()
        assert ("xla_gpu_disable_async_collectives" in debug) == (variant == "bad")


def test_bad_fixture_one_finding_naming_every_sync_start_and_the_flag():
    folder = FIXTURES / "jax-h100_2x8-bad"
    starts = _sync_starts(_snapshot(folder))
    assert starts == ["all-gather-start", "all-reduce-start", "reduce-scatter-start"]
    (finding,) = _sync_findings(folder)
    assert finding.instruction == "all-gather-start"  # the first in schedule order
    assert finding.evidence["cause"] == "flag"
    assert finding.evidence["flag"] == "xla_gpu_disable_async_collectives"
    assert finding.evidence["flags"] == [FLAG]
    assert finding.evidence["sync_starts"] == starts
    assert finding.evidence["starts_with_independent_work"] == ["all-reduce-start"]
    assert finding.message.startswith(f"{FLAG} makes the listed collectives synchronous: 3 collectives")
    assert all(name in finding.message for name in starts)
    assert f"the flag, not the program, is to blame: remove {FLAG}" in finding.message
    assert FLAG in finding.suggestion.summary
    assert set(finding.related) >= {"all-reduce-start", "reduce-scatter-start", "all-gather-done"}
    assert "reduce-scatter.11" not in finding.message  # the async-start's wrapped op is no second collective


def test_fixed_fixture_no_finding_although_xla_made_the_first_all_gather_sync():
    folder = FIXTURES / "jax-h100_2x8-fixed"
    # XLA itself made the step's first all-gather synchronous: only constant tables and a few
    # KiB of loss bookkeeping are independent of it, nothing that could hide 5 MiB of weights
    assert _sync_starts(_snapshot(folder)) == ["all-gather-start"]
    assert _sync_findings(folder) == ()
    # even with every byte of independent work counted: XLA made it synchronous itself, and no
    # matmul or loop is independent of it, so its own schedule stands
    report = analyze_dump(folder, select=["sync-collective"],
                          rule_options={"sync-collective": {"min_work_fraction": 0.0}})
    assert report.findings == ()


# --- analyze_jax(target=...) -------------------------------------------------------------------


def test_analyze_jax_target_rejects_devices_and_bad_targets():
    from hlo_doctor.api import analyze_jax

    with pytest.raises(InputError, match="drop devices=16"):
        analyze_jax(lambda x: x, 1.0, target="h100:2x8", devices=16)
    with pytest.raises(InputError, match="contradicts target h100:2x8"):
        analyze_jax(lambda x: x, 1.0, target="h100:2x8", devices_per_host=4)
    with pytest.raises(InputError, match="unknown target 'v100'"):
        analyze_jax(lambda x: x, 1.0, target="v100")


_TINY_FSDP = """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import hlo_doctor
    from hlo_doctor.runner.targets import target_devices

    if sys.argv[2] == "cpu-mesh":  # CPU devices with the target's ids are moved onto the target
        jax.config.update("jax_num_cpu_devices", 16)
        jax.config.update("jax_platforms", "cpu")
        devices = jax.devices()
    else:
        devices = target_devices("h100:2x8")
    mesh = Mesh(np.array(devices), ("fsdp",))
    fsdp = NamedSharding(mesh, P("fsdp", None))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w[0]) @ w[1])

    def train_step(w, x):
        value, grads = jax.value_and_grad(loss)(w, x)
        return [p - 0.1 * g for p, g in zip(w, grads)], value

    w = [jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=fsdp),
         jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=fsdp)]
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=fsdp)
    out = {}
    for label, options in (("default", None), ("flag", {
            "xla_gpu_disable_async_collectives": "allgather,reducescatter,allreduce"})):
        report = hlo_doctor.analyze_jax(train_step, w, x, target="h100:2x8",
                                        dump_dir=f"{sys.argv[1]}/{label}", compiler_options=options)
        out[label] = [{"rule": f.rule, "instruction": f.instruction, "message": f.message,
                       "evidence": f.evidence} for f in report.findings]
        out[label + "-skipped"] = {s.rule: s.reason for s in report.skipped}
    print(json.dumps(out, default=str))
"""


def _run_tiny_fsdp(tmp_path: Path, mesh: str) -> dict:
    script = tmp_path / "tiny_fsdp.py"
    script.write_text(textwrap.dedent(_TINY_FSDP))
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "dumps"), mesh],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@needs_plugin
@pytest.mark.parametrize("mesh", ["target-mesh", "cpu-mesh"])
def test_analyze_jax_for_h100_2x8(tmp_path, mesh):
    out = _run_tiny_fsdp(tmp_path, mesh)
    for label in ("default", "flag"):
        folder = tmp_path / "dumps" / label
        record = json.loads((folder / "hlo_doctor_run.json").read_text())
        assert record["target"]["name"] == "h100" and record["device_count"] == 16
        assert record["devices_per_host"] == 8
        assert record["hosts"] == [{"process_index": 0, "device_ids": list(range(8))},
                                   {"process_index": 1, "device_ids": list(range(8, 16))}]
        assert list(record["device_assignments"].values()) == [list(range(16))]
        assert "is_scheduled=true" in _snapshot(folder).split("\n", 1)[0]
        # communication-bound chose the H100 profile by itself, and judged the step too short to
        # say (its matmuls take well under a microsecond: latency, not bandwidth, decides it)
        assert [f for f in out[label] if f["rule"] == "communication-bound"] == []
        reason = out[label + "-skipped"]["communication-bound"]
        assert " on h100, under min-compute-seconds" in reason

    # default flags: XLA made the first all-gather synchronous itself; no warning
    assert _sync_starts(_snapshot(tmp_path / "dumps" / "default"))  # the premise
    assert [f for f in out["default"] if f["rule"] == "sync-collective"] == []
    # the flag: one warning naming every synchronous start and the flag to remove
    starts = _sync_starts(_snapshot(tmp_path / "dumps" / "flag"))
    assert {s.rsplit(".", 1)[0] for s in starts} >= {"all-gather-start", "reduce-scatter-start",
                                                     "all-reduce-start"}
    [sync] = [f for f in out["flag"] if f["rule"] == "sync-collective"]
    assert sync["instruction"] == starts[0]
    assert sync["evidence"]["sync_starts"] == starts
    assert sync["evidence"]["flags"] == [FLAG]
    assert f"remove {FLAG}" in sync["message"]


def test_the_fix_removes_the_flag_and_keeps_the_others(monkeypatch):
    """The printed Python removes the overlap-killing flag from XLA_FLAGS and keeps every other
    flag (an empty value, --xla_gpu_disable_async_collectives=, is rejected by XLA's flag parser:
    tests/test_printed_fixes_recompile.py recompiles the patched program)."""
    from hlo_doctor.analysis import analyze_dump

    report = analyze_dump(Path(__file__).resolve().parents[1] / "fixtures" / "sync-collective" / "jax-h100_2x8-bad",
                          select=["sync-collective"])
    assert report.findings
    for finding in report.findings:
        for code in (finding.suggestion.jax, finding.suggestion.torch_xla):
            environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_gpu_disable_async_collectives=allgather,allreduce "
                                    "--xla_force_host_platform_device_count=8"}
            monkeypatch.setattr("os.environ", environ)
            exec(code, {"os": __import__("os")})  # the Python lines, run
            assert environ["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/d", "--xla_force_host_platform_device_count=8"]