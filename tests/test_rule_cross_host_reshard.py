"""cross-host-tensor-parallel and reshard-churn on the real fixtures, with exact evidence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from tests.conftest import program_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TP = "cross-host-tensor-parallel"
CHURN = "reshard-churn"


def _findings(folder: str, rule: str, **options):
    report = analyze_dump(FIXTURES / folder, select=[rule], **options)
    assert not report.errors, report.errors
    return report, [f for f in report.findings if f.rule == rule]


# -- cross-host-tensor-parallel ---------------------------------------------


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_tp_all_reduce_across_hosts(partitioner):
    _, found = _findings(f"cross-host-tp/jax-{partitioner}-bad", TP)
    assert len(found) == 1
    finding = found[0]
    assert finding.instruction == "all-reduce"
    assert finding.source is not None and finding.source.line == program_line("cross_host_tp.py", "return jax.nn.relu(x @ w1) @ w2")
    assert finding.source.file.endswith("cross_host_tp.py")
    ev = finding.evidence
    assert ev["kind"] == "all-reduce"
    assert ev["mesh_axes"] == ["tp"]
    assert ev["data_parallel_axes"] == ["dp"]
    assert ev["physical_groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert ev["crossing_groups"] == 4
    assert ev["hosts"] == [0, 1]
    assert ev["devices_per_host"] == 4
    assert ev["bytes_per_device"] == 16 * 512 * 4
    assert ev["wire_bytes_per_device"] == 32768  # 2(n-1)/n with n = 2
    assert "{0,4}" in finding.message and "'tp'" in finding.message
    suggestion = finding.suggestion
    assert suggestion is not None
    # the program's own construction (line 38), its axes and reshape permuted: 'tp' last
    assert suggestion.jax is not None and suggestion.jax.startswith("mesh = Mesh(devices.reshape(n // 2, 2), ('dp', 'tp'))")
    assert "create_hybrid_device_mesh((2, 2), (2, 1))" in suggestion.jax
    assert suggestion.torch_xla == (
        "mesh = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1), axis_names=('dp', 'tp'))"
    )


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_tp_inside_a_host_is_silent(partitioner):
    _, found = _findings(f"cross-host-tp/jax-{partitioner}-fixed", TP)
    assert found == []


def test_host_size_decides():
    # one host of 8: the bad mesh's TP groups stay inside it
    _, found = _findings("cross-host-tp/jax-shardy-bad", TP, devices_per_host=8)
    assert found == []
    # one device per host: even the fixed mesh's TP pairs {0,1} cross hosts
    _, found = _findings("cross-host-tp/jax-shardy-fixed", TP, devices_per_host=1)
    assert [f.instruction for f in found] == ["all-reduce"]
    assert found[0].evidence["physical_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert found[0].evidence["hosts"] == [0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("partitioner", ["shardy", "gspmd"])
def test_transposed_mesh_crosses_hosts_physically(partitioner):
    # logical TP groups {0,1},... look local; the device assignment
    # [0,4,1,5,2,6,3,7] puts each pair on two hosts
    _, found = _findings(f"transposed-mesh/jax-{partitioner}-bad", TP)
    assert len(found) == 1
    ev = found[0].evidence
    assert ev["device_assignment"] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert ev["physical_groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert ev["hosts"] == [0, 1]
    assert found[0].source is not None and found[0].source.line == program_line("transposed_mesh.py", "return jax.nn.relu(x @ w1) @ w2")
    assert "not in host order" in found[0].suggestion.summary
    _, fixed = _findings(f"transposed-mesh/jax-{partitioner}-fixed", TP)
    assert fixed == []


def test_fsdp_and_gradient_traffic_across_hosts_is_silent():
    # 16 devices on 2 hosts, FSDP over all of them: weight all-gathers and
    # gradient all-reduces cross hosts by design
    folder = FIXTURES / "sync-collective" / "jax-h100_2x8-bad"
    if not folder.exists():
        pytest.skip("GPU fixture not generated")
    report, found = _findings("sync-collective/jax-h100_2x8-bad", TP)
    assert found == []
    assert not [s for s in report.skipped if s.rule == TP]


def test_gpu_hosts_from_the_record():
    folder = FIXTURES / "cross-host-tp" / "jax-h100_2x8-bad"
    if not folder.exists():
        pytest.skip("GPU fixture not generated")
    _, found = _findings("cross-host-tp/jax-h100_2x8-bad", TP)
    assert len(found) == 1
    ev = found[0].evidence
    assert ev["devices_per_host"] == 8
    assert ev["physical_groups"][:2] == [[0, 8], [1, 9]]
    assert ev["hosts"] == [0, 1]
    assert found[0].suggestion.jax.startswith("mesh = Mesh(devices.reshape(n // 2, 2), ('dp', 'tp'))")
    assert "create_hybrid_device_mesh((4, 2), (2, 1))" in found[0].suggestion.jax


def test_no_host_layout_skips():
    report, found = _findings("fsdp-activation-gather/torch_xla-bad", TP)
    assert found == []
    reasons = [s.reason for s in report.skipped if s.rule == TP]
    assert len(reasons) == 1 and "--devices-per-host" in reasons[0]


@pytest.mark.parametrize(
    "folder",
    ["llama-fsdp/jax-shardy-healthy", "llama-2d/jax-shardy-healthy", "llama-scan/jax-shardy-healthy",
     "train-step/jax-shardy-healthy"],
)
def test_healthy_models_silent_even_across_hosts(folder):
    # two devices per host: FSDP gathers and gradient reductions cross hosts; still silent
    # (llama-2d's TP pairs {0,1},{2,3}... stay inside a host of 2)
    _, found = _findings(folder, TP, devices_per_host=2)
    assert found == []


def test_llama_2d_tp_all_reduces_across_hosts():
    # one device per host: llama-2d's four TP all-reduces of activations cross hosts; its FSDP gathers do not count
    _, found = _findings("llama-2d/jax-shardy-healthy", TP, devices_per_host=1)
    assert len(found) == 1
    finding = found[0]
    assert finding.evidence["mesh_axes"] == ["tp"]
    assert finding.evidence["collectives"] == 4
    assert {finding.instruction, *finding.related} == {"all-reduce", "all-reduce.1", "all-reduce.2", "all-reduce.3"}


# -- reshard-churn ------------------------------------------------------------


def test_back_and_forth_all_to_all_chain():
    _, found = _findings("reshard-churn/jax-shardy-bad", CHURN)
    assert len(found) == 1
    finding = found[0]
    assert finding.instruction == "all-to-all"
    assert set(finding.related) == {"all-to-all.1", "all-to-all.2", "all-to-all.3", "all-gather", "all-gather.1"}
    assert finding.source is not None and finding.source.line == 42  # the with_sharding_constraint
    ev = finding.evidence
    assert ev["pattern"] == "back-and-forth"
    assert ev["reshards"] == 4
    assert ev["layouts_per_device"] == [[64, 256], [256, 64], [64, 256], [256, 64], [64, 256]]
    # each all-to-all: 64 KiB in, (n-1)/n of it sent with n = 4
    assert ev["reshard_bytes_per_device"] == 4 * 49152
    # each all-gather: 256 KiB out, 3/4 of it received
    assert ev["extra_all_gathers"] == 2
    assert ev["all_gather_bytes_per_device"] == 2 * 196608
    assert ev["wasted_bytes_per_device"] == 589824
    assert ev["mesh_axes"] == ["x"]
    assert finding.suggestion.jax.endswith("NamedSharding(mesh, P('x', None)))")
    assert finding.suggestion.torch_xla == "xs.mark_sharding(x, mesh, ('x', None))"


@pytest.mark.parametrize("folder", ["constraint-chain/jax-shardy-bad", "constraint-chain/jax-gspmd-bad"])
def test_constraints_in_turn_are_one_chain_with_the_layout_to_keep(folder):
    # lines 47-50 constrain one value, through the program's helper `constrain` (line 39), to the rows,
    # the sequence, the features and the sequence in turn: the reshards between them (and the gradient's
    # back through the same constraints) are one finding at the first constraint's caller line
    _, found = _findings(folder, CHURN)
    assert len(found) == 1
    finding = found[0]
    ev = finding.evidence
    assert ev["pattern"] == "conflicting-constraints"
    assert ev["constraint_lines"] == [48, 49, 50]
    assert finding.source is not None and finding.source.line == 47
    assert ev["helper_line"].endswith("constraint_chain.py:39 (main.<locals>.constrain)")
    # per device on 4 devices: rows [4,64,256], the sequence [16,16,256], the features [16,64,64]
    assert ev["layouts_per_device"][:4] == [[4, 64, 256], [16, 16, 256], [16, 64, 64], [16, 16, 256]]
    assert "lines 48, 49 and 50" in finding.message
    # the layout to keep is the first constraint's (the batch split), never one the others ask for
    assert finding.suggestion.jax.endswith("h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P('data', None, None)))")
    # every all-to-all of the step is this one cause's (the fixed twin has none)
    text = next((FIXTURES / folder).glob("*after_spmd-partitioning*.txt")).read_text()
    all_to_alls = set(re.findall(r"%(all-to-all(?:\.\d+)?) = ", text))
    assert len(all_to_alls) > 3 and all_to_alls <= {finding.instruction, *finding.related}


@pytest.mark.parametrize(
    "folder",
    ["reshard-churn/jax-shardy-fixed", "constraint-chain/jax-shardy-fixed", "constraint-chain/jax-gspmd-fixed", "non-batch-dim-sharding/jax-shardy-bad", "fsdp-activation-gather/jax-shardy-bad",
     "llama-2d/jax-shardy-healthy", "llama-scan/jax-shardy-healthy", "train-step/jax-shardy-healthy",
     "replicated-large-param/jax-shardy-fixed"],
)
def test_churn_silent(folder):
    # a single reshard (or a gather of a weight, or one of an activation) is not churn
    _, found = _findings(folder, CHURN)
    assert found == []


_REMAT = """\
HloModule jit_f, entry_computation_layout={(f32[16,64]{1,0})->f32[64,16]{1,0}}, num_partitions=4

