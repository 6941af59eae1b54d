"""What keeps big dumps in bounded memory: files never opened, parameter lines parsed alone,
attribute text read back from the module text, compressed graph rows."""

from __future__ import annotations

import builtins
import pathlib
import shutil
from pathlib import Path

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump
from hlo_doctor.dump.folder import Role
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.dataflow_graph import IdRows
from hlo_doctor.hlo import parse_module
from hlo_doctor.hlo.opcodes import OPCODE_STRINGS
from hlo_doctor.hlo.parser import parse_entry_parameters
from hlo_doctor.report.json import render_json
from hlo_doctor.rules import RuleContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "fsdp-activation-gather" / "jax-shardy-bad"


# The rules that read XLA's memory files (hlo-doctor memory's peak); the others never open them.
MEMORY_RULES = ("exceeds-device-memory", "gathered-weights-held", "replicated-optimizer-state")


def test_buffer_assignment_and_memory_reports_are_opened_only_by_the_memory_rules_with_a_target(tmp_path, monkeypatch):
    folder = tmp_path / "dump"
    shutil.copytree(FIXTURE, folder)
    reports = [folder / f"module_0000.jit_mlp.cpu_after_optimizations-{kind}.txt"
               for kind in ("buffer-assignment", "buffer-assignment-values", "memory-usage-report", "live-range")]
    for report in reports:
        report.write_text("BufferAssignment:\nallocation 0: size 4\n")
    # without drawings, as the CLI analyses for every format but HTML (whose memory picture reads them)
    expected = render_json(analyze_dump(FIXTURE, jobs=1, ignore=MEMORY_RULES, drawings=False))
    opened: list[str] = []
    real_open, real_read_bytes, real_read_text = builtins.open, pathlib.Path.read_bytes, pathlib.Path.read_text
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: opened.append(str(file)) or real_open(file, *a, **k))
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda self: opened.append(str(self)) or real_read_bytes(self))
    monkeypatch.setattr(pathlib.Path, "read_text",
                        lambda self, *a, **k: opened.append(str(self)) or real_read_text(self, *a, **k))
    report = analyze_dump(folder, jobs=1, ignore=MEMORY_RULES, drawings=False)
    assert opened and not [p for p in opened if any(str(r) == p for r in reports)]
    assert render_json(report).replace(str(folder), str(FIXTURE)) == expected
    analyze_dump(folder, jobs=1, select=MEMORY_RULES, drawings=False)  # a CPU dump with no target: nothing to measure
    assert not [p for p in opened if any(str(r) == p for r in reports)]
    analyze_dump(folder, jobs=1, select=MEMORY_RULES, hardware="h100", drawings=False)
    assert [p for p in opened if any(str(r) == p for r in reports)]  # the memory rules do read them
    opened.clear()
    analyze_dump(folder, jobs=1, ignore=MEMORY_RULES)  # with drawings: the HTML's memory picture reads them
    assert [p for p in opened if any(str(r) == p for r in reports)]


def test_entry_parameters_come_from_their_lines_alone():
    snapshot = load_dump(FIXTURE).modules[0].snapshot(Role.BEFORE_OPTIMIZATIONS)
    light = snapshot.entry_parameters()
    assert not snapshot.parsed  # the whole module was not parsed for them
    full = snapshot.module().entry.parameters()
    assert [(p.name, p.parameter_number, p.shape, p.metadata, p.sharding) for p in light] == \
        [(p.name, p.parameter_number, p.shape, p.metadata, p.sharding) for p in full]


def test_entry_parameters_of_a_module_without_an_entry_header():
    assert parse_entry_parameters("HloModule m\n\nc {\n  ROOT p = f32[] parameter(0)\n}\n") is None


def test_attributes_read_back_from_the_module_text_are_what_was_written():
    text = ("HloModule m\n\nENTRY e {\n  %p = f32[4]{0} parameter(0), sharding={devices=[2]<=[2]}  \r\n"
            '  ROOT %n = f32[4]{0} negate(%p), metadata={op_name="x"}\n}\n')
    module = parse_module(text)
    p, n = module.entry.instructions
    assert isinstance(p.raw_attributes, int)  # no copy of the text: where it starts
    assert p.attributes == (("sharding", "{devices=[2]<=[2]}"),)
    assert p.attribute("sharding") == "{devices=[2]<=[2]}" and p.attribute("metadata") is None
    assert n.attributes == (("metadata", '{op_name="x"}'),) and n.metadata.op_name == "x"
    assert n.operands[0] is p.name  # the defining instruction's own string
    assert n.opcode is OPCODE_STRINGS["negate"]  # the one string object of that opcode


def test_graph_rows_are_the_operands_and_users():
    module = load_dump(FIXTURE).modules[0].partitioned().module()
    graph = build_graph(module)
    for node, instruction in enumerate(graph.instruction_at):
        local = graph.computation_ids(graph.keys[node][0])
        assert graph.operand_ids[node] == tuple(local.get(o, -1) for o in instruction.operands)
        for user in graph.user_ids[node]:
            assert instruction.name in graph.instruction_at[user].operands
    assert len(graph.operand_ids) == len(graph.instruction_at) == len(list(graph.user_ids))


def test_id_rows():
    rows = IdRows([(1, 2), (), (3,)])
    assert len(rows) == 3 and rows[0] == (1, 2) and rows[1] == () and rows[-1] == (3,)
    assert list(rows) == [(1, 2), (), (3,)]


def test_equal_parameter_bitsets_are_one_object():
    """A deep network's nodes derive from the same growing sets of parameters: one int each."""
    module = load_dump(FIXTURES / "llama-fsdp" / "jax-shardy-healthy").modules[0].partitioned().module()
    graph = build_graph(module)
    bits = [graph.parameter_bits(node) for node in range(len(graph))
            if graph.instruction_at[node].opcode != "tuple" and not graph.instruction_at[node].shape.is_tuple]
    assert len({id(b) for b in bits if b > 256}) == len({b for b in bits if b > 256}) > 1


def test_collective_roles_share_their_parameter_tuples():
    """Operands that derive from the same parameters hold one tuple of them, not a copy each."""
    dump = load_dump(FIXTURES / "hf-1d-params-torch-xla" / "torch_xla-bad")
    ctx = RuleContext(dump, dump.modules[0])
    tuples = [o.parameters for role in ctx.semantics.roles for o in role.operands if len(o.parameters) > 1]
    assert len({id(t) for t in tuples}) == len(set(tuples)) < len(tuples)


def test_node_keys_are_made_when_read():
    """graph.keys holds no tuple per node; each key read is the computation's and the name."""
    module = load_dump(FIXTURE).modules[0].partitioned().module()
    graph = build_graph(module)
    expected = [(c.name, i.name) for c in module.computations for i in c.instructions]
    keys = graph.keys
    assert len(keys) == len(expected) and list(keys) == expected
    assert [keys[n] for n in range(len(keys))] == expected and keys[-1] == expected[-1]
    assert keys[2:5] == expected[2:5]
    assert all(graph.id_of(key) == node for node, key in enumerate(keys))
