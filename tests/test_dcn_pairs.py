"""A collective between two TPU slices over 2-member groups (one device of each slice): no ring
splits it, each pair exchanges the whole tensor over DCN, and that is what it costs (issue 27).

On the real two-slice fixture (cross-host-tp, v5e:4x4 x 2 slices) the tensor-parallel all-reduce
pairs device d of slice 0 with device d of slice 1, and its MegaScale transfer in the optimized
module is that pair exchange.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.graph.collectives import find_collectives
from hlo_doctor.graph.devices import device_map
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.semantics.hardware import load_profile

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "cross-host-tp" / "jax-v5e_4x4x2slices-bad"


def test_the_cross_slice_pair_all_reduce_costs_the_whole_tensor_over_dcn():
    dump = load_dump(FOLDER)
    semantics = RuleContext(dump, dump.modules[0], AnalysisOptions()).semantics
    crossing = [r.facts for r in semantics.roles if r.facts.crosses_slow_boundary]
    assert crossing
    hardware = load_profile("tpu-v5e")
    assert hardware.inter_slice_bandwidth is not None
    for facts in crossing:
        op = facts.op
        assert op.group_size == 2 and all(len(g) == 2 for g in op.logical_groups)
        assert op.wire_bytes_per_device == op.bytes_in_per_device  # the whole tensor, not a ring's share
        seconds = semantics.cost(hardware).collective_seconds(facts)
        assert seconds == pytest.approx(op.bytes_in_per_device / hardware.inter_slice_bandwidth)


def test_the_megascale_pair_transfer_sends_the_whole_tensor():
    dump = load_dump(FOLDER)
    (module,) = dump.modules
    devices = device_map(module, dump.run_record)
    optimized = module.after_optimizations().module()
    (dcn,) = [c for c in find_collectives(optimized, devices) if c.op is not None and c.op.opcode == "send"]
    assert dcn.kind == "all-reduce" and dcn.group_size == 2
    assert all(devices.crosses_slow_boundary(g) for g in dcn.logical_groups)
    assert dcn.wire_bytes_per_device == dcn.bytes_in_per_device
