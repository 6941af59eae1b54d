"""Tests for hlo_doctor.graph.collectives.

Real dumps for the synchronous forms (the CPU backend never makes collectives
async); hand-written modules in GPU's printed syntax for the start/done and
async-wrapped forms and for XLA's group modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.graph.collectives import (
    Form,
    GroupMode,
    find_collectives,
    group_mode,
    participant_groups,
)
from hlo_doctor.graph.devices import DeviceMap, device_map
from hlo_doctor.graph.mesh import Mesh, recover_mesh
from hlo_doctor.hlo import parse_module
from tests.conftest import program_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _collectives(case: str, snapshot: str = "after_optimizations", **kwargs: object):  # type: ignore[no-untyped-def]
    dump = load_dump(FIXTURES / case)
    module = dump.modules[0]
    devices = device_map(module, dump.run_record, **kwargs)  # type: ignore[arg-type]
    mesh = recover_mesh(module, run_record=dump.run_record)
    chosen = module.after_optimizations() if snapshot == "after_optimizations" else module.partitioned()
    assert chosen is not None
    return find_collectives(chosen.module(), devices, mesh)


# -- real dumps --------------------------------------------------------------------


def test_cross_host_tp_all_reduce_crosses_hosts() -> None:
    # mesh ('tp'=2,'dp'=4): TP groups {0,4},{1,5},... on hosts of 4 devices.
    (found,) = _collectives("cross-host-tp/jax-shardy-bad")
    assert found.kind == "all-reduce" and found.form is Form.SYNC
    assert found.instruction == "all-reduce" and found.done is None
    assert found.mode is GroupMode.FLATTENED_ID
    assert found.channel_id == 1 and found.use_global_device_ids
    assert found.logical_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert found.physical_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert found.mesh_axes == ("tp",)
    assert found.crosses_hosts is True
    # f32[16,512] = 32768 bytes; ring all-reduce over 2: 2*(1/2)*32768
    assert (found.bytes_in_per_device, found.bytes_out_per_device) == (32768, 32768)
    assert found.wire_bytes_per_device == 32768
    assert found.dimension is None
    assert found.source is not None and found.source.file.endswith("cross_host_tp.py")
    assert found.source.line == program_line("cross_host_tp.py", "return jax.nn.relu(x @ w1) @ w2")


def test_cross_host_tp_fixed_stays_in_host() -> None:
    (found,) = _collectives("cross-host-tp/jax-shardy-fixed")
    assert found.logical_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found.physical_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found.mesh_axes == ("tp",)
    assert found.crosses_hosts is False


def test_cross_host_tp_gspmd_same_groups() -> None:
    (found,) = _collectives("cross-host-tp/jax-gspmd-bad")
    assert found.physical_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert found.mesh_axes == ("tp",)  # mesh from the sidecar
    assert found.crosses_hosts is True


@pytest.mark.parametrize("framework", ["jax-shardy", "jax-gspmd"])
def test_transposed_mesh_logical_vs_physical(framework: str) -> None:
    # Same HLO in both variants; only the device assignment differs.
    (bad,) = _collectives(f"transposed-mesh/{framework}-bad")
    (fixed,) = _collectives(f"transposed-mesh/{framework}-fixed")
    assert bad.logical_groups == fixed.logical_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert bad.physical_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert fixed.physical_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert bad.mesh_axes == fixed.mesh_axes == ("tp",)
    assert bad.crosses_hosts is True
    assert fixed.crosses_hosts is False


@pytest.mark.parametrize("framework", ["jax-shardy", "jax-gspmd", "torch_xla"])
def test_seed_activation_all_gathers(framework: str) -> None:
    found = _collectives(f"fsdp-activation-gather/{framework}-bad", snapshot="partitioned")
    assert [c.kind for c in found] == ["all-gather", "all-gather"]
    first, second = found
    # x f32[160,1280] gathered along dim 0 from f32[40,1280] shards over 4 devices
    assert first.dimension == 0
    assert first.bytes_in_per_device == 40 * 1280 * 4 == 204800
    assert first.bytes_out_per_device == 160 * 1280 * 4 == 819200
    assert first.wire_bytes_per_device == 3 * 819200 // 4 == 614400
    assert first.logical_groups == ((0, 1, 2, 3),)
    assert first.mesh_axes == ("fsdp",)
    # the hidden activation f32[160,960] gathered along dim 1 from f32[160,240]
    assert second.dimension == 1
    assert second.bytes_in_per_device == 160 * 240 * 4 == 153600
    assert second.bytes_out_per_device == 160 * 960 * 4 == 614400
    assert second.wire_bytes_per_device == 460800
    assert second.mesh_axes == ("fsdp",)


def test_torch_xla_hosts_unknown() -> None:
    found = _collectives("fsdp-activation-gather/torch_xla-bad")
    assert [c.crosses_hosts for c in found] == [None, None]
    assert [c.physical_groups for c in found] == [((0, 1, 2, 3),), ((0, 1, 2, 3),)]


def test_all_to_all_split_dim() -> None:
    found = _collectives("non-batch-dim-sharding/jax-shardy-bad", snapshot="partitioned")
    a2a = [c for c in found if c.kind == "all-to-all"]
    assert len(a2a) == 1
    (only,) = a2a
    assert only.mode is GroupMode.CROSS_PARTITION  # channel_id, no use_global_device_ids
    assert only.dimension == 0
    assert only.logical_groups == ((0, 1, 2, 3),)
    # f32[4,64,256] in and out: 262144 bytes; (4-1)/4 of it leaves the device
    assert (only.bytes_in_per_device, only.bytes_out_per_device) == (262144, 262144)
    assert only.wire_bytes_per_device == 196608
    assert only.mesh_axes == ("data",)


def test_tuple_all_to_all_sums_leaves() -> None:
    # After optimization the all-to-all is the 4-operand tuple form, no dimensions.
    found = _collectives("non-batch-dim-sharding/jax-shardy-bad")
    (only,) = [c for c in found if c.kind == "all-to-all"]
    assert only.dimension is None
    assert only.bytes_in_per_device == 4 * (64 * 256 * 4) == 262144
    assert only.bytes_out_per_device == 262144


def test_collectives_inside_the_scan_while_body() -> None:
    dump = load_dump(FIXTURES / "llama-scan/jax-shardy-healthy")
    module = dump.modules[0]
    hlo = module.partitioned().module()
    bodies = {
        name
        for _, instruction in hlo.instructions()
        if instruction.opcode == "while"
        for name in [instruction.attribute("body")]
        if name is not None
    }
    assert bodies == {"%region_0.5_spmd"}
    found = find_collectives(hlo, device_map(module, dump.run_record), recover_mesh(module))
    in_body = [c for c in found if c.computation == "region_0.5_spmd"]
    assert len(found) == 9 and len(in_body) == 7
    # the layer weights f32[256,256] (shard f32[64,256]) gathered along dim 0 over fsdp
    square = [c for c in in_body if c.bytes_out_per_device == 256 * 256 * 4]
    assert len(square) == 4
    for c in square:
        assert c.dimension == 0
        assert c.bytes_in_per_device == 64 * 256 * 4
        assert c.wire_bytes_per_device == 3 * 262144 // 4
        assert c.logical_groups == ((0, 1, 2, 3),)
        assert c.mesh_axes == ("fsdp",)
        assert c.crosses_hosts is False


def test_train_step_reduce_scatter_free_all_reduces() -> None:
    found = _collectives("train-step/jax-shardy-healthy", snapshot="partitioned")
    kinds = {c.kind for c in found}
    assert kinds <= {"all-gather", "all-reduce", "reduce-scatter"}
    reduces = [c for c in found if c.kind == "all-reduce"]
    assert reduces
    for c in reduces:
        assert c.logical_groups == ((0, 1, 2, 3),)
        assert c.wire_bytes_per_device == 2 * 3 * c.bytes_in_per_device // 4


# -- async forms (GPU syntax, hand-written) ------------------------------------------

ASYNC_HLO = """\
HloModule async_collectives, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%wrapped_reduce_scatter (p0: f32[64,128]) -> f32[16,128] {
  %p0 = f32[64,128]{1,0} parameter(0)
  ROOT %rs = f32[16,128]{1,0} reduce-scatter(%p0), channel_id=4, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true, to_apply=%add
}

