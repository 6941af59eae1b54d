"""hlo_doctor.dump: file-name grammar, roles, metadata, laziness, bad files.

Real dumps come from a tiny JAX program compiled in a subprocess (once per
session, Shardy and GSPMD); hand-written snippets are marked as such.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hlo_doctor.dump import (
    DeviceAssignment,
    FileKind,
    Partitioner,
    Role,
    load_dump,
    parse_file_name,
    parse_meshes,
    parse_mlir_info,
    parse_textproto,
)
from hlo_doctor.dump import folder as folder_module
from hlo_doctor.dump.options import CompileOptions
from hlo_doctor.dump.textproto import TextprotoError
from hlo_doctor.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

JAX_PROGRAM = r"""
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(2, 4).T, ("x", "y"))
x = jax.device_put(jnp.ones((16, 32)), NamedSharding(mesh, P("x", None)))
w = jax.device_put(jnp.ones((32, 64)), NamedSharding(mesh, P(None, "y")))
@jax.jit
def f(x, w):
    return jnp.tanh(x @ w)
f(x, w).block_until_ready()
"""


def make_jax_dumps(base: Path) -> dict[str, Path]:
    """Compile JAX_PROGRAM under Shardy and GSPMD into base/{shardy,gspmd} (reused if present)."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    out = {}
    for mode, flag in (("shardy", "1"), ("gspmd", "0")):
        target = base / mode
        done = base / f"{mode}.done"
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            env = dict(os.environ)
            env.update(
                JAX_PLATFORMS="cpu",
                JAX_USE_SHARDY_PARTITIONER=flag,
                XLA_FLAGS=(
                    f"--xla_dump_to={target} --xla_dump_hlo_pass_re=spmd|propagation|shardy-verbose "
                    "--xla_force_host_platform_device_count=8"
                ),
            )
            result = subprocess.run(
                [sys.executable, "-c", JAX_PROGRAM], env=env, capture_output=True, text=True, timeout=120
            )
            if result.returncode != 0:
                pytest.skip(f"jax compile failed: {result.stderr[-500:]}")
            done.touch()
        out[mode] = target
    return out


@pytest.fixture(scope="session")
def jax_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.getbasetemp() / "jax_dumps"
    base.mkdir(exist_ok=True)
    return make_jax_dumps(base)


# --------------------------------------------------------------------------
# File-name grammar (names as XLA 0.10.2 writes them)


@pytest.mark.parametrize(
    "name, expected",
    [
        (
            "module_0010.jit_f.0001.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt",
            dict(kind=FileKind.PASS, module_id=10, module_name="jit_f", ordinal=1,
                 pipeline="spmd-partitioner", after_pass="sharding-propagation",
                 before_pass="spmd-partitioning", timestamp=None),
        ),
        (
            "1796006743798379.module_0010.jit_f.0003.spmd-partitioner.after_shardy-xla.before_spmd-partitioning.txt",
            dict(kind=FileKind.PASS, module_id=10, module_name="jit_f", ordinal=3,
                 after_pass="shardy-xla", timestamp=1796006743798379),
        ),
        (
            "module_0010.jit_f.0020.copy-insertion.after_adding_copies_to_resolve_interference.txt",
            dict(kind=FileKind.PASS, pipeline="copy-insertion",
                 after_pass="adding_copies_to_resolve_interference", before_pass=None),
        ),
        (
            "module_0010.jit_f.0008.HLO_passes_through_layout_assignment.after_pipeline-start.before_batched_gather_scatter_normalizer.txt",
            dict(pipeline="HLO_passes_through_layout_assignment", after_pass="pipeline-start",
                 before_pass="batched_gather_scatter_normalizer"),
        ),
        ("module_0010.jit_f.before_optimizations.txt",
         dict(kind=FileKind.BEFORE_OPTIMIZATIONS, module_name="jit_f")),
        ("module_0010.jit_f.cpu_after_optimizations.txt",
         dict(kind=FileKind.AFTER_OPTIMIZATIONS, backend="cpu", module_name="jit_f")),
        ("module_0003.jit_train_step.sm_9.0a_gpu_after_optimizations.txt",
         dict(kind=FileKind.AFTER_OPTIMIZATIONS, backend="sm_9.0a_gpu", module_name="jit_train_step")),
        ("module_0003.jit_step.gpu_after_optimizations.txt", dict(backend="gpu")),
        ("module_0000.SyncTensorsGraph.12.before_optimizations.txt",
         dict(kind=FileKind.BEFORE_OPTIMIZATIONS, module_name="SyncTensorsGraph.12")),
        ("module_0000.SyncTensorsGraph.12.0002.spmd-partitioner.after_spmd-partitioning.before_x.txt",
         dict(module_name="SyncTensorsGraph.12", ordinal=2, after_pass="spmd-partitioning")),
        ("module_0000.SyncTensorsGraph.12.tpu_after_optimizations.txt",
         dict(module_name="SyncTensorsGraph.12", backend="tpu")),
        ("module_0010.jit_f.debug_options", dict(kind=FileKind.DEBUG_OPTIONS)),
    ],
)
def test_file_name_grammar(name: str, expected: dict[str, object]) -> None:
    parsed = parse_file_name(name)
    assert parsed is not None
    for key, value in expected.items():
        assert getattr(parsed, key) == value, key


