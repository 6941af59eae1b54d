"""Exit codes and output flags of ``analyze``/``check``: JSON on failure, SIGINT, baselines, config
values, --exit-zero/--quiet/--statistics, atomic -o, which source files may be quoted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli import main
from hlo_doctor.testing import builtin_rule_ids
from tests.sarif_schema import SARIF_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"
# Two findings of two rules with different causes: the padded vocab dim, and the vocab-parallel
# all-reduces over all 8 devices, which cross hosts of 4.
TWO_CAUSES = (str(ROOT / "fixtures" / "uneven-padding" / "jax-shardy-bad"), "--devices-per-host", "4")
BUILTIN = ("--ignore", "expert-weights-not-expert-sharded")  # a plugin the test venv may have installed


def run(*args: str):
    return CliRunner().invoke(main, list(args))


# -- JSON on failure --------------------------------------------------------


@pytest.mark.parametrize("dump", ["/no/such/dump", "EMPTY"])
def test_json_prints_a_document_with_errors_when_nothing_can_be_read(dump, tmp_path):
    if dump == "EMPTY":
        dump = str(tmp_path)
    result = run("analyze", dump, "--format", "json")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["findings"] == [] and document["modules"] == []
    assert len(document["errors"]) == 1 and document["errors"][0]["path"] == dump
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_json_failure_document_matches_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "hlo_doctor" / "report" / "schema-v1.json").read_text())
    jsonschema.validate(json.loads(run("check", "/no/such/dump", "--format", "json").stdout), schema)


def test_json_failure_goes_to_the_output_file(tmp_path):
    out = tmp_path / "report.json"
    result = run("check", "/no/such/dump", "--format", "json", "-o", str(out))
    assert result.exit_code == 2 and result.stdout == ""
    assert json.loads(out.read_text())["errors"]


def test_text_failure_prints_no_document():
    result = run("analyze", "/no/such/dump")
    assert result.exit_code == 2 and result.stdout == ""


# -- SIGINT -----------------------------------------------------------------


def test_ctrl_c_exits_130():
    # A real SIGINT, sent to the CLI's own process in the middle of the analysis.
    script = (
        "import os, signal, time, hlo_doctor.cli.common as c\n"
        # a shell's background job inherits SIGINT ignored; a user's terminal delivers it
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "def slow(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)\n"
        "c.run_analysis = slow\n"
        "import hlo_doctor.cli.output as r; r.run_analysis = slow\n"
        "from hlo_doctor.cli import main\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", script, "check", str(SEED)], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert result.returncode == 130, result.stderr
    assert "interrupted" in result.stderr and "Traceback" not in result.stderr
    assert signal.SIGINT == 2  # 130 = 128 + SIGINT


# -- baselines ----------------------------------------------------------------


def test_missing_baseline_says_how_to_create_one(tmp_path):
    missing = tmp_path / "hlo-baseline.json"
    result = run("check", str(SEED), "--baseline", str(missing))
    assert result.exit_code == 2
    assert f"--write-baseline {missing}" in result.stderr and "not found" in result.stderr
    assert result.stderr.count("\n") == 1


@pytest.fixture
def partial_baseline(tmp_path) -> Path:
    """A baseline holding the uneven-sharding-padding finding only (1 of the dump's 2)."""
    path = tmp_path / "baseline.json"
    assert run("check", *TWO_CAUSES, "--select", "uneven-sharding-padding",
               "--write-baseline", str(path)).exit_code == 0
    return path


def test_baselined_findings_are_counted_in_text_and_markdown(partial_baseline):
    text = run("check", *TWO_CAUSES, *BUILTIN, "--baseline", str(partial_baseline))
    assert text.exit_code == 1  # the cross-host-tensor-parallel finding is new
    assert "1 finding accepted by the baseline (not shown)" in text.stdout
    assert "found 1 finding (1 warning) in 1 module: cross-host-tensor-parallel 1" in text.stdout
    markdown = run("check", *TWO_CAUSES, *BUILTIN, "--baseline", str(partial_baseline), "--format", "markdown").stdout
    assert markdown.startswith("### hlo-doctor: 1 new finding in 1 module (1 warning), 1 accepted by the baseline")


def test_sarif_marks_new_and_unchanged_results(partial_baseline):
    result = run("check", *TWO_CAUSES, *BUILTIN, "--baseline", str(partial_baseline), "--format", "sarif")
    log = json.loads(result.stdout)
    states = sorted((r["ruleId"], r["baselineState"]) for r in log["runs"][0]["results"])
    assert states == [("cross-host-tensor-parallel", "new"), ("uneven-sharding-padding", "unchanged")]
    if SARIF_SCHEMA.is_file():
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.Draft4Validator(json.loads(SARIF_SCHEMA.read_text())).validate(log)


def test_sarif_without_baseline_has_no_baseline_state():
    log = json.loads(run("analyze", str(SEED), "--format", "sarif").stdout)
    assert log["runs"][0]["results"] and all("baselineState" not in r for r in log["runs"][0]["results"])


# -- configuration values ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[tool.hlo-doctor.rules.uneven-sharding-padding]\nmin-bytes = -1\n",
         "rules.uneven-sharding-padding.min-bytes must not be negative, not -1"),
        ("[tool.hlo-doctor.rules.uneven-sharding-padding]\nround-to = 0\n",
         "rules.uneven-sharding-padding.round-to must be at least 1, not 0"),
        ("[tool.hlo-doctor.rules.sync-collective]\nmin-work-fraction = -0.5\n",
         "rules.sync-collective.min-work-fraction must not be negative"),
        ('[tool.hlo-doctor]\nignore = "communication-bound"\n',
         "ignore must be a list of strings, not the string 'communication-bound'"),
        ('[tool.hlo-doctor]\nignore-ops = "jit(f)/*"\n', "ignore-ops must be a list of strings"),
    ],
)
def test_bad_config_values_exit_2_naming_the_key(tmp_path, monkeypatch, body, message):
    (tmp_path / "pyproject.toml").write_text(body if body.startswith("[tool.hlo-doctor]") else
                                             "[tool.hlo-doctor]\n" + body)
    monkeypatch.chdir(tmp_path)
    result = run("check", str(SEED))
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_select_and_ignore_that_leave_no_rule_warn():
    result = run("analyze", str(SEED), "--select", "activation-all-gather", "--ignore", "activation-all-gather")
    assert result.exit_code == 0
    assert "warning: select (command line) and ignore (command line) leave no rule to run" in result.stderr
    assert "warning" not in run("analyze", str(SEED), "--select", "activation-all-gather").stderr


