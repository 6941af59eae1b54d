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
import shutil
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


# --------------------------------------------------------------------------------------------------
# Issue 30: what got through. Each test copies a real fixture to a temporary folder and mutates it
# there (the numbers are the items).

PROGRAM_RECORDED = "/work/main/hlo_doctor/examples/programs/fsdp_activation_gather.py"
FINDING_LINE = 49  # the seed's finding is at this line of its program
SECRET = "SECRET-hunter2"


def seed_copy(target: Path, seed: Path = SEED) -> Path:
    shutil.copytree(seed, target)
    return target


def recorded_program(dump: Path, path: str) -> None:
    """Point every ``FileNames`` entry of the dump's snapshots at ``path``."""
    for snapshot in dump.glob("*.txt"):
        snapshot.write_text(snapshot.read_text().replace(PROGRAM_RECORDED, path))


def secret_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{SECRET} line {n}\n" for n in range(1, 80)))
    return path


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def one_error_line(result, exit_code: int = 2) -> str:
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder, the current directory."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_1_the_run_record_does_not_unlock_quoting_of_other_files(tmp_path, project):
    dump = seed_copy(tmp_path / "dump")
    secret = secret_file(tmp_path / "etc" / "passwd")
    recorded_program(dump, str(secret))
    record = json.loads((dump / "hlo_doctor_run.json").read_text())
    record["script"] = {"path": str(tmp_path / "etc" / "x"), "sha256": None}
    (dump / "hlo_doctor_run.json").write_text(json.dumps(record))
    text = invoke("analyze", str(dump))
    html_result = invoke("analyze", str(dump), "--format", "html", "-o", str(project / "r.html"))
    assert text.exit_code == html_result.exit_code == 0, text.output
    assert "non-batch-dim-sharding" in text.stdout  # the finding, at the secret file's line, is reported
    assert SECRET not in text.stdout and SECRET not in (project / "r.html").read_text()
    # the same dump with the limit lifted on purpose does quote it: the check above can fail
    assert SECRET in invoke("analyze", str(dump), "--show-source-anywhere").stdout


def test_2_fix_neither_reads_nor_writes_a_file_outside_the_project(tmp_path, project):
    dump = seed_copy(tmp_path / "dump")
    (dump / "hlo_doctor_run.json").unlink()
    outside = tmp_path / "elsewhere" / "fsdp_activation_gather.py"
    outside.parent.mkdir()
    shutil.copyfile(ROOT / "hlo_doctor" / "examples" / "programs" / "fsdp_activation_gather.py", outside)
    recorded_program(dump, str(outside))
    before = outside.read_text()
    result = invoke("fix", str(dump), "--write")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "outside the project root" in result.stderr and "0 edits" in result.stderr
    assert result.stdout == ""  # no diff: not one of its lines is printed
    assert outside.read_text() == before
    # a file the user maps there on purpose is read, but --write still edits only the project's files
    mapped = invoke("fix", str(dump), "--write", "--path-map", f"{outside}={outside}")
    assert "outside the project root" in one_error_line(mapped) and outside.read_text() == before
    # inside the project, the same program is fixed
    inside = project / "fsdp_activation_gather.py"
    shutil.copyfile(outside, inside)
    for snapshot in dump.glob("*.txt"):
        snapshot.write_text(snapshot.read_text().replace(str(outside), str(inside)))
    assert invoke("fix", str(dump), "--write").exit_code == 0
    assert inside.read_text() != before


def test_3_a_symlinked_folder_does_not_hide_an_installed_library(tmp_path, project):
    library = tmp_path / "lib" / "python3.11" / "site-packages" / "thirdparty"
    library.mkdir(parents=True)
    target = library / "fsdp_activation_gather.py"
    shutil.copyfile(ROOT / "hlo_doctor" / "examples" / "programs" / "fsdp_activation_gather.py", target)
    (project / "vendor").symlink_to(library, target_is_directory=True)
    dump = seed_copy(tmp_path / "dump")
    recorded_program(dump, str(project / "vendor" / "fsdp_activation_gather.py"))
    before = target.read_text()
    result = invoke("fix", str(dump), "--write")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "installed library's file" in result.stderr
    assert target.read_text() == before


