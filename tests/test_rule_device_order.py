"""reshard-churn, the same split in another device order: a data input whose spec lists the batch axes
in another order than the program's constraints on the values it feeds.

The bad fixtures (JAX under both partitioners, torch_xla FSDPv2 with ``extra_data_axis``) are real
compiles; the fixed twins write the input in the constraints' order. One test edits a real dump by
hand (said so there).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "input-device-order"
CHURN = "reshard-churn"
BAD = ("jax-shardy-bad", "jax-gspmd-bad", "torch_xla-bad")


def _permutes(folder: Path) -> set[str]:
    """Every collective-permute of the partitioned module."""
    (module,) = load_dump(folder).modules
    text = next(folder.glob("*after_spmd-partitioning*")).read_text()
    assert module is not None
    return set(re.findall(r"%(collective-permute(?:\.\d+)?) = ", text))


@pytest.mark.parametrize("variant", BAD)
def test_the_input_in_another_order_is_one_finding_with_every_permute_between_the_orders(variant):
    folder = FIXTURES / variant
    findings = [f for f in analyze_dump(folder, devices_per_host=4).findings if f.rule == CHURN]
    assert len(findings) == 1, [f.message for f in findings]
    (finding,) = findings
    evidence = finding.evidence
    assert evidence["pattern"] == "device-order"
    assert (evidence["input_axes"], evidence["constraint_axes"]) == (["fsdp", "data"], ["data", "fsdp"])
    # every permute of the step moves a value between the two orders: all of them are this finding's
    held = {finding.instruction, *[r for r in finding.related if r.startswith("collective-permute")]}
    assert held == _permutes(folder)
    assert evidence["reshards"] == len(held)
    assert evidence["crosses_hosts"] is True  # pairs such as 4 -> 1 join the two hosts of 4
    code = finding.suggestion.torch_xla if variant.startswith("torch") else finding.suggestion.jax
    assert "('data', 'fsdp')" in code and "'fsdp', 'data'" not in code
    (edit,) = finding.suggestion.edits
    assert edit.old_spec[0] == ("fsdp", "data") and edit.spec[0] == ("data", "fsdp")
    lines = Path(edit.file).read_text().splitlines()
    assert "P(\"fsdp\", \"data\")" in lines[edit.line - 1] or "(\"fsdp\", \"data\")" in lines[edit.line - 1]
    # the finding is at the line that makes (JAX) or marks (torch_xla) the input
    assert finding.source is not None and lines[finding.source.line - 1].lstrip().startswith(
        ("x = jax.ShapeDtypeStruct", "xs.mark_sharding(x,"))


@pytest.mark.parametrize("variant", ("jax-shardy-fixed", "jax-gspmd-fixed", "torch_xla-fixed"))
@pytest.mark.parametrize("per_host", (4, 8))
def test_the_input_in_the_constraints_order_is_silent(variant, per_host):
    assert not analyze_dump(FIXTURES / variant, devices_per_host=per_host).findings


@pytest.mark.parametrize("variant", ("jax-gspmd-bad", "torch_xla-bad"))
def test_a_plain_dump_still_finds_it(variant, tmp_path):
    """No runner record: the input's spec is found in the program's source (JAX: the argument's
    ShapeDtypeStruct; torch_xla: the one mark_sharding that writes the input's spec)."""
    shutil.copytree(FIXTURES / variant, tmp_path / "dump")
    (tmp_path / "dump" / "hlo_doctor_run.json").unlink()
    (finding,) = [f for f in analyze_dump(tmp_path / "dump", devices_per_host=4).findings if f.rule == CHURN]
    assert finding.evidence["pattern"] == "device-order"
    (edit,) = finding.suggestion.edits
    assert edit.spec[0] == ("data", "fsdp") and edit.old_spec[0] == ("fsdp", "data")
    if variant.startswith("torch"):
        assert "xs.mark_sharding(x, mesh, (('data', 'fsdp'), None))" in finding.suggestion.torch_xla


def test_an_order_no_constraint_asks_for_is_the_partitioners_own(tmp_path):
    """Hand-edited real dump: the propagated module's constraints rewritten into the input's own device
    order. The permutes are still in the partitioned module, but no constraint of the program asks for
    the order they put the input in: no device-order finding."""
    shutil.copytree(FIXTURES / "jax-gspmd-bad", tmp_path / "dump")
    propagated = next((tmp_path / "dump").glob("*after_sharding-propagation*"))
    text = propagated.read_text()
    constraint = re.compile(r"(%copy(?:\.\d+)? = f32\[256,1024\]\{1,0\} copy\([^)]*\), sharding=)\{devices=\[8,1\]<=\[8\]\}")
    edited, count = constraint.subn(r"\1{devices=[8,1]0,4,1,5,2,6,3,7}", text)
    assert count >= 3
    propagated.write_text(edited)
    findings = analyze_dump(tmp_path / "dump", devices_per_host=4).findings
    assert not [f for f in findings if f.evidence.get("pattern") == "device-order"]
