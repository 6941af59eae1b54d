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


def dump_errors(report: dict) -> list[str]:
    """The JSON report's errors about the dump (not a rule plugin of this environment that did not load)."""
    return [e["message"] for e in report["errors"] if "rule plugin not loaded" not in e["message"]]


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
    assert "0 edits" in result.stderr
    assert result.stdout == ""  # no diff: not one of its lines is printed
    # the rules did not read it either: the analysis says so
    sources = json.loads(invoke("analyze", str(dump), "--format", "json").stdout)["sources"]
    assert {"recorded": str(outside), "local": None, "how": "outside"} in sources
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
    # the project's own virtual environment: inside the project root, so the rules read the file
    # (one outside is not even read) and the fix reaches the site-packages guard
    library = project / ".venv" / "lib" / "python3.11" / "site-packages" / "thirdparty"
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


@pytest.mark.parametrize("output_format", ["text", "json", "html"])
def test_4_symlinks_inside_the_dump_do_not_lead_out(tmp_path, output_format):
    dump = seed_copy(tmp_path / "dump")
    secret = tmp_path / "secrets.textproto"
    secret.write_text(f'num_partitions: 4\npassword: "{SECRET}"\n')
    options = dump / "module_0000.jit_mlp" / "compile_options.textproto"
    options.unlink()
    options.symlink_to(secret)
    shutil.move(dump / "shardy", tmp_path / "shardy-elsewhere")
    (dump / "shardy").symlink_to(tmp_path / "shardy-elsewhere", target_is_directory=True)
    args = ["analyze", str(dump), "--format", output_format, "--verbose"]
    if output_format == "html":
        args += ["-o", str(tmp_path / "r.html")]
    result = invoke(*args)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    shown = (tmp_path / "r.html").read_text() if output_format == "html" else result.stdout
    assert SECRET not in shown and "non-batch-dim-sharding" in shown
    if output_format == "json":
        skipped = {(Path(e["path"]).name, e["message"]) for e in json.loads(result.stdout)["errors"]}
        message = "skipped: a symbolic link that leads out of the dump folder"
        assert {("compile_options.textproto", message), ("module_0000.jit_mlp", message)} <= skipped
    ls = invoke("ls", str(dump))
    assert ls.exit_code == 0 and SECRET not in ls.stdout


def test_5_markup_in_module_names_does_not_reach_the_progress_bar(tmp_path, monkeypatch):
    import io
    import sys
    import time

    from rich.text import Text

    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.cli import common

    dump = tmp_path / "dump"
    dump.mkdir()
    name = "jit_x[link=javascript:alert(1)]CLICK"
    for path in SEED.glob("module_0000.jit_mlp.*.txt"):
        (dump / path.name.replace("jit_mlp", name)).write_text(path.read_text())

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(common.Progress, "DELAY", 0.0)
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    shown = []
    real_show = common.Progress._show

    def show(self):  # what the bar was given to draw
        real_show(self)
        shown.append(self._bar.tasks[0].description)

    monkeypatch.setattr(common.Progress, "_show", show)
    progress = common.Progress()
    with progress as update:
        deadline = time.monotonic() + 10
        while not progress.shown and time.monotonic() < deadline:  # the bar is up
            time.sleep(0.01)
        report = analyze_dump(dump, progress=update, jobs=1)
    assert [m.name for m in report.modules] == [name] and report.findings
    assert any(name in Text.from_markup(description).plain for description in shown)  # shown as text
    assert "\x1b]8;" not in terminal.getvalue()  # no OSC 8 hyperlink


@pytest.mark.parametrize("attribute", ["replica_groups=[1000000000,4]<=[4000000000]",
                                       "sharding={devices=[4000000000,1]<=[4000000000]}",
                                       # small, but more devices than the module declares (4)
                                       "replica_groups=[8,4]<=[32]", "sharding={devices=[32,1]<=[32]}"])