@pytest.mark.parametrize("output_format", ["text", "sarif", "github"])
def test_9_a_file_name_longer_than_the_system_allows_is_only_a_name(tmp_path, output_format):
    dump = seed_copy(tmp_path / "dump")
    recorded_program(dump, f"/tmp/{'a' * 300}/train.py")
    result = invoke("analyze", str(dump), "--format", output_format)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "non-batch-dim-sharding" in result.stdout  # the finding is not lost to a crash
    assert "internal-error" not in result.stdout and "Errno" not in result.output


def test_12_a_baseline_entry_of_the_wrong_type_is_bad_input(tmp_path):
    dump = seed_copy(tmp_path / "dump")
    baseline = tmp_path / "baseline.json"
    assert invoke("check", str(dump), "--write-baseline", str(baseline)).exit_code == 0
    document = json.loads(baseline.read_text())
    assert document["findings"][0]["op"]  # a real entry, with an op signature
    document["findings"][0]["op"] = ["not", "a", "string"]
    baseline.write_text(json.dumps(document))
    line = one_error_line(invoke("check", str(dump), "--baseline", str(baseline)))
    assert "malformed baseline entry 0" in line and '"op" must be a string or null, not list' in line


def test_13_a_pyproject_toml_that_is_not_utf8(tmp_path, project):
    dump = seed_copy(tmp_path / "dump")
    (project / "pyproject.toml").write_bytes(b"[project]\nname = \"caf\xe9\"\n")  # another tool's, Latin-1
    result = invoke("analyze", str(dump))
    assert result.exit_code == 0 and "non-batch-dim-sharding" in result.stdout, result.output
    ls = invoke("ls", str(dump))
    assert ls.exit_code == 0, ls.output
    (project / "pyproject.toml").write_bytes(b"[tool.hlo-doctor]\nignore = [\"caf\xe9\"]\n")  # ours: one line
    line = one_error_line(invoke("analyze", str(dump)))
    assert line.endswith("pyproject.toml:2:15: not UTF-8 (byte 0xe9); TOML files are UTF-8")


@pytest.mark.parametrize(("field", "value"), [("inter_host_bandwidth", 0), ("intra_host_bandwidth", -1e9),
                                              ("peak_bf16_flops", "nan"), ("devices_per_host", 0)])
def test_17_a_hardware_file_out_of_range_is_bad_input(tmp_path, field, value):
    dump = seed_copy(tmp_path / "dump")
    from hlo_doctor.semantics.hardware import bundled_profiles

    profile = json.loads(json.dumps(dataclass_dict(bundled_profiles()["h100"])))
    profile[field] = float(value) if value == "nan" else value
    hardware = tmp_path / "hw.json"
    hardware.write_text(json.dumps(profile))
    line = one_error_line(invoke("analyze", str(dump), "--hardware", str(hardware)))
    assert f"{field} must be" in line and ("> 0" in line or "from 1 to" in line)


def dataclass_dict(profile) -> dict:
    import dataclasses

    data = dataclasses.asdict(profile)
    data["peak_flops"] = dict(data["peak_flops"])
    return data


def test_18_output_onto_a_fifo_writes_into_it(tmp_path):
    import os
    import stat
    import threading

    dump = seed_copy(tmp_path / "dump")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = invoke("analyze", str(dump), "--format", "json", "-o", str(fifo))
    reader.join(10)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO, not a regular file in its place
    assert json.loads(received[0])["findings"][0]["rule"] == "non-batch-dim-sharding"


def test_18_output_onto_a_socket_is_refused(tmp_path):
    import socket

    dump = seed_copy(tmp_path / "dump")
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        line = one_error_line(invoke("analyze", str(dump), "-o", str(path)))
    assert "not a regular file, device or pipe" in line


def test_19_sarif_uris_are_percent_encoded(tmp_path):
    from urllib.parse import unquote, urlsplit

    dump = seed_copy(tmp_path / "dump")
    name = "/src/my file#1%20\u202e.py"
    recorded_program(dump, name)
    result = invoke("analyze", str(dump), "--format", "sarif")
    assert result.exit_code == 0, result.output
    uris = [location["physicalLocation"]["artifactLocation"]["uri"]
            for run_ in json.loads(result.stdout)["runs"] for r in run_["results"] for location in r["locations"]]
    assert uris and all(uri.isascii() and " " not in uri for uri in uris)
    source = [urlsplit(uri) for uri in uris if "my" in uri]
    assert source and all(u.scheme == "file" and not u.fragment and unquote(u.path) == name for u in source)