# -- --exit-zero, --quiet, --statistics ----------------------------------------------


def test_exit_zero_keeps_check_green_but_not_on_bad_input():
    assert run("check", str(SEED)).exit_code == 1
    assert run("check", str(SEED), "--exit-zero").exit_code == 0
    assert run("check", "/no/such/dump", "--exit-zero").exit_code == 2


def test_quiet_prints_findings_only():
    loud, quiet = run("check", str(SEED)), run("check", str(SEED), "--quiet")
    assert "rules ran" in loud.stdout and "at or above" in loud.stderr
    assert "rules ran" not in quiet.stdout and "found 1 finding" not in quiet.stdout and quiet.stderr == ""
    assert quiet.stdout.count(": warning ") == 1 and quiet.exit_code == 1


def test_statistics_counts_per_rule():
    result = run("analyze", *TWO_CAUSES, "--statistics")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["1", "cross-host-tensor-parallel", "warning"]
    assert lines[1].split() == ["1", "uneven-sharding-padding", "warning"]
    assert run("analyze", str(SEED), "--statistics", "--format", "json").exit_code == 2


def test_summary_names_only_rules_with_findings_and_what_was_not_judged():
    out = run("analyze", *TWO_CAUSES, *BUILTIN).stdout
    summary = out[out.index("found 2 findings"):]
    assert "cross-host-tensor-parallel 1, uneven-sharding-padding 1" in summary
    assert "reshard-churn" not in out  # ran, found nothing: not named
    assert f"{len(builtin_rule_ids())} rules ran" in summary
    assert "not judged: communication-bound: no hardware profile" in summary


# -- -o ------------------------------------------------------------------------------


def test_output_file_is_replaced_atomically(tmp_path):
    out = tmp_path / "report.md"
    out.write_text("old")
    out.chmod(0o640)
    assert run("analyze", str(SEED), "--format", "markdown", "-o", str(out)).exit_code == 0
    assert out.read_text().startswith("### hlo-doctor: 1 finding")
    assert (out.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary file left


def test_output_into_a_missing_folder_exits_2(tmp_path):
    result = run("analyze", str(SEED), "-o", str(tmp_path / "no" / "report.txt"))
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_html_needs_an_output_file():
    result = run("analyze", str(SEED), "--format", "html")
    assert result.exit_code == 2 and "-o report.html" in result.stderr


# -- source snippets ------------------------------------------------------------------


def _dump_pointing_at(target: Path, tmp_path: Path) -> Path:
    """The seed dump with its user source file replaced by ``target`` (an absolute path)."""
    dump = tmp_path / "dump"
    for path in SEED.rglob("*"):
        out = dump / path.relative_to(SEED)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text()
            if path.suffix == ".txt":
                text = text.replace('"/work/main/hlo_doctor/examples/programs/fsdp_activation_gather.py"',
                                    json.dumps(str(target)))
            out.write_text(text)
    return dump


def test_source_lines_come_only_from_the_project(tmp_path, monkeypatch):
    secret = tmp_path / "elsewhere" / "secret.py"
    secret.parent.mkdir()
    secret.write_text("".join(f"line {n} SECRET\n" for n in range(1, 80)))
    dump = _dump_pointing_at(secret, tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    shown = run("analyze", str(dump)).stdout
    assert "secret.py:49:1: warning" in shown  # the finding still points there
    assert "SECRET" not in shown
    anywhere = run("analyze", str(dump), "--show-source-anywhere").stdout
    assert "49 | line 49 SECRET" in anywhere
    monkeypatch.chdir(secret.parent)  # now it is below the current directory
    assert "49 | line 49 SECRET" in run("analyze", str(dump)).stdout


# -- progress ------------------------------------------------------------------------


@pytest.mark.parametrize(("tty", "seconds", "shown"), [(True, 0.4, True), (True, 0.0, False), (False, 0.4, False)])
def test_progress_bar_only_on_a_terminal_and_only_when_slow(monkeypatch, tty, seconds, shown):
    import time

    from hlo_doctor.cli.common import Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    monkeypatch.setattr(Progress, "DELAY", 0.1)
    progress = Progress()
    with progress as update:
        assert (update is not None) == tty
        if update is not None:
            update(0, 1, "module_0000.jit_mlp")
        time.sleep(seconds)
    assert progress.shown == shown


@pytest.mark.parametrize("args", [("--select", "no-such-rule"), ("--hardware", "v100"), ("--baseline", "/no/such.json")])
def test_json_prints_a_document_for_every_input_error(args):
    result = run("check", str(SEED), "--format", "json", *args)
    assert result.exit_code == 2
    (error,) = json.loads(result.stdout)["errors"]
    assert error["message"] in result.stderr
