"""`hlo-doctor fix`: exit codes, bad input, the JSON documents, and how findings match across a patch.

The edit library is replaced here by tests/fix_fakes.py (it has its own tests); the end-to-end
runs with the real one are in tests/test_fix_verify.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import hlo_doctor.fix as fixlib
from hlo_doctor.cli import main
from hlo_doctor.findings import Finding, Severity, SourceRef
from hlo_doctor.fingerprint import finding_signature
from hlo_doctor.fix.verify import LineMap, match_findings
from tests.fix_fakes import fake_planner

ROOT = Path(__file__).resolve().parents[1]
SEED_BAD = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"
SEED_FIXED = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-fixed"
PROGRAM = ROOT / "hlo_doctor" / "examples" / "programs" / "fsdp_activation_gather.py"
CONSTRAINT = "h = jax.lax.with_sharding_constraint(h, batch)"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def program_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the seed program in a project of its own (the current folder: fix reads and
    writes only the project's files), and a fake planner that inserts the constraint into it."""
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "fsdp_activation_gather.py"
    shutil.copyfile(PROGRAM, copy)
    monkeypatch.setattr(fixlib, "plan_fixes", fake_planner(lambda f: CONSTRAINT, file=str(copy)))
    return copy


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("fix", "/no/such/dump"), "no such file or directory"),
        (("fix", str(SEED_BAD), "--select", "no-such-rule"), "unknown rule id 'no-such-rule'"),
        (("fix", str(SEED_BAD), "--hardware", "v100"), "unknown hardware 'v100'"),
        (("fix",), "give one DUMP"),
        (("fix", str(SEED_BAD), str(SEED_FIXED)), "give one DUMP"),
        (("fix", str(SEED_BAD), "-o", "fixed.py"), "-o needs --verify"),
        (("fix", str(SEED_BAD), "--path-map", "no-equals-sign"), "--path-map takes RECORDED=LOCAL"),
        (("fix", "--verify"), "--verify runs a script"),
        (("fix", str(SEED_BAD), "--bogus"), "no such option: --bogus"),
        (("fix", "--verify", "--bogus", "--", "python", str(PROGRAM)), "no such option: --bogus"),
        (("fix", "--verify", "--", sys.executable, "/no/such/script.py"), "no such script"),
        (("fix", "--verify", "--devices", "4", "--target", "h100:1x8", "--", "python", str(PROGRAM)),
         "drop --devices"),
        (("fix", "--verify", "--target", "nonsense:9x9", "--", "python", str(PROGRAM)), "--target:"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.output


def test_a_library_that_is_not_built_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_built(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise NotImplementedError

    monkeypatch.setattr(fixlib, "plan_fixes", not_built)
    result = run("fix", str(SEED_BAD))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == ["error: hlo-doctor fix: this build has no edit library "
                                                  "(hlo_doctor.fix.plan_fixes)"]


def test_fix_prints_the_diff_and_exits_0_when_every_finding_got_an_edit(program_copy: Path) -> None:
    before = program_copy.read_text()
    result = run("fix", str(SEED_BAD))
    assert result.exit_code == 0, result.output
    assert f"+        {CONSTRAINT}\n" in result.stdout
    assert result.stdout.startswith(f"--- a/{program_copy}\n+++ b/{program_copy}\n")
    assert "1 edit in 1 file (not written: add --write)" in result.stderr
    assert program_copy.read_text() == before  # printed, not applied


def test_fix_write_applies_the_patch(program_copy: Path) -> None:
    result = run("fix", str(SEED_BAD), "--write")
    assert result.exit_code == 0, result.output
    lines = program_copy.read_text().splitlines()
    assert lines[48].strip() == "h = x @ w1.T + b1" and lines[49].strip() == CONSTRAINT
    assert "1 edit in 1 file (written)" in result.stderr


def test_a_finding_without_a_safe_edit_exits_1_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixlib, "plan_fixes", fake_planner(lambda f: None))
    result = run("fix", str(SEED_BAD))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert ("fsdp_activation_gather.py:49: non-batch-dim-sharding: the fake planner has no edit for it"
            in result.stderr)
    assert result.stderr.startswith("no safe edit: ")
    assert "0 edits in 0 files; 1 finding without a safe edit" in result.stderr
    document = json.loads(run("fix", str(SEED_BAD), "--format", "json").stdout)
    (refused,) = document["refused"]
    assert set(refused) == {"rule", "fingerprint", "where", "message", "reason"}
    assert refused["rule"] == "non-batch-dim-sharding" and refused["where"].endswith("fsdp_activation_gather.py:49")
    assert refused["reason"] == "the fake planner has no edit for it" and refused["fingerprint"]


def test_the_real_library_refuses_a_model_dimension_and_fix_exits_1() -> None:
    # uneven-sharding-padding on the vocabulary (50257): padding it would change the model
    result = run("fix", str(ROOT / "fixtures" / "uneven-padding" / "jax-shardy-bad"))
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert ("uneven_padding.py:44: uneven-sharding-padding: the size 50257 is a model dimension (a config value "
            "such as the vocabulary): padding it changes the model, so it is yours to make") in result.stderr
    assert result.stderr.strip().endswith("0 edits in 0 files; 1 finding without a safe edit")


def test_a_recorded_gallery_program_from_another_checkout_is_read_from_this_one() -> None:
    # the dump was made in another worktree (/work/wt-tpu/...); its program is this package's copy
    dump = ROOT / "fixtures" / "cross-host-tp" / "jax0.7.2-shardy-bad"
    assert "/work/wt-tpu/" in (dump / "hlo_doctor_run.json").read_text()
    result = run("fix", str(dump), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [Path(f).name for f in document["files"]] == ["cross_host_tp.py"]
    assert '+        mesh = Mesh(devices.reshape(n // 2, 2), ("dp", "tp"))\n' in document["diff"]


def test_fix_of_a_clean_dump_has_nothing_to_do(program_copy: Path) -> None:
    result = run("fix", str(SEED_FIXED))
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr.strip() == "nothing to fix"


def test_fix_json_document(program_copy: Path) -> None:
    result = run("fix", str(SEED_BAD), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"schema_version", "kind", "tool", "dump", "diff", "files", "written", "edits", "refused"}
    assert document["kind"] == "fix" and document["schema_version"] == 1
    assert document["files"] == [str(program_copy)] and document["written"] == []
    (edit,) = document["edits"]
    assert edit["rule"] == "non-batch-dim-sharding" and edit["kind"] == "constrain" and edit["line"] == 49
    assert edit["file"] == str(program_copy)
    assert f"+        {CONSTRAINT}\n" in document["diff"]
    assert document["refused"] == []


def test_select_passes_the_rules_to_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def planner(findings, *, program=None, select=(), path_map=None, readable=None):  # noqa: ANN001, ANN202
        seen.update(program=program, select=select, rules=[f.rule for f in findings])
        return fixlib.FixPlan()

    monkeypatch.setattr(fixlib, "plan_fixes", planner)
    assert run("fix", str(SEED_BAD), "--select", "non-batch-dim-sharding,uneven-sharding-padding").exit_code == 0
    assert seen.pop("program").endswith("/hlo_doctor/examples/programs/fsdp_activation_gather.py")
    assert seen == {"select": ("non-batch-dim-sharding", "uneven-sharding-padding"), "rules": ["non-batch-dim-sharding"]}


# -- matching findings across the patch --------------------------------------------------------

def _finding(rule: str, file: str, line: int, op: str = "jit(mlp)/dot_general|dot|f32[160,960]|{s}",
             severity: Severity = Severity.WARNING) -> Finding:
    source = SourceRef(file, line, "mlp")
    return Finding(rule, severity, "module_0000.jit_mlp", "m", source=source, signature="\n".join(
        (finding_signature(source, None, "x").split("\n")[0], op)))


def test_line_map_follows_inserted_replaced_and_deleted_lines() -> None:
    before = "a\nb\nc\nd\n"
    after = "a\nnew\nb\nC\n"  # insert before b; c and d replaced by one line
    line = LineMap(before, after)
    assert [line(n) for n in (1, 2, 3, 4)] == [1, 3, 4, 4]
    assert LineMap("a\nb\nc\n", "a\nc\n")(2) == 2  # a deleted line: the line after it


def test_findings_match_through_the_patch_and_the_copy_name() -> None:
    maps = {"train.py": ("train_fixed.py", LineMap("a\nb\nc\n", "a\ninserted\nb\nc\n"))}
    kept = _finding("activation-all-gather", "/src/train.py", 3)
    fixed = _finding("non-batch-dim-sharding", "/src/train.py", 2)
    sharding_changed = _finding("uneven-sharding-padding", "/src/train.py", 1)
    after = [
        _finding("activation-all-gather", "/tmp/train_fixed.py", 4),  # line 3 moved down by the insert
        _finding("uneven-sharding-padding", "/tmp/train_fixed.py", 1, op="jit(mlp)/dot_general|dot|f32[8]|{r}"),
        _finding("replicated-batch", "/tmp/train_fixed.py", 2, severity=Severity.INFO),
    ]
    outcomes, new = match_findings([kept, fixed, sharding_changed], after, maps)
    assert [(o.status, o.matched_by) for o in outcomes] == [
        ("still there", "fingerprint"), ("gone", None), ("still there", "line")]
    assert [f.rule for f in new] == ["replicated-batch"]
    # without the line map (two commits, as `hlo-doctor diff` sees them) the moved finding is the
    # same op at another line: still there, not gone plus new
    outcomes, new = match_findings([kept], after[:1], {})
    assert [(o.status, o.matched_by) for o in outcomes] == [("still there", "op")] and new == ()
    # another op at another line is another finding
    elsewhere = _finding("activation-all-gather", "/tmp/train_fixed.py", 9, op="jit(mlp)/dot_general|dot|f32[8]|{r}")
    outcomes, new = match_findings([kept], [elsewhere], {})
    assert [o.status for o in outcomes] == ["gone"] and new == (elsewhere,)
    # a finding without a signature is matched by its fingerprint only
    plain = Finding("communication-bound", Severity.WARNING, "module_0000.jit_mlp", "m", fingerprint="abc")
    other = Finding("communication-bound", Severity.WARNING, "module_0000.jit_mlp", "n", fingerprint="def")
    assert match_findings([plain], [other], {})[1] == (other,)
    assert match_findings([plain], [plain], {})[1] == ()