@pytest.mark.parametrize(
    "name",
    [
        "module_0010.jit_f.cpu_after_optimizations-buffer-assignment.txt",
        "module_0010.jit_f.cpu_after_optimizations-memory-usage-report.txt",
        "module_0010.jit_f.cpu_after_optimizations-live-range.txt",
        "module_0010.jit_f.sm_9.0a_gpu_after_optimizations-buffer-assignment.txt",
        "module_0010.jit_f.__compute_module_wrapped_tanh.ir-with-opt.ll",
        "module_0010.jit_f.obj-file.__compute_module_wrapped_tanh.o",
        "module_0010.jit_f.thunk_sequence.txt",
        "module_0010.jit_f.ptx",
        "README.txt",
        "hlo_doctor_run.json",
    ],
)
def test_non_hlo_files_are_ignored(name: str) -> None:
    assert parse_file_name(name) is None


def test_known_module_name_disambiguates_dotted_names() -> None:
    name = "module_0000.Graph.1234.0001.spmd-partitioner.after_spmd-partitioning.before_x.txt"
    assert parse_file_name(name).module_name == "Graph"  # the grammar alone guesses wrong
    assert parse_file_name(name, {"Graph.1234"}).module_name == "Graph.1234"
    assert parse_file_name(name, {"Graph.1234"}).ordinal == 1


@pytest.mark.parametrize(
    "name, role",
    [
        ("module_0001.f.before_optimizations.txt", Role.BEFORE_OPTIMIZATIONS),
        ("module_0001.f.0000.spmd-partitioner.after_conditional-canonicalizer.before_sharding-propagation.txt",
         Role.BEFORE_PROPAGATION),
        ("module_0001.f.0001.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt",
         Role.AFTER_PROPAGATION),
        ("module_0001.f.0000.spmd-partitioner.after_shardy-xla.before_spmd-partitioning.txt",
         Role.AFTER_PROPAGATION),
        ("module_0001.f.0002.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter.txt",
         Role.AFTER_PARTITIONING),
        ("module_0001.f.0005.spmd-cleanup.after_dce.before_tuple-simplifier.txt", Role.OTHER),
        ("module_0001.f.sm_9.0a_gpu_after_optimizations.txt", Role.AFTER_OPTIMIZATIONS),
    ],
)
def test_roles(name: str, role: Role) -> None:
    assert folder_module.role_of(parse_file_name(name)) is role


# --------------------------------------------------------------------------
# Text format, device assignment, MLIR


# Hand-written, in the shape of a real compile_options.textproto (2 replicas x 2 partitions).
COMPILE_OPTIONS = """
executable_build_options {
  device_ordinal: -1
  debug_options { xla_dump_to: "/tmp/x" }  # comment
  num_replicas: 2
  num_partitions: 2
  use_spmd_partitioning: true
  device_assignment {
    replica_count: 2
    computation_count: 2
    computation_devices { replica_device_ids: 0 replica_device_ids: 2 }
    computation_devices { replica_device_ids: 1 replica_device_ids: 3 }
  }
  use_shardy_partitioner: true
  process_count: 1
  memory_fitting_level: EFFORT_O2
}
profile_version: -1
"""


def test_compile_options_device_assignment() -> None:
    options = CompileOptions.from_message(parse_textproto(COMPILE_OPTIONS))
    assert (options.num_partitions, options.num_replicas) == (2, 2)
    assert options.use_shardy_partitioner is True and options.use_spmd_partitioning is True
    assignment = options.device_assignment
    assert assignment == DeviceAssignment(((0, 1), (2, 3)))
    assert assignment.device(replica=1, partition=0) == 2
    assert assignment.device_ids == (0, 1, 2, 3)
    assert assignment.logical_id(3) == (1, 1)