ENTRY %main (x: f32[8,128], y: f32[32,128], z: f32[64,128], w: f32[4,64]) -> f32[16,128] {
  %x = f32[8,128]{1,0} parameter(0)
  %y = f32[32,128]{1,0} parameter(1)
  %z = f32[64,128]{1,0} parameter(2)
  %w = f32[4,64]{1,0} parameter(3)
  %ag-start = (f32[8,128]{1,0}, f32[64,128]{1,0}) all-gather-start(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true, backend_config={"operation_queue_id":"0","collective_backend_config":{"is_sync":false}}
  %ag-done = f32[64,128]{1,0} all-gather-done(%ag-start)
  %ar-start = f32[32,128]{1,0} all-reduce-start(%y), channel_id=2, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add, backend_config={"operation_queue_id":"0","collective_backend_config":{"is_sync":true}}
  %ar-done = f32[32,128]{1,0} all-reduce-done(%ar-start)
  %cp-start = (f32[32,128]{1,0}, f32[32,128]{1,0}, u32[], u32[]) collective-permute-start(%ar-done), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cp-done = f32[32,128]{1,0} collective-permute-done(%cp-start)
  %rs-start = ((f32[64,128]{1,0}), f32[16,128]{1,0}) async-start(%z), calls=%wrapped_reduce_scatter
  %rs-done = f32[16,128]{1,0} async-done(%rs-start)
  %a2a-start = ((f32[4,64]{1,0}), f32[4,64]{1,0}) all-to-all-start(%w), channel_id=5, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %a2a-done = f32[4,64]{1,0} all-to-all-done(%a2a-start)
  ROOT %out = f32[16,128]{1,0} add(%rs-done, %rs-done)
}
"""


@pytest.fixture(scope="module")
def async_found():  # type: ignore[no-untyped-def]
    module = parse_module(ASYNC_HLO)
    devices = DeviceMap((0, 4, 1, 5, 2, 6, 3, 7), devices_per_host=4,
                        host_of={d: d // 4 for d in range(8)}, num_partitions=8)
    mesh = Mesh(("dp", "tp"), (4, 2), tuple(range(8)), "sidecar")
    return {c.instruction: c for c in find_collectives(module, devices, mesh)}


def test_async_forms_are_found_once(async_found) -> None:  # type: ignore[no-untyped-def]
    assert sorted(async_found) == ["a2a-start", "ag-start", "ar-start", "cp-start", "rs-start"]
    assert {c.instruction: c.form for c in async_found.values()} == {
        "ag-start": Form.START_DONE, "ar-start": Form.START_DONE, "cp-start": Form.START_DONE,
        "rs-start": Form.ASYNC_WRAPPED, "a2a-start": Form.ASYNC_WRAPPED,
    }
    assert {c.instruction: c.done for c in async_found.values()} == {
        "ag-start": "ag-done", "ar-start": "ar-done", "cp-start": "cp-done",
        "rs-start": "rs-done", "a2a-start": "a2a-done",
    }


def test_all_gather_start(async_found) -> None:  # type: ignore[no-untyped-def]
    ag = async_found["ag-start"]
    assert ag.kind == "all-gather" and ag.dimension == 0
    assert ag.logical_groups == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert ag.physical_groups == ((0, 4, 1, 5, 2, 6, 3, 7),)
    assert ag.mesh_axes == ("dp", "tp")
    # in f32[8,128] = 4096 bytes, out f32[64,128] = 32768; wire 7/8 * 32768
    assert (ag.bytes_in_per_device, ag.bytes_out_per_device, ag.wire_bytes_per_device) == (4096, 32768, 28672)
    assert ag.is_sync is False
    assert ag.crosses_hosts is True


def test_all_reduce_start(async_found) -> None:  # type: ignore[no-untyped-def]
    ar = async_found["ar-start"]
    assert ar.kind == "all-reduce" and ar.is_sync is True
    assert ar.logical_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    # logical 0 -> device 0, logical 4 -> device 2: same host
    assert ar.physical_groups == ((0, 2), (4, 6), (1, 3), (5, 7))
    assert ar.crosses_hosts is False
    assert ar.mesh_axes == ("dp:(1)2",)
    assert (ar.bytes_in_per_device, ar.bytes_out_per_device, ar.wire_bytes_per_device) == (16384, 16384, 16384)


def test_collective_permute_start(async_found) -> None:  # type: ignore[no-untyped-def]
    cp = async_found["cp-start"]
    assert cp.kind == "collective-permute" and cp.mode is GroupMode.CROSS_PARTITION
    assert cp.logical_groups == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert cp.physical_groups == ((0, 4), (4, 1), (1, 5), (5, 0))
    assert cp.group_size == 2
    assert cp.mesh_axes == ("dp", "tp")
    assert (cp.bytes_in_per_device, cp.bytes_out_per_device, cp.wire_bytes_per_device) == (16384, 16384, 16384)
    assert cp.crosses_hosts is True


def test_async_wrapped_reduce_scatter(async_found) -> None:  # type: ignore[no-untyped-def]
    rs = async_found["rs-start"]
    assert rs.kind == "reduce-scatter" and rs.computation == "main"
    assert rs.channel_id == 4 and rs.dimension == 0
    assert rs.logical_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert rs.physical_groups == ((0, 4, 1, 5), (2, 6, 3, 7))
    assert rs.mesh_axes == ("dp:(2)2", "tp")  # partitions 0-3: the minor half of dp, and tp
    # in f32[64,128] = 32768, out f32[16,128] = 8192; wire 3/4 * 32768
    assert (rs.bytes_in_per_device, rs.bytes_out_per_device, rs.wire_bytes_per_device) == (32768, 8192, 24576)


def test_sugared_all_to_all_start(async_found) -> None:  # type: ignore[no-untyped-def]
    a2a = async_found["a2a-start"]
    assert a2a.kind == "all-to-all" and a2a.mode is GroupMode.CROSS_PARTITION
    assert a2a.dimension == 0
    assert a2a.logical_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert (a2a.bytes_in_per_device, a2a.bytes_out_per_device, a2a.wire_bytes_per_device) == (1024, 1024, 768)


# -- group modes ---------------------------------------------------------------------------


def test_group_mode_table() -> None:
    assert group_mode("all-reduce", None, False) is GroupMode.CROSS_REPLICA
    assert group_mode("all-gather", 1, False) is GroupMode.CROSS_REPLICA_AND_PARTITION
    assert group_mode("all-gather", 1, True) is GroupMode.FLATTENED_ID
    assert group_mode("all-to-all", 1, None) is GroupMode.CROSS_PARTITION
    assert group_mode("collective-permute", 1, None) is GroupMode.CROSS_PARTITION
    with pytest.raises(ValueError):
        group_mode("all-reduce", None, True)


def test_participant_groups() -> None:
    # 2 replicas x 4 partitions; flattened id = replica*4 + partition
    assert participant_groups(((0, 1),), GroupMode.CROSS_REPLICA, 2, 4) == (
        (0, 4), (1, 5), (2, 6), (3, 7))
    assert participant_groups(((0, 1), (2, 3)), GroupMode.CROSS_PARTITION, 2, 4) == (
        (0, 1), (4, 5), (2, 3), (6, 7))
    assert participant_groups(((0,), (1,)), GroupMode.CROSS_REPLICA_AND_PARTITION, 2, 4) == (
        (0, 1, 2, 3), (4, 5, 6, 7))
    # one replica: {{0}} with channel and no use_global_device_ids is all partitions
    assert participant_groups(((0,),), GroupMode.CROSS_REPLICA_AND_PARTITION, 1, 4) == ((0, 1, 2, 3),)
    assert participant_groups((), GroupMode.CROSS_PARTITION, 1, 4) == ((0, 1, 2, 3),)
    assert participant_groups((), GroupMode.CROSS_REPLICA, 1, 4) == ((0,), (1,), (2,), (3,))
    assert participant_groups(((3, 1),), GroupMode.FLATTENED_ID, 1, 4) == ((3, 1),)


def test_all_gather_without_global_ids_spans_all_partitions() -> None:
    text = """\
HloModule m, num_partitions=4

ENTRY %main (x: f32[2,8]) -> f32[8,8] {
  %x = f32[2,8]{1,0} parameter(0)
  %ag = f32[8,8]{1,0} all-gather(%x), channel_id=1, replica_groups={{0}}, dimensions={0}
  ROOT %cb = f32[8,8]{1,0} collective-broadcast(%ag), channel_id=2, replica_groups={}
}
"""
    found, broadcast = find_collectives(parse_module(text))
    # collective-broadcast: channel, no use_global_device_ids -> partitions; {} = all of them
    assert broadcast.kind == "collective-broadcast" and broadcast.mode is GroupMode.CROSS_PARTITION
    assert broadcast.logical_groups == ((0, 1, 2, 3),)
    assert broadcast.wire_bytes_per_device == broadcast.bytes_in_per_device == 256
    assert found.mode is GroupMode.CROSS_REPLICA_AND_PARTITION
    assert found.logical_groups == ((0, 1, 2, 3),)
    assert found.physical_groups is None and found.crosses_hosts is None
    assert found.wire_bytes_per_device == 3 * 256 // 4
