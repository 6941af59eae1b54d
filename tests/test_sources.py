"""Finding the program files a dump names, on another machine's paths, and never outside the allowed folders.

The acceptance cases copy real fixtures (dumps the runner made from gallery programs, whose
recorded paths are those of the checkout that made them) and their program files under another
root, with the recorded paths left as they were: the fixes there must be byte-identical to the
ones on the original paths, and the files must have been found by their recorded path's tail
(the gallery fallback is switched off, so it cannot be what found them).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.cli import main
from hlo_doctor.findings import Report
from hlo_doctor.program.locate import READ_LIMIT, SourceFinder, SourceSettings, map_prefix, parse_path_maps
from hlo_doctor.report import render
from hlo_doctor.report.source import SourcePolicy

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
# Fixtures whose fixes quote the program: its variables, its rules list, its LayoutMap keys, its
# specs and its FSDPv2 wrapper, JAX and torch_xla.
CASES = [
    "non-batch-dim-sharding/jax-gspmd-bad",
    "replicated-batch/jax-gspmd-bad",
    "flax-linen-rules/jax-shardy-bad",
    "keras-layout-map/jax-shardy-bad",
    "hf-fsdpv2-torch-xla/torch_xla-bad",
]
NO_GALLERY = SourceSettings(gallery=False)


def _fixes(report: Report) -> list[tuple]:
    """Every finding's fix, as the report holds it (code, summary, edits, the reason for no edit)."""
    out = []
    for finding in report.findings:
        s = finding.suggestion
        out.append((finding.rule, finding.instruction, finding.source, finding.message,
                    None if s is None else (s.summary, s.jax, s.torch_xla, s.edits, s.no_edit)))
    return out


def _analyze(dump: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch, settings: SourceSettings = NO_GALLERY) -> Report:
    monkeypatch.chdir(cwd)
    return analyze_dump(dump, sources=settings, jobs=1, drawings=False)


# Where a fixture recorded in this checkout says it was made, once copied as a dump from elsewhere.
ELSEWHERE = "/elsewhere/recording-checkout"


def _made_elsewhere(case: str, tmp_path: Path) -> Path:
    """The fixture as a dump made in another checkout: itself where its recorded paths are not this
    checkout's (CI's clean clone), else a copy whose every file names ``ELSEWHERE`` for this
    checkout's root (the checkout that recorded the fixtures)."""
    folder = FIXTURES / case
    if str(ROOT) + os.sep not in (folder / "hlo_doctor_run.json").read_text():
        return folder
    copy = tmp_path / "recorded-elsewhere" / case.replace("/", "--")
    shutil.copytree(folder, copy)
    for file in copy.rglob("*"):
        if file.is_file():
            text = file.read_bytes()
            file.write_bytes(text.replace(os.fsencode(str(ROOT) + os.sep), os.fsencode(ELSEWHERE + os.sep)))
    return copy


def _relocate(folder: Path, original: Report, checkout: Path, dumps: Path, plain: bool = False) -> Path:
    """The dump ``folder`` under ``dumps`` and its program files (as read on the original paths)
    under ``checkout`` at the same place relative to it as to this repository."""
    dump = dumps / folder.name
    shutil.copytree(folder, dump)
    if plain:
        (dump / "hlo_doctor_run.json").unlink(missing_ok=True)
    for source in original.sources:
        assert source.local is not None, source
        target = checkout / Path(source.local).resolve().relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.local, target)
    return dump


@pytest.mark.parametrize("case", CASES)
def test_a_dump_made_elsewhere_gets_the_same_fixes(case, tmp_path, monkeypatch):
    source = _made_elsewhere(case, tmp_path)
    original = _analyze(source, ROOT, monkeypatch)
    assert original.findings and original.sources
    assert any(f.suggestion is not None and f.suggestion.edits for f in original.findings), "a fix quotes the program"
    # The recorded paths point at the checkout that made the fixture, not at this one.
    assert not any(s.recorded.startswith(str(ROOT) + os.sep) for s in original.sources)

    # The user's checkout is the current directory; the dump came from a cluster, elsewhere.
    checkout, incoming = tmp_path / "checkout", tmp_path / "incoming"
    dump = _relocate(source, original, checkout, incoming)
    moved = _analyze(dump, checkout, monkeypatch)
    assert [(s.recorded, s.how) for s in moved.sources] == [(s.recorded, "suffix") for s in original.sources]
    assert all(Path(s.local).resolve().is_relative_to(checkout.resolve()) for s in moved.sources)
    assert _fixes(moved) == _fixes(original)

    # Without the files the same analysis finds nothing to read, and the fixes change: the
    # comparison above can fail.
    for source in moved.sources:
        Path(source.local).unlink()
    bare = _analyze(dump, checkout, monkeypatch)
    # (missing here; outside where the recording checkout exists on this machine, as on the
    # machine that made the fixtures)
    assert {s.how for s in bare.sources} <= {"missing", "outside"}
    assert all(s.local is None for s in bare.sources)
    assert _fixes(bare) != _fixes(original)
    # and no fix blames a line it could not read: the file is said to be unread, not the line
    for finding in bare.findings:
        text = "" if finding.suggestion is None else f"{finding.suggestion.summary} {finding.suggestion.no_edit}"
        assert "assigns no variable" not in text, text