ENTRY %main.0_spmd (param: f32[16,64]) -> f32[64,16] {
  %param = f32[16,64]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %all-gather = f32[64,64]{1,0} all-gather(%param), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %constant = s32[] constant(0)
  %constant.1 = s32[4]{0} constant({0, 16, 32, 48})
  %partition-id = u32[] partition-id()
  %dynamic-slice = s32[1]{0} dynamic-slice(%constant.1, %partition-id), dynamic_slice_sizes={1}
  %reshape = s32[] reshape(%dynamic-slice)
  ROOT %dynamic-slice.1 = f32[64,16]{1,0} dynamic-slice(%all-gather, %constant, %reshape), dynamic_slice_sizes={64,16}
}
"""


def test_a_lone_full_rematerialization_is_one_reshard_not_churn(tmp_path):
    # The shape of XLA's fallback reshard (rows -> columns through the full value), written by hand:
    # one reshard between two layouts. The data it moves is needed (only its bytes past an
    # all-to-all's are waste), so it is no churn finding; the analysis layer still reads it as a reshard.
    name = "module_0000.jit_f.0001.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter.txt"
    (tmp_path / name).write_text(_REMAT)
    report = analyze_dump(tmp_path, select=[CHURN])
    assert [f for f in report.findings if f.rule == CHURN] == []
    dump = load_dump(tmp_path)
    roles = {r.facts.instruction: (r.role, r.facts.sliced_by)
             for r in RuleContext(dump, dump.modules[0], AnalysisOptions()).semantics.roles}
    assert roles == {"all-gather": ("reshard", "dynamic-slice.1")}


def test_traffic_that_crosses_hosts_only_through_its_batch_axes_is_not_tensor_parallelism():
    # Hand-built mesh and hosts (no HLO): 16 devices as ('fsdp'=8, 'tp'=2), tp minor, two hosts
    # of 8. An activation all-reduce over both axes crosses hosts, but only through 'fsdp':
    # every 'tp' pair stays inside a host, so laying 'tp' inside a host (this rule's fix) is done.
    # With 'tp' major, its pairs cross hosts and the traffic is tensor-parallel across hosts.
    from types import SimpleNamespace

    from hlo_doctor.graph.devices import DeviceMap
    from hlo_doctor.graph.mesh_model import Mesh
    from hlo_doctor.rules.builtin.cross_host_tensor_parallel import _only_data_parallel_axes_cross

    hosts = DeviceMap(tuple(range(16)), devices_per_host=8, host_of={d: d // 8 for d in range(16)})
    minor = SimpleNamespace(mesh=Mesh(("fsdp", "tp"), (8, 2), tuple(range(16)), "test"), device_map=hosts)
    major = SimpleNamespace(mesh=Mesh(("tp", "fsdp"), (2, 8), tuple(range(16)), "test"), device_map=hosts)
    data_parallel = frozenset({"fsdp"})
    assert _only_data_parallel_axes_cross(minor, ("fsdp", "tp"), data_parallel)
    assert not _only_data_parallel_axes_cross(major, ("tp", "fsdp"), data_parallel)
    # nothing to decide: no data-parallel axis among them, or only data-parallel ones
    assert not _only_data_parallel_axes_cross(minor, ("tp",), data_parallel)
    assert not _only_data_parallel_axes_cross(minor, ("fsdp",), data_parallel)


_PADDED_CHURN = """\
HloModule jit_f, entry_computation_layout={(f32[2,3]{1,0})->f32[2,4]{1,0}}, num_partitions=2

