"""Every fix printed for a real bad fixture is written in the user's own terms.

* the variable: a constraint fix names the variable its source line assigns
  (read from the program with ``ast``), never a fixed ``h`` or ``x``;
* the mesh axis names: every axis a fix names is an axis of the program's mesh,
  whenever the dump or the runner's record names the mesh;
* the rank: a partition spec has one entry per dim of the tensor it constrains.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump
from hlo_doctor.rules._suggest import assigned_name
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.testing import builtin_rule_ids

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BAD = sorted(p.parent for p in FIXTURES.glob("*/*-bad/hlo_doctor_run.json"))
_CONSTRAINT = re.compile(r"^(\S+) = jax\.lax\.with_sharding_constraint\((\S+), NamedSharding\(mesh, (P\(.*\))\)\)", re.M)
_MARK = re.compile(r"^xs\.mark_sharding\(([^,]+), mesh, (.*)\)$", re.M)


def _mesh_names(folder: Path) -> tuple[str, ...] | None:
    dump = load_dump(folder)
    mesh = RuleContext(dump, dump.modules[0], AnalysisOptions()).mesh
    return None if mesh is None or mesh.is_inferred else mesh.axis_names


def _axes(spec_text: str) -> set[str]:
    return set(re.findall(r"'([^']+)'", spec_text))


@pytest.mark.parametrize("folder", BAD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixes_use_the_variable_and_the_mesh_of_the_program(folder):
    report = analyze_dump(folder, select=builtin_rule_ids())
    names = _mesh_names(folder)
    for finding in report.findings:
        suggestion, source = finding.suggestion, finding.source
        if suggestion is None:
            continue
        variable = assigned_name(source.file, source.line) if source is not None else None
        for code in (suggestion.jax or "", suggestion.torch_xla or ""):
            for target, value, spec in _CONSTRAINT.findall(code):
                assert target == value
                if finding.rule in ("non-batch-dim-sharding", "activation-all-gather") and variable:
                    assert value == variable, (finding.rule, source, code)
                if names is not None:
                    assert _axes(spec) <= set(names), (spec, names)
                ast.parse(code)  # pasteable Python
            for value, spec in _MARK.findall(code):
                if finding.rule in ("non-batch-dim-sharding", "activation-all-gather") and variable:
                    assert value == variable
                if names is not None:
                    assert _axes(spec) <= set(names), (spec, names)


def test_the_variable_comes_from_the_line(tmp_path):
    """Hand-written source: the name assigned on a line, across continuation lines."""
    program = tmp_path / "prog.py"
    program.write_text("def f(x, w1, b1):\n    out = (x @ w1.T\n           + b1)\n    return out @ w1\n")
    assert assigned_name(str(program), 2) == "out" and assigned_name(str(program), 3) == "out"
    assert assigned_name(str(program), 4) is None


def test_mesh_axis_names_from_the_program_when_the_dump_has_none(tmp_path):
    """Hand-written programs: the names of the one mesh construction of the inferred shape."""
    from hlo_doctor.rules._program import program_mesh_axes

    program = tmp_path / "train.py"
    program.write_text(
        "import numpy as np\n"
        "mesh = xs.Mesh(np.arange(16), (2, 8), ('replica', 'fsdp'))\n"
        "other = jax.make_mesh((4, 4), ('data', 'model'))\n"
        "flat = Mesh(devices, ('batch',))\n"
        "keras_mesh = keras.distribution.DeviceMesh(shape=(2, 4), axis_names=['data', 'model'])\n"
    )
    assert program_mesh_axes(str(program), (2, 8)) == ("replica", "fsdp")
    assert program_mesh_axes(str(program), (4, 4)) == ("data", "model")
    assert program_mesh_axes(str(program), (2, 4)) == ("data", "model")
    assert program_mesh_axes(str(program), (16,)) == ("batch",)
    assert program_mesh_axes(str(program), (8, 2)) is None  # no construction of that shape: stay positional


def test_nnx_parameters_are_named_by_their_variable_path():
    """nnx.jit names parameters model.states[0][i]; the runner's record gives their paths."""
    (finding,) = analyze_dump(FIXTURES / "flax-nnx-partitioning" / "jax-shardy-bad",
                              select=["replicated-large-parameter"]).findings
    assert finding.message.startswith("parameter unembed/kernel (model.states[0][5]) (f32[256,2048]")
    # the lever: the initializer of the layer that lost its partitioning metadata (line 56 of the
    # program makes self.unembed = nnx.Linear(..., kernel_init=init) without with_partitioning)
    # ('fsdp', None): its forward matmul reads a batch-sharded activation, so the contracting dim
    # (see rules/_weight_dim.py; the fixed twin writes the same)
    assert finding.suggestion.jax == "kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ('fsdp', None))"
    (edit,) = finding.suggestion.edits
    assert (edit.kind, edit.line, edit.target, edit.spec) == ("with-partitioning", 56, "unembed/kernel", (("fsdp",), None))


def test_one_fix_one_finding():
    """Findings of one rule whose fix is the same edit of the program share their cause: the Flax
    rules order gives five feature-sharded dots one fix (the rules list), so one finding lists
    the other four in ``related`` and ``evidence["same_fix"]``."""
    (finding,) = analyze_dump(FIXTURES / "flax-linen-rules" / "jax-shardy-bad",
                              select=["non-batch-dim-sharding"]).findings
    others = [s["instruction"] for s in finding.evidence["same_fix"]]
    assert sorted(others) == ["dot.13", "dot.3", "dot.5", "dot.7"]
    assert set(others) <= set(finding.related)
    (edit,) = finding.suggestion.edits
    assert edit.kind == "logical-rule" and edit.details["before"] == ("embed",)
    assert "4 more ops" in finding.message


def test_different_lines_with_their_own_constraint_stay_apart():
    """Two constraints on two lines are two fixes: the seed's bad fixture keeps its own finding per line."""
    report = analyze_dump(FIXTURES / "fsdp-activation-gather" / "jax-gspmd-bad", select=builtin_rule_ids())
    assert all("same_fix" not in f.evidence for f in report.findings)
