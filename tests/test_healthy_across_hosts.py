"""No warning on any healthy or fixed fixture, analyzed as 1 host, 2 hosts and (without TP) 4 hosts.

FSDP weight gathers and gradient reductions that cross hosts are the design, and
so are expert dispatch and pipeline sends. Tensor parallelism is the one thing
that must stay inside a host, so a program with tensor parallelism is analyzed
only at host sizes its TP groups fit in (a host size that splits a TP group
gives a real cross-host finding). The TP group size of each program is read
from its mesh in the gallery program (``TP_GROUP``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.rules.base import Severity
from hlo_doctor.testing import builtin_rule_ids

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BUILTIN = builtin_rule_ids()

# Example -> devices in one tensor-parallel group (its programs' meshes); absent: no TP.
TP_GROUP = {
    "cross-host-tp": 2,        # fixed: reshape(N/2, 2) as ('dp', 'tp')
    "transposed-mesh": 2,      # fixed: reshape(4, 2) as ('dp', 'tp')
    "llama-2d": 2,             # reshape(4, 2) as ('fsdp', 'tp')
    "uneven-padding": 8,       # vocab-parallel over all 8 devices, ('model',)
    "shard-map-megatron": 4,   # ('data'=2, 'model'=4), psum over 'model'
    "keras-layout-map": 4,     # Keras DeviceMesh((2, 4), ('batch', 'model'))
    "keras-model-axis-across-hosts": 4,  # fixed: DeviceMesh((2, 4), ('batch', 'model'))
}


def _healthy(folder: Path) -> bool:
    """A fixed or healthy program whose HLO is healthy (a compiler may still not honour a fix:
    jax 0.4.35's experimental Shardy gathers the constrained activation; its expected findings say so)."""
    if not folder.name.endswith(("-fixed", "-healthy")):
        return False
    expected = json.loads((folder / "expected_findings.json").read_text())
    return not expected["findings"]


def _cases():
    for record in sorted(FIXTURES.glob("*/*/hlo_doctor_run.json")):
        folder = record.parent
        if not _healthy(folder):
            continue
        devices = json.loads(record.read_text()).get("device_count") or 1
        example = folder.parent.name
        for hosts in (1, 2, 4):
            if devices % hosts or (hosts == 4 and example in TP_GROUP):
                continue
            per_host = devices // hosts
            if per_host < TP_GROUP.get(example, 1) or per_host % TP_GROUP.get(example, 1):
                continue
            yield pytest.param(folder, per_host, id=f"{example}/{folder.name}@{hosts}hosts")


CASES = list(_cases())


def test_every_healthy_fixture_is_covered():
    covered = {folder for folder, _ in (c.values for c in CASES)}
    healthy = {p.parent for p in FIXTURES.glob("*/*/hlo_doctor_run.json") if _healthy(p.parent)}
    assert covered == healthy and len(healthy) >= 35
    for record in FIXTURES.glob("*/*/hlo_doctor_run.json"):  # a fixed twin that is not healthy says why
        folder = record.parent
        if folder.name.endswith("-fixed") and not _healthy(folder):
            assert "compiler" in json.loads((folder / "expected_findings.json").read_text()).get("note", "")
    assert any(per_host * 4 <= 16 for _, per_host in (c.values for c in CASES))


@pytest.mark.parametrize(("folder", "devices_per_host"), CASES)
def test_no_warning_on_a_healthy_program(folder, devices_per_host):
    report = analyze_dump(folder, devices_per_host=devices_per_host, select=BUILTIN)
    warnings = [f"{f.rule} {f.instruction}: {f.message}" for f in report.findings
                if f.severity.rank <= Severity.WARNING.rank]
    assert warnings == []
