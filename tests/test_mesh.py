"""Tests for hlo_doctor.graph.mesh and hlo_doctor.graph.devices on real dumps.

Fixtures (fixtures/README.md): cross-host-tp builds its mesh from
np.arange(8).reshape(2, 4) as ('tp', 'dp') (bad) or reshape(4, 2) as
('dp', 'tp') (fixed); transposed-mesh builds np.array(jax.devices())
.reshape(2, 4).T as ('dp', 'tp'), which JAX compiles with the device
assignment [0, 4, 1, 5, 2, 6, 3, 7] (its fixed twin: reshape(4, 2)).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.graph.devices import device_map
from hlo_doctor.graph.mesh import Mesh, dim_axes, infer_mesh, recover_mesh
from hlo_doctor.hlo.attributes import parse_sharding

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _load(case: str):  # type: ignore[no-untyped-def]
    dump = load_dump(FIXTURES / case)
    return dump, dump.modules[0]


# -- mesh recovery -------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "names", "sizes"),
    [
        ("cross-host-tp/jax-shardy-bad", ("tp", "dp"), (2, 4)),
        ("cross-host-tp/jax-shardy-fixed", ("dp", "tp"), (4, 2)),
        ("fsdp-activation-gather/jax-shardy-bad", ("fsdp", "replica"), (4, 1)),
        ("llama-2d/jax-shardy-healthy", ("fsdp", "tp"), (4, 2)),
        ("transposed-mesh/jax-shardy-bad", ("dp", "tp"), (4, 2)),
    ],
)
def test_shardy_mesh_comes_from_module_mlir(case: str, names: tuple[str, ...], sizes: tuple[int, ...]) -> None:
    dump, module = _load(case)
    mesh = recover_mesh(module, run_record=dump.run_record)
    assert mesh is not None
    assert mesh.source == "module.mlir"
    assert (mesh.axis_names, mesh.axis_sizes) == (names, sizes)
    assert mesh.name == "mesh"
    # JAX meshes are iota in partition ids, whatever their physical order.
    assert mesh.device_ids == tuple(range(sizes[0] * sizes[1]))
    assert not mesh.is_inferred


@pytest.mark.parametrize(
    ("case", "names", "sizes"),
    [
        ("cross-host-tp/jax-gspmd-bad", ("tp", "dp"), (2, 4)),
        ("cross-host-tp/jax-gspmd-fixed", ("dp", "tp"), (4, 2)),
        ("fsdp-activation-gather/jax-gspmd-bad", ("fsdp", "replica"), (4, 1)),
        ("fsdp-activation-gather/torch_xla-bad", ("fsdp", "replica"), (4, 1)),
        ("fsdp-activation-gather/torch_xla-fixed", ("fsdp", "replica"), (4, 1)),
    ],
)
def test_gspmd_and_torch_xla_mesh_comes_from_the_sidecar(
    case: str, names: tuple[str, ...], sizes: tuple[int, ...]
) -> None:
    dump, module = _load(case)
    mesh = recover_mesh(module, run_record=dump.run_record)
    assert mesh is not None
    assert mesh.source == "sidecar"
    assert (mesh.axis_names, mesh.axis_sizes) == (names, sizes)
    assert mesh.device_ids == tuple(range(sizes[0] * sizes[1]))


@pytest.mark.parametrize("variant", ["bad", "fixed"])
def test_sidecar_mesh_ids_are_mapped_back_to_partition_ids(variant: str) -> None:
    # GSPMD dumps have no sdy.mesh. The bad sidecar records the transposed mesh
    # in device ids [0,4,1,5,2,6,3,7]; through the device assignment (the
    # same list) they are partitions 0..7, as they are in the fixed twin.
    dump, module = _load(f"transposed-mesh/jax-gspmd-{variant}")
    assert dump.run_record is not None
    recorded = [0, 4, 1, 5, 2, 6, 3, 7] if variant == "bad" else list(range(8))
    assert dump.run_record["meshes"][0]["device_ids"] == recorded
    assert module.device_assignment == tuple(recorded)
    mesh = recover_mesh(module, run_record=dump.run_record)
    assert mesh is not None and mesh.source == "sidecar"
    assert (mesh.axis_names, mesh.axis_sizes) == (("dp", "tp"), (4, 2))
    assert mesh.device_ids == (0, 1, 2, 3, 4, 5, 6, 7)
    assert mesh.groups_over(("tp",)) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_mesh_from_replica_groups_mesh_form() -> None:
    # No mlir, no sidecar: the seed's all-gather writes
    # replica_groups=mesh['axis_0'=4,'axis_1'=1] {'axis_0'}.
    _, module = _load("fsdp-activation-gather/jax-shardy-bad")
    hlo = module.after_optimizations().module()
    mesh = recover_mesh(None, hlo_module=hlo)
    assert mesh is not None
    assert mesh.source == "replica_groups"
    assert (mesh.axis_names, mesh.axis_sizes) == (("axis_0", "axis_1"), (4, 1))


@pytest.mark.parametrize(
    ("case", "sizes"),
    [
        ("cross-host-tp/jax-gspmd-bad", (2, 4)),  # shardings <=[2,4]T(1,0) and <=[8]
        ("cross-host-tp/jax-gspmd-fixed", (4, 2)),
        ("llama-2d/jax-shardy-healthy", (4, 2)),
        ("fsdp-activation-gather/torch_xla-bad", (4,)),  # the size-1 'replica' axis is invisible
        ("uneven-padding/jax-shardy-bad", (8,)),
    ],
)
def test_inferred_mesh(case: str, sizes: tuple[int, ...]) -> None:
    _, module = _load(case)
    snapshot = module.after_propagation()
    assert snapshot is not None
    mesh = infer_mesh(snapshot.module(), module.num_partitions)
    assert mesh is not None
    assert mesh.is_inferred and mesh.source == "inferred"
    assert mesh.axis_sizes == sizes
    assert mesh.axis_names == tuple(f"axis_{i}" for i in range(len(sizes)))
    assert "inferred" in mesh.describe()


def test_recover_mesh_falls_back_to_inference() -> None:
    _, module = _load("cross-host-tp/jax-gspmd-bad")
    mesh = recover_mesh(module, run_record=None)
    assert mesh is not None
    assert mesh.source == "inferred"
    assert mesh.axis_sizes == (2, 4)


# -- mesh helpers ----------------------------------------------------------------


def test_groups_over_and_axes_for_groups() -> None:
    mesh = Mesh(("tp", "dp"), (2, 4), tuple(range(8)), "sidecar")
    assert mesh.groups_over(("tp",)) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert mesh.groups_over(("dp",)) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert mesh.groups_over(("dp", "tp")) == ((0, 4, 1, 5, 2, 6, 3, 7),)
    assert mesh.groups_over(()) == tuple((d,) for d in range(8))
    assert mesh.axes_for_groups(((0, 4), (1, 5), (2, 6), (3, 7))) == ("tp",)
    assert mesh.axes_for_groups(((0, 1, 2, 3), (4, 5, 6, 7))) == ("dp",)
    assert mesh.axes_for_groups(((0, 1, 2, 3, 4, 5, 6, 7),)) == ("tp", "dp")
    assert mesh.axes_for_groups(((0, 4, 1, 5, 2, 6, 3, 7),)) == ("dp", "tp")
    # dp split in halves: the minor sub-axis dp:(2)2
    assert mesh.axes_for_groups(((0, 1), (2, 3), (4, 5), (6, 7))) == ("dp:(2)2",)
    assert mesh.axes_for_groups(((0, 2), (1, 3), (4, 6), (5, 7))) == ("dp:(1)2",)
    assert mesh.axes_for_groups(((0, 3), (1, 2), (4, 7), (5, 6))) is None
    assert mesh.axes_for_groups(((0,), (1,))) == ()
    assert mesh.axis_size("dp") == 4 and mesh.axis_size("dp:(2)2") == 2
    assert mesh.axes_between(1, 6) == ("tp", "dp")
    assert mesh.axes_between(1, 5) == ("tp",)


def test_mesh_with_explicit_device_order() -> None:
    # A mesh whose logical ids are not iota: rows (0,2),(1,3) over ('a','b').
    mesh = Mesh(("a", "b"), (2, 2), (0, 2, 1, 3), "module.mlir")
    assert mesh.groups_over(("b",)) == ((0, 2), (1, 3))
    assert mesh.groups_over(("a",)) == ((0, 1), (2, 3))
    assert mesh.axes_for_groups(((0, 1), (2, 3))) == ("a",)


# -- dim_axes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rank", "expected"),
    [
        # cross-host-tp GSPMD bad, mesh ('tp'=2,'dp'=4):
        ("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", 2, (("dp",), ())),
        ("{devices=[1,2,4]<=[8] last_tile_dim_replicate}", 2, ((), ("tp",))),
        ("{devices=[4,2]<=[2,4]T(1,0)}", 2, (("dp",), ("tp",))),
        ("{devices=[8,1]<=[8]}", 2, (("tp", "dp"), ())),
        ("{devices=[8]<=[2,4]T(1,0)}", 1, (("dp", "tp"),)),
        ("{devices=[2,1,4]<=[2,4]T(1,0) last_tile_dim_replicate}", 2, (("dp:(1)2",), ())),
        ("{replicated}", 2, ((), ())),
    ],
)
def test_dim_axes(text: str, rank: int, expected: tuple[tuple[str, ...], ...]) -> None:
    mesh = Mesh(("tp", "dp"), (2, 4), tuple(range(8)), "sidecar")
    assert dim_axes(parse_sharding(text), rank, mesh) == expected


def test_dim_axes_on_real_shardings() -> None:
    # transposed-mesh (bad): w1 is P(None, 'tp') over mesh ('dp'=4,'tp'=2).
    dump, module = _load("transposed-mesh/jax-shardy-bad")
    mesh = recover_mesh(module, run_record=dump.run_record)
    assert mesh is not None
    hlo = module.after_propagation().module()
    entry = hlo.entry
    assert entry is not None
    found = {}
    for instruction in entry.instructions:
        if instruction.opcode == "parameter" and instruction.sharding is not None:
            found[instruction.name] = dim_axes(instruction.sharding, instruction.shape.rank, mesh)
    assert found == {"x.0": (("dp",), ()), "w1.0": ((), ("tp",)), "w2.0": (("tp",), ())}


def test_dim_axes_named_sharding() -> None:
    mesh = Mesh(("a", "b"), (2, 4), tuple(range(8)), "module.mlir")
    sharding = parse_sharding("{mesh['a'=2,'b'=4], [{'b'}, {'a'}]}")
    assert dim_axes(sharding, 2, mesh) == (("b",), ("a",))


def test_dim_axes_rejects_a_tile_assignment_not_built_from_the_mesh() -> None:
    mesh = Mesh(("tp", "dp"), (2, 4), tuple(range(8)), "sidecar")
    assert dim_axes(parse_sharding("{devices=[2,1]3,0}"), 2, Mesh(("x",), (4,), (0, 1, 2, 3), "inferred")) is None
    assert dim_axes(parse_sharding("{devices=[8,1]0,3,1,2,4,7,5,6}"), 2, mesh) is None


# -- device map ------------------------------------------------------------------


def test_transposed_mesh_device_assignment() -> None:
    dump, module = _load("transposed-mesh/jax-shardy-bad")
    assert module.device_assignment == (0, 4, 1, 5, 2, 6, 3, 7)
    devices = device_map(module, dump.run_record)
    assert devices.assignment_source == "compile_options"
    assert devices.physical((0, 1)) == (0, 4)
    assert devices.physical((6, 7)) == (3, 7)
    assert devices.devices_per_host == 4 and devices.host_source == "sidecar"
    assert devices.hosts((0, 1)) == (0, 1)
    assert devices.spans_hosts((0, 1)) is True
    assert devices.spans_hosts((0, 2, 4, 6)) is False  # devices 0,1,2,3
    assert devices.logical_id(4) == 1


def test_fixed_twin_has_identity_assignment() -> None:
    dump, module = _load("transposed-mesh/jax-shardy-fixed")
    devices = device_map(module, dump.run_record)
    assert devices.logical_to_physical == (0, 1, 2, 3, 4, 5, 6, 7)
    assert devices.is_identity
    assert devices.spans_hosts((0, 1)) is False


def test_devices_per_host_argument_wins() -> None:
    dump, module = _load("cross-host-tp/jax-shardy-bad")
    devices = device_map(module, dump.run_record, devices_per_host=8)
    assert devices.host_source == "argument"
    assert devices.spans_hosts((0, 4)) is False
    assert device_map(module, dump.run_record).spans_hosts((0, 4)) is True


def test_single_process_topology_is_one_host() -> None:
    # The CPU topology.textproto lists 4 devices, all process_index 0, and
    # this example's record has no devices_per_host.
    dump, module = _load("llama-fsdp/jax-shardy-healthy")
    assert dump.run_record is not None and dump.run_record["devices_per_host"] is None
    devices = device_map(module, dump.run_record)
    assert devices.host_source == "single-process"
    assert devices.devices_per_host == 4
    assert devices.spans_hosts((0, 1, 2, 3)) is False


def test_torch_xla_has_no_host_information() -> None:
    dump, module = _load("fsdp-activation-gather/torch_xla-bad")
    devices = device_map(module, dump.run_record)
    assert devices.logical_to_physical == (0, 1, 2, 3)
    assert devices.assignment_source == "identity"
    assert devices.spans_hosts((0, 1, 2, 3)) is None
