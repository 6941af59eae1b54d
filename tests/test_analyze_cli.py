"""``hlo-doctor analyze`` and ``hlo-doctor rules``: exit codes, text, JSON against its schema."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
UNEVEN_BAD = ROOT / "fixtures" / "uneven-padding" / "jax-shardy-bad"
SCHEMA = json.loads((ROOT / "hlo_doctor" / "report" / "schema-v1.json").read_text())


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_text_report():
    result = _run("analyze", str(UNEVEN_BAD))
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("hlo_doctor/examples/programs/uneven_padding.py:44:")  # path:line:col
    assert "warning uneven-sharding-padding dimension 1 of size 50257" in out.splitlines()[0]
    assert "logits = jax.lax.with_sharding_constraint" in out  # the user's source line
    assert "NamedSharding(mesh" in out  # the fix, for JAX only: the dump says it came from JAX
    assert "xs.mark_sharding" not in out
    assert "%pad = f32[50264,256]" not in out and "all-reduce x3" not in out  # only with --verbose


def test_verbose_text_adds_evidence_hlo_and_collectives():
    out = _run("analyze", str(UNEVEN_BAD), "--verbose").output
    assert "%pad = f32[50264,256]" in out  # the HLO excerpt
    assert "evidence:" in out
    assert "module_0000.jit_loss" in out and "all-reduce x3" in out


def test_verbose_says_why_rules_were_skipped():
    out = _run("analyze", str(UNEVEN_BAD), "-v").output
    assert "CPU dump" in out and "--hardware" in out


def test_json_report_matches_schema():
    result = _run("analyze", str(UNEVEN_BAD), "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    jsonschema.validate(data, SCHEMA)
    assert data["schema_version"] == 1 and data["tool"]["name"] == "hlo-doctor"
    (finding,) = data["findings"]
    assert finding["rule"] == "uneven-sharding-padding" and finding["instruction"] == "pad"
    assert finding["source"]["line"] == 44
    assert data["modules"][0]["partitioner"] == "shardy" and data["modules"][0]["num_partitions"] == 8


def test_json_with_hardware_matches_schema(tmp_path):
    path = ROOT / "fixtures" / "replicated-large-param" / "jax-shardy-bad"
    data = json.loads(_run("analyze", str(path), "--format", "json", "--hardware", "h100").output)
    jsonschema.validate(data, SCHEMA)
    # a step of well under a microsecond of matmuls: too short for the bandwidth model to judge
    assert {f["rule"] for f in data["findings"]} == {"replicated-large-parameter"}
    [skip] = [s for s in data["skipped"] if s["rule"] == "communication-bound"]
    assert "under min-compute-seconds" in skip["reason"]
    config = tmp_path / "hlo-doctor.toml"
    config.write_text("[rules.communication-bound]\nmin-compute-seconds = 0\n")
    data = json.loads(_run("analyze", str(path), "--format", "json", "--hardware", "h100",
                           "--config", str(config)).output)
    jsonschema.validate(data, SCHEMA)
    assert {f["rule"] for f in data["findings"]} == {"replicated-large-parameter", "communication-bound"}


def test_select_and_ignore_options():
    data = json.loads(_run("analyze", str(UNEVEN_BAD), "--format", "json", "--ignore", "uneven-sharding-padding").output)
    assert data["findings"] == [] and "uneven-sharding-padding" not in data["rules"]
    data = json.loads(_run("analyze", str(UNEVEN_BAD), "--format", "json",
                           "--select", "sync-collective,communication-bound").output)
    assert data["rules"] == ["communication-bound", "sync-collective"]


@pytest.mark.parametrize(
    "args",
    [("/no/such/dump",), (str(UNEVEN_BAD), "--select", "no-such-rule"), (str(UNEVEN_BAD), "--hardware", "v100")],
)
def test_input_errors_exit_2_with_one_line(args):
    result = subprocess.run([sys.executable, "-c", "from hlo_doctor.cli import main; main()", "analyze", *args],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_one_bad_module_does_not_stop_the_others(tmp_path):
    for item in UNEVEN_BAD.iterdir():
        target = tmp_path / item.name
        shutil.copytree(item, target) if item.is_dir() else shutil.copy(item, target)
    (tmp_path / "module_0007.broken.before_optimizations.txt").write_text("HloModule broken\n\nENTRY %e { nonsense")
    report = analyze_dump(tmp_path)
    assert [m.key for m in report.modules] == ["module_0000.jit_loss", "module_0007.broken"]
    assert [f.rule for f in report.findings] == ["uneven-sharding-padding"]
    assert any(e.module == "module_0007.broken" for e in report.errors)
    result = _run("analyze", str(tmp_path), "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    jsonschema.validate(data, SCHEMA)
    assert data["modules"][1]["errors"]


def test_report_str_is_plain_text_for_the_runner():
    text = str(analyze_dump(UNEVEN_BAD))
    assert "uneven-sharding-padding" in text and "\x1b[" not in text


def test_rules_lists_every_rule_with_origin():
    result = _run("rules")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert any(line.startswith("uneven-sharding-padding") and "builtin" in line and "warning" in line
               for line in lines)
    assert len(lines) >= 4


def test_rules_id_prints_its_docs():
    result = _run("rules", "sync-collective")
    assert result.exit_code == 0
    for section in ("## What it finds", "## Why it hurts", "## Example", "## Fix", "## Options"):
        assert section in result.output
    assert _run("rules", "no-such-rule").exit_code == 2


def test_generated_rule_docs_are_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_rule_docs.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