def test_6_a_huge_iota_is_rejected_at_its_place_before_it_is_expanded(tmp_path, attribute):
    dump = seed_copy(tmp_path / "dump")
    partitioned = next(dump.glob("*after_spmd-partitioning*.txt"))
    text = partitioned.read_text()
    if attribute.startswith("replica_groups"):
        target = "replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}"
    else:
        target = re.search(r"parameter\(0\), (sharding=\{[^}]*\})", text).group(1)
    at = text.index(target)
    line, first_col = text[:at].count("\n") + 1, at - text.rfind("\n", 0, at)
    partitioned.write_text(text.replace(target, attribute, 1))
    result = invoke("analyze", str(dump), "--format", "json")  # it ends (a test runs under 24 GB)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    report = json.loads(result.stdout)
    located = [re.match(rf"{re.escape(str(partitioned))}:(\d+):(\d+): .*more than the module's 4 ", e["message"])
               for e in report["errors"]]
    places = [(int(m.group(1)), int(m.group(2))) for m in located if m]
    assert places and all(row == line and first_col < col < first_col + len(attribute) for row, col in places), \
        report["errors"]
    assert report["findings"]  # what the other snapshots show is still reported
    check = invoke("check", str(dump))
    assert check.exit_code == 2 and f"{partitioned.name}:{line}:" in check.stdout + check.stderr


def long_name_dump(tmp_path: Path, megabytes: float) -> tuple[Path, str]:
    """The seed with one op_name (the dot's, after propagation) ``megabytes`` MB long."""
    dump = seed_copy(tmp_path / "dump")
    name = "jit(mlp)/" + "layer_" * int(megabytes * 1e6 / 6)
    snapshot = next(dump.glob("*before_spmd-partitioning.txt"))
    text = snapshot.read_text()
    assert 'op_name="jit(mlp)/dot_general"' in text
    snapshot.write_text(text.replace('op_name="jit(mlp)/dot_general"', f'op_name="{name}"', 1))
    return dump, name


@pytest.mark.parametrize("output_format", ["text", "markdown", "sarif", "github", "html", "json"])
def test_7_a_long_name_is_cut_in_every_output_but_json(tmp_path, output_format):
    dump, name = long_name_dump(tmp_path, 0.2)  # a long op_name
    long = "dot_general.0" + "x" * 200_000  # and a long instruction name, which messages quote
    propagated = next(dump.glob("*before_spmd-partitioning.txt"))
    propagated.write_text(re.sub(r"%dot_general\.0\b", f"%{long}", propagated.read_text()))
    args = ["analyze", str(dump), "--format", output_format, "--verbose"]
    if output_format == "html":
        args += ["-o", str(tmp_path / "r.html")]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    out = (tmp_path / "r.html").read_text() if output_format == "html" else result.stdout
    if output_format == "json":  # whole names
        findings = json.loads(out)["findings"]
        assert any(f["op_name"] == name for f in findings) and any(f["instruction"] == long for f in findings)
    else:
        assert name not in out and long not in out
        assert "more characters]" in out  # the instruction name is shown, cut
        assert max(len(word) for word in out.split()) < 1200


def test_7_a_quoted_string_costs_no_memory_per_character():
    """The quoted-string patterns are unrolled: a 2 MB op_name is matched without the
    per-character backtracking state of the ``(?:[^"\\\\]|\\\\.)*`` form (which raises a
    RecursionError-free MemoryError only at far larger sizes: the check is on the pattern)."""
    from hlo_doctor.hlo.attr_cursor import _DQ_STRING
    from hlo_doctor.hlo.lexer import STRING

    for pattern in (_DQ_STRING, STRING):
        assert "|\\\\." not in pattern.pattern
        value = '"' + "a\\\"b" * 500_000 + '"'
        assert pattern.match(value).end() == len(value)