ENTRY %main.0_spmd (param: f32[2,3]) -> f32[2,4] {
  %param = f32[2,3]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  %zero = f32[] constant(0)
  %pad = f32[2,4]{1,0} pad(%param, %zero), padding=0_0x0_1
  %reshape = f32[2,2,2]{2,1,0} reshape(%pad)
  %all-to-all = f32[2,2,2]{2,1,0} all-to-all(%reshape), channel_id=1, replica_groups={{0,1}}, dimensions={1}
  %reshape.1 = f32[4,2]{1,0} reshape(%all-to-all)
  %slice = f32[4,2]{1,0} slice(%reshape.1), slice={[0:4], [0:2]}
  %negate = f32[4,2]{1,0} negate(%slice)
  %pad.1 = f32[4,2]{1,0} pad(%negate, %zero), padding=0_0x0_0
  %reshape.2 = f32[2,2,2]{2,1,0} reshape(%pad.1)
  %all-to-all.1 = f32[2,2,2]{2,1,0} all-to-all(%reshape.2), channel_id=2, replica_groups={{0,1}}, dimensions={1}
  ROOT %reshape.3 = f32[2,4]{1,0} reshape(%all-to-all.1)
}
"""


@pytest.mark.parametrize(("cut", "churn"), [("[0:4], [0:2]", True), ("[1:4], [0:2]", False)])
def test_churn_through_the_padding_of_an_uneven_dim(tmp_path, cut, churn):
    # Written by hand, in the shape torch_xla's conflicting marks take when a dim does not divide
    # its shards (a corpus program: seq 8 over 16 devices): between the two all-to-alls the
    # partitioner drops the padding (a slice of each dim's head) and adds it back (a pad at the
    # end). Those keep the value; a slice that drops a row does not, and ends the chain.
    name = "module_0000.jit_f.0001.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter.txt"
    (tmp_path / name).write_text(_PADDED_CHURN.replace("[0:4], [0:2]", cut))
    found = [f for f in analyze_dump(tmp_path, select=[CHURN]).findings if f.rule == CHURN]
    assert len(found) == int(churn)
    if churn:
        assert found[0].instruction == "all-to-all" and found[0].related == ("all-to-all.1",)
        assert "the padding of a dim the shards do not divide" in found[0].message


# Hand-written HLO: the value a back-and-forth reshards is made at one line of a program (a scale,
# line 2) and resharded at another (line 3), whose metadata XLA gives the inserted all-to-alls.
_PROGRAM = "def step(x, w):\n    y = x * 2.0\n    h = y @ w\n    return h\n"
_REMAT_LINES = """\
HloModule jit_step, entry_computation_layout={(f32[64,64]{1,0})->f32[64,64]{1,0}}, num_partitions=2

