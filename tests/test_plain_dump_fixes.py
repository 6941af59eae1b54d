"""Fixes on plain dumps: every bad fixture analysed without the runner's record (as a user's
``XLA_FLAGS`` dump) still writes its fix in the program's own terms.

* a constraint fix at a line that assigns a variable constrains that variable;
* no fix code names ``axis_N`` or an identifier the program does not have, except in a visible
  placeholder (``<mesh>``, ``<axis 0>``): the code is parsed and its names compared with the
  program's identifiers, framework names and builtins;
* every edit points at a line of the program that is the lever its kind says (a ``P(...)``, a mesh
  construction, an FSDPv2 wrapper, the assignment of the axes variable);
* ``fix DUMP`` on plain dumps of a JAX and a torch_xla gallery program gives a patch (and, slow,
  the JAX one recompiled through the runner is clean).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.cli import main
from hlo_doctor.dump import load_dump
from hlo_doctor.examples.registry import local_program_file
from hlo_doctor.program.suggest import assigned_name, called_on
from hlo_doctor.program.terms import FRAMEWORK_NAMES, PLACEHOLDER, code_names, program_names
from hlo_doctor.testing import builtin_rule_ids

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROGRAMS = Path(__file__).resolve().parents[1] / "hlo_doctor" / "examples" / "programs"
BAD = sorted(p.parent for p in FIXTURES.glob("*/*-bad/hlo_doctor_run.json"))
# The rules whose fix constrains the value the finding's own line makes.
_VALUE_RULES = ("non-batch-dim-sharding", "activation-all-gather", "reshard-churn", "uneven-sharding-padding")
_CONSTRAINED = re.compile(r"^(?:(\S+) = jax\.lax\.with_sharding_constraint\(|xs\.mark_sharding\(([^,]+),)", re.M)


def plain_copy(folder: Path, tmp: Path) -> Path:
    """The fixture as a user's own dump: copied, without the runner's record."""
    plain = tmp / folder.parent.name / folder.name
    shutil.copytree(folder, plain)
    for record in plain.rglob("hlo_doctor_run.json"):
        record.unlink()
    return plain


def _program(folder: Path) -> str | None:
    """The gallery program the fixture was made from (the test reads the record; the analysis does not)."""
    script = (load_dump(folder).run_record or {}).get("script")
    local = local_program_file(script["path"]) if isinstance(script, dict) else None
    return str(local) if local is not None else None


@pytest.fixture(scope="module")
def plain_reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    return {folder: analyze_dump(plain_copy(folder, tmp), select=builtin_rule_ids(), jobs=1, drawings=False)
            for folder in BAD}


def _codes(finding) -> list[str]:
    suggestion = finding.suggestion
    return [c for c in (suggestion.jax, suggestion.torch_xla) if c] if suggestion is not None else []


@pytest.mark.parametrize("folder", BAD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plain_dump_fixes_name_only_what_the_program_names(folder, plain_reports):
    program = _program(folder)
    for finding in plain_reports[folder].findings:
        files = [program, finding.source.file if finding.source is not None else None]
        known = (program_names(files) or frozenset()) | FRAMEWORK_NAMES
        for code in _codes(finding):
            outside = PLACEHOLDER.sub("", code)
            assert not re.search(r"axis_\d", outside), (finding.rule, code)
            read = code_names(code)
            assert read is not None, f"not Python: {code}"
            used, _ = read
            assert used <= known, (finding.rule, sorted(used - known), code)


@pytest.mark.parametrize("folder", BAD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plain_dump_fixes_constrain_the_lines_own_variable(folder, plain_reports):
    for finding in plain_reports[folder].findings:
        if finding.rule not in _VALUE_RULES or finding.source is None:
            continue
        # the variable the line assigns, or the one a mark_sharding statement on it marks
        variable = assigned_name(finding.source.file, finding.source.line)
        if variable is None and "mark_sharding(" in _statement_text(finding.source.file, finding.source.line):
            variable = called_on(finding.source.file, finding.source.line)
        # a constraint first in a function the program defines (a scan's body: the carry is its parameter)
        parameters = {e.target for e in finding.suggestion.edits if e.kind == "constrain"
                      and e.details.get("position") == "function-start"} if finding.suggestion else set()
        for code in _codes(finding):
            for jax_target, torch_target in _CONSTRAINED.findall(code):
                target = (jax_target or torch_target).strip()
                if target in parameters:
                    continue
                if variable is not None:
                    assert target == variable, (finding.rule, finding.source, code)
                else:
                    assert PLACEHOLDER.fullmatch(target), (finding.rule, finding.source, code)
        for edit in finding.suggestion.edits if finding.suggestion else ():
            if edit.kind == "constrain" and edit.file is None and edit.target is not None:
                assert edit.target == variable


def _statement_text(path: str, line: int) -> str:
    tree = ast.parse(Path(path).read_text())
    lines = Path(path).read_text().splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.For, ast.If,
                                                                 ast.With, ast.While, ast.Try)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            return "\n".join(lines[node.lineno - 1:node.end_lineno])
    return lines[line - 1]


_LEVER_TEXT = {"respec": r"\bP\(|PartitionSpec\(|mark_sharding\(", "mesh": r"Mesh\(|make_mesh\(",
               "shard-output": r"FSDPv2\(|SpmdFullyShardedDataParallel\(", "with-partitioning": r"Linear\(|Param\(|init"}


@pytest.mark.parametrize("folder", BAD, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plain_dump_edits_point_at_the_programs_own_lever(folder, plain_reports):
    for finding in plain_reports[folder].findings:
        for edit in finding.suggestion.edits if finding.suggestion else ():
            if edit.kind == "xla-flag":
                continue
            path = edit.file or (finding.source.file if finding.source else None)
            local = local_program_file(path) if path else None
            assert local is not None, (finding.rule, edit)
            if edit.line is None:
                continue
            text = _statement_text(str(local), edit.line)
            if edit.kind in _LEVER_TEXT:
                assert re.search(_LEVER_TEXT[edit.kind], text), (finding.rule, edit.kind, text)
            if edit.kind == "axes":
                assert re.match(rf"\s*{re.escape(edit.details['variable'])}\s*=", text), text


def test_the_fsdpv2_program_gets_its_own_levers_from_a_plain_dump(plain_reports):
    """The default shard_output leaves the batch replicated over 'replica': the fix rewrites the
    axes the program's marks read and gives the layers' wrappers a shard_output, in the program's
    mesh axis names (its mesh is xs.Mesh(..., (2, DEVICES // 2), ('replica', 'fsdp')))."""
    [finding] = plain_reports[FIXTURES / "hf-fsdpv2-torch-xla" / "torch_xla-bad"].findings
    kinds = {(e.kind, e.line, e.spec) for e in finding.suggestion.edits}
    program = (PROGRAMS / "hf_fsdpv2_torch_xla.py").read_text().splitlines()
    assert kinds == {("axes", 56, (("replica", "fsdp"),)), ("shard-output", 68, (("replica", "fsdp"), None, None))}
    assert program[55].lstrip().startswith("batch_axes = ") and "FSDPv2(layer" in program[67]
    assert "xs.mark_sharding(input_ids, mesh, (('replica', 'fsdp'), None))" in finding.suggestion.torch_xla


def _recorded_programs(dump: Path) -> str:
    """The folder of the gallery programs as the dump records it (another checkout's path)."""
    for text in (p.read_text(errors="replace") for p in sorted(dump.rglob("*")) if p.is_file()):
        match = re.search(r'(/[^"\s]*/hlo_doctor/examples/programs)/', text)
        if match:
            return match.group(1)
    raise AssertionError("the dump names no gallery program")


@pytest.mark.parametrize(("fixture", "expected"), [
    ("fsdp-activation-gather/jax-shardy-bad",
     '+        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(("fsdp", "replica"), None)))'),
    ("hf-fsdpv2-torch-xla/torch_xla-bad", '+    batch_axes = ("replica", "fsdp") if args.variant == "bad"'),
])
def test_fix_on_a_plain_dump_gives_a_patch(tmp_path, fixture, expected):
    plain = plain_copy(FIXTURES / fixture, tmp_path)
    programs = tmp_path / "programs"
    shutil.copytree(PROGRAMS, programs)
    result = CliRunner().invoke(main, ["fix", str(plain), "--path-map", f"{_recorded_programs(plain)}={programs}"])
    assert result.exit_code == 0, result.output
    assert expected in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_the_patch_of_a_plain_jax_dump_recompiles_clean(tmp_path, monkeypatch):
    from hlo_doctor.runner.run import run_script

    monkeypatch.chdir(tmp_path)  # the project: --write edits only its files

    plain = plain_copy(FIXTURES / "fsdp-activation-gather" / "jax-shardy-bad", tmp_path)
    programs = tmp_path / "programs"
    shutil.copytree(PROGRAMS, programs)
    result = CliRunner().invoke(main, ["fix", str(plain), "--write",
                                       "--path-map", f"{_recorded_programs(plain)}={programs}"])
    assert result.exit_code == 0, result.output
    script = programs / "fsdp_activation_gather.py"
    assert "with_sharding_constraint(h, NamedSharding(mesh" in script.read_text()
    dump = run_script(script, ["--variant", "bad"], dump_dir=tmp_path / "after", python=sys.executable,
                      devices=4).dump_dir
    assert [f.rule for f in analyze_dump(plain, select=builtin_rule_ids()).findings] == ["non-batch-dim-sharding"]
    assert not analyze_dump(dump, select=builtin_rule_ids()).findings


def test_a_replicated_weights_placement_is_found_in_the_source(tmp_path, monkeypatch):
    """Hand-written program: the P() a weight is placed with, by device_put (one of several
    placements of that name) or by its entry of jit's in_shardings; two sites: no guess."""
    from hlo_doctor.program.spec_sites import parameter_spec_site

    monkeypatch.chdir(tmp_path)  # the program is read only inside the project (here: the current folder)

    program = tmp_path / "train.py"
    head = ("import jax\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
            "mesh = jax.make_mesh((4,), ('fsdp',))\nfsdp = NamedSharding(mesh, P('fsdp', None))\n"
            "def step(x, w1, w2):\n    return (x @ w1) @ w2\n"
            "w1 = jax.device_put(w1, fsdp)\nw2 = jax.device_put(w2, fsdp)\n")
    program.write_text(head + "w2 = jax.device_put(w2, NamedSharding(mesh, P()))\n")
    site = parameter_spec_site(str(program), "w2", ())
    assert (site.line, site.text) == (9, "P()")
    program.write_text(head + "jitted = jax.jit(step, in_shardings=(fsdp, fsdp, NamedSharding(mesh, P())))\n")
    site = parameter_spec_site(str(program), "w2", (), "step")
    assert (site.line, site.text) == (9, "P()") and parameter_spec_site(str(program), "x", (), "step") is None
    program.write_text(head + "w2 = jax.device_put(w2, NamedSharding(mesh, P()))\n"
                       "jitted = jax.jit(step, in_shardings=(fsdp, fsdp, NamedSharding(mesh, P())))\n")
    assert parameter_spec_site(str(program), "w2", (), "step") is None  # two places replicate it


def test_mesh_axis_names_come_from_any_file_the_dump_names(tmp_path, monkeypatch):
    """Hand-written programs: the model file builds no mesh, the script does; a size the source
    does not fix (``n``) matches its place, and an axis written with size 1 is left out (a dump
    never shows it); two files that name the same shape differently give no answer."""
    from hlo_doctor.program.terms import mesh_axes_in, mesh_axes_of_shape

    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    model = tmp_path / "model.py"
    model.write_text("def forward(params, x):\n    return x @ params['w']\n")
    script = tmp_path / "train.py"
    script.write_text("import numpy as np\nfrom jax.sharding import Mesh\n"
                      "mesh = Mesh(np.array(jax.devices()[:n]).reshape(n, 1), ('fsdp', 'replica'))\n"
                      "grid = Mesh(devices.reshape(2, 4), ('data', 'model'))\n")
    assert mesh_axes_of_shape(str(script), (8,)) == ("fsdp",)
    assert mesh_axes_of_shape(str(script), (2, 4)) == ("data", "model")
    assert mesh_axes_of_shape(str(model), (8,)) is None
    assert mesh_axes_in([str(model), str(script)], (8,)) == ("fsdp",)
    assert mesh_axes_in([str(model), str(script)], (4, 2)) is None  # no construction of that shape
    other = tmp_path / "other.py"
    other.write_text("mesh = jax.make_mesh((8,), ('batch',))\n")
    assert mesh_axes_in([str(script), str(other)], (8,)) is None  # 'fsdp' or 'batch': no guess
    torch = tmp_path / "torch_train.py"
    torch.write_text("mesh = xs.Mesh(np.arange(8), (2, 4), ('replica', 'fsdp'))\n")
    assert mesh_axes_of_shape(str(torch), (2, 4)) == ("replica", "fsdp")


def _plain_fix(folder: Path, tmp_path: Path, rule: str):
    report = analyze_dump(plain_copy(folder, tmp_path), select=builtin_rule_ids(), jobs=1, drawings=False)
    return [f for f in report.findings if f.rule == rule]


def test_a_plain_gspmd_dump_whose_mesh_is_built_beside_the_model(tmp_path):
    """The replicated-batch program builds its mesh ('data'=2, 'fsdp'=4) in its script, and the
    finding's line is in the model file: the fix names the mesh variable and its axes."""
    [finding] = _plain_fix(FIXTURES / "replicated-batch" / "jax-gspmd-bad", tmp_path, "replicated-batch")
    assert finding.source.file.endswith("llama_model.py")
    assert "NamedSharding(mesh, P(('data', 'fsdp'), None))" in finding.suggestion.jax
    assert "'data'" in finding.message and "axis_" not in finding.message


def test_a_plain_keras_dump_gets_the_programs_layout_map(tmp_path):
    """Keras names the step's parameters by position (state[0][7]); the program's LayoutMap is the
    lever, with the key the dump cannot tell written as a placeholder, and no edit. The step donates
    its buffers, and is still read as JAX."""
    findings = _plain_fix(FIXTURES / "keras-layout-map" / "jax-shardy-bad", tmp_path, "replicated-large-parameter")
    assert findings
    program = (PROGRAMS / "keras_layout_map.py").read_text().splitlines()
    made = next(i for i, line in enumerate(program, 1) if "LayoutMap(" in line)
    for finding in findings:
        parameter = finding.message.split()[1]
        assert finding.suggestion.jax == f'layout[r"<variable path of {parameter}>"] = {_spec_of(finding)}'
        assert f"LayoutMap layout of line {made}" in finding.suggestion.summary
        assert not finding.suggestion.edits and parameter in finding.suggestion.no_edit


def _spec_of(finding) -> str:
    return re.search(r"\] = (\(.*\))$", finding.suggestion.jax).group(1)


def test_a_plain_nnx_dump_points_at_the_layer_built_without_partitioning(tmp_path):
    [finding] = _plain_fix(FIXTURES / "flax-nnx-partitioning" / "jax-shardy-bad", tmp_path,
                           "replicated-large-parameter")
    program = (PROGRAMS / "flax_nnx_partitioning.py").read_text().splitlines()
    # the unembed layer of the bad variant: the one nnx.Linear built without partitioning metadata
    assert "self.unembed = nnx.Linear(" in program[55] and "with_partitioning" not in program[55]
    assert "line 56 builds an nnx.Linear without it" in finding.suggestion.summary
    assert finding.suggestion.jax == "<weight>_init=nnx.with_partitioning(<its initializer>, ('fsdp', None))"
    assert not finding.suggestion.edits


def test_a_plain_flax_dump_gets_the_rules_the_program_passes(tmp_path):
    """The program passes ``BAD_RULES if args.variant == "bad" else HEALTHY_RULES`` to
    nn.logical_axis_rules: of the two literals, only the bad one explains the finding (the healthy
    one already puts 'batch' first), so the plain dump gets the fix the runner's record gives."""
    folder = FIXTURES / "flax-linen-rules" / "jax-shardy-bad"
    recorded = analyze_dump(folder, select=builtin_rule_ids(), jobs=1, drawings=False).findings
    plain = _plain_fix(folder, tmp_path, "non-batch-dim-sharding")
    assert len(plain) == len(recorded) == 1
    assert plain[0].suggestion.jax == recorded[0].suggestion.jax
    assert [(e.kind, e.line, e.details) for e in plain[0].suggestion.edits] == \
        [(e.kind, e.line, e.details) for e in recorded[0].suggestion.edits]
    assert plain[0].suggestion.edits[0].kind == "logical-rule"


ALL_RECORDED = sorted(p.parent for p in FIXTURES.glob("*/*/hlo_doctor_run.json"))


@pytest.mark.parametrize("folder", ALL_RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_plain_dump_is_read_as_the_framework_that_made_it(folder, tmp_path):
    """The runner records the framework; without the record the ops' metadata says it. Flax, Keras
    and AdamW steps donate their buffers, as torch_xla's training steps do: that is no sign."""
    import json

    from hlo_doctor.rules.context import AnalysisOptions, RuleContext

    recorded = json.loads((folder / "hlo_doctor_run.json").read_text()).get("framework", "").replace("-", "_")
    dump = load_dump(plain_copy(folder, tmp_path))
    assert {RuleContext(dump, m, AnalysisOptions()).framework for m in dump.modules} == {recorded}


def test_a_plain_equinox_dump_finds_the_constraint_in_its_ops(tmp_path):
    """Without the runner's record, the program's own eqx.filter_shard is read from the op it left in
    the module (op_name .../sharding_constraint, its line, its sharding over the mesh): the lever is the
    spec it reads through two names (line 50), for the forward dot (w @ x under vmap, its product
    transposed on the same line) and the backward one, which reaches the constraint's transpose."""
    folder = FIXTURES / "equinox-filter-shard" / "jax-shardy-bad"
    recorded = analyze_dump(folder, select=builtin_rule_ids(), jobs=1, drawings=False).findings
    [finding] = _plain_fix(folder, tmp_path, "non-batch-dim-sharding")
    assert [f.rule for f in recorded] == ["non-batch-dim-sharding"]
    assert finding.suggestion.jax == recorded[0].suggestion.jax == "feature_sharding = NamedSharding(mesh, P('data', None))"
    assert [(e.kind, e.line, e.old_spec, e.spec) for e in finding.suggestion.edits] == \
        [("respec", 50, (None, ("data",)), (("data",), None))]
    assert "dot_general.3" in finding.related and finding.evidence["symptoms"]


_CONSTRAINED_HLO = """\
HloModule jit_f, num_partitions=2

ENTRY %main (x: f32[4,6]) -> f32[4,6] {
  %x = f32[4,6]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  %c = f32[4,6]{1,0} copy(%x), sharding={devices=[1,2]<=[2]}, metadata={op_name="jit(f)/sharding_constraint" source_file="/p/train.py" source_line=12}
  %m = f32[4,6]{1,0} custom-call(%c), custom_call_target="Sharding", sharding={devices=[2,1]<=[2]}, metadata={op_type="xla__custom_sharding" op_name="xla__custom_sharding" source_file="/p/model.py" source_line=30}
  ROOT %n = f32[4,6]{1,0} negate(%m), sharding={devices=[2,1]<=[2]}, metadata={op_name="jit(f)/neg" source_file="/p/train.py" source_line=13}
}
"""


def test_the_programs_sharding_calls_are_read_from_the_ops_they_left():
    """Hand-written HLO: a with_sharding_constraint's copy and a mark_sharding's Sharding custom-call,
    in the runner's record form (the spec over the mesh's axes, the global shape, the stack); other ops
    are no call, and a mesh whose axis names are made up gives none."""
    from hlo_doctor.graph.mesh import Mesh
    from hlo_doctor.hlo import parse_module
    from hlo_doctor.program.records import sharding_calls_in, user_line

    module = parse_module(_CONSTRAINED_HLO)
    calls = sharding_calls_in(module, Mesh(("data",), (2,), (0, 1), "program"))
    assert [(c["function"], c["spec"], c["shape"], user_line(c)) for c in calls] == [
        ("with_sharding_constraint", "P(None, 'data')", [4, 6], ("/p/train.py", 12)),
        ("mark_sharding", "('data', None)", [4, 6], ("/p/model.py", 30))]
    assert sharding_calls_in(module, Mesh(("axis_0",), (2,), (0, 1), "inferred")) == []
