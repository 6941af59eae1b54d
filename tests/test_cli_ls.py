"""``hlo-doctor ls``: inventory output, and one stderr line with exit 2 for unusable input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli import main
from hlo_doctor.dump import files as files_module
from hlo_doctor.dump import folder as folder_module
from tests.test_dump import make_jax_dumps


@pytest.fixture(scope="session")
def jax_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.getbasetemp() / "jax_dumps"
    base.mkdir(exist_ok=True)
    return make_jax_dumps(base)


def run_ls(*args: str):
    return CliRunner().invoke(main, ["ls", *args])


def assert_input_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]
    assert len(lines[0]) < 700


def test_ls_real_dump_text_and_json(jax_dumps: dict[str, Path]) -> None:
    result = run_ls(str(jax_dumps["shardy"]))
    assert result.exit_code == 0, result.output
    assert "module_0010.jit_f snapshots" in result.stdout
    assert "after shardy-xla" in result.stdout and "shardy" in result.stdout
    assert result.stderr == ""

    result = run_ls(str(jax_dumps["gspmd"]), "--format", "json")
    assert result.exit_code == 0
    inventory = json.loads(result.stdout)
    module = next(m for m in inventory["modules"] if m["name"] == "jit_f")
    assert module["partitioner"] == "gspmd" and module["num_partitions"] == 8
    assert module["device_assignment"] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert [s["role"] for s in module["snapshots"]] == [
        "before_optimizations", "before_propagation", "after_propagation",
        "after_partitioning", "after_optimizations",
    ]
    assert all(s["instructions"] for s in module["snapshots"])
    assert inventory["errors"] == []


def test_ls_partly_bad_dump_exits_0_and_lists_errors(jax_dumps: dict[str, Path], tmp_path: Path) -> None:
    shutil.copytree(jax_dumps["gspmd"], tmp_path / "d")
    bad = next((tmp_path / "d").glob("module_*.jit_f.*after_spmd-partitioning*.txt"))
    bad.write_bytes(b"\x00\x01\x02garbage")
    result = run_ls(str(tmp_path / "d"), "--format", "json")
    assert result.exit_code == 0
    errors = json.loads(result.stdout)["errors"]
    assert [e["path"] for e in errors] == [str(bad)]
    assert "binary data" in errors[0]["message"]


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make, fragments",
    [
        (lambda d: d / "missing", ["no such file or directory"]),
        (lambda d: d, ["no HLO modules found"]),
        (lambda d: write(d / "notes.txt", b"x").parent, ["no HLO modules found"]),
        (lambda d: write(d / "garbage.txt", bytes(range(256)) * 8), ["garbage.txt:1:1", "binary data"]),
        (
            lambda d: write(d / "trunc.txt", b"HloModule m\n\nENTRY e {\n  p = f32[2]{0} parameter(0)\n  ROOT r = f32[2]{0} add(p, "),
            ["trunc.txt:5:"],
        ),
        (lambda d: write(d / "latin1.txt", b"HloModule m\n\n// caf\xe9\n"), ["latin1.txt:3:7", "invalid UTF-8"]),
        (lambda d: write(d / "long.txt", b"HloModule m, x=" + b"a" * 30_000_000), ["long.txt:1:"]),
        (lambda d: write(d / "empty.txt", b""), ["empty.txt:1:1"]),
    ],
    ids=["missing", "empty-dir", "no-hlo-dir", "binary", "truncated", "non-utf8", "30mb-line", "empty-file"],
)
def test_ls_bad_input(tmp_path: Path, make, fragments: list[str]) -> None:
    assert_input_error(run_ls(str(make(tmp_path))), *fragments)


def test_ls_bad_module_file_in_folder(tmp_path: Path) -> None:
    write(tmp_path / "module_0001.jit_f.before_optimizations.txt", b"\xff\xfe")
    assert_input_error(run_ls(str(tmp_path)), "module_0001.jit_f.before_optimizations.txt:1:1")


def test_ls_symlink_loop(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_input_error(run_ls(str(loop)), "symbolic links")


def test_ls_unreadable_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folder_module.os, "scandir", denied)  # chmod has no effect as root
    assert_input_error(run_ls(str(tmp_path)), "permission denied")


def test_ls_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "module_0001.f.before_optimizations.txt", b"HloModule f\n")
    path.chmod(0)
    try:
        path.read_bytes()
    except PermissionError:
        pass  # not root: the real permission check applies
    else:
        def denied(_path: Path) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(files_module, "_check_readable", denied)
        monkeypatch.setattr(files_module, "_read_bytes", denied)
    assert_input_error(run_ls(str(path)), "permission denied")
    assert_input_error(run_ls(str(tmp_path)), "permission denied")


def test_ls_usage_without_argument() -> None:
    result = run_ls()
    assert result.exit_code == 2 and "Traceback" not in result.output
