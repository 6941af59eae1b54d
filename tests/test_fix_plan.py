"""plan_fixes as a whole: refusals without edits, select, the same edit once, conflicts, line
tracking through earlier edits, the diff and reading programs recorded elsewhere (hand-written
programs)."""

from __future__ import annotations

import os

import pytest

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix import plan_fixes
from hlo_doctor.fix.apply import resolve_path
from tests.fix_cases import PATH, finding, plan

PROGRAM = '''\
import jax
from jax.sharding import NamedSharding, PartitionSpec as P


def main():
    mesh = jax.make_mesh((2, 4), ("tp", "dp"))
    a = f(x)
    b = g(a)
    return b
'''

A = SourceEdit("constrain", "jax", target="a", spec=(("dp",), None))
B = SourceEdit("constrain", "jax", target="b", spec=(("dp",), None))


def test_a_finding_without_edits_is_refused_with_the_rules_reason():
    result = plan(PROGRAM, finding(no_edit="the batch is replicated by design"), finding(line=7))
    assert [r.reason for r in result.refused] == ["the batch is replicated by design",
                                                  "the rule gives no edit for this finding"]
    assert result.diff() == ""


def test_select_keeps_only_those_rules():
    result = plan(PROGRAM, finding(A, line=7, rule="x"), finding(B, line=8, rule="y"), select={"y"})
    assert [p.edit for p in result.applied] == [B] and not result.refused


def test_the_same_edit_is_made_once_for_every_finding():
    result = plan(PROGRAM, finding(A, line=7), finding(A, line=7, rule="activation-all-gather"))
    assert len(result.applied) == 2 and result.patched[PATH].count("with_sharding_constraint(a,") == 1


def test_a_conflicting_edit_at_the_same_place_is_refused():
    other = SourceEdit("constrain", "jax", target="a", spec=(None, ("dp",)))
    result = plan(PROGRAM, finding(A, line=7), finding(other, line=7))
    assert len(result.applied) == 1
    assert result.refused[0].reason.startswith("conflicts with another constrain edit at train.py:7")


def test_lines_are_those_of_the_program_before_any_edit():
    mesh = SourceEdit("mesh", "jax", details={"axis_names": ("dp", "tp")})
    result = plan(PROGRAM, finding(A, line=7), finding(B, line=8), finding(mesh, line=6))
    assert not result.refused
    assert result.patched[PATH].splitlines()[5:10] == [
        '    mesh = jax.make_mesh((4, 2), ("dp", "tp"))',
        "    a = f(x)",
        '    a = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P("dp", None)))',
        "    b = g(a)",
        '    b = jax.lax.with_sharding_constraint(b, NamedSharding(mesh, P("dp", None)))']


def test_diff_paths_relative_to_the_folder(tmp_path):
    program = tmp_path / "src" / "train.py"
    program.parent.mkdir()
    program.write_text(PROGRAM)
    result = plan_fixes([finding(A, line=7, path="/elsewhere/src/train.py")], path_map={"/elsewhere": str(tmp_path)})
    assert list(result.patched) == [str(program)]
    text = result.diff(relative_to=str(tmp_path))
    assert text.startswith("--- a/src/train.py\n+++ b/src/train.py\n@@ -5,5 +5,6 @@\n")
    assert program.read_text() == PROGRAM  # nothing written
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path / "src")
        assert result.diff().startswith("--- a/train.py\n")
    finally:
        os.chdir(cwd)


def test_path_map_by_file_and_by_longest_folder():
    mapping = {"/work/main": "/clone", "/work/main/sub": "/other", "/work/x.py": "/y.py"}
    assert resolve_path("/work/main/a/b.py", mapping) == "/clone/a/b.py"
    assert resolve_path("/work/main/sub/b.py", mapping) == "/other/b.py"
    assert resolve_path("/work/x.py", mapping) == "/y.py"
    assert resolve_path("/work/mainly.py", mapping) == "/work/mainly.py"


def test_unreadable_program_is_a_refusal():
    result = plan_fixes([finding(A, line=7, path="/no/such/file.py")])
    assert result.refused[0].reason.startswith("cannot read /no/such/file.py")


def test_write_changes_only_the_patched_files(tmp_path):
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    untouched = tmp_path / "other.py"
    untouched.write_text(PROGRAM)
    result = plan_fixes([finding(A, line=7, path=str(program)), finding(A, line=4, path=str(untouched))])
    assert result.changed == [str(program)] and len(result.refused) == 1
    assert result.write() == [str(program)]
    assert program.read_text() == result.patched[str(program)] != PROGRAM
    assert untouched.read_text() == PROGRAM


def test_a_program_that_does_not_parse_is_a_refusal():
    result = plan("def f(:\n", finding(A, line=1))
    assert result.refused[0].reason.startswith(f"{PATH} does not parse")


def test_xla_flag_edit_reads_the_runners_program():
    edit = SourceEdit("xla-flag", "jax", details={"flag": "--xla_gpu_enable_latency_hiding_scheduler"})
    program = 'import os\nos.environ["XLA_FLAGS"] = "--xla_gpu_enable_latency_hiding_scheduler=false"\n'
    result = plan_fixes([finding(edit, line=3, path="/elsewhere/llama_model.py")], program=PATH,
                        sources={PATH: program})
    assert not result.refused
    assert result.patched[PATH].splitlines()[1] == 'os.environ["XLA_FLAGS"] = ""'


def test_an_installed_librarys_file_is_never_edited():
    path = "/usr/lib/python3/site-packages/keras_hub/models/gemma/gemma_decoder_block.py"
    result = plan_fixes([finding(A, line=7, path=path)], sources={path: PROGRAM})
    assert "an installed library's file" in result.refused[0].reason and not result.patched


def test_diff_of_a_file_without_a_final_newline_applies(tmp_path):
    import shutil
    import subprocess

    if shutil.which("patch") is None:
        pytest.skip("no patch program")
    program = tmp_path / "train.py"
    program.write_text(PROGRAM.rstrip("\n"))
    result = plan_fixes([finding(B, line=8, path=str(program))])
    text = result.diff(relative_to=str(tmp_path))
    assert "\\ No newline at end of file\n" in text
    subprocess.run(["patch", "-p1", "-s"], input=text, text=True, cwd=tmp_path, check=True)
    assert program.read_text() == result.patched[str(program)]


def test_an_internal_error_is_a_refusal_and_the_other_edits_are_made(monkeypatch):
    from hlo_doctor.fix import apply

    def broken(source, edit, line):
        raise RuntimeError("boom")

    monkeypatch.setitem(apply.HANDLERS, "mesh", broken)
    result = plan(PROGRAM, finding(SourceEdit("mesh", "jax", details={"shape": (8,)}), line=6), finding(A, line=7))
    assert result.refused[0].reason.startswith("internal error making the mesh edit (RuntimeError: boom)")
    assert len(result.applied) == 1 and "with_sharding_constraint(a," in result.patched[PATH]


def test_a_gallery_program_recorded_by_another_checkout_is_read_from_this_package():
    from hlo_doctor.examples.registry import PROGRAMS

    recorded = "/no/such/checkout/hlo_doctor/examples/programs/fsdp_activation_gather.py"
    edit = SourceEdit("constrain", "jax", target="h", spec=(("fsdp", "replica"), None))
    result = plan_fixes([finding(edit, line=49, path=recorded)])
    assert list(result.patched) == [str(PROGRAMS / "fsdp_activation_gather.py")] and not result.refused