@pytest.mark.parametrize("case", CASES[:2])
def test_a_plain_dump_beside_its_checkout_gets_the_same_fixes(case, tmp_path, monkeypatch):
    """No run record; the dump lies inside the user's project, the command runs from a sub
    folder: the files are found below the dump's parents, up to the project root."""
    plain_original = tmp_path / "plain-original"
    shutil.copytree(_made_elsewhere(case, tmp_path), plain_original)
    (plain_original / "hlo_doctor_run.json").unlink()
    original = _analyze(plain_original, ROOT, monkeypatch)
    assert original.sources and all(s.how == "suffix" for s in original.sources)

    project = tmp_path / "project"
    dump = _relocate(plain_original, original, project, project / "dumps", plain=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'user'\n")
    (project / "scripts").mkdir()
    moved = _analyze(dump, project / "scripts", monkeypatch)
    assert {s.how for s in moved.sources} == {"suffix"}
    assert all(Path(s.local).resolve().is_relative_to(project.resolve()) for s in moved.sources)
    assert _fixes(moved) == _fixes(original)


SECRET = "secret_hidden_7f3a"


def _dump_naming(tmp_path: Path, program: Path) -> Path:
    """A copy of the non-batch-dim-sharding fixture whose frames and record name ``program``."""
    dump = tmp_path / "dump"
    shutil.copytree(FIXTURES / CASES[0], dump)
    recorded = json.loads((dump / "hlo_doctor_run.json").read_text())["script"]["path"]
    # the record too (its script.path never widens what may be read)
    for file in [*dump.glob("*.txt"), dump / "hlo_doctor_run.json"]:
        file.write_text(file.read_text().replace(recorded, str(program)))
    return dump


def test_a_program_outside_the_project_and_the_dump_is_never_read(tmp_path, monkeypatch):
    """The dump names a copy of its program in a folder outside the project and the dump, its
    fixed line's variable renamed: neither the rules nor the report read it."""
    gallery = ROOT / "hlo_doctor" / "examples" / "programs" / "non_batch_dim_sharding.py"
    text = gallery.read_text()
    assert text.count("    hidden = ") == text.count(", hidden)") == 1
    outside = tmp_path / "elsewhere" / "train.py"
    outside.parent.mkdir()
    outside.write_text(text.replace("    hidden = ", f"    {SECRET} = ").replace(", hidden)", f", {SECRET})"))
    dump = _dump_naming(tmp_path, outside)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'user'\n")

    report = _analyze(dump, project, monkeypatch, SourceSettings())
    assert report.findings
    assert [(s.recorded, s.local, s.how) for s in report.sources] == [(str(outside), None, "outside")]
    policy = SourcePolicy.of(SourceSettings(), str(dump))
    for output_format in ("text", "json", "html", "sarif", "markdown"):
        assert SECRET not in render(report, output_format, color=False, sources=policy)
    assert SECRET not in repr(_fixes(report))

    # Lifted on purpose, the same file is read and its variable is in the fix: the checks above can fail.
    anywhere = _analyze(dump, project, monkeypatch, SourceSettings(anywhere=True))
    assert [s.how for s in anywhere.sources] == ["recorded"]
    assert SECRET in repr(_fixes(anywhere))


@pytest.mark.skipif(not Path("/etc/passwd").is_file(), reason="no /etc/passwd here")
def test_etc_passwd_named_by_the_frames_is_not_read(tmp_path, monkeypatch):
    dump = _dump_naming(tmp_path, Path("/etc/passwd"))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    result = CliRunner().invoke(main, ["analyze", str(dump), "--format", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["sources"] == [{"recorded": "/etc/passwd", "local": None, "how": "outside"}]
    first = Path("/etc/passwd").read_text().splitlines()[0]
    text = CliRunner().invoke(main, ["analyze", str(dump)]).stdout
    assert first not in text and first not in result.stdout
    assert "/etc/passwd (not read: outside the project and the dump" in text


# -- the finder, case by case ---------------------------------------------------


def _program(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_order_recorded_path_map_suffix_gallery(tmp_path):
    project, dump = tmp_path / "project", tmp_path / "project" / "dumps" / "d"
    dump.mkdir(parents=True)
    here = _program(project / "src" / "train.py")
    mapped = _program(tmp_path / "mapped" / "src" / "train.py")
    finder = SourceFinder(SourceSettings(), dump, cwd=project)
    assert finder.find(str(here)).how == "recorded"
    assert finder.find("/ci/work/repo/src/train.py") == finder.find("/ci/work/repo/src/train.py")
    assert (finder.local("/ci/work/repo/src/train.py"), finder.find("/ci/work/repo/src/train.py").how) == (
        project / "src" / "train.py", "suffix")
    # a bare file name never matches a file of the same name
    assert finder.find("/ci/train.py").how == "missing"
    # a path map wins over the tail, and its target may be outside the project
    mapping = SourceSettings(path_map=(("/ci/work/repo", str(tmp_path / "mapped")),))
    found = SourceFinder(mapping, dump, cwd=project).find("/ci/work/repo/src/train.py")
    assert (found.local, found.how) == (str(mapped), "path-map")
    # and over the recorded path itself, where that exists too (the user said which copy is meant)
    both = SourceSettings(path_map=((str(project / "src"), str(tmp_path / "mapped" / "src")),))
    assert SourceFinder(both, dump, cwd=project).find(str(here)).how == "path-map"
    gallery = SourceFinder(SourceSettings(), dump, cwd=project).find(
        "/elsewhere/hlo_doctor/examples/programs/non_batch_dim_sharding.py")
    assert gallery.how == "gallery"
    assert SourceFinder(NO_GALLERY, dump, cwd=project).find(gallery.recorded).how == "missing"


def test_the_longest_prefix_wins():
    maps = (("/a", "/x"), ("/a/b", "/y"), ("/a/b/c.py", "/z.py"))
    assert map_prefix("/a/b/c.py", maps) == "/z.py"
    assert map_prefix("/a/b/d.py", maps) == "/y/d.py"
    assert map_prefix("/a/bc/d.py", maps) == "/x/bc/d.py"
    assert map_prefix("/q/d.py", maps) is None


def test_a_link_inside_the_dump_that_leads_out_is_outside(tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    secret = _program(tmp_path / "secret" / "keys" / "train.py")
    (dump / "keys").symlink_to(secret.parent, target_is_directory=True)
    finder = SourceFinder(SourceSettings(), dump, cwd=dump)
    assert finder.find("/ci/keys/train.py").how == "outside"
    assert finder.find(str(dump / "keys" / "train.py")).how == "outside"
    assert SourceFinder(SourceSettings(anywhere=True), dump, cwd=dump).find("/ci/keys/train.py").how == "suffix"


def test_a_file_too_big_is_not_read(tmp_path):
    big = _program(tmp_path / "src" / "big.py", "#" * (READ_LIMIT + 1))
    found = SourceFinder(SourceSettings(), tmp_path, cwd=tmp_path).find(str(big))
    assert (found.local, found.how) == (None, "too-big")


def test_a_tail_that_climbs_out_is_not_tried(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    _program(tmp_path / "outside" / "x.py")
    finder = SourceFinder(SourceSettings(), None, cwd=project)
    assert finder.find("/ci/../outside/x.py").how == "missing"


@pytest.mark.parametrize("value", ["nothing", "=local", "recorded=", "/ci=/no/such/folder"])
def test_a_bad_path_map_is_one_line(value, tmp_path, monkeypatch):
    with pytest.raises(ValueError):
        parse_path_maps([value])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES / CASES[0]), "--path-map", value])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and "--path-map" in result.stderr


def test_path_map_from_the_command_line_and_the_configuration(tmp_path, monkeypatch):
    original = _analyze(FIXTURES / CASES[0], ROOT, monkeypatch)
    local = tmp_path / "mine"
    for source in original.sources:
        _program(local / Path(source.recorded).name, Path(source.local).read_text())
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    prefix = str(Path(original.sources[0].recorded).parent)
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES / CASES[0]), "--format", "json",
                                       "--path-map", f"{prefix}={local}"])
    assert result.exit_code == 0, result.output
    assert {s["how"] for s in json.loads(result.stdout)["sources"]} == {"path-map"}

    (project / "pyproject.toml").write_text(f'[tool.hlo-doctor]\npath-map = {{"{prefix}" = "../mine"}}\n')
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES / CASES[0]), "--format", "json"])
    assert result.exit_code == 0, result.output
    sources = json.loads(result.stdout)["sources"]
    assert {s["how"] for s in sources} == {"path-map"}
    assert all(Path(s["local"]).resolve().is_relative_to(local.resolve()) for s in sources)

    (project / "pyproject.toml").write_text('[tool.hlo-doctor]\npath-map = ["/ci=../mine"]\n')
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES / CASES[0])])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "path-map" in result.stderr


def test_show_and_explain_show_the_files_found_here(tmp_path, monkeypatch):
    original = _analyze(FIXTURES / CASES[0], ROOT, monkeypatch)
    recorded = original.sources[0].recorded
    local = _program(tmp_path / "mine" / Path(recorded).name, Path(original.sources[0].local).read_text())
    monkeypatch.chdir(tmp_path)
    mapping = f"{Path(recorded).parent}={local.parent}"
    explained = CliRunner().invoke(main, ["explain", str(FIXTURES / CASES[0]), "dot", "--path-map", mapping])
    assert explained.exit_code == 0, explained.output
    assert f"mine/{local.name}:" in explained.stdout and recorded not in explained.stdout
    for command in (["explain", str(FIXTURES / CASES[0]), "dot"], ["show", str(FIXTURES / CASES[0])]):
        bad = CliRunner().invoke(main, [*command, "--path-map", "nothing"])
        assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "--path-map" in bad.stderr