def test_textproto_values() -> None:
    # Hand-written: the syntax variants XLA and protobuf emit.
    message = parse_textproto(
        'a: [1, 2] b <c: "x" "y"> [ext.z]: -1.5e3\n d {e: ENUM} d: {e: 0x10}; s: "\\001\\n" t: true'
    )
    assert message.to_dict() == {
        "a": [1, 2], "b": {"c": "xy"}, "ext.z": -1500.0,
        "d": [{"e": "ENUM"}, {"e": 16}], "s": "\x01\n", "t": True,
    }
    with pytest.raises(TextprotoError, match="2:5"):
        parse_textproto("a {\n b: }")


def test_mlir_meshes_and_signature() -> None:
    # Hand-written: a mesh with explicit device ids, the attribute form, and GSPMD strings.
    text = """
module @jit_g attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=2], device_ids=[0, 2, 1, 3]>
  sdy.mesh @maximal = <[], device_ids=[1]>
  func.func public @main(%arg0: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>} loc("x"),
                         %arg1: tensor<4xf32> {mhlo.sharding = "{devices=[2,2]<=[4] last_tile_dim_replicate}"})
      -> (tensor<8x4xf32> {jax.result_info = "out", sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}]>}) {
    return %arg0 : tensor<8x4xf32>
  }
}
"""
    info = parse_mlir_info(text)
    assert info.module_name == "jit_g" and info.num_partitions == 4
    mesh = info.mesh("mesh")
    assert mesh.axes == (("data", 2), ("model", 2)) and mesh.device_ids == (0, 2, 1, 3)
    assert info.mesh("maximal").axes == () and info.mesh("maximal").device_ids == (1,)
    first, second = info.arguments
    assert (first.type, first.name, first.sharding_dialect) == ("tensor<8x4xf32>", "x", "sdy")
    assert first.sharding == '#sdy.sharding<@mesh, [{"data"}, {}]>'
    assert second.sharding == "{devices=[2,2]<=[4] last_tile_dim_replicate}"
    assert info.results[0].name == "out" and info.results[0].sharding_dialect == "sdy"
    assert parse_meshes('xla.sdy.meshes={mesh = #sdy.mesh<["x"=4, "y"=2]>}')[0].shape == (4, 2)


# --------------------------------------------------------------------------
# Real JAX dumps


def test_real_shardy_dump(jax_dumps: dict[str, Path]) -> None:
    dump = load_dump(jax_dumps["shardy"])
    module = dump.module("jit_f")
    assert module.partitioner is Partitioner.SHARDY
    assert module.num_partitions == 8 and module.num_replicas == 1
    assert module.device_assignment == (0, 4, 1, 5, 2, 6, 3, 7)
    assert [(m.name, m.axes) for m in module.meshes] == [("mesh", (("x", 4), ("y", 2)))]
    assert [s.role for s in module.snapshots] == [
        Role.BEFORE_OPTIMIZATIONS, Role.AFTER_PROPAGATION, Role.AFTER_PARTITIONING, Role.AFTER_OPTIMIZATIONS,
    ]
    assert module.after_propagation().after_pass == "shardy-xla"
    assert module.partitioned().after_pass == "spmd-partitioning"
    assert module.before_propagation() is None
    assert module.backend == "cpu"
    assert module.debug_options["xla_force_host_platform_device_count"] == 8
    assert module.topology.platform_name == "cpu"
    assert [p.name for p in module.shardy_dumps][:2] == ["00.input_module.mlir", "01.before_propagation.mlir"]
    args = module.mlir.arguments
    assert [a.sharding for a in args] == ['#sdy.sharding<@mesh, [{"x"}, {}]>', '#sdy.sharding<@mesh, [{}, {"y"}]>']
    assert dump.run_record is None and dump.parse_all() == ()


def test_real_gspmd_dump(jax_dumps: dict[str, Path]) -> None:
    module = load_dump(jax_dumps["gspmd"]).module("jit_f")
    assert module.partitioner is Partitioner.GSPMD
    assert module.device_assignment == (0, 4, 1, 5, 2, 6, 3, 7)
    assert [(s.role, s.after_pass, s.before_pass) for s in module.snapshots[1:4]] == [
        (Role.BEFORE_PROPAGATION, "conditional-canonicalizer", "sharding-propagation"),
        (Role.AFTER_PROPAGATION, "sharding-propagation", "spmd-partitioning"),
        (Role.AFTER_PARTITIONING, "spmd-partitioning", "control-dep-rewriter"),
    ]
    assert module.meshes == ()
    assert module.mlir.arguments[0].sharding == "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"
    assert module.partitioned().module().entry.parameters()[0].shape.dims == (4, 32)


