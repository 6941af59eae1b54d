"""A hostile dump against every output format: nothing from it may reach a terminal or a page live.

The dump is built in a temporary folder from the real seed fixture
(``fixtures/fsdp-activation-gather/jax-shardy-bad``) by rewriting its names:
the module name in every file name, the user's source file name in the
``FileNames`` tables and an ``op_name`` in the metadata get terminal escape
sequences (OSC ``ESC]0;…BEL``, CSI, an 8-bit CSI), backticks, ``<img>`` and ``|``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"
MODULE = "jit_\x1b]0;pwned\x07\x1b[31m`x`<img src=x onerror=alert(1)>|y\x9b2J"
SOURCE = "evil\x1b]0;title\x07`|<img src=y>.py"
OP_NAME = "jit(mlp)/\x1b[2J`|<b>dot</b>"
# What the module name reads as once its escape sequences are gone (it is shown, not dropped).
MODULE_SHOWN = "jit_`x`<img src=x onerror=alert(1)>|y"
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _hostile(text: str) -> str:
    return text.replace("fsdp_activation_gather.py", SOURCE).replace("jit(mlp)/dot_general", OP_NAME)


def _hostile_json(value):
    if isinstance(value, str):
        return _hostile(value)
    if isinstance(value, list):
        return [_hostile_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _hostile_json(v) for k, v in value.items()}
    return value


def make_hostile_dump(target: Path) -> Path:
    target.mkdir(parents=True)
    for path in sorted(SEED.rglob("*")):
        out = target / str(path.relative_to(SEED)).replace("jit_mlp", MODULE)
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".json":  # the run record: strings changed, still valid JSON
            out.write_text(json.dumps(_hostile_json(json.loads(path.read_text()))))
        else:
            out.write_text(_hostile(path.read_text()))
    return target


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    return make_hostile_dump(tmp_path_factory.mktemp("hostile") / "dump")


def run(*args: str) -> str:
    # color=True: click would otherwise strip CSI sequences itself and hide what we print
    result = CliRunner().invoke(main, list(args), color=True)
    assert result.exit_code in (0, 1), result.output
    return result.output


def without_code_spans(markdown: str) -> str:
    """Markdown with its fenced blocks and inline code spans (any fence length) removed."""
    markdown = re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", markdown, flags=re.S | re.M)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown)


def test_the_dump_is_hostile_and_still_analyzed(dump):
    data = json.loads(run("analyze", str(dump), "--format", "json"))
    assert [m["name"] for m in data["modules"]] == [MODULE]  # the names really are hostile
    assert len(data["findings"]) == 1 and len(data["findings"][0]["related"]) >= 2
    assert any(SOURCE in (f["source"] or {}).get("file", "") for f in data["findings"])
    assert any(f["op_name"] == OP_NAME for f in data["findings"])


@pytest.mark.parametrize("output_format", ["text", "json", "sarif", "markdown", "github", "html"])
def test_no_control_character_in_any_format(dump, output_format, tmp_path):
    if output_format == "html":
        run("analyze", str(dump), "--format", "html", "-o", str(tmp_path / "r.html"))
        out = (tmp_path / "r.html").read_text()
    else:
        out = run("analyze", str(dump), "--format", output_format, "--verbose")
    assert not CONTROLS.findall(out.replace("\n", "").replace("\t", ""))
    if output_format == "sarif":  # what viewers show is plain; the artifact URIs name the files, %-encoded
        results = json.loads(out)["runs"][0]["results"]
        shown = [r["message"]["text"] for r in results] + [
            loc["fullyQualifiedName"] for r in results for loc in r["locations"][0].get("logicalLocations", [])]
        assert shown and not any("pwned" in text or CONTROLS.search(text) for text in shown)
    elif output_format != "json":  # JSON keeps the data as it is, escaped: \u001b]0;pwned
        assert "pwned" not in out


def test_text_shows_names_with_their_escapes_removed(dump):
    out = run("analyze", str(dump), "--verbose")
    assert MODULE_SHOWN in out and "evil`|<img src=y>.py" in out
    assert "pwned" not in out and "title" not in out


def test_colored_text_has_only_its_own_color_codes():
    from hlo_doctor.analysis import ModuleSummary, Report
    from hlo_doctor.report.text import render_text
    from hlo_doctor.rules.base import Finding, Severity

    finding = Finding(rule="r", severity=Severity.WARNING, module=MODULE, message=f"bad {MODULE}", file=SOURCE, line=1)
    report = Report(dump="d", modules=(ModuleSummary(0, MODULE, MODULE, "shardy", 4, ()),), findings=(finding,))
    out = render_text(report, color=True)
    assert "\x1b[" in out  # colour is on
    assert re.sub(r"\x1b\[[0-9;]*m", "", out) == render_text(report, color=False)
    assert not CONTROLS.findall(re.sub(r"\x1b\[[0-9;]*m", "", out).replace("\n", ""))


@pytest.mark.parametrize("command", ["analyze", "diff"])
def test_markdown_renders_no_html_and_keeps_its_table(dump, tmp_path, command):
    if command == "diff":
        before = make_hostile_dump(tmp_path / "before")
        clean = tmp_path / "after"
        make_hostile_dump(clean)
        out = run("diff", str(before), str(clean), "--format", "markdown")
    else:
        out = run("analyze", str(dump), "--format", "markdown")
    live = without_code_spans(out)
    assert "<img" not in live and "<b>" not in live
    assert "&lt;img" in out or "<img" in out  # the names are there (escaped, or inside code spans)
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 1
    for row in rows:  # every table here has 4 columns: 5 unescaped pipes, whatever the names hold
        assert len(re.findall(r"(?<!\\)\|", row)) == 5, row


def test_markdown_code_span_survives_backticks():
    from hlo_doctor.report.safe import md_code

    span = md_code("a`b``c")
    assert span == "``` a`b``c ```"


def test_html_escapes_everything(dump, tmp_path):
    page = tmp_path / "report.html"
    run("analyze", str(dump), "--format", "html", "-o", str(page))
    html = page.read_text()
    assert "<img" not in html and "<b>dot" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_diff_text_and_json_are_plain(dump, tmp_path):
    other = make_hostile_dump(tmp_path / "other")
    for output_format in ("text", "json"):
        out = run("diff", str(dump), str(other), "--format", output_format)
        assert not CONTROLS.findall(out.replace("\n", "").replace("\t", ""))
        if output_format == "text":
            assert MODULE_SHOWN in out and "pwned" not in out


def test_error_lines_are_plain(tmp_path):
    broken = tmp_path / f"module_0000.{MODULE}.before_optimizations.txt"
    broken.write_text("HloModule m\n\nthis is not HLO\n")
    result = CliRunner().invoke(main, ["analyze", str(broken)], color=True)
    assert result.exit_code == 2
    assert "error: " in result.stderr and "jit_`x`" in result.stderr
    assert "pwned" not in result.stderr and not CONTROLS.findall(result.stderr.replace("\n", ""))


@pytest.mark.parametrize("command", [["ls"], ["collectives"]])
def test_inventories_print_dump_names_plain(dump, command):
    """``ls`` and ``collectives`` tables: names from the dump lose their escapes and stay literal
    (rich markup such as ``[bold]`` in a name is shown, not applied)."""
    out = run(*command, str(dump))
    assert not CONTROLS.findall(out.replace("\n", "")) and "pwned" not in out
    assert "`x`<img" in out or "collectives" in out
