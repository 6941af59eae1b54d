"""The show and explain commands."""

import json
from pathlib import Path

from click.testing import CliRunner

from hlo_doctor.cli import main
from tests.conftest import program_line

SEED = Path(__file__).parent.parent / "fixtures" / "fsdp-activation-gather"


def _run(*args):
    return CliRunner(env={"COLUMNS": "200"}).invoke(main, [str(a) for a in args])


def test_explain_json():
    result = _run("explain", SEED / "jax-shardy-fixed", "dot_general.0", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["module"] == "jit_mlp" and data["instruction"] == "dot_general.0"
    assert data["sharding"] == "{devices=[4,1]<=[4]}"
    origin = data["origins"]["fsdp"]
    assert origin["kind"] == "constraint" and origin["index"] is None
    assert origin["instruction"] == "sharding_constraint.0"
    assert origin["source"]["line"] == program_line("fsdp_activation_gather.py", "with_sharding_constraint(h, batch)") and origin["source"]["function"] == "main.<locals>.mlp"
    assert [s["instruction"] for s in data["path"][0]["steps"]] == ["dot_general.0", "add.3", "sharding_constraint.0"]
    assert data["collectives"] == ["all-gather"]


def test_explain_text_and_bad_input():
    result = _run("explain", SEED / "jax-gspmd-bad", "add.11")
    assert result.exit_code == 0
    assert "axis fsdp: input 1 at %w1.1" in result.output
    missing = _run("explain", SEED / "jax-gspmd-bad", "no_such_op")
    assert missing.exit_code == 2
    assert "no instruction 'no_such_op'" in missing.output
    assert _run("explain", SEED / "nope", "x").exit_code == 2


def test_show_table_and_op():
    result = _run("show", SEED / "jax-gspmd-bad")
    assert result.exit_code == 0 and "dot_general.2" in result.output
    picture = _run("show", SEED / "jax-gspmd-bad", "--op", "dot_general.2")
    assert "[0:160, 240:480]  -> devices 1" in picture.output


def _finding_names(dump):
    report = json.loads(_run("analyze", dump, "--format", "json").output)
    return [f["instruction"] for f in report["findings"] if f["instruction"]]


def test_explain_and_show_accept_the_names_findings_print():
    dump = SEED / "jax-shardy-bad"
    report = json.loads(_run("analyze", dump, "--format", "json").output)
    [finding] = report["findings"]
    names = [finding["instruction"], *[n for n in finding["related"] if n.startswith("all-gather")]]
    assert names == ["dot", "all-gather", "all-gather.1"]  # after-partitioning names, none of them after propagation
    for name in names:
        explained = _run("explain", dump, name)
        assert explained.exit_code == 0, explained.output
        assert "(after_spmd-partitioning)" in explained.output and "after propagation (after_shardy-xla)" in explained.output
        shown = _run("show", dump, "--op", name)
        assert shown.exit_code == 0, shown.output
        assert f"%{name} f32[" in shown.output and "per device (after partitioning)" in shown.output
    # a renamed op is explained as the op it was; an inserted collective as the op it serves
    data = json.loads(_run("explain", dump, "dot", "--format", "json").output)
    assert data["instruction"] == "dot_general.0"
    assert data["lookup"] == {"name": "dot", "snapshot": "after_spmd-partitioning", "after_propagation": "dot_general.0",
                              "after_partitioning": "dot", "note": data["lookup"]["note"]}
    assert "it is %dot_general.0" in data["lookup"]["note"]


def test_a_name_after_propagation_says_so():
    result = _run("explain", SEED / "jax-shardy-fixed", "dot_general.0")
    assert result.output.startswith("%dot_general.0: looking in the after-propagation snapshot (after_shardy-xla)")


def test_show_json():
    table = json.loads(_run("show", SEED / "jax-gspmd-bad", "--format", "json").output)
    (module,) = table
    ops = {row["op"]: row for row in module["ops"]}
    assert ops["dot_general.2"]["per_device"] == "[160, 240]" and module["snapshot"].startswith("after_")
    picture = json.loads(_run("show", SEED / "jax-gspmd-bad", "--op", "dot_general.2", "--format", "json").output)
    assert {"slice": ["0:160", "240:480"], "devices": [1]} in picture["split"]
    assert picture["lookup"]["after_propagation"] == "dot_general.2"
    missing = _run("show", SEED / "jax-gspmd-bad", "--op", "nope", "--format", "json")
    assert missing.exit_code == 2 and "no instruction 'nope'" in missing.output