def test_loading_is_lazy(jax_dumps: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from hlo_doctor import hlo

    calls: list[str | None] = []
    real = hlo.parse_module

    def counting(text: str, *, path: str | None = None):
        calls.append(path)
        return real(text, path=path)

    monkeypatch.setattr(hlo, "parse_module", counting)
    dump = load_dump(jax_dumps["shardy"])
    module = dump.module("jit_f")
    _ = (module.partitioner, module.device_assignment, module.meshes, module.debug_options, dump.errors)
    assert calls == []
    snapshot = module.partitioned()
    assert not snapshot.parsed
    first = snapshot.module()
    assert snapshot.module() is first
    assert calls == [str(snapshot.path)]


def test_timestamped_dump_groups_by_module(jax_dumps: dict[str, Path], tmp_path: Path) -> None:
    for path in jax_dumps["gspmd"].iterdir():
        target = tmp_path / (("1796006743798379." + path.name) if path.name.endswith(".txt") else path.name)
        (shutil.copytree if path.is_dir() else shutil.copy)(path, target)
    module = load_dump(tmp_path).module("jit_f")
    assert module.snapshots[0].timestamp == 1796006743798379
    assert module.partitioned().ordinal == 2 and module.device_assignment is not None


def test_bad_file_is_isolated(jax_dumps: dict[str, Path], tmp_path: Path) -> None:
    shutil.copytree(jax_dumps["gspmd"], tmp_path / "d")
    bad = next((tmp_path / "d").glob("module_*.jit_f.*after_spmd-partitioning*.txt"))
    bad.write_text("HloModule jit_f\n\nENTRY main {\n  p = f32[")
    dump = load_dump(tmp_path / "d")
    assert dump.errors == ()  # nothing parsed yet
    errors = dump.parse_all()
    assert len(errors) == 1 and errors[0].path == str(bad)
    assert errors[0].message.startswith(f"{bad}:4:")
    module = dump.module("jit_f")
    assert module.partitioned().try_module() is None and module.after_propagation().try_module() is not None
    assert all(s.parsed for m in dump.modules if m is not module for s in m.snapshots)


def test_non_utf8_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "m.txt"
    path.write_bytes(b"HloModule m\n\nENTRY e {\n  p = f32[2]{0} param\xe9ter(0)\n}\n")
    snapshot = load_dump(path).modules[0].snapshots[0]
    from hlo_doctor.hlo.errors import ParseError

    with pytest.raises(ParseError) as caught:
        snapshot.module()
    assert (caught.value.line, caught.value.col) == (4, 22)
    assert snapshot.error.startswith(f"{path}:4:22: invalid UTF-8 byte 0xe9")


def test_single_file_and_run_record(jax_dumps: dict[str, Path], tmp_path: Path) -> None:
    shutil.copytree(jax_dumps["shardy"], tmp_path / "d")
    (tmp_path / "d" / "hlo_doctor_run.json").write_text('{"frontend": "jax", "device_count": 8}')
    dump = load_dump(tmp_path / "d")
    assert dump.run_record == {"frontend": "jax", "device_count": 8}
    single = next((tmp_path / "d").glob("module_*.jit_f.*after_spmd-partitioning*.txt"))
    one = load_dump(single)
    assert len(one) == 1 and one.modules[0].name == "jit_f"
    assert one.modules[0].partitioned() is not None
    assert one.modules[0].device_assignment == (0, 4, 1, 5, 2, 6, 3, 7)  # sibling module folder
    (tmp_path / "d" / "hlo_doctor_run.json").write_text("{not json")
    assert load_dump(tmp_path / "d").errors[0].message.startswith("not valid JSON")


def test_plain_hlo_file(tmp_path: Path) -> None:
    # Hand-written module in a file without the dump grammar.
    path = tmp_path / "model.hlo.txt"
    path.write_text("HloModule m\n\nENTRY e {\n  ROOT p = f32[2]{0} parameter(0)\n}\n")
    module = load_dump(path).modules[0]
    assert (module.id, module.name, module.snapshots[0].role) == (None, "model", Role.OTHER)
    assert module.snapshots[0].module().name == "m"


# --------------------------------------------------------------------------
# Unusable input


def test_input_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="no such file or directory"):
        load_dump(tmp_path / "missing")
    with pytest.raises(InputError, match="no HLO modules found"):
        load_dump(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "module_0001.f.ir-with-opt.ll").write_text("define void @f()")
    with pytest.raises(InputError, match="no HLO modules found"):
        load_dump(tmp_path)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match="symbolic links"):
        load_dump(loop)

    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folder_module.os, "scandir", denied)
    with pytest.raises(InputError, match="permission denied"):
        load_dump(tmp_path)


FIXTURE_ROOT = Path(__file__).resolve().parents[1] / "fixtures"


