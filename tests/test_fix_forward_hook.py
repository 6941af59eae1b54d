"""The ``forward-hook`` edit (torch_xla): a hook that marks a submodule's output over the batch axes,
registered before the model call, on small hand-written programs; and on the hf-1d-params-torch-xla
fixed fixture, whose o_proj dots the runner names by module path."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix import plan_fixes
from hlo_doctor.testing import builtin_rule_ids
from tests.fix_cases import PATH, dedent, finding, patched, plan, refused

PROGRAM = '''\
import torch_xla.distributed.spmd as xs


def main():
    mesh = xs.Mesh(ids, (2, 8), ("replica", "fsdp"))
    model = build()
    # the step
    loss = model(input_ids=input_ids).loss
    loss.backward()
'''

EACH = SourceEdit("forward-hook", "torch_xla", target="model.layers.*.self_attn.o_proj", spec=(("replica", "fsdp"),),
                  line=8, details={"position": "before", "model": "model", "module": "layer.self_attn.o_proj",
                                   "each": "model.model.layers", "loop": "layer"})
ONE = SourceEdit("forward-hook", "torch_xla", target="model.layers.0.mlp.down_proj", spec=(("replica", "fsdp"),),
                 line=8, details={"position": "before", "model": "model",
                                  "module": "model.model.layers[0].mlp.down_proj"})

HOOK = '''\
    # the step
    def shard_batch(module, args, output):
        xs.mark_sharding(output, mesh, (("replica", "fsdp"),) + (None,) * (output.dim() - 1))

'''


def test_a_hook_on_every_layer_before_the_model_call():
    assert patched(PROGRAM, EACH, line=8) == PROGRAM.replace("    # the step\n", HOOK + (
        "    for layer in model.model.layers:\n"
        "        layer.self_attn.o_proj.register_forward_hook(shard_batch)\n"))


def test_a_second_module_registers_the_same_function():
    result = plan(PROGRAM, finding(EACH, line=8), finding(ONE, line=8))
    assert not result.refused, result.refused
    text = result.patched[PATH]
    assert text.count("def shard_batch") == 1
    assert "    model.model.layers[0].mlp.down_proj.register_forward_hook(shard_batch)\n    loss = model(" in text
    ast.parse(text)


def test_imports_added_only_when_missing_and_a_taken_loop_variable_renamed():
    program = dedent('''\
        import torch_xla.distributed.spmd


        def main(layer):
            mesh = torch_xla.distributed.spmd.Mesh(ids, (16,), ("fsdp",))
            loss = model(x).loss
        ''')
    edit = SourceEdit("forward-hook", "torch_xla", target="layers.*.fc", spec=(("fsdp",),), line=6,
                      details={"model": "model", "module": "layer.fc", "each": "model.layers", "loop": "layer"})
    text = patched(program, edit, line=6)
    assert "torch_xla.distributed.spmd.mark_sharding(output, mesh, (\"fsdp\",) + (None,)" in text
    assert "    for layer_ in model.layers:\n        layer_.fc.register_forward_hook(shard_batch)\n" in text
    assert "import torch_xla.distributed.spmd as xs" not in text

    bare = program.replace("import torch_xla.distributed.spmd\n", "import numpy as np\n").replace(
        "torch_xla.distributed.spmd.Mesh", "Mesh")
    assert "import torch_xla.distributed.spmd as xs\n" in patched(bare, edit, line=6)


def test_applied_twice_is_refused():
    once = patched(PROGRAM, EACH, line=8)
    moved = dataclasses.replace(EACH, line=13)  # the call moved 5 lines down
    again = plan(once, finding(moved, line=13))
    assert not again.applied and again.patched[PATH] == dedent(once)
    assert "already applied" in again.refused[0].reason


def test_applied_twice_is_refused_whatever_the_names_of_the_module_path():
    edit = dataclasses.replace(EACH, details={**EACH.details, "module": "layer.post_attention_layernorm"})
    once = patched(PROGRAM.replace("def main():", "def main(layer):"), edit, line=8)
    assert "    for layer_ in model.model.layers:\n        layer_.post_attention_layernorm.register_forward_hook(" \
        "shard_batch)\n" in once
    again = plan(once, finding(dataclasses.replace(edit, line=13), line=13))
    assert not again.applied and "already applied" in again.refused[0].reason


def test_refused_without_the_model_or_a_mesh():
    assert "does not use" in refused(PROGRAM.replace("model(input_ids", "net(input_ids"), EACH, line=8)
    no_mesh = PROGRAM.replace('    mesh = xs.Mesh(ids, (2, 8), ("replica", "fsdp"))\n', "")
    assert "no mesh variable" in refused(no_mesh, dataclasses.replace(EACH, line=7), line=7)


ROOT = Path(__file__).resolve().parents[1]
HF_FIXED = ROOT / "fixtures" / "hf-1d-params-torch-xla" / "torch_xla-fixed"


def test_the_hf_fixed_fixture_gets_one_finding_and_one_hook_for_both_layers():
    report = analyze_dump(HF_FIXED, select=builtin_rule_ids())
    [found] = [f for f in report.findings if f.rule == "non-batch-dim-sharding"]
    assert len(found.evidence["same_fix"]) == 1  # layer 1's o_proj: the same cause, the same fix
    [edit] = found.suggestion.edits
    assert edit.kind == "forward-hook" and edit.target == "model.layers.*.self_attn.o_proj"
    assert edit.spec == (("replica", "fsdp"),)
    assert dict(edit.details) == {"position": "before", "model": "model", "module": "layer.self_attn.o_proj",
                                  "each": "model.model.layers", "loop": "layer"}
    assert "model.layers.0.self_attn.o_proj" in found.message
    program = ROOT / "hlo_doctor" / "examples" / "programs" / "hf_1d_params_torch_xla.py"
    recorded = report.program
    assert recorded is not None
    result = plan_fixes(report.findings, program=recorded, path_map={recorded: str(program)})
    assert not result.refused, [r.reason for r in result.refused]
    text = result.patched[str(program)]
    assert ("    for layer in model.model.layers:\n"
            "        layer.self_attn.o_proj.register_forward_hook(shard_batch)\n"
            "    loss = model(input_ids=input_ids, labels=labels).loss\n") in text
    # planned again on the patched program, the call 6 lines down: nothing changes
    moved = dataclasses.replace(found, suggestion=dataclasses.replace(
        found.suggestion, edits=(dataclasses.replace(edit, line=edit.line + 6),)))
    again = plan_fixes([moved], program=recorded, path_map={recorded: str(program)}, sources={str(program): text})
    assert not again.applied and "already applied" in again.refused[0].reason


def _installed(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.skipif(not _installed("torch_xla", "transformers"),
                    reason="needs torch_xla and transformers (the third-party extra)")
def test_the_patched_hf_fixed_program_recompiles_without_the_finding(tmp_path: Path):
    """`hlo-doctor fix` on the fixed twin, applied to a copy of the gallery, recompiled through the runner
    with the fixture's arguments (16 CPU devices as 2 hosts x 8): no non-batch-dim-sharding, no new warning."""
    import shutil

    from hlo_doctor.examples.registry import PROGRAMS
    from hlo_doctor.findings import Severity
    from hlo_doctor.runner import run_example

    report = analyze_dump(HF_FIXED, select=builtin_rule_ids())
    programs = tmp_path / "programs"
    shutil.copytree(PROGRAMS, programs, ignore=shutil.ignore_patterns("__pycache__"))
    script = programs / "hf_1d_params_torch_xla.py"
    assert report.program is not None
    result = plan_fixes(report.findings, program=report.program, path_map={report.program: str(script)})
    assert not result.refused and result.changed
    script.write_text(result.patched[str(script)])
    run = run_example("hf-1d-params-torch-xla", framework="torch_xla", variant="fixed", dump_dir=tmp_path / "dump",
                      script=script, timeout=600)
    after = analyze_dump(run.dump_dir, select=builtin_rule_ids())
    assert not after.errors, after.errors
    left = [f"{f.rule}: {f.message}" for f in after.findings if f.severity is not Severity.INFO]
    assert not left, left


