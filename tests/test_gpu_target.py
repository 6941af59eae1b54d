"""Deviceless GPU targets: parsing, configs, the GPU dump grammar, and (slow) real compiles."""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hlo_doctor.cli.run import run_command
from hlo_doctor.dump import FileKind, Role, load_dump, parse_file_name
from hlo_doctor.dump.options import CompileOptions
from hlo_doctor.dump.textproto import parse_textproto
from hlo_doctor.runner import (
    build_env,
    read_sidecar,
    run_example,
    run_script,
    trim_dump,
)
from hlo_doctor.runner.targets import (
    CONFIG_DIR,
    TARGET_SPECS,
    Target,
    TargetError,
    parse_target,
    target_env_value,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
HAVE_PLUGIN = (importlib.util.find_spec("jax") is not None
               and importlib.util.find_spec("jax_plugins") is not None  # absent: no plugin at all
               and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None)
needs_plugin = pytest.mark.skipif(not HAVE_PLUGIN, reason="jax CUDA plugin not installed "
                                  "(pip install -e .[gpu-target])")

_START = re.compile(r"%(?P<name>[\w.-]+) = .*? (?P<op>all-gather-start|all-reduce-start|"
                    r"collective-permute-start|async-start)\(")
_DONE = re.compile(r" (all-gather-done|all-reduce-done|collective-permute-done|async-done)\(")


def _collective_starts(text: str) -> list[tuple[str, bool, bool]]:
    """(name, is_sync, done right after start) of each collective start in a scheduled module."""
    lines = text.splitlines()
    bodies = dict(re.findall(r"^%([\w.-]+) [^\n]*\{\n(.*?)^\}", text, re.S | re.M))
    starts = []
    for i, line in enumerate(lines):
        match = _START.search(line)
        if match is None:
            continue
        if match["op"] == "async-start":
            called = re.search(r"calls=%([\w.-]+)", line)
            body = bodies.get(called[1], "") if called else ""
            if not re.search(r" (reduce-scatter|all-gather|all-reduce|all-to-all)\(", body):
                continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        adjacent = bool(_DONE.search(following)) and f"%{match['name']})" in following
        starts.append((match["name"], '"is_sync":true' in line, adjacent))
    return starts


# --- target parsing ----------------------------------------------------------------


@pytest.mark.parametrize(("text", "name", "hosts", "per_host"), [
    ("h100", "h100", 1, 8),
    ("h100:2x8", "h100", 2, 8),
    ("A100:4x4", "a100", 4, 4),
    (" a100 : 1x1 ", "a100", 1, 1),
])
def test_parse_target(text, name, hosts, per_host):
    target = parse_target(text)
    assert (target.name, target.hosts, target.devices_per_host) == (name, hosts, per_host)
    assert target.device_count == hosts * per_host
    assert target.topology == f"1x{hosts}x{per_host}"
    assert target.config_path == TARGET_SPECS[name].config_path.resolve()
    assert str(target) == f"{name}:{hosts}x{per_host}"


@pytest.mark.parametrize(("text", "message"), [
    ("v100", "unknown target 'v100'; choose one of: a100[:HOSTSxDEVICES], h100"),
    ("h100:2", "expected HOSTSxDEVICES"),
    ("h100:2x", "expected HOSTSxDEVICES"),
    ("h100:0x8", "at least 1"),
    ("h100:-1x8", "expected HOSTSxDEVICES"),
    ("", "unknown target"),
])
def test_parse_target_rejects(text, message):
    with pytest.raises(TargetError, match=re.escape(message)):
        parse_target(text)


def test_target_config_file(tmp_path):
    own = tmp_path / "my_gpu.txtpb"
    own.write_text((CONFIG_DIR / "h100_sxm.txtpb").read_text())
    target = parse_target("cluster:2x4", config_file=own)
    assert (target.name, target.hosts, target.devices_per_host) == ("cluster", 2, 4)
    assert target.config_path == own.resolve()
    assert parse_target(None, config_file=own).name == "my_gpu"
    assert parse_target("h100:2x8", config_file=own).config_path == own.resolve()
    assert target.to_json()["config"] == str(own.resolve())
    assert parse_target("h100").to_json()["config"] == "h100_sxm.txtpb"
    bad = tmp_path / "bad.txtpb"
    bad.write_text("platform_name: 'CUDA'\n")
    with pytest.raises(TargetError, match="not a GpuTargetConfigProto"):
        parse_target("x", config_file=bad)
    with pytest.raises(TargetError, match="--target-config"):
        parse_target("x", config_file=tmp_path / "missing.txtpb")


@pytest.mark.parametrize("name", sorted(TARGET_SPECS))
def test_builtin_configs_load(name):
    spec = TARGET_SPECS[name]
    text = spec.config_path.read_text()
    assert "Apache License 2.0" in text and "openxla/xla" in text  # provenance header
    message = parse_textproto(text)
    info = message.get("gpu_device_info")
    assert info is not None and info.get("core_count") in (108, 132)
    assert message.get("platform_name") == "CUDA"
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "collective_memory_granularity" not in body  # unknown to jaxlib 0.10.2
    assert (CONFIG_DIR / "NOTICE").is_file()


def test_cli_rejects_bad_targets(tmp_path):
    runner = CliRunner()
    result = runner.invoke(run_command, ["--target", "v100:2x8", "--", "python", "x.py"])
    assert result.exit_code == 2
    assert "unknown target 'v100'" in result.output and "h100[:HOSTSxDEVICES]" in result.output
    result = runner.invoke(run_command, ["--target", "h100:2by8", "--", "python", "x.py"])
    assert result.exit_code == 2 and "HOSTSxDEVICES" in result.output
    result = runner.invoke(run_command, ["--target", "h100", "--devices", "4",
                                         "--", "python", "x.py"])
    assert result.exit_code == 2 and "drop --devices" in result.output
    assert isinstance(run_command, click.Command)


def test_build_env_for_a_target(tmp_path):
    target = parse_target("h100:2x8")
    env = build_env({"JAX_PLATFORMS": "cuda"}, framework="jax", dump_dir=tmp_path,
                    target=target_env_value(target))
    assert env["JAX_PLATFORMS"] == "cpu"
    assert json.loads(env["HLO_DOCTOR_TARGET"])["topology"] == "1x2x8"
    with pytest.raises(ValueError, match="JAX programs only"):
        build_env({}, framework="torch_xla", dump_dir=tmp_path, target="{}")
    with pytest.raises(ValueError, match="drop --devices"):
        build_env({}, framework="jax", dump_dir=tmp_path, devices=4, target="{}")


def test_example_without_targets_rejects_one(tmp_path):
    with pytest.raises(ValueError, match="does not compile for a deviceless target"):
        run_example("llama-fsdp", framework="jax", variant="healthy",
                    dump_dir=tmp_path / "d", target=Target("h100", CONFIG_DIR, 1, 8))


# --- the GPU dump grammar -----------------------------------------------------------------


def test_gpu_file_names():
    name = parse_file_name("module_0001.jit_step.sm_9.0a_gpu_after_optimizations.txt")
    assert name.kind is FileKind.AFTER_OPTIMIZATIONS and name.backend == "sm_9.0a_gpu"
    assert name.module_name == "jit_step"
    name = parse_file_name("module_0001.jit_f.sm_8.0_gpu_after_optimizations.txt", {"jit_f"})
    assert name.backend == "sm_8.0_gpu"
    for ignored in (
        "module_0001.jit_step.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt",
        "module_0001.jit_step.sm_9.0a_gpu_after_optimizations-buffer-assignment-values.txt",
        "module_0001.jit_step.sm_9.0a_gpu_after_optimizations-live-range.txt",
        "module_0001.jit_step.sm_9.0a_gpu_after_optimizations-memory-usage-report.txt",
        "module_0001.jit_step.thunk_sequence.txt",
        "module_0001.jit_step.thunk_metadata.txt",
        "module_0001.jit_step.config.pbtxt",
        "module_0001.jit_step.gpu_target_config.pbtxt",
        "module_0001.jit_step.autotune_results.pbtxt",
        "module_0001.jit_step.13.ptx",
        "module_0001.jit_step.12.ir-no-opt.ll",
    ):
        assert parse_file_name(ignored, {"jit_step"}) is None, ignored


_CONFIG = """
num_partitions: 4
use_spmd_partitioning: true
debug_options { xla_gpu_autotune_level: 4 }
static_device_assignment {
  replica_count: 1
  computation_count: 4
  computation_devices { replica_device_ids: 0 }
  computation_devices { replica_device_ids: 4 }
  computation_devices { replica_device_ids: 1 }
  computation_devices { replica_device_ids: 5 }
}
"""


def test_static_device_assignment_from_config_pbtxt(tmp_path):
    options = CompileOptions.from_message(parse_textproto(_CONFIG), "config.pbtxt")
    assert options.device_assignment.device_ids == (0, 4, 1, 5)
    assert options.num_partitions == 4
    hlo = "HloModule jit_f, is_scheduled=true, num_partitions=4\n\nENTRY %main {\n}\n"
    (tmp_path / "module_0001.jit_f.before_optimizations.txt").write_text(hlo)
    (tmp_path / "module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt").write_text(hlo)
    (tmp_path / "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt"
     ).write_text("x")
    (tmp_path / "module_0001.jit_f.thunk_sequence.txt").write_text("x")
    (tmp_path / "module_0001.jit_f.config.pbtxt").write_text(_CONFIG)
    [module] = load_dump(tmp_path).modules
    assert [s.role for s in module.snapshots] == [Role.BEFORE_OPTIMIZATIONS,
                                                  Role.AFTER_OPTIMIZATIONS]
    assert module.backend == "sm_9.0a_gpu"
    assert module.device_assignment == (0, 4, 1, 5)
    assert module.compile_options.source.endswith("module_0001.jit_f.config.pbtxt")
    one = load_dump(tmp_path / "module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt")
    assert one.modules[0].device_assignment == (0, 4, 1, 5)


def test_trim_drops_gpu_noise(tmp_path):
    names = {
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt": True,
        "module_0001.jit_f.config.pbtxt": True,
        "module_0001.jit_f.gpu_target_config.pbtxt": True,
        "module_0001.jit_f.debug_options": True,
        # XLA's own memory files stay for `hlo-doctor memory`; the per-value listing goes
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt": True,
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-buffer-assignment-values.txt": False,
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-live-range.txt": True,
        "module_0001.jit_f.sm_9.0a_gpu_after_optimizations-memory-usage-report.txt": True,
        "module_0001.jit_f.thunk_sequence.txt": False,
        "module_0001.jit_f.thunk_metadata.txt": False,
        "module_0001.jit_f.autotune_results.pbtxt": False,
        "module_0001.jit_f.3.ptx": False,
        "module_0001.jit_f.2.ir-no-opt.ll": False,
    }
    for name in names:
        (tmp_path / name).write_text("HloModule x\n" if name.endswith("optimizations.txt") else "x")
    report = trim_dump(tmp_path)
    assert sorted(report.removed) == sorted(n for n, keep in names.items() if not keep)


# --- checked-in GPU fixtures ------------------------------------------------------------------

_GPU_FIXTURES = sorted(p for p in FIXTURES.glob("*/jax-*_*x*-*")
                       if read_sidecar(p)["target"].get("platform") != "tpu")


@pytest.mark.parametrize("folder", _GPU_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_gpu_fixture(folder):
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 2 << 20
    sidecar = read_sidecar(folder)
    target = sidecar["target"]
    assert folder.name.startswith(f"jax-{target['name']}_{target['hosts']}x"
                                  f"{target['devices_per_host']}-")
    assert [h["process_index"] for h in sidecar["hosts"]] == list(range(target["hosts"]))
    dump = load_dump(folder)
    [module] = dump.modules
    assert module.backend.endswith("_gpu") and module.backend.startswith("sm_")
    assert module.device_assignment == tuple(range(target["device_count"]))
    text = module.after_optimizations().path.read_text()
    assert text.startswith("HloModule") and "is_scheduled=true" in text.split("\n", 1)[0]
    assert not list(folder.glob("*.ll")) and not list(folder.glob("*thunk*"))


def test_sync_collective_fixtures_differ_in_is_sync():
    folder = FIXTURES / "sync-collective"
    if not folder.is_dir():
        pytest.skip("no sync-collective fixtures")
    bad = _collective_starts(next(folder.glob("jax-h100_2x8-bad/*gpu_after_optimizations.txt"))
                             .read_text())
    fixed = _collective_starts(next(folder.glob(
        "jax-h100_2x8-fixed/*gpu_after_optimizations.txt")).read_text())
    assert bad and all(sync and adjacent for _, sync, adjacent in bad)
    assert any(not sync for _, sync, _ in fixed)
    # the default pipeline overlaps some collectives: something between start and done
    assert any(not sync and not adjacent for _, sync, adjacent in fixed)


# --- end to end (slow): a real deviceless compile through the runner ---------------------------

_TINY_FSDP = """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    assert jax.device_count() == 16, jax.device_count()
    fsdp = NamedSharding(mesh, P("fsdp", None))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w[0]) @ w[1])

    @jax.jit
    def step(w, x):
        return [p - 0.1 * g for p, g in zip(w, jax.grad(loss)(w, x))]

    w = jax.device_put([np.ones((256, 512), np.float32), np.ones((512, 256), np.float32)],
                       fsdp)
    x = jax.device_put(np.ones((64, 256), np.float32), fsdp)
    for _ in range(2):
        w = step(w, x)
    print("OUT", w[0].shape, w[0].sharding.spec)
"""


@pytest.mark.slow
@needs_plugin
def test_run_script_on_h100_2x8(tmp_path):
    script = tmp_path / "tiny_fsdp.py"
    script.write_text(textwrap.dedent(_TINY_FSDP))
    result = run_script(script, [], dump_dir=tmp_path / "dump",
                        target=parse_target("h100:2x8"), timeout=300)
    assert "OUT (256, 512) P('fsdp', None)" in result.stdout
    sidecar = read_sidecar(result.dump_dir)
    assert sidecar["target"]["name"] == "h100" and sidecar["target"]["topology"] == "1x2x8"
    assert sidecar["device_count"] == 16 and sidecar["devices_per_host"] == 8
    assert sidecar["hosts"] == [{"process_index": 0, "device_ids": list(range(8))},
                                {"process_index": 1, "device_ids": list(range(8, 16))}]
    assert {d["process_index"] for d in sidecar["devices"] if d["id"] >= 8} == {1}
    assert len(sidecar["compiles"]) == 1  # the second call hit the cache
    assert sidecar["instrumentation_errors"] == []
    [(key, assignment)] = sidecar["device_assignments"].items()
    assert key.endswith(".jit_step") and assignment == list(range(16))

    snapshots = list(result.dump_dir.glob("*.sm_9.0a_gpu_after_optimizations.txt"))
    assert len(snapshots) == 1
    text = snapshots[0].read_text()
    assert "is_scheduled=true" in text.split("\n", 1)[0]
    starts = _collective_starts(text)
    assert starts and any(not sync for _, sync, _ in starts)
    for op in ("all-gather-start", "all-gather-done"):
        assert f" {op}(" in text
    assert " all-reduce-start(" in text or "reduce-scatter" in text
    assert not list(result.dump_dir.glob("*.ll")) and not list(result.dump_dir.glob("*thunk*"))

    dump = load_dump(result.dump_dir)
    [module] = dump.modules
    assert module.backend == "sm_9.0a_gpu"
    assert module.device_assignment == tuple(range(16))
    assert module.compile_options.source.endswith(".config.pbtxt")
    assert module.after_optimizations().module().attribute("is_scheduled") == "true"

    # ... and analyzed: the H100 profile and the host layout come from the dump and its sidecar
    from hlo_doctor.analysis import analyze_dump

    report = analyze_dump(result.dump_dir, rule_options={"communication-bound": {"min_compute_seconds": 0.0}})
    assert not [f for f in report.findings if f.rule == "internal-error"]
    # judged although the toy step's matmuls take nanoseconds (min_compute_seconds 0)
    assert sorted({f.rule for f in report.findings}) == ["communication-bound"]
    [bound] = report.findings
    assert bound.evidence["hardware"] == "h100" and bound.evidence["slow_boundary"] == "host"
    assert bound.evidence["slow_link_bytes_sent"] > 0  # FSDP over 16 devices crosses the 2 hosts
    # the FSDP weight gathers of a scheduled module are async: part of their time overlaps
    assert bound.evidence["exposed_communication_seconds"] <= bound.evidence["communication_seconds"]


@pytest.mark.slow
@needs_plugin
def test_compile_for_target_in_process(tmp_path):
    import subprocess
    import sys

    code = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np, json
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from hlo_doctor.runner.targets import compile_for_target, target_devices
        mesh = Mesh(np.array(target_devices("a100:2x8")).reshape(16, 1), ("fsdp", "tp"))
        x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
        w = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=NamedSharding(mesh, P("fsdp")))
        out = compile_for_target(lambda x, w: x @ w, x, w, target="a100:2x8",
            dump_dir={str(tmp_path / 'dump')!r},
            compiler_options={{"xla_gpu_disable_async_collectives": "allgather"}})
        print(json.dumps([out.sidecar["hosts"], out.sidecar["device_count"]]))
    """)
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    hosts, count = json.loads(done.stdout.strip().splitlines()[-1])
    assert count == 16 and [h["device_ids"] for h in hosts] == [list(range(8)),
                                                                list(range(8, 16))]
    [snapshot] = (tmp_path / "dump").glob("*.sm_8.0_gpu_after_optimizations.txt")
    starts = _collective_starts(snapshot.read_text())
    assert starts and all(sync for _, sync, _ in starts)
    assert load_dump(tmp_path / "dump").modules[0].device_assignment == tuple(range(16))
