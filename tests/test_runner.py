"""The runner: environment, framework detection, trimming, the sidecar, the mesh hook, the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli.run import examples_command, run_command
from hlo_doctor.examples import EXAMPLES, get_example
from hlo_doctor.runner import (
    SIDECAR_NAME,
    FrameworkError,
    RunError,
    build_env,
    detect_framework,
    merge_xla_flags,
    parse_xla_flags,
    read_sidecar,
    run_example,
    run_script,
    trim_dump,
)
from hlo_doctor.runner.sidecar import build_sidecar

HAVE_JAX = importlib.util.find_spec("jax") is not None
HAVE_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# --- XLA_FLAGS and the environment ---------------------------------------------


def test_merge_keeps_every_user_flag():
    user = "--xla_cpu_enable_fast_math=false --xla_dump_hlo_as_proto --xla_dump_to=/user/dir"
    merged = parse_xla_flags(
        merge_xla_flags(user, {"xla_dump_to": "/ours", "xla_dump_hlo_pass_re": "spmd"})
    )
    assert merged["xla_cpu_enable_fast_math"] == "false"
    assert "xla_dump_hlo_as_proto" in merged and merged["xla_dump_hlo_as_proto"] is None
    assert merged["xla_dump_to"] == "/ours"
    assert merged["xla_dump_hlo_pass_re"] == "spmd"


def test_merge_widens_a_user_pass_regex():
    merged = parse_xla_flags(merge_xla_flags("--xla_dump_hlo_pass_re=fusion", {
        "xla_dump_hlo_pass_re": "spmd|propagation"}))
    assert merged["xla_dump_hlo_pass_re"] == "fusion|spmd|propagation"


def test_flags_with_spaces_round_trip():
    text = merge_xla_flags('--xla_dump_to="/a b/c"', {})
    assert parse_xla_flags(text) == {"xla_dump_to": "/a b/c"}


def test_build_env_for_jax(tmp_path):
    env = build_env({"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false", "PYTHONPATH": "/old"},
                    framework="jax", dump_dir=tmp_path, devices=8, partitioner="gspmd",
                    bootstrap_dir=tmp_path / "boot", events_file=tmp_path / "e.jsonl")
    flags = parse_xla_flags(env["XLA_FLAGS"])
    assert flags["xla_cpu_use_thunk_runtime"] == "false"
    assert flags["xla_dump_to"] == str(tmp_path)
    assert flags["xla_dump_hlo_pass_re"] == "spmd|propagation|shardy-verbose"
    assert flags["xla_force_host_platform_device_count"] == "8"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["JAX_USE_SHARDY_PARTITIONER"] == "0"
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "boot"), "/old"])
    assert env["HLO_DOCTOR_EVENTS"] == str(tmp_path / "e.jsonl")


def test_build_env_for_torch_xla(tmp_path):
    env = build_env({}, framework="torch_xla", dump_dir=tmp_path, devices=4)
    assert env["PJRT_DEVICE"] == "CPU"
    assert env["CPU_NUM_DEVICES"] == "4"
    assert env["XLA_HLO_DEBUG"] == "1"
    assert "xla_force_host_platform_device_count" not in parse_xla_flags(env["XLA_FLAGS"])
    assert "JAX_PLATFORMS" not in env


def test_build_env_without_devices_leaves_the_platform(tmp_path):
    env = build_env({}, framework="jax", dump_dir=tmp_path)
    assert "JAX_PLATFORMS" not in env and "JAX_USE_SHARDY_PARTITIONER" not in env


@pytest.mark.parametrize("kwargs", [
    {"framework": "torch_xla", "partitioner": "shardy"},
    {"framework": "jax", "partitioner": "auto"},
    {"framework": "jax", "devices": 0},
])
def test_build_env_rejects_bad_settings(tmp_path, kwargs):
    with pytest.raises(ValueError):
        build_env({}, dump_dir=tmp_path, **kwargs)


# --- framework detection ----------------------------------------------------------


@pytest.mark.parametrize("source, expected", [
    ("import jax\n", "jax"),
    ("from jax.sharding import Mesh\n", "jax"),
    ("import jax.numpy as jnp\n", "jax"),
    ("import torch\nimport torch_xla.core.xla_model as xm\n", "torch_xla"),
    ("from torch_xla.distributed import spmd as xs\n", "torch_xla"),
])
def test_detect_framework(tmp_path, source, expected):
    assert detect_framework(_write(tmp_path / "s.py", source)) == expected


def test_detect_framework_follows_local_modules(tmp_path):
    _write(tmp_path / "model.py", "import jax\n")
    assert detect_framework(_write(tmp_path / "train.py", "import model\n")) == "jax"


@pytest.mark.parametrize("source", ["import torch\n", "import jax\nimport torch_xla\n"])
def test_detect_framework_refuses_to_guess(tmp_path, source):
    with pytest.raises(FrameworkError):
        detect_framework(_write(tmp_path / "s.py", source))


# --- trimming ---------------------------------------------------------------------


def test_trim_keeps_hlo_and_sharding_mlir(tmp_path):
    keep = {
        "module_0000.jit_f.before_optimizations.txt": "HloModule jit_f\n",
        "module_0000.jit_f.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt":
            "HloModule jit_f\n" + "x" * 5000,
        "module_0000.jit_f/module.mlir": "module {}",
        "module_0000.jit_f/compile_options.textproto": "x",
        "shardy/module_0000.jit_f/02.after_propagation.mlir": "module {}",
        "module_0000.jit_f.debug_options": "x",
        SIDECAR_NAME: "{}",
    }
    drop = {
        "module_0000.jit_f.broadcast_add_fusion_kernel_module.ir-no-opt.ll": "x",
        "module_0000.jit_f.obj-file.broadcast_add_fusion_kernel_module.o": "x",
        "module_0000.jit_f.fusion_kernel_module-post-lowering.mlir": "x",
        "module_0000.jit_f.cpu_after_optimizations-buffer-assignment.txt": "y" * 5000,
        "kernels/only.ll": "x",
    }
    for name, text in {**keep, **drop}.items():
        _write(tmp_path / name, text)
    report = trim_dump(tmp_path, size_cap=1000)
    assert sorted(report.removed) == sorted(drop)
    for name in keep:
        assert (tmp_path / name).is_file(), name
    assert not (tmp_path / "kernels").exists()
    assert report.bytes_removed == sum(len(t) for t in drop.values())


# --- the sidecar ------------------------------------------------------------------


def test_sidecar_dedupes_meshes_and_calls():
    mesh = {"event": "mesh", "axis_names": ["fsdp", "replica"], "shape": [4, 1],
            "device_ids": [0, 1, 2, 3], "kind": "Mesh", "stack": []}
    call = {"event": "sharding_call", "function": "mark_sharding", "spec": "('fsdp', None)",
            "stack": [{"file": "t.py", "line": 3, "function": "<module>"}]}
    events = [mesh, dict(mesh), call, dict(call),
              {"event": "module_call", "module_class": "torch.nn.Linear", "file": "t.py",
               "line": 9, "count": 2, "stack": []},
              {"event": "process", "device_count": 8, "versions": {"jax": "0.10.2"}}]
    sidecar = build_sidecar(command=["python", "t.py"], framework="jax", partitioner="shardy",
                            devices=None, devices_per_host=4, events=events)
    assert sidecar["schema_version"] == 1
    assert sidecar["device_count"] == 8
    assert sidecar["devices_per_host"] == 4
    assert sidecar["versions"]["jax"] == "0.10.2"
    assert [m["axis_names"] for m in sidecar["meshes"]] == [["fsdp", "replica"]]
    assert len(sidecar["sharding_calls"]) == 1 and sidecar["sharding_calls"][0]["count"] == 2
    assert sidecar["module_calls"][0]["module_class"] == "torch.nn.Linear"


# --- the child hook, with a stand-in framework (fast, no jax/torch needed) ----------

_FAKE_XLA_SHARDING = """
class Mesh:
    def __init__(self, device_ids, mesh_shape, axis_names=None):
        self.device_ids = list(device_ids)
        self.mesh_shape = tuple(mesh_shape)
        self.axis_names = axis_names