@pytest.mark.parametrize("where", ["instruction", "op_name"])
def test_8_collectives_prints_long_names_cut(tmp_path, where):
    dump = seed_copy(tmp_path / "dump")
    long = "x" * 1_000_000
    for snapshot in dump.glob("*.txt"):
        text = snapshot.read_text()
        if where == "instruction":
            text = re.sub(r"%all-gather\.1\b", f"%all-gather.1{long}", text)
        else:
            text = text.replace('op_name="jit(mlp)/dot_general"', f'op_name="jit(mlp)/{long}"')
        snapshot.write_text(text)
    result = invoke("collectives", str(dump))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "all-gather" in result.stdout and long not in result.stdout
    assert len(result.stdout) < 100_000  # a table of 2 rows, not a megabyte folded into cells
    whole = json.loads(invoke("collectives", str(dump), "--format", "json").stdout)
    if where == "instruction":
        assert any(long in json.dumps(module) for module in whole["modules"])


@pytest.mark.parametrize("file_name", ["compile_options.textproto", "topology.textproto"])
@pytest.mark.parametrize("command", ["analyze", "ls"])
def test_10_deep_nesting_in_a_textproto_is_an_error_of_that_file(tmp_path, file_name, command):
    dump = seed_copy(tmp_path / "dump")
    path = dump / "module_0000.jit_mlp" / file_name
    with path.open("a") as stream:
        stream.write("deep { " * 500 + "}" * 500 + "\n")
    result = invoke(command, str(dump), "--format", "json")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    document = json.loads(result.stdout)
    errors = document["errors"]
    if command == "analyze" or file_name == "compile_options.textproto":  # ls reads no topology
        assert any(e["message"].endswith("nested more than 100 levels deep") and file_name in e["message"]
                   for e in errors), errors
    if command == "analyze":
        assert [f["rule"] for f in document["findings"]] == ["non-batch-dim-sharding"]


def test_11_a_computation_named_like_the_entry_is_one_error_line(tmp_path):
    dump = seed_copy(tmp_path / "dump")
    snapshot = next(dump.glob("*before_spmd-partitioning.txt"))
    text = snapshot.read_text()
    entry = re.search(r"^ENTRY %([\w.\-]+)", text, re.M)
    line = text[: entry.start()].count("\n") + 1
    twin = f"%{entry.group(1)} (a: f32[]) -> f32[] {{\n  ROOT %a = f32[] parameter(0)\n}}\n\n"
    snapshot.write_text(text[: entry.start()] + twin + text[entry.start():])
    error = one_error_line(invoke("explain", str(dump), "dot_general.0"))
    assert error.endswith(f"{snapshot.name}:{line + 4}:1: computation '{entry.group(1)}' is defined twice "
                          f"(first at line {line})")
    result = invoke("analyze", str(dump), "--format", "json")
    assert result.exit_code == 0, result.output  # the other snapshots still give the finding
    report = json.loads(result.stdout)
    assert report["findings"] and not any(f["rule"] == "internal-error" for f in report["findings"])
    assert any("is defined twice" in e["message"] for e in report["errors"])


def two_module_dump(target: Path, mutate) -> Path:
    """The seed, plus a copy of its module as module 1 (``jit_other``) with ``mutate(text, file
    name)`` applied to each of its snapshots."""
    dump = seed_copy(target)
    for path in sorted(SEED.glob("module_0000.jit_mlp*")):
        if path.is_dir():
            continue
        other = dump / path.name.replace("module_0000.jit_mlp", "module_0001.jit_other")
        text = path.read_text().replace("HloModule jit_mlp", "HloModule jit_other")
        other.write_text(mutate(text, other.name) if other.suffix == ".txt" else text)
    return dump


