"""The device mesh a program was partitioned over, and which mesh axes each sharding and group uses.

**Id space.** A :class:`Mesh` lists its devices in *logical* ids: the ids
HLO tile assignments and replica groups use (partition ids for the one-replica
programs JAX and torch_xla emit). They are not device ids. JAX compiles with
the device assignment set to the mesh's devices, flattened, so a JAX mesh is
always ``0..n-1`` in logical ids whatever its physical order: the mesh
``np.array(jax.devices()).reshape(2, 4).T`` is logical ``[[0,1],[2,3],...]``
and runs on physical ``[0,4,1,5,2,6,3,7]``.
:mod:`hlo_doctor.graph.devices` maps logical ids to devices and hosts.

:func:`recover_mesh` takes the mesh, in order, from:

1. ``module.mlir``'s ``sdy.mesh`` (Shardy; its ``device_ids``, when written,
   are the ids Shardy puts in tile assignments: logical). A dump without
   module.mlir but with ``xla.sdy.meshes`` in the HLO header gives source
   ``"hlo_header"``;
2. the runner's sidecar (``hlo_doctor_run.json`` ``meshes``, in *physical*
   ids for JAX, mapped back through the device assignment; torch_xla's mesh
   ids go into its shardings unchanged, so they are taken as logical);
3. a ``replica_groups=mesh[...]`` collective (its axis names are whatever
   the partitioner wrote, often ``axis_0``...);
4. otherwise it is inferred from the tile assignments and replica groups:
   the finest factorization of the devices that every one of them respects,
   with axes named ``axis_0``, ``axis_1``... (major first) and source
   ``"inferred"``.

The :class:`Mesh` is in :mod:`.mesh_model`, the recovery in :mod:`.mesh_recovery`;
this module maps a sharding's tensor dims to mesh axes (:func:`dim_axes`) and
re-exports the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlo_doctor.hlo.ir import Sharding, ShardingKind

if TYPE_CHECKING:
    pass

from hlo_doctor.graph.mesh_model import SOURCES, Mesh, _strides
from hlo_doctor.graph.mesh_recovery import infer_mesh, recover_mesh

__all__ = ["SOURCES", "Mesh", "dim_axes", "infer_mesh", "recover_mesh"]


# --------------------------------------------------------------------------
# Tensor dims -> mesh axes


def dim_axes(sharding: Sharding, shape_rank: int, mesh: Mesh) -> tuple[tuple[str, ...], ...] | None:
    """The mesh axes (major first) each tensor dim is sharded over.

    ``()`` for a dim that is not split. A named (Shardy v3) sharding over a
    mesh with the same axis names is read as written. Otherwise the tile
    assignment is walked: along each tensor dim, the devices must step
    through mesh axes (or sub-axes, ``name:(pre)size``) in mixed-radix order,
    and every tile must be the sum of its per-dim steps. Trailing subgroup
    dims (``last_tile_dim_replicate``, ``last_tile_dims``) are replicated or
    manual axes and are not reported. None when the tile assignment is not
    built from the mesh's axes (for an inferred mesh, the axes are made-up
    names: see :attr:`Mesh.is_inferred`).
    """
    if sharding.kind is not ShardingKind.TILED or sharding.tile_assignment is None:
        return ((),) * shape_rank if sharding.kind is not ShardingKind.TUPLE else None
    # A module repeats a few shardings on thousands of ops: each is read once per mesh.
    key = (sharding.tile_assignment, sharding.last_tile_dim_replicate, sharding.last_tile_dims, sharding.named,
           shape_rank)
    known = mesh.read_shardings
    if key in known:
        return known[key]
    found = _dim_axes(sharding, shape_rank, mesh)
    if len(known) < _READ_SHARDINGS_KEPT:
        known[key] = found
    return found


# The most shardings a mesh remembers the reading of (a module with more distinct ones reads the rest anew).
_READ_SHARDINGS_KEPT = 4096


def _dim_axes(sharding: Sharding, shape_rank: int, mesh: Mesh) -> tuple[tuple[str, ...], ...] | None:
    assert sharding.tile_assignment is not None
    named = sharding.named
    if (
        named is not None
        and len(named.dim_axes) == shape_rank
        and tuple(a.name for a in named.axes) == mesh.axis_names
        and not any(r.is_sub_axis for refs in named.dim_refs for r in refs)
    ):
        return tuple(tuple(d) for d in named.dim_axes)
    assignment = sharding.tile_assignment
    dims = assignment.dims
    data = sharding.data_tile_dims
    if len(data) != shape_rank:
        return None
    ids = assignment.device_ids()
    strides = _strides(dims)
    base = mesh.coords(ids[0])
    if base is None:
        return None
    out: list[tuple[str, ...]] = []
    steps: list[tuple[tuple[int, ...], ...]] = []
    for d, size in enumerate(dims):
        seq = [ids[j * strides[d]] for j in range(size)]
        if size == 1:
            steps.append(((0,) * len(mesh.axis_sizes),))
            if d < shape_rank:
                out.append(())
            continue
        walk = mesh._walk(seq)
        if walk is None:
            return None
        names, offsets = walk
        steps.append(offsets)
        if d < shape_rank:
            out.append(names)
    # Every tile is the sum of its per-dim steps.
    for flat, device in enumerate(ids):
        coords = mesh.coords(device)
        if coords is None:
            return None
        expect = list(base)
        for d, stride in enumerate(strides):
            step = steps[d][flat // stride % dims[d]]
            for a, v in enumerate(step):
                expect[a] += v
        if tuple(expect) != coords:
            return None
    return tuple(out)
