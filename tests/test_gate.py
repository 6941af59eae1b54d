"""The CI gate: `check` exit codes and baselines, `diff`, configuration, SARIF validity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.cli import main
from hlo_doctor.rules.hardware import profile_names
from tests.sarif_schema import SARIF_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
UNEVEN_BAD = FIXTURES / "uneven-padding" / "jax-shardy-bad"
UNEVEN_FIXED = FIXTURES / "uneven-padding" / "jax-shardy-fixed"
SEED_BAD = FIXTURES / "fsdp-activation-gather" / "jax-shardy-bad"
SEED_FIXED = FIXTURES / "fsdp-activation-gather" / "jax-shardy-fixed"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_check_fails_on_the_bad_dump_and_passes_on_its_fixed_twin() -> None:
    bad = run("check", str(UNEVEN_BAD), "--format", "json")
    assert bad.exit_code == 1, bad.output
    assert [f["rule"] for f in json.loads(bad.stdout)["findings"]] == ["uneven-sharding-padding"]
    assert run("check", str(UNEVEN_FIXED)).exit_code == 0


def test_fail_on_sets_the_threshold() -> None:
    # uneven-sharding-padding is a warning: it fails at warning and info, not at error.
    assert run("check", str(UNEVEN_BAD), "--fail-on", "error").exit_code == 0
    assert run("check", str(UNEVEN_BAD), "--fail-on", "info").exit_code == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("check", "/no/such/dump"), "no such file or directory"),
        (("check", str(UNEVEN_BAD), "--select", "no-such-rule"), "unknown rule id 'no-such-rule'"),
        (("check", str(UNEVEN_BAD), "--hardware", "v100"), "unknown hardware 'v100'"),
        (("check", str(UNEVEN_BAD), "--baseline", "/no/such/baseline.json"), "baseline file not found"),
    ],
)
def test_usage_and_input_errors_exit_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_baseline_of_the_same_dump_makes_check_pass(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    written = run("check", str(UNEVEN_BAD), "--write-baseline", str(baseline))
    assert written.exit_code == 0
    entries = json.loads(baseline.read_text())["findings"]
    assert [e["rule"] for e in entries] == ["uneven-sharding-padding"]
    again = run("check", str(UNEVEN_BAD), "--baseline", str(baseline))
    assert again.exit_code == 0, again.output
    assert "1 known finding ignored, 0 new, 0 fixed" in again.stderr


def test_a_finding_that_disappears_is_reported_as_fixed(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    run("check", str(UNEVEN_BAD), "--write-baseline", str(baseline))
    result = run("check", str(UNEVEN_FIXED), "--baseline", str(baseline))
    assert result.exit_code == 0
    assert "0 known findings ignored, 0 new, 1 fixed" in result.stderr
    assert "fixed: uneven-sharding-padding in module_0000.jit_loss at " in result.stderr


@pytest.mark.slow
def test_baseline_matches_a_recompile_of_the_same_program(tmp_path: Path) -> None:
    """Instruction names and dump files change on a recompile; the fingerprint must not."""
    pytest.importorskip("jax")
    from hlo_doctor.runner import run_example

    baseline = tmp_path / "baseline.json"
    assert run("check", str(UNEVEN_BAD), "--write-baseline", str(baseline)).exit_code == 0
    recompiled = tmp_path / "recompiled"
    run_example("uneven-padding", framework="jax", variant="bad", dump_dir=recompiled)
    without = run("check", str(recompiled))
    assert without.exit_code == 1  # the problem is really there in the recompile
    with_baseline = run("check", str(recompiled), "--baseline", str(baseline))
    assert with_baseline.exit_code == 0, with_baseline.output
    assert "1 known finding ignored, 0 new, 0 fixed" in with_baseline.stderr


def test_fingerprints_ignore_names_that_recompiles_renumber() -> None:
    from hlo_doctor.gate.fingerprint import finding_key, module_family
    from hlo_doctor.rules.base import SourceRef

    assert module_family("module_0012.SyncTensorsGraph.33") == "SyncTensorsGraph"
    assert module_family("module_0000.jit_train_step") == "jit_train_step"
    here = SourceRef("/home/ci/repo/train.py", 42, "step")
    there = SourceRef("/Users/me/src/repo/train.py", 42, "step")
    assert finding_key("r", "module_0001.jit_f", here, "sig") == finding_key("r", "module_0007.jit_f", there, "sig")
    assert finding_key("r", "module_0001.jit_f", here, "sig") != finding_key("r", "module_0001.jit_f", here, "other")


def test_diff_of_the_seed_shows_the_all_gathers_and_exits_on_growth() -> None:
    result = run("diff", str(SEED_BAD), str(SEED_FIXED), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (module,) = data["modules"]
    gathers = module["collectives"]["all-gather"]
    assert gathers["before"]["count"] == 2 and gathers["after"]["count"] == 2
    # bad: x f32[160,1280] on dim 0 (819200 B) and h f32[160,960] on dim 1 (614400 B);
    # fixed: the weights w1 f32[960,1280] (4915200 B) and w2 f32[128,960] (491520 B).
    assert gathers["before"]["bytes"] == 819200 + 614400
    assert gathers["after"]["bytes"] == 4915200 + 491520
    removed = [(d["role"], d["parameters"], d["result_shape"], d["dimension"], d["bytes_per_device"])
               for d in module["collectives_removed"]]
    added = [(d["role"], d["parameters"], d["result_shape"], d["dimension"], d["bytes_per_device"])
             for d in module["collectives_added"]]
    assert removed == [
        ("activation-gather", ["x"], "f32[160,1280]", 0, 819200),
        ("activation-gather", ["x"], "f32[160,960]", 1, 614400),
    ]
    assert added == [("weight-gather", ["w1"], "f32[1280,960]", 1, 4915200),
                     ("weight-gather", ["w2"], "f32[960,128]", 1, 491520)]
    # one root cause: the feature-sharded first layer, whose finding lists the two gathers it causes
    assert {f["rule"] for f in module["findings_removed"]} == {"non-batch-dim-sharding"}
    assert module["findings_added"] == []
    grown = run("diff", str(SEED_BAD), str(SEED_FIXED), "--max-comm-increase", "50")
    assert grown.exit_code == 1
    assert "collective bytes grew" in grown.stderr


def test_diff_reports_new_findings_and_exits_1() -> None:
    result = run("diff", str(UNEVEN_FIXED), str(UNEVEN_BAD))
    assert result.exit_code == 1
    assert "+ uneven-sharding-padding pad:" in result.stdout
    assert "1 new finding" in result.stderr


def test_sarif_validates_and_points_at_the_users_line() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    if not SARIF_SCHEMA.is_file():
        pytest.skip(f"{SARIF_SCHEMA} is absent")
    result = run("analyze", str(UNEVEN_BAD), "--format", "sarif")
    assert result.exit_code == 0
    log = json.loads(result.stdout)
    jsonschema.Draft4Validator(json.loads(SARIF_SCHEMA.read_text())).validate(log)
    run_ = log["runs"][0]
    rule_ids = [rule["id"] for rule in run_["tool"]["driver"]["rules"]]
    assert "uneven-sharding-padding" in rule_ids and rule_ids == sorted(rule_ids)
    for rule in run_["tool"]["driver"]["rules"]:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"] and rule["help"]["text"]
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    (result_,) = run_["results"]
    location = result_["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"].endswith("uneven_padding.py")
    assert location["region"]["startLine"] == 44
    assert result_["partialFingerprints"]["hloDoctorFinding/v1"]
    assert result_["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(
        "after_spmd-partitioning.before_control-dep-rewriter.txt"
    )


# --- configuration ------------------------------------------------------------------------


def write_pyproject(folder: Path, body: str) -> None:
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.hlo-doctor]\n" + body)


def test_config_file_is_found_and_flags_override_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_pyproject(tmp_path, 'ignore = ["uneven-sharding-padding"]\nfail-on = "error"\n'
                              "[tool.hlo-doctor.rules.uneven-sharding-padding]\nmin-bytes = 1024\n")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    shown = CliRunner().invoke(main, ["config"])
    assert shown.exit_code == 0, shown.output
    assert f"configuration file: {tmp_path / 'pyproject.toml'}" in shown.output
    lines = {line.split()[0]: line.split(None, 1)[1] for line in shown.output.splitlines()[1:]}
    file_origin = f"({tmp_path / 'pyproject.toml'} [tool.hlo-doctor])"
    assert lines["ignore"] == f'["uneven-sharding-padding"]  {file_origin}'
    assert lines["fail-on"] == f'"error"  {file_origin}'
    assert lines["rules.uneven-sharding-padding.min-bytes"] == f"1024  {file_origin}"
    assert lines["select"] == '"all rules"  (default)'
    # The file ignores the rule: check passes; a flag selects it back and --fail-on overrides.
    assert CliRunner().invoke(main, ["check", str(UNEVEN_BAD), "--fail-on", "warning"]).exit_code == 0
    selected = CliRunner().invoke(main, ["check", str(UNEVEN_BAD), "--select", "uneven-sharding-padding",
                                         "--fail-on", "warning"])
    assert selected.exit_code == 1
    flagged = CliRunner().invoke(main, ["config", "--format", "json"])
    origins = {s["key"]: s["origin"] for s in json.loads(flagged.stdout)["settings"]}
    assert origins["select"] == "default" and origins["fail-on"].endswith("[tool.hlo-doctor]")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("selekt = []\n", "unknown key 'selekt' (valid keys: select, ignore, devices-per-host, hardware, "
                          "ignore-ops, fail-on, path-map, rules)"),
        ('fail-on = "fatal"\n', "fail-on must be one of error, warning, info, not 'fatal'"),
        ("devices-per-host = 0\n", "devices-per-host must be a positive integer"),
        ('hardware = "v100"\n', f"hardware must be one of {', '.join(profile_names())}, not 'v100'"),
        ('select = ["nope"]\n', "select: unknown rule 'nope' (valid rules: "),
        ("[tool.hlo-doctor.rules.uneven-sharding-padding]\nthreshold = 3\n",
         "rules.uneven-sharding-padding: unknown option 'threshold' (valid options: "),
        ('[tool.hlo-doctor.rules.uneven-sharding-padding]\nmin-bytes = "big"\n',
         "rules.uneven-sharding-padding.min-bytes must be int, not 'big'"),
    ],
)
def test_bad_configuration_exits_2_listing_the_valid_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, message: str
) -> None:
    write_pyproject(tmp_path, body)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", str(UNEVEN_BAD)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_hlo_doctor_toml_wins_over_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_pyproject(tmp_path, 'fail-on = "error"\n')
    (tmp_path / "hlo-doctor.toml").write_text('fail-on = "info"\n')
    monkeypatch.chdir(tmp_path)
    shown = CliRunner().invoke(main, ["config"])
    assert f'"info"  ({tmp_path / "hlo-doctor.toml"})' in shown.output


def test_ignore_ops_drops_findings_by_op_name_glob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = json.loads(run("analyze", str(UNEVEN_BAD), "--format", "json").stdout)
    op_name = report["findings"][0]["op_name"]
    assert op_name
    write_pyproject(tmp_path, f'ignore-ops = ["{op_name.split("/")[0]}/*"]\n')
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["check", str(UNEVEN_BAD)]).exit_code == 0


def test_copied_dump_gives_the_same_fingerprints(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(UNEVEN_BAD, copy)
    first = json.loads(run("analyze", str(UNEVEN_BAD), "--format", "json").stdout)["findings"]
    second = json.loads(run("analyze", str(copy), "--format", "json").stdout)["findings"]
    assert [f["fingerprint"] for f in first] == [f["fingerprint"] for f in second]


def test_sarif_puts_the_seed_findings_on_the_users_program_lines() -> None:
    result = run("check", str(SEED_BAD), "--format", "sarif")
    assert result.exit_code == 1
    results = json.loads(result.stdout)["runs"][0]["results"]
    located = sorted(
        (r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].rsplit("/", 1)[-1],
         r["locations"][0]["physicalLocation"]["region"]["startLine"])
        for r in results
    )
    # x @ w1.T + b1 is line 49 of the seed program: the first layer's output lost the batch
    # sharding, which causes both activation gathers (listed in the finding, not reported again)
    assert located == [("non-batch-dim-sharding", "fsdp_activation_gather.py", 49)]


# Counted by hand from the after_spmd-partitioning snapshots (f32: 4 bytes; bytes per device per step:
# the gathered result, the larger side of an all-gather).
#   torch_xla-bad:   %all-gather   = f32[160,1280] all-gather(%param)   (x, parameter 2: data)  160*1280*4 = 819200
#                    %all-gather.1 = f32[160,960]  all-gather(%add.0)   (h = x @ w1 + b1: data) 160*960*4  = 614400
#                    critical path 819200 + 614400 = 1433600 B = 1.37 MiB; prefetchable 0
#   torch_xla-fixed: %all-gather   = f32[1280,960] all-gather(%transpose.0) (w1, parameter 1)  1280*960*4 = 4915200
#                    %all-gather.1 = f32[960,128]  all-gather(%transpose.1) (w2, parameter 3)  960*128*4  = 491520
#                    all 5406720 B = 5.16 MiB prefetchable (derived from weights only); critical path 0
TORCH_BAD = FIXTURES / "fsdp-activation-gather" / "torch_xla-bad"
TORCH_FIXED = FIXTURES / "fsdp-activation-gather" / "torch_xla-fixed"


@pytest.mark.parametrize("before, after", [(TORCH_BAD, TORCH_FIXED), (SEED_BAD, SEED_FIXED)],
                         ids=["torch_xla", "jax-shardy"])
def test_critical_path_gate_passes_the_right_fix_that_sends_more_bytes(before: Path, after: Path) -> None:
    failed = run("diff", str(before), str(after), "--max-comm-increase", "10")
    assert failed.exit_code == 1
    assert "collective bytes grew 277.1% (limit 10%)" in failed.stderr
    passed = run("diff", str(before), str(after), "--max-comm-increase", "10", "--critical-path")
    assert passed.exit_code == 0, passed.output
    assert ("collective bytes per device: 1.37 MiB -> 5.16 MiB (+277%), on the critical path 1.37 MiB -> 0 B "
            "(-100%)") in passed.stdout
    assert "  activation-gather        1.37 MiB -> 0 B         -100%" in passed.stdout
    assert "4915200 B/device, can overlap (prefetchable) [all-gather]" in passed.stdout
    assert "819200 B/device [all-gather]" in passed.stdout  # the activation gather waits on the input
    data = json.loads(run("diff", str(before), str(after), "--format", "json").stdout)
    assert data["bytes_per_device"] == {"before": 1433600, "after": 5406720,
                                        "increase_pct": pytest.approx(277.14, abs=0.01)}
    assert data["critical_path_bytes_per_device"] == {"before": 1433600, "after": 0, "increase_pct": -100.0}
    assert data["bytes_per_device_by_role"] == {"activation-gather": {"before": 1433600, "after": 0},
                                                "weight-gather": {"before": 0, "after": 5406720}}


def test_critical_path_gate_fails_the_change_that_puts_gathers_on_it() -> None:
    result = run("diff", str(TORCH_FIXED), str(TORCH_BAD), "--max-comm-increase", "10", "--critical-path")
    assert result.exit_code == 1
    assert "collective bytes on the critical path grew from 0 B to 1.37 MiB (limit 10%)" in result.stderr


def test_critical_path_needs_max_comm_increase() -> None:
    result = run("diff", str(SEED_BAD), str(SEED_FIXED), "--critical-path")
    assert result.exit_code == 2
    assert "add --max-comm-increase" in result.output


def test_byte_account_splits_a_training_step_into_prefetchable_gathers_and_critical_reductions() -> None:
    from hlo_doctor.dump import load_dump
    from hlo_doctor.rules.context import AnalysisOptions, RuleContext

    dump = load_dump(FIXTURES / "train-step" / "jax-shardy-healthy")
    (module,) = dump.modules
    account = RuleContext(dump, module, AnalysisOptions()).semantics.bytes
    assert account.total == account.critical + account.prefetchable
    # FSDP: every weight gather derives from the weights only; the gradients and the loss from the batch
    assert account.prefetchable == account.by_role["weight-gather"]
    assert account.critical == account.by_role["gradient-reduce"] + account.by_role["scalar-reduce"]
    assert {c.role for c in account.overlappable_gathers} == {"weight-gather"}


def test_critical_path_reads_the_async_collectives_of_a_scheduled_gpu_dump() -> None:
    # compiled for 2 hosts x 8 A100s: the gathers are all-gather-start/done pairs in the scheduled HLO
    bad, fixed = (FIXTURES / "fsdp-activation-gather" / f"jax-a100_2x8-{v}" for v in ("bad", "fixed"))
    data = json.loads(run("diff", str(bad), str(fixed), "--format", "json").stdout)
    assert data["critical_path_bytes_per_device"]["before"] == data["bytes_per_device"]["before"] == 5734400
    assert data["critical_path_bytes_per_device"]["after"] == 0
    assert data["bytes_per_device_by_role"]["weight-gather"] == {"before": 0, "after": 5406720}
    assert run("diff", str(bad), str(fixed), "--max-comm-increase", "0", "--critical-path").exit_code == 0


def test_diff_of_a_commit_that_only_moves_the_line_reports_no_new_finding(tmp_path: Path) -> None:
    """A line inserted above the problem changes its fingerprint (which hashes the line), not the
    problem: `diff` matches it as the same op at another line, and the gate passes."""
    pytest.importorskip("jax")
    from hlo_doctor.runner import run_script

    programs = Path(__file__).resolve().parents[1] / "hlo_doctor" / "examples" / "programs"
    script = tmp_path / "train.py"
    script.write_text((programs / "uneven_padding.py").read_text())
    before = run_script(script, ["--variant", "bad"], dump_dir=tmp_path / "before", devices=8).dump_dir
    script.write_text("# a comment pushes every line down\n" + script.read_text())
    after = run_script(script, ["--variant", "bad"], dump_dir=tmp_path / "after", devices=8).dump_dir
    result = run("diff", str(before), str(after), "--format", "json")
    assert result.exit_code == 0, result.output
    (module,) = json.loads(result.stdout)["modules"]
    assert module["findings_added"] == [] and module["findings_removed"] == []


def test_baseline_accepts_a_finding_whose_line_moved(tmp_path: Path) -> None:
    """The baseline records each finding's op as well as its fingerprint: a recompile of the
    program with a line inserted above the problem is the same problem, not a new one."""
    pytest.importorskip("jax")
    from hlo_doctor.runner import run_script

    programs = Path(__file__).resolve().parents[1] / "hlo_doctor" / "examples" / "programs"
    script = tmp_path / "train.py"
    script.write_text((programs / "uneven_padding.py").read_text())
    before = run_script(script, ["--variant", "bad"], dump_dir=tmp_path / "before", devices=8).dump_dir
    baseline = tmp_path / "baseline.json"
    assert run("check", str(before), "--write-baseline", str(baseline)).exit_code == 0
    assert all(entry["op"] for entry in json.loads(baseline.read_text())["findings"])
    script.write_text("# a comment pushes every line down\n" + script.read_text())
    after = run_script(script, ["--variant", "bad"], dump_dir=tmp_path / "after", devices=8).dump_dir
    result = run("check", str(after), "--baseline", str(baseline))
    assert result.exit_code == 0, result.output
    assert "1 known finding ignored, 0 new, 0 fixed" in result.stderr
