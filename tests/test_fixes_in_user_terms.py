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
from hlo_doctor.program.suggest import assigned_name
from hlo_doctor.program.terms import PLACEHOLDER
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
                if PLACEHOLDER.fullmatch(target):
                    continue  # a value no line of the program names: a visible placeholder, not code yet
                ast.parse(code)  # pasteable Python
            for value, spec in _MARK.findall(code):
                if finding.rule in ("non-batch-dim-sharding", "activation-all-gather") and variable:
                    assert value == variable
                if names is not None:
                    assert _axes(spec) <= set(names), (spec, names)


def test_keras_parameters_are_named_by_their_variable_path():
    """Keras' JAX trainer names parameters state[0][i]; the runner's record of the train step's
    state gives their paths, and each LayoutMap key suggested is that variable's own: one key per
    FFN kernel, which also covers the other layer's (one fix, one finding)."""
    folder = FIXTURES / "keras-layout-map" / "jax-shardy-bad"
    record = load_dump(folder).run_record
    [state] = [s for s in record["keras"]["states"] if s["function"] == "train_step"]
    trainable = state["groups"][0]["variables"]
    program_keys = {e["key"] for e in record["keras"]["layouts"]}
    matched = [v["path"] for v in record["keras"]["variables"] if v["matched_key"] is not None]
    named = re.compile(r"parameter (\S+) \(state\[0\]\[(\d+)\]\) \(f32\[512,512\]")
    findings = analyze_dump(folder, select=["replicated-large-parameter"]).findings
    covered = []
    for finding in findings:
        (edit,) = finding.suggestion.edits
        key = edit.details["key"]
        assert (edit.kind, edit.line) == ("layout-map-key", 53)  # after the program's last key
        assert key not in program_keys
        assert not any(re.fullmatch(key, other) for other in matched)  # no variable gets two keys
        assert finding.suggestion.jax.startswith(f'layout[r"{key}"] = (') and _axes(finding.suggestion.jax) == {"model"}
        assert edit.spec in ((("model",), None), (None, ("model",)))
        messages = [finding.message] + [same["message"] for same in finding.evidence.get("same_fix", ())]
        paths = []
        for message in messages:
            name = named.match(message)
            assert name is not None, message
            path, index = name.group(1), int(name.group(2))
            assert path == trainable[index]["path"] and re.fullmatch(r"decoder_block_\d/ffw_\w+/kernel", path)
            assert re.search(key, path) and re.fullmatch(key, path)  # Keras 3.15 matches keys with fullmatch
            paths.append(path)
        assert tuple(sorted(paths)) == edit.details["paths"] and edit.target == edit.details["paths"][0]
        covered += paths
    assert len(findings) == 3 and len(covered) == 6  # the six FFN kernels, each under its own key
    assert {f.suggestion.edits[0].details["key"] for f in findings} == {
        r"decoder_block_\d+/ffw_gating/kernel", r"decoder_block_\d+/ffw_gating_2/kernel",
        r"decoder_block_\d+/ffw_linear/kernel"}


def test_positional_parameters_map_to_recorded_paths_only_when_the_shapes_agree():
    """state[g][i] is variable i of group g of the traced step's recorded state; nnx.jit's
    model.states[0][i] is leaf i. A shape that differs, another function or a missing shape: no name."""
    from hlo_doctor.program.source import recorded_parameter_path

    variables = [{"path": "dense/kernel", "shape": [4, 8], "dtype": "float32"},
                 {"path": "dense/bias", "shape": [8], "dtype": "float32"},
                 {"path": "norm/scale", "shape": None, "dtype": "float32"}]
    record = {"keras": {"states": [
        {"function": "test_step", "groups": [{"name": "trainable_variables", "variables": variables[::-1]}]},
        {"function": "train_step", "groups": [
            {"name": "trainable_variables", "variables": variables},
            {"name": "non_trainable_variables", "variables": []},
            {"name": "optimizer_variables", "variables": [{"path": "sgd/iteration", "shape": [], "dtype": "int32"}]}]},
    ]}, "nnx_jit_calls": [{"function": "train_step", "arguments": [
        {"name": "model", "leaves": [{"index": 0, "path": "w_in/kernel", "shape": [4, 8]}]}]}]}
    assert recorded_parameter_path(record, "train_step", "state[0][0]", (4, 8)) == "dense/kernel"
    assert recorded_parameter_path(record, "train_step", "state[0][1]", (8,)) == "dense/bias"
    assert recorded_parameter_path(record, "train_step", "state[2][0]", ()) == "sgd/iteration"
    assert recorded_parameter_path(record, "test_step", "state[0][0]", ()) is None  # norm/scale: no shape recorded
    assert recorded_parameter_path(record, "test_step", "state[0][2]", (4, 8)) == "dense/kernel"
    assert recorded_parameter_path(record, "train_step", "state[0][0]", (8, 4)) is None  # shape mismatch
    assert recorded_parameter_path(record, "train_step", "state[0][0]", None) is None
    assert recorded_parameter_path(record, "train_step", "state[0][3]", (4, 8)) is None  # past the group
    assert recorded_parameter_path(record, "train_step", "state[1][0]", (4, 8)) is None  # an empty group
    assert recorded_parameter_path(record, "predict_step", "state[0][0]", (4, 8)) is None  # not recorded
    assert recorded_parameter_path(record, "train_step", "data[0]", (4, 8)) is None
    assert recorded_parameter_path(record, "train_step", "model.states[0][0]", (4, 8)) == "w_in/kernel"
    assert recorded_parameter_path(record, "train_step", "model.states[0][0]", (8, 4)) is None
    assert recorded_parameter_path({}, "train_step", "state[0][0]", (4, 8)) is None