def _fixture_snapshots():
    for folder in sorted(p.parent for p in FIXTURE_ROOT.glob("*/*/expected_findings.json")):
        for module in load_dump(folder).modules:
            yield from module.snapshots


def test_header_reads_agree_with_the_parsed_module_on_every_fixture_snapshot() -> None:
    """Parameter shapes and buffer donors read from a header line, without parsing, equal the module's."""
    compared = donors = 0
    for snapshot in _fixture_snapshots():
        module = snapshot.module()
        params = module.entry.parameters()
        shapes = snapshot.entry_parameter_shapes
        assert shapes is not None, snapshot.path
        assert [s.dims for s in shapes] == [p.shape.dims for p in params], snapshot.path
        assert [s.element_type for s in shapes] == [p.shape.element_type for p in params]
        assert snapshot.header_attribute("buffer_donor") == module.attribute("buffer_donor")
        assert snapshot.header_attribute("num_partitions") == module.attribute("num_partitions")
        compared += 1
        donors += module.attribute("buffer_donor") is not None
    assert compared > 100 and donors > 0


def test_header_attribute_edge_cases() -> None:
    """Hand-written header lines (not compiler output)."""
    from hlo_doctor.dump.folder import entry_layout_parameters, header_attribute

    header = ("HloModule m, is_scheduled=true, entry_computation_layout={(f32[2,3]{1,0}, /*index=1*/(s32[], "
              "f32[4]))->f32[2]{0}}, num_partitions=4")
    assert header_attribute(header, "num_partitions") == "4"
    assert header_attribute(header, "is_scheduled") == "true"
    assert header_attribute(header, "missing") is None
    shapes = entry_layout_parameters(header)
    assert shapes is not None and [s.dims for s in shapes[:1]] == [(2, 3)] and shapes[1].is_tuple
    assert entry_layout_parameters("HloModule m, entry_computation_layout={(f32[2]") is None
    assert entry_layout_parameters("HloModule m") is None


def test_symlinks_out_of_the_dump_folder_are_skipped_with_a_note(tmp_path):
    import shutil

    from hlo_doctor.analysis import analyze_dump

    seed = Path(__file__).resolve().parents[1] / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"
    dump = tmp_path / "dump"
    shutil.copytree(seed, dump)
    outside = tmp_path / "outside"
    outside.mkdir()
    before = next(dump.glob("*.before_optimizations.txt"))
    (outside / "other.txt").write_text(before.read_text())
    (outside / "run.json").write_text((dump / "hlo_doctor_run.json").read_text())
    (dump / "module_0007.jit_other.before_optimizations.txt").symlink_to(outside / "other.txt")
    (dump / "hlo_doctor_run.json").unlink()
    (dump / "hlo_doctor_run.json").symlink_to(outside / "run.json")
    (dump / "module_0008.jit_inside.before_optimizations.txt").symlink_to(before)  # inside: kept

    loaded = load_dump(dump)
    assert sorted(m.name for m in loaded.modules) == ["jit_inside", "jit_mlp"]
    assert loaded.run_record is None
    notes = {Path(e.path).name: e.message for e in loaded.load_errors}
    assert notes == {
        "module_0007.jit_other.before_optimizations.txt": "skipped: a symbolic link that leads out of the dump folder",
        "hlo_doctor_run.json": "skipped: a symbolic link that leads out of the dump folder",
    }
    report = analyze_dump(dump)
    assert sum("leads out of the dump folder" in e.message for e in report.errors) == 2


def test_release_drops_what_was_read_and_records_an_error_once(tmp_path: Path) -> None:
    """``DumpModule.release`` drops the parses, headers and metadata read for a module's analysis
    (a long serial run, or a module worker, keeps only summaries); what is read again reads the
    same, and a metadata error read twice is recorded once."""
    folder = tmp_path / "d"
    shutil.copytree(FIXTURES / "uneven-padding" / "jax-shardy-bad", folder)
    next(folder.glob("*.debug_options")).write_text("xla_dump_to: {{{ not a textproto\n")
    module = load_dump(folder).modules[0]
    snapshot = module.snapshots[0]
    header, shapes = snapshot.header_attributes, snapshot.entry_parameter_shapes
    assert snapshot.module() is not None and module.debug_options == {}
    assert len(module.errors_found) == 1
    module.release()
    assert not snapshot.parsed and "header_attributes" not in vars(snapshot)
    assert "debug_options" not in vars(module)
    assert module.debug_options == {} and len(module.errors_found) == 1
    assert snapshot.header_attributes == header and snapshot.entry_parameter_shapes == shapes
