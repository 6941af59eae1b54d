"""analyze/check on unusable input: one clear line and exit 2; a bad module beside good ones is only reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "fixtures" / "uneven-padding" / "jax-shardy-bad"


@pytest.mark.parametrize("command", ["analyze", "check"])
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x01\xff garbage", "bad.txt:1:1: binary data"),
        (b"HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n", "bad.txt:4:1: unterminated computation"),
        (b"HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] negate(a)\n}\n\xff\xfe", "bad.txt:6:1: invalid UTF-8 byte 0xff"),
    ],
)
def test_a_single_unusable_file_is_one_line_and_exit_2(tmp_path: Path, command: str, content: bytes,
                                                        message: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    result = CliRunner().invoke(main, [command, str(bad)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_a_bad_module_beside_good_ones_is_reported_and_the_rest_analyzed(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(GOOD, dump)
    (dump / "module_0009.jit_broken.before_optimizations.txt").write_text("HloModule broken\nENTRY e {\n")
    result = CliRunner().invoke(main, ["analyze", str(dump), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [f["rule"] for f in report["findings"]] == ["uneven-sharding-padding"]
    assert any(e["message"].endswith("module_0009.jit_broken.before_optimizations.txt:3:1: unterminated computation "
                                     "'e': missing '}'") for e in report["errors"]), report["errors"]