def test_the_layout_map_key_is_the_variables_own(tmp_path, monkeypatch):
    """The key generalizes the layer index only when every variable it then matches is unmatched
    and of the same shape, and is no key the program has; else it is the path itself."""
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    from hlo_doctor.program.library_levers import keras_layout_key

    program = tmp_path / "train.py"
    program.write_text("layout = LayoutMap(mesh)\nlayout['block_1/ffw/kernel'] = (None, 'model')\n")

    def record(*variables, keys=("block_1/ffw/kernel",)):
        return {"keras": {
            "layouts": [{"key": k, "axes": [None, "model"], "stack": [{"file": str(program), "line": 2,
                                                                      "function": "main"}]} for k in keys],
            "variables": [{"path": p, "matched_key": m, "axes": None} for p, m, _ in variables],
            "states": [{"function": "train_step", "groups": [{"name": "trainable_variables", "variables": [
                {"path": p, "shape": list(shape), "dtype": "float32"} for p, _, shape in variables]}]}]}}

    dims = (("model",), None)

    def key(rec, path="block_0/ffw/kernel"):
        lever = keras_layout_key(rec, (4, 8), dims, path)
        return None if lever is None else lever.edits[0].details["key"]

    two = [("block_0/ffw/kernel", None, (4, 8)), ("block_2/ffw/kernel", None, (4, 8))]
    assert key(record(*two)) == r"block_\d+/ffw/kernel"
    lever = keras_layout_key(record(*two), (4, 8), dims, "block_0/ffw/kernel")
    assert lever.code == 'layout[r"block_\\d+/ffw/kernel"] = (\'model\', None)' and lever.edits[0].line == 2
    assert lever.edits[0].details["paths"] == ("block_0/ffw/kernel", "block_2/ffw/kernel")
    assert lever.edits[0].target == "block_0/ffw/kernel"  # the same edit for block_2's finding: one fix
    # block_1's kernel matched the program's key: the pattern would give it two keys
    assert key(record(*two, ("block_1/ffw/kernel", "block_1/ffw/kernel", (4, 8)))) == "block_0/ffw/kernel"
    # another layer's kernel of another shape: one spec would not fit both
    assert key(record(*two, ("block_3/ffw/kernel", None, (8, 8)))) == "block_0/ffw/kernel"
    # a key the program already has is never suggested again: the path instead
    assert key(record(*two, keys=(r"block_\d+/ffw/kernel",))) == "block_0/ffw/kernel"
    # a variable a key did match is not replicated for a missing key
    assert key(record(("block_0/ffw/kernel", "block.*", (4, 8)))) is None


def test_the_variable_comes_from_the_line(tmp_path, monkeypatch):
    """Hand-written source: the name assigned on a line, across continuation lines."""
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    program = tmp_path / "prog.py"
    program.write_text("def f(x, w1, b1):\n    out = (x @ w1.T\n           + b1)\n    return out @ w1\n")
    assert assigned_name(str(program), 2) == "out" and assigned_name(str(program), 3) == "out"
    assert assigned_name(str(program), 4) is None


def test_mesh_axis_names_from_the_program_when_the_dump_has_none(tmp_path, monkeypatch):
    """Hand-written programs: the names of the one mesh construction of the inferred shape."""
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    from hlo_doctor.program.source import program_mesh_axes

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
    rules order gives five feature-sharded dots and the embedding lookup (its result split on 'embed'
    while the tokens are split over 'data') one fix (the rules list), so one finding lists the other
    five in ``related`` and ``evidence["same_fix"]``."""
    (finding,) = analyze_dump(FIXTURES / "flax-linen-rules" / "jax-shardy-bad",
                              select=["non-batch-dim-sharding"]).findings
    others = [s["instruction"] for s in finding.evidence["same_fix"]]
    assert sorted(others) == ["dot.13", "dot.3", "dot.5", "dot.7", "gather.9"]
    assert set(others) <= set(finding.related)
    (edit,) = finding.suggestion.edits
    assert edit.kind == "logical-rule" and edit.details["before"] == ("embed",)
    assert "5 more ops" in finding.message


def test_different_lines_with_their_own_constraint_stay_apart():
    """Two constraints on two lines are two fixes: the seed's bad fixture keeps its own finding per line."""
    report = analyze_dump(FIXTURES / "fsdp-activation-gather" / "jax-gspmd-bad", select=builtin_rule_ids())
    assert all("same_fix" not in f.evidence for f in report.findings)


@pytest.mark.parametrize("folder", ["embedding-lost-batch/jax-gspmd-bad", "scan-carry-features/jax-gspmd-bad"])
def test_a_value_no_line_names_is_a_visible_placeholder(folder):
    """GSPMD's scan body gathers the carry with no metadata: no line of the program, so no variable to
    name. The code writes <activation>, never a made-up name, and says why there is no edit."""
    (finding,) = analyze_dump(FIXTURES / folder, select=builtin_rule_ids()).findings
    assert finding.source is None
    for code in (finding.suggestion.jax, finding.suggestion.torch_xla):
        assert "<activation>" in code and not re.search(r"\bh\b", code), code
    assert not finding.suggestion.edits and "no variable to name" in finding.suggestion.no_edit