ENTRY %main.0_spmd (param: f32[64,64]) -> f32[64,64] {
  %param = f32[64,64]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}, metadata={op_name="x"}
  %two = f32[] constant(2)
  %b = f32[64,64]{1,0} broadcast(%two), dimensions={}
  %y = f32[64,64]{1,0} multiply(%param, %b), metadata={op_name="jit(step)/mul" source_file="PROGRAM" source_line=2}
  %reshape = f32[64,2,32]{2,1,0} reshape(%y)
  %all-to-all = f32[64,2,32]{2,1,0} all-to-all(%reshape), channel_id=1, replica_groups={{0,1}}, dimensions={1}, metadata={op_name="jit(step)/dot_general" source_file="PROGRAM" source_line=3}
  %reshape.1 = f32[128,32]{1,0} reshape(%all-to-all)
  %negate = f32[128,32]{1,0} negate(%reshape.1)
  %reshape.2 = f32[64,2,32]{2,1,0} reshape(%negate)
  %all-to-all.1 = f32[64,2,32]{2,1,0} all-to-all(%reshape.2), channel_id=2, replica_groups={{0,1}}, dimensions={1}, metadata={op_name="jit(step)/dot_general" source_file="PROGRAM" source_line=3}
  ROOT %reshape.3 = f32[64,64]{1,0} reshape(%all-to-all.1)
}
"""


@pytest.mark.parametrize("value_has_a_line", [True, False])
def test_the_fix_constrains_the_value_at_the_line_that_makes_it(tmp_path, value_has_a_line):
    program = tmp_path / "prog.py"
    program.write_text(_PROGRAM)
    text = _REMAT_LINES.replace("PROGRAM", str(program))
    if not value_has_a_line:  # the scale's op carries no line: the consumer's line names another value
        text = text.replace(', metadata={op_name="jit(step)/mul" source_file="' + str(program) + '" source_line=2}', "")
    name = "module_0000.jit_step.0001.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter.txt"
    (tmp_path / name).write_text(text)
    (finding,) = [f for f in analyze_dump(tmp_path, select=[CHURN]).findings if f.rule == CHURN]
    assert finding.evidence["value_line"] is value_has_a_line
    if value_has_a_line:
        assert finding.source.line == 2 and finding.suggestion.jax.splitlines()[-1].startswith(
            "y = jax.lax.with_sharding_constraint(y, ")
    else:
        # never h (line 3 assigns the matmul's output, not the resharded value): a visible placeholder
        assert finding.source.line == 3 and "(<value>, " in finding.suggestion.jax
        assert "h = " not in finding.suggestion.jax and "no line of your code is recorded" in finding.suggestion.summary


def test_marks_in_turn_are_one_chain_in_torch_xla():
    # torch_xla: a mark on each new value, through the program's helper; the mark's own frame is
    # torch_xla's, so each line is its reshard's (the statement whose op takes the new layout)
    _, found = _findings("constraint-chain/torch_xla-bad", CHURN)
    assert len(found) == 1
    finding = found[0]
    assert finding.evidence["pattern"] == "conflicting-constraints"
    assert finding.evidence["constraint_lines"] == [51, 52, 53]
    assert finding.evidence["layouts_per_device"] == [[4, 64, 256], [16, 16, 256], [16, 64, 64], [16, 16, 256]]
    assert finding.suggestion.torch_xla == "xs.mark_sharding(h, self.mesh, ('data', None, None))"
    # the second block gathering the sequence-split value back is this cause's symptom
    report = analyze_dump(FIXTURES / "constraint-chain" / "torch_xla-bad")
    (churn,) = [f for f in report.findings if f.rule == CHURN]
    assert [f.rule for f in report.findings] == [CHURN]
    assert {s["instruction"] for s in churn.evidence["symptoms"]} == {"all-gather", "all-gather.1"}


# Hand-written HLO: a data-parallel step (batch 8 over 2 devices, 4 rows each) whose value is flipped
# to another layout and back by two all-to-alls with only an elementwise op between. ROWS makes that
# value: from the device's own rows, or from all 8 rows gathered (the batch lost there).
_FLIP_ON_ROWS = """\
HloModule jit_step, entry_computation_layout={(f32[64,32]{1,0}, f32[8,64]{1,0})->(f32[64,32]{1,0}, f32[8,64]{1,0})}, num_partitions=2

