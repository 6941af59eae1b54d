"""The runner's module paths in torch_xla op_names (``model.layers.0.self_attn.o_proj/aten__mm``):
read back as the op's module, ignored where the op's own name is meant."""

from __future__ import annotations

import dataclasses

import pytest

from hlo_doctor.analysis import _ignored_op
from hlo_doctor.findings import Finding, Severity, SourceEdit, Suggestion
from hlo_doctor.graph.source import module_path_of, split_module_path
from hlo_doctor.hlo import parse_module
from hlo_doctor.rules.engine import merge_outcomes

_HLO = """HloModule SyncTensorsGraph.9

ENTRY %main (p0.1: f32[4,8], p1.2: f32[8,8]) -> f32[4,8] {
  %p0.1 = f32[4,8]{1,0} parameter(0), metadata={op_type="xla__device_data" op_name="model.layers.0.q_proj/xla__device_data"}
  %p1.2 = f32[8,8]{1,0} parameter(1), metadata={op_type="xla__device_data" op_name="xla__device_data"}
  %dot.3 = f32[4,8]{1,0} dot(%p0.1, %p1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_type="aten__mm" op_name="model.layers.0.self_attn.o_proj/aten__mm" source_file="/x/site-packages/torch/nn/modules/linear.py" source_line=134}
  %add.4 = f32[4,8]{1,0} add(%dot.3, %dot.3), metadata={op_type="aten__add" op_name="aten__add.14/aten__add"}
  ROOT %multiply.5 = f32[4,8]{1,0} multiply(%add.4, %add.4), metadata={op_type="aten__mul" op_name="model.norm/aten__add.3/aten__add"}
}
"""


@pytest.mark.parametrize(("op_name", "expected"), [
    ("model.layers.0.self_attn.o_proj/aten__mm", ("model.layers.0.self_attn.o_proj", "aten__mm")),
    ("model.norm/aten__add.3/aten__add", ("model.norm", "aten__add.3/aten__add")),
    ("aten__add.14/aten__add", (None, "aten__add.14/aten__add")),  # torch_xla's own scope
    ("aten__mm", (None, "aten__mm")),
    ("jit(step)/dot_general", (None, "jit(step)/dot_general")),  # JAX
    ("jit(step)/xla__fake", (None, "jit(step)/xla__fake")),  # not a module path: a JAX name
    (None, (None, "")),
])
def test_split_module_path(op_name, expected):
    assert split_module_path(op_name) == expected


def test_module_path_of_an_op_and_not_of_a_parameter():
    module = parse_module(_HLO)
    ops = {i.name: i for i in module.entry.instructions}
    assert module_path_of(ops["dot.3"]) == "model.layers.0.self_attn.o_proj"
    assert module_path_of(ops["add.4"]) is None
    assert module_path_of(ops["multiply.5"]) == "model.norm"
    # a parameter takes the path of the first module torch_xla lowers that reads it: not its own
    assert module_path_of(ops["p0.1"]) is None


def test_ignore_ops_matches_the_op_name_with_or_without_its_module_path():
    op_name = "model.layers.0.mlp.down_proj/aten__mm"
    assert _ignored_op(op_name, ("aten__mm",))
    assert _ignored_op(op_name, ("model.layers.*/aten__mm",))
    assert not _ignored_op(op_name, ("aten__addmm",))
    assert not _ignored_op("jit(step)/dot_general", ("dot_general",))


def _finding(rule: str, instruction: str, related: tuple[str, ...] = (), edits=()) -> Finding:
    return Finding(rule=rule, severity=Severity.WARNING, module="m", message=f"{rule} {instruction}",
                   instruction=instruction, related=related,
                   suggestion=Suggestion("fix", edits=edits) if edits else None)


def test_a_symptom_of_an_op_folded_for_the_same_fix_folds_into_that_finding():
    """Layer 0's and layer 1's o_proj share one forward-hook edit: the all-gather before layer 1's
    dot is a symptom of the one finding, as the all-gather before layer 0's is."""
    edit = SourceEdit("forward-hook", "torch_xla", target="model", spec=(("dp",),), file="t.py", line=9,
                      details={"path": "model.layers.*.o_proj"})
    layer0 = _finding("non-batch-dim-sharding", "dot.6", ("dot.219",), (edit,))
    layer1 = _finding("non-batch-dim-sharding", "dot.15", ("dot.393",), (dataclasses.replace(edit),))
    gathers = [_finding("activation-all-gather", "all-gather.6", ("dot.6",)),
               _finding("activation-all-gather", "all-gather.15", ("dot.15",))]
    findings, _ = merge_outcomes([([layer0, layer1], None), (gathers, None)],
                                 ranks={"non-batch-dim-sharding": 20, "activation-all-gather": 30})
    [kept] = findings
    assert kept.instruction == "dot.6"
    assert [s["instruction"] for s in kept.evidence["same_fix"]] == ["dot.15"]
    assert [s["instruction"] for s in kept.evidence["symptoms"]] == ["all-gather.6", "all-gather.15"]