@pytest.mark.parametrize("output_format", ["markdown", "github", "sarif", "json", "text"])
def test_14_check_fails_when_a_module_cannot_be_read(tmp_path, output_format):
    fixed = SEED.parent / "jax-shardy-fixed"
    dump = seed_copy(tmp_path / "dump", fixed)
    for path in fixed.glob("module_0000.jit_mlp.*.txt"):
        (dump / path.name.replace("jit_mlp", "jit_zero")).write_bytes(b"\0" * path.stat().st_size)
    assert invoke("check", str(fixed), "--format", output_format).exit_code == 0  # the fixed program passes
    result = invoke("check", str(dump), "--format", output_format)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "jit_zero" in result.stdout + result.stderr and "binary data" in result.stdout + result.stderr
    assert "error: " in result.stderr


def test_15_one_bad_attribute_stops_only_its_module(tmp_path):
    good = "replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}"

    def broken(text: str, name: str) -> str:
        return text.replace(good, "replica_groups=mesh['zz'=0] {'nope'}")

    dump = two_module_dump(tmp_path / "dump", broken)
    bad = dump / next(p.name for p in dump.glob("module_0001.*after_spmd-partitioning*.txt"))
    at = bad.read_text().index("replica_groups=mesh['zz'=0]")
    line = bad.read_text()[:at].count("\n") + 1
    result = invoke("analyze", str(dump), "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    found = [(f["module"], f["rule"]) for f in report["findings"]]
    assert ("module_0000.jit_mlp", "non-batch-dim-sharding") in found  # the good module's finding is kept
    assert all(rule != "internal-error" for _, rule in found)
    errors = [e for e in report["errors"] if e["module"] == "module_0001.jit_other"]
    assert len(errors) == 1 and errors[0]["message"].startswith(f"{bad}:{line}:")
    assert "mesh axis 'zz' must have a positive size" in errors[0]["message"]
    assert "<string>" not in result.stdout


@pytest.mark.parametrize("mutation", ["sharding={bogus}", "sharding={devices=[0,1]<=[0]}", "run-record"])
def test_16_malformed_values_are_the_inputs_error_not_the_tools(tmp_path, mutation):
    dump = seed_copy(tmp_path / "dump")
    snapshot = next(dump.glob("*before_spmd-partitioning.txt"))
    if mutation == "run-record":
        record = json.loads((dump / "hlo_doctor_run.json").read_text())
        record["sharding_calls"] = 7
        record["meshes"][0]["shape"] = "4x1"
        (dump / "hlo_doctor_run.json").write_text(json.dumps(record))
    else:
        text = snapshot.read_text()
        text, count = re.subn(r"(parameter\(0\)), sharding=\{[^}]*\}", lambda m: f"{m.group(1)}, {mutation}", text,
                              count=1)
        assert count == 1
        snapshot.write_text(text)
    result = invoke("analyze", str(dump), "--format", "json")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    report = json.loads(result.stdout)
    assert not any(f["rule"] == "internal-error" for f in report["findings"]), report["findings"]
    assert report["findings"]  # the rules the bad value does not stop still report
    messages = dump_errors(report)
    if mutation == "run-record":
        assert any("'sharding_calls' must be a list, not an integer; ignored" in m for m in messages), messages
        assert any("'meshes'[0]: 'shape' must be a list or null, not a string; ignored" in m for m in messages)
    else:
        assert len(messages) == 1 and messages[0].startswith(f"{snapshot}:29:")


def test_15_an_attribute_read_apart_from_its_line_is_still_located(tmp_path):
    dump = seed_copy(tmp_path / "dump")
    snapshot = next(dump.glob("*before_spmd-partitioning.txt"))
    text = snapshot.read_text()
    at = text.index("lhs_contracting_dims={1}")
    line = text[:at].count("\n") + 1
    snapshot.write_text(text.replace("lhs_contracting_dims={1}", "lhs_contracting_dims={1,x}", 1))
    result = invoke("analyze", str(dump), "--format", "json")
    assert result.exit_code == 0, result.output
    messages = dump_errors(json.loads(result.stdout))
    assert len(messages) == 1 and messages[0].startswith(f"{snapshot}:{line}:"), messages
    assert "<string>" not in result.stdout