ENTRY %main.0_spmd (w: f32[64,32], x: f32[4,64]) -> (f32[64,32], f32[8,64]) {
  %w = f32[64,32]{1,0} parameter(0), sharding={replicated}, metadata={op_name="params['w']"}
  %x = f32[4,64]{1,0} parameter(1), sharding={devices=[2,1]<=[2]}, metadata={op_name="batch['x']"}
  ROWS
  %reshape = f32[R,2,32]{2,1,0} reshape(%v)
  %all-to-all = f32[R,2,32]{2,1,0} all-to-all(%reshape), channel_id=1, replica_groups={{0,1}}, dimensions={1}
  %reshape.1 = f32[R2,32]{1,0} reshape(%all-to-all)
  %negate = f32[R2,32]{1,0} negate(%reshape.1)
  %reshape.2 = f32[R,2,32]{2,1,0} reshape(%negate)
  %all-to-all.1 = f32[R,2,32]{2,1,0} all-to-all(%reshape.2), channel_id=2, replica_groups={{0,1}}, dimensions={1}
  %h = f32[R,64]{1,0} reshape(%all-to-all.1)
  %d = f32[R,32]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g = f32[64,32]{1,0} dot(%h, %d), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %lr = f32[] constant(0.1)
  %lrb = f32[64,32]{1,0} broadcast(%lr), dimensions={}
  %step = f32[64,32]{1,0} multiply(%g, %lrb)
  %new = f32[64,32]{1,0} subtract(%w, %step)
  ROOT %out = (f32[64,32]{1,0}, f32[R,64]{1,0}) tuple(%new, %h)
}
"""


@pytest.mark.parametrize("gathered", [False, True])
def test_the_partitioners_flips_of_repeated_rows_are_the_lost_batchs_symptom(tmp_path, gathered):
    rows, value = (8, "%v = f32[8,64]{1,0} all-gather(%x), channel_id=3, replica_groups={{0,1}}, dimensions={0}, "
                      "use_global_device_ids=true") if gathered else (4, "%v = f32[4,64]{1,0} negate(%x)")
    text = (_FLIP_ON_ROWS.replace("ROWS", value).replace("R2", str(2 * rows)).replace("[R,", f"[{rows},")
            .replace("f32[R,64]", f"f32[{rows},64]"))
    name = "module_0000.jit_step.0001.spmd-partitioner.after_spmd-partitioning.before_control-dep-rewriter.txt"
    (tmp_path / name).write_text(text)
    findings = analyze_dump(tmp_path, select=[CHURN, "activation-all-gather"]).findings
    if not gathered:  # the device's own rows flipped and back: churn
        assert [(f.rule, f.instruction) for f in findings] == [(CHURN, "all-to-all")]
    else:  # the flips hold all 8 rows: the gather that lost the batch is the finding, not them
        assert [(f.rule, f.instruction) for f in findings] == [("activation-all-gather", "v")]