# -- torch_xla parameters: every one is xla__device_data; named by the runner's module path ----------

_PARAMETERS = """HloModule SyncTensorsGraph.12

ENTRY %main (p0.1: s64[4,8], p1.2: f32[8,8], p2.3: f32[8], p3.4: f32[8], p4.5: f32[2,8], p5.6: f32[2,8]) -> s64[4,8] {
  %p0.1 = s64[4,8]{1,0} parameter(0), metadata={op_type="xla__device_data" op_name="model.embed/xla__device_data"}
  %p1.2 = f32[8,8]{1,0} parameter(1), metadata={op_type="xla__device_data" op_name="model.layers.0.q_proj/xla__device_data"}
  %p2.3 = f32[8]{0} parameter(2), metadata={op_type="xla__device_data" op_name="model.layers.0.norm/xla__device_data"}
  %p3.4 = f32[8]{0} parameter(3), metadata={op_type="xla__device_data" op_name="model.layers.0.norm/xla__device_data"}
  %p4.5 = f32[2,8]{1,0} parameter(4), metadata={op_type="xla__device_data" op_name="model.head/xla__device_data"}
  %p5.6 = f32[2,8]{1,0} parameter(5), metadata={op_type="xla__device_data" op_name="xla__device_data"}
  ROOT %copy.7 = s64[4,8]{1,0} copy(%p0.1)
}
"""
_RECORD = {"module_trees": [{"module_class": "Model", "modules": [], "parameters": [
    {"path": "model.embed.weight", "shape": [16, 8], "dtype": "torch.float32"},
    {"path": "model.layers.0.q_proj.weight", "shape": [8, 8], "dtype": "torch.float32"},
    {"path": "model.layers.0.q_proj.bias", "shape": [8], "dtype": "torch.float32"},
    {"path": "model.layers.0.norm.weight", "shape": [8], "dtype": "torch.float32"},
    {"path": "model.head.weight", "shape": [2, 8], "dtype": "torch.bfloat16"},
]}]}


def test_torch_parameters_are_named_by_the_recorded_module_path_else_number_and_shape():
    """Hand-written HLO: a path only for one recorded parameter of the module that first reads it, with
    its shape and dtype, claimed by one entry parameter; otherwise the parameter's name and shape."""
    from hlo_doctor.semantics.parameters import torch_parameter_names

    params = parse_module(_PARAMETERS).entry.parameters()
    assert torch_parameter_names(params, _RECORD) == {
        0: "p0.1 s64[4,8]",  # no recorded s64 parameter of model.embed
        1: "model.layers.0.q_proj.weight",  # the bias is f32[8], not f32[8,8]
        2: "p2.3 f32[8]",  # two entry parameters match model.layers.0.norm.weight: neither is named
        3: "p3.4 f32[8]",
        4: "p4.5 f32[2,8]",  # recorded as bf16
        5: "p5.6 f32[2,8]",  # read first by no module
    }
    assert torch_parameter_names(params, _RECORD, exclude=frozenset({1}))[1] == "p1.2 f32[8,8]"  # data
    assert torch_parameter_names(params, None)[1] == "p1.2 f32[8,8]"  # no runner record


def test_the_seeds_torch_parameters_are_named_in_collectives_findings_and_show():
    """The seed's 1-D strategy under torch_xla (the runner recorded the model's parameters)."""
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from hlo_doctor.cli import main

    dump = str(Path(__file__).resolve().parents[1] / "fixtures" / "hf-1d-params-torch-xla" / "torch_xla-bad")
    inventory = json.loads(CliRunner().invoke(main, ["collectives", dump, "--format", "json"]).stdout)
    rows = inventory["modules"][0]["collectives"]
    named = {name for row in rows for name in row["parameters"]}
    assert not any("xla__device_data" in name for name in named)
    assert not any("xla__device_data" in row["reason"] for row in rows)
    # the 21 weights by their module paths; the token ids (data) by number and shape
    assert {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight", "model.norm.weight",
            "p0.1 s64[16,16]"} <= named
    assert len({name for name in named if name.endswith(".weight")}) == 21

    result = CliRunner().invoke(main, ["analyze", dump, "--format", "json"])
    [finding] = json.loads(result.stdout)["findings"]
    messages = " ".join(s["message"] for s in finding["evidence"]["symptoms"])
    assert "gathering the weight model.layers.0.self_attn.q_proj.weight instead" in messages
    assert "xla__device_data" not in messages and "the batch input p0.1 (s64[16,16])" in finding["message"]

    shown = json.loads(CliRunner().invoke(main, ["show", dump, "--format", "json"]).stdout)
    ops = {row["op"]: row for row in shown[0]["ops"]}
    assert ops["p17.163"]["parameter"] == "model.layers.0.self_attn.q_proj.weight"
    assert ops["p0.1"]["parameter"] is None
    found = json.loads(CliRunner().invoke(main, ["show", dump, "--op", "model.layers.0.self_attn.q_proj.weight",
                                                 "--format", "json"]).stdout)
    assert found["instruction"] == "p17.163"