def _record(program: Path) -> dict:
    linear, attention = "torch.nn.modules.linear.Linear", "transformers.models.llama.modeling_llama.LlamaAttention"
    modules = [{"path": "", "class": "LlamaForCausalLM"}, {"path": "model.layers", "class": "ModuleList"}]
    for i in (0, 1):
        modules += [{"path": f"model.layers.{i}", "class": "LlamaDecoderLayer"},
                    {"path": f"model.layers.{i}.self_attn", "class": attention},
                    {"path": f"model.layers.{i}.self_attn.o_proj", "class": linear}]
    return {"module_trees": [{"modules": modules, "stack": [{"file": str(program), "line": 3, "function": "main"}]}]}


def test_the_lever_loops_over_the_layers_only_when_each_has_the_finding(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    from hlo_doctor.program.module_hooks import forward_hook_lever

    program = tmp_path / "train.py"
    program.write_text("def main(net, mesh, x):\n    opt = 1\n    loss = net(x).loss\n")
    record = _record(program)
    both = {"model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"}
    dims = [("dp",), None]
    lever = forward_hook_lever(record, "model.layers.1.self_attn.o_proj", both, dims, 0)
    assert lever is not None and lever.line == (str(program), 3)
    [edit] = lever.edits
    assert edit.target == "model.layers.*.self_attn.o_proj" and edit.spec == (("dp",),)
    assert dict(edit.details) == {"position": "before", "model": "net", "module": "layer.self_attn.o_proj",
                                  "each": "net.model.layers", "loop": "layer"}
    assert "for layer in net.model.layers:\n    layer.self_attn.o_proj.register_forward_hook(shard_batch)" in lever.code

    one = forward_hook_lever(record, "model.layers.1.self_attn.o_proj", {"model.layers.1.self_attn.o_proj"}, dims, 0)
    assert one is not None and one.edits[0].target == "model.layers.1.self_attn.o_proj"
    assert one.edits[0].details["module"] == "net.model.layers[1].self_attn.o_proj" and "each" not in one.edits[0].details
    # not a leaf linear layer (its output is a tuple, its dot not its output), batch not dim 0, no such module
    assert forward_hook_lever(record, "model.layers.1.self_attn", both, dims, 0) is None
    assert forward_hook_lever(record, "model.layers.1.self_attn.o_proj", both, [None, ("dp",)], 1) is None
    assert forward_hook_lever(record, "model.layers.7.self_attn.o_proj", both, dims, 0) is None