class HybridMesh(Mesh):
    def __init__(self, ici, dcn, axis_names=None):
        super().__init__(range(ici * dcn), (dcn, ici), axis_names)

def mark_sharding(t, mesh, partition_spec):
    return t
"""

_FAKE_USER_SCRIPT = """
import os, sys
import torch_xla.distributed.spmd as xs

class T:
    shape = (160, 1280)

mesh = xs.Mesh(range(4), (4, 1), ("fsdp", "replica"))
xs.HybridMesh(2, 2, ("dcn", "ici"))
for _ in range(3):
    xs.mark_sharding(T(), mesh, (("fsdp", "replica"), None))
print("XLA_FLAGS=" + os.environ["XLA_FLAGS"])
print("CHAINED=" + str("_hlo_doctor_chained_sitecustomize" in sys.modules))
dump = [f for f in os.environ["XLA_FLAGS"].split() if f.startswith("--xla_dump_to=")][0]
with open(os.path.join(dump.split("=", 1)[1], "kernel.ll"), "w") as f:
    f.write("llvm")
with open(os.path.join(dump.split("=", 1)[1], "m.after_spmd-partitioning.txt"), "w") as f:
    f.write("HloModule m")
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def fake_torch_xla(tmp_path):
    """A stand-in torch_xla package and a user script using it, in separate folders."""
    lib = tmp_path / "lib"
    _write(lib / "torch_xla" / "__init__.py", "")
    _write(lib / "torch_xla" / "distributed" / "__init__.py", "")
    _write(lib / "torch_xla" / "distributed" / "spmd" / "__init__.py",
           "from .xla_sharding import Mesh, HybridMesh, mark_sharding\n")
    _write(lib / "torch_xla" / "distributed" / "spmd" / "xla_sharding.py", _FAKE_XLA_SHARDING)
    _write(lib / "sitecustomize.py", "CHAINED = True\n")
    script = _write(tmp_path / "user" / "train.py", _FAKE_USER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(lib), XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    return script, env


def test_run_script_records_meshes_and_calls(tmp_path, fake_torch_xla):
    script, env = fake_torch_xla
    result = run_script(script, [], dump_dir=tmp_path / "dump", devices=4, env=env)
    sidecar = read_sidecar(result.dump_dir)
    assert sidecar == result.sidecar
    assert sidecar["framework"] == "torch_xla"  # detected from the imports
    assert sidecar["partitioner"] == "gspmd"
    assert sidecar["device_count"] == 4
    assert sidecar["command"] == [sys.executable, str(script)]
    meshes = {tuple(m["axis_names"]): m for m in sidecar["meshes"]}
    assert meshes[("fsdp", "replica")]["shape"] == [4, 1]
    assert meshes[("fsdp", "replica")]["device_ids"] == [0, 1, 2, 3]
    assert meshes[("fsdp", "replica")]["stack"][0] == {
        "file": str(script), "line": 8, "function": "<module>"}
    assert meshes[("dcn", "ici")]["kind"] == "HybridMesh"
    [call] = sidecar["sharding_calls"]
    assert call["spec"] == "(('fsdp', 'replica'), None)"
    assert call["shape"] == [160, 1280]
    assert call["mesh_axis_names"] == ["fsdp", "replica"]
    assert call["count"] == 3
    assert call["stack"][0]["line"] == 11
    # the user's flags survive, the existing sitecustomize ran, the dump was trimmed
    assert "--xla_cpu_enable_fast_math=false" in result.stdout
    assert "CHAINED=True" in result.stdout
    assert result.trim.removed == ("kernel.ll",)
    assert (result.dump_dir / "m.after_spmd-partitioning.txt").is_file()


def test_run_script_failure_raises_with_the_stderr_tail(tmp_path):
    script = _write(tmp_path / "boom.py", """
        import jax
        import sys
        for i in range(30):
            print(f"line {i}", file=sys.stderr)
        raise SystemExit(3)
    """)
    with pytest.raises(RunError) as caught:
        run_script(script, [], dump_dir=tmp_path / "dump")
    assert caught.value.returncode == 3
    assert caught.value.stderr_tail[-1] == "line 29"
    assert len(caught.value.stderr_tail) == 20


def test_run_script_refuses_a_non_empty_dump_dir(tmp_path, fake_torch_xla):
    script, env = fake_torch_xla
    _write(tmp_path / "dump" / "old.txt", "x")
    with pytest.raises(ValueError, match="not empty"):
        run_script(script, [], dump_dir=tmp_path / "dump", env=env)


# --- the CLI ----------------------------------------------------------------------


def test_examples_command_lists_one_line_each():
    result = CliRunner().invoke(examples_command, [])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert len(lines) == len(EXAMPLES)
    assert lines[0].startswith("fsdp-activation-gather")


@pytest.mark.parametrize("args", [
    [],
    ["--example", "no-such-example"],
    ["--variant", "bad", "--", "python", "x.py"],
    ["--example", "cross-host-tp", "--devices", "2"],
    ["--", "python", "missing.py"],
])
def test_run_command_usage_errors(args):
    assert CliRunner().invoke(run_command, args).exit_code == 2


def test_run_command_script_failure_exits_2(tmp_path):
    script = _write(tmp_path / "boom.py", "import jax\nraise RuntimeError('kaboom')\n")
    result = CliRunner().invoke(
        run_command, ["--dump-dir", str(tmp_path / "d"), "--", sys.executable, str(script)])
    assert result.exit_code == 2
    assert "kaboom" in result.output


def test_run_command_without_analysis(tmp_path, fake_torch_xla, monkeypatch):
    script, env = fake_torch_xla
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    dump = tmp_path / "d"
    result = CliRunner().invoke(
        run_command, ["--dump-dir", str(dump), "--devices", "4", "--no-analyze", "--", "python", str(script)])
    assert result.exit_code == 0, result.output
    assert "mesh (fsdp=4, replica=1) devices [0, 1, 2, 3]" in result.output
    assert (dump / SIDECAR_NAME).is_file()


# --- the example registry -----------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.name)
def test_example_scripts_exist(example):
    for framework in example.frameworks:
        script = example.script(framework)
        assert script.is_file()
        source = script.read_text()
        for variant in example.variants:
            assert f'"{variant}"' in source
        assert detect_framework(script) == framework


def test_get_example_rejects_unknown_names():
    with pytest.raises(ValueError, match="no example"):
        get_example("nope")


# --- end to end with the real frameworks ---------------------------------------------

_JAX_USER_SCRIPT = """
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
x = jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
w = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "model")))

def f(x, w):
    return jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data", "model")))

jax.jit(f).lower(x, w).compile()
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_jax_end_to_end(tmp_path, partitioner):
    script = _write(tmp_path / "elsewhere" / "user_model.py", _JAX_USER_SCRIPT)
    result = run_script(script, [], dump_dir=tmp_path / "dump", devices=4,
                        partitioner=partitioner)
    dump = result.dump_dir
    assert list(dump.glob("module_*.after_spmd-partitioning*.txt")) or list(
        dump.glob("module_*spmd-partitioning*.txt"))
    assert list(dump.glob("module_*/module.mlir"))
    assert not list(dump.rglob("*.ll")) and not list(dump.rglob("*.o"))
    assert (dump / "shardy").is_dir() == (partitioner == "shardy")
    sidecar = json.loads((dump / SIDECAR_NAME).read_text())
    assert sidecar["framework"] == "jax"
    assert sidecar["partitioner"] == partitioner
    assert sidecar["device_count"] == 4
    assert sidecar["versions"]["jax"]
    [mesh] = sidecar["meshes"]
    assert mesh["axis_names"] == ["data", "model"]
    assert mesh["shape"] == [2, 2]
    assert mesh["device_ids"] == [0, 1, 2, 3]
    assert mesh["stack"][0]["file"] == str(script)
    [call] = sidecar["sharding_calls"]
    assert call["function"] == "with_sharding_constraint"
    assert call["mesh_axis_names"] == ["data", "model"]
    assert call["stack"][0]["function"] == "f"


def _partitioned_hlo(dump: Path) -> str:
    [path] = dump.glob("*after_spmd-partitioning*.txt")
    return path.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed")
def test_seed_example_bad_and_fixed_differ(tmp_path):
    bad = run_example("fsdp-activation-gather", framework="jax", variant="bad",
                      dump_dir=tmp_path / "bad")
    fixed = run_example("fsdp-activation-gather", framework="jax", variant="fixed",
                        dump_dir=tmp_path / "fixed")
    assert bad.sidecar["example"] == {"name": "fsdp-activation-gather", "variant": "bad"}
    bad_hlo, fixed_hlo = _partitioned_hlo(bad.dump_dir), _partitioned_hlo(fixed.dump_dir)
    # bad: the input batch (dim 0) and the hidden activation (dim 1) are all-gathered
    assert "f32[160,1280]{1,0} all-gather(" in bad_hlo
    assert "f32[160,960]{1,0} all-gather(" in bad_hlo
    # fixed: only the two weights are
    assert fixed_hlo.count(" all-gather(") == 2
    assert "f32[160," not in "".join(
        line for line in fixed_hlo.splitlines() if " all-gather(" in line)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TORCH_XLA, reason="torch_xla is not installed")
def test_torch_xla_end_to_end(tmp_path):
    script = _write(tmp_path / "elsewhere" / "mlp.py", """
        import numpy as np
        import torch
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(4), (4, 1), ("fsdp", "replica"))
        model = torch.nn.Linear(64, 32).to(torch_xla.device())
        xs.mark_sharding(model.weight, mesh, ("fsdp", None))
        x = torch.randn(16, 64).to(torch_xla.device())
        xs.mark_sharding(x, mesh, (("fsdp", "replica"), None))
        y = model(x)
        torch_xla.sync()
    """)
    result = run_script(script, [], dump_dir=tmp_path / "dump", devices=4)
    sidecar = result.sidecar
    assert sidecar["framework"] == "torch_xla"
    assert sidecar["versions"]["torch_xla"]
    [mesh] = sidecar["meshes"]
    assert mesh["axis_names"] == ["fsdp", "replica"]
    assert mesh["shape"] == [4, 1]
    assert mesh["device_ids"] == [0, 1, 2, 3]
    assert {c["spec"] for c in sidecar["sharding_calls"]} == {
        "('fsdp', None)", "(('fsdp', 'replica'), None)"}
    [linear] = [c for c in sidecar["module_calls"] if c["module_class"].endswith("Linear")]
    assert linear["file"] == str(script) and linear["line"] == 14
    assert list(result.dump_dir.glob("module_*SyncTensorsGraph*after_spmd-partitioning*.txt"))


def test_a_missing_extra_stops_the_run_before_the_child_starts(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import hlo_doctor.cli.run as runner_cli
    from hlo_doctor.cli import main
    from hlo_doctor.runner import extras

    monkeypatch.setattr(extras, "_found_here", lambda name: name not in ("torch_xla",))

    def must_not_run(*args, **kwargs):
        raise AssertionError("the child was started")

    monkeypatch.setattr(runner_cli, "run_example", must_not_run)
    monkeypatch.setattr(runner_cli, "run_script", must_not_run)
    result = CliRunner().invoke(main, ["run", "--example", "fsdpv2-torch-xla", "--dump-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert result.stderr == ("error: the torch-xla extra is not installed (no module torch_xla): "
                             "pip install 'hlo-doctor[torch-xla]'\n")
    assert not (tmp_path / "d").exists()
    script = tmp_path / "train.py"
    script.write_text("import torch_xla\n")
    # this interpreter, whose probe the test replaced (another `python` on PATH is probed in a child)
    result = CliRunner().invoke(main, ["run", "--", sys.executable, str(script)])
    assert result.exit_code == 2 and "pip install 'hlo-doctor[torch-xla]'" in result.stderr


@pytest.mark.parametrize(("target", "needed", "absent"), [
    ("v5e:4x4", "tpu-target", ("jax_cuda12_plugin", "jax_plugins.xla_cuda12")),
    ("a100:2x8", "gpu-target", ("libtpu",)),
])
def test_a_target_needs_only_its_own_platforms_extra(monkeypatch, tmp_path, target, needed, absent):
    """With only jax and the target's own extra installed (the other target extra absent), the run
    starts; with that extra absent too, the one line names it."""
    from click.testing import CliRunner

    import hlo_doctor.cli.run as runner_cli
    from hlo_doctor.cli import main
    from hlo_doctor.runner import extras

    started = []

    def record(*args, **kwargs):
        started.append(kwargs["target"])
        raise runner_cli.RunError(["stopped", "by", "the", "test"], 3, [], tmp_path)

    monkeypatch.setattr(runner_cli, "run_example", record)
    monkeypatch.setattr(runner_cli, "run_script", record)
    monkeypatch.setattr(extras, "_found_here", lambda name: name not in absent)
    command = ["run", "--example", "fsdp-activation-gather", "--target", target, "--dump-dir", str(tmp_path / "d")]
    result = CliRunner().invoke(main, command)
    assert "extra is not installed" not in result.stderr
    assert [str(t) for t in started] == [target]

    monkeypatch.setattr(extras, "_found_here", lambda name: name not in (*absent, *extras.EXTRAS[needed]))
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2 and len(started) == 1
    assert result.stderr.startswith(f"error: the {needed} extra is not installed ")
    script = tmp_path / "train.py"
    script.write_text("import jax\n")
    result = CliRunner().invoke(main, ["run", "--target", target, "--", sys.executable, str(script)])
    assert result.exit_code == 2 and f"pip install 'hlo-doctor[{needed}]'" in result.stderr


def test_extras_are_probed_in_the_scripts_own_interpreter(tmp_path):
    import os

    from hlo_doctor.runner.extras import missing_modules

    other = tmp_path / "python"
    os.symlink(sys.executable, other)  # another path: probed in a child process
    assert missing_modules(("json", "no_such_module_for_hlo_doctor"), str(other)) == ["no_such_module_for_hlo_doctor"]
    assert missing_modules(("json", "no_such_module_for_hlo_doctor")) == ["no_such_module_for_hlo_doctor"]


def test_examples_say_which_extra_each_needs():
    from click.testing import CliRunner

    from hlo_doctor.cli import main

    lines = {line.split()[0]: line for line in CliRunner().invoke(main, ["examples"]).output.splitlines()}
    assert "needs jax | torch-xla " in lines["fsdp-activation-gather"]
    assert "needs torch-xla " in lines["fsdpv2-torch-xla"]
    assert "needs jax+gpu-target " in lines["sync-collective"]
    assert "needs jax+tpu-target " in lines["tpu-v4-llama"]
    assert "needs jax " in lines["llama-fsdp"]
