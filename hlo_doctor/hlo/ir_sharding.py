"""IR values: shardings, tile assignments, named meshes and replica groups."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from hlo_doctor.errors import ShardingError
from hlo_doctor.hlo.ir_metadata import OpMetadata


class ShardingKind(str, Enum):
    REPLICATED = "replicated"
    MANUAL = "manual"
    UNKNOWN = "unknown"
    MAXIMAL = "maximal"
    TILED = "tiled"
    TUPLE = "tuple"
    UNREDUCED = "unreduced"  # ``{unreduced}``: every device holds a partial value


class SubgroupType(str, Enum):
    """Kinds of the trailing tile dims listed in ``last_tile_dims={...}``."""

    REPLICATED = "replicated"
    MANUAL = "manual"
    MAXIMAL = "maximal"
    UNREDUCED = "unreduced"


# The most devices a sharding, mesh or set of replica groups may name. The parser rejects more
# (with file:line:col) before anything is expanded: ``[4000000000]<=[4000000000]`` costs 30 bytes to
# write and 30 GB to expand. Real programs stay far below it (the largest TPU slices and GPU
# clusters are tens of thousands of devices).
MAX_DEVICES = 1 << 20


@dataclass(frozen=True, slots=True)
class IotaDevices:
    """``<=[reshape_dims]T(perm)``: iota(prod(reshape)) reshaped, transposed, flattened."""

    reshape_dims: tuple[int, ...]
    transpose_perm: tuple[int, ...] | None = None

    def device_ids(self) -> tuple[int, ...]:
        """The device ids in row-major order, exactly as XLA's IotaTileAssignment."""
        dims = self.reshape_dims
        perm = self.transpose_perm or tuple(range(len(dims)))
        count = math.prod(dims)
        strides = [1] * len(dims)
        for axis in range(len(dims) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * dims[axis + 1]
        out_dims = [dims[p] for p in perm]
        out_strides = [strides[p] for p in perm]
        ids = [0]
        for size, stride in zip(out_dims, out_strides, strict=False):
            ids = [base + i * stride for base in ids for i in range(size)]
        assert len(ids) == count
        return tuple(ids)

    def __str__(self) -> str:
        text = "<=[" + ",".join(map(str, self.reshape_dims)) + "]"
        if self.transpose_perm is not None:
            text += "T(" + ",".join(map(str, self.transpose_perm)) + ")"
        return text


@dataclass(frozen=True, slots=True)
class TileAssignment:
    """The tile grid shape and the device in each tile (explicit list or iota)."""

    dims: tuple[int, ...]
    explicit: tuple[int, ...] | None = None
    iota: IotaDevices | None = None

    def device_ids(self) -> tuple[int, ...]:
        """Device per tile, row-major over ``dims``."""
        if self.explicit is not None:
            return self.explicit
        if self.iota is not None:
            return self.iota.device_ids()
        return tuple(range(math.prod(self.dims)))

    @property
    def num_devices(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True, slots=True)
class MeshAxis:
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis ``'x'``, or its sub-axis ``'x':(pre_size)size``.

    A sub-axis is the slice of axis ``x`` (viewed as major-to-minor factors)
    that comes after ``pre_size`` and has ``size`` elements; ``size`` is None
    for the whole axis.
    """

    name: str
    pre_size: int = 1
    size: int | None = None

    @property
    def is_sub_axis(self) -> bool:
        return self.size is not None

    def __str__(self) -> str:
        if self.size is None:
            return f"'{self.name}'"
        return f"'{self.name}':({self.pre_size}){self.size}"


@dataclass(frozen=True, slots=True)
class NamedMesh:
    """The v3 ``{mesh['a'=2,'b'=4], [{'a'}, {}], replicated={'b'}}`` form.

    ``dim_axes``/``replicated_axes``/``unreduced_axes``/``manual_axes`` name
    the axes (a sub-axis appears under its axis's name); the ``*_refs``
    fields keep the exact references, sub-axes included. ``open_dims`` marks
    dimensions written with a trailing ``?``. The mesh's devices are
    ``device_ids`` (explicit), ``device_iota`` (``device_ids=([4,2]T(1,0))``)
    or, when both are None, iota over the axes. ``maximal_device`` is set for
    ``maximal_mesh[device_id=N]``. ``unreduced_reduction`` is the reduction
    written in ``unreduced=max{...}`` (newer XLA), else None.
    """

    axes: tuple[MeshAxis, ...]
    dim_axes: tuple[tuple[str, ...], ...]
    replicated_axes: tuple[str, ...] = ()
    unreduced_axes: tuple[str, ...] = ()
    device_ids: tuple[int, ...] | None = None
    manual_axes: tuple[str, ...] = ()
    dim_refs: tuple[tuple[AxisRef, ...], ...] = ()
    replicated_refs: tuple[AxisRef, ...] = ()
    unreduced_refs: tuple[AxisRef, ...] = ()
    manual_refs: tuple[AxisRef, ...] = ()
    open_dims: tuple[bool, ...] = ()
    device_iota: IotaDevices | None = None
    maximal_device: int | None = None
    unreduced_reduction: str | None = None

    @property
    def num_devices(self) -> int:
        if self.maximal_device is not None:
            return 1
        return math.prod(a.size for a in self.axes)

    def devices(self) -> tuple[int, ...]:
        """The mesh's device ids, row-major over the axes."""
        if self.maximal_device is not None:
            return (self.maximal_device,)
        if self.device_ids is not None:
            return self.device_ids
        if self.device_iota is not None:
            return self.device_iota.device_ids()
        return tuple(range(self.num_devices))


def split_mesh_axes(
    axes: tuple[MeshAxis, ...], refs: tuple[AxisRef, ...]
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Split mesh axes into the factors that ``refs`` need.

    Returns the factor sizes (row-major over the mesh: axes in order, each
    axis major to minor) and, per ref, the indices of the factors it covers.
    Raises ValueError for an unknown axis, a sub-axis that does not divide
    its axis, or refs that overlap.
    """
    index = {axis.name: i for i, axis in enumerate(axes)}
    bounds: list[set[int]] = [{1, axis.size} for axis in axes]
    spans: list[tuple[int, int, int]] = []
    for ref in refs:
        if ref.name not in index:
            raise ShardingError(f"unknown mesh axis '{ref.name}'")
        i = index[ref.name]
        full = axes[i].size
        if ref.size is None:
            lo, hi = 1, full
        else:
            lo, hi = ref.pre_size, ref.pre_size * ref.size
            if ref.pre_size < 1 or ref.size < 1 or full % hi or hi % lo:
                raise ShardingError(f"sub-axis {ref} does not divide axis '{ref.name}'={full}")
        bounds[i].update((lo, hi))
        spans.append((i, lo, hi))
    sizes: list[int] = []
    starts: list[dict[int, int]] = []  # per axis: lower bound -> factor index
    for i in range(len(axes)):
        cuts = sorted(bounds[i])
        for a, b in zip(cuts, cuts[1:], strict=False):
            if b % a:
                raise ShardingError(f"sub-axes of '{axes[i].name}' do not nest")
        starts.append({a: len(sizes) + k for k, a in enumerate(cuts[:-1])})
        sizes.extend(b // a for a, b in zip(cuts, cuts[1:], strict=False))
    covered: list[tuple[int, ...]] = []
    used: set[int] = set()
    for ref, (i, lo, hi) in zip(refs, spans, strict=False):
        cuts = sorted(c for c in bounds[i] if lo <= c < hi)
        factors = tuple(starts[i][c] for c in cuts)
        if used.intersection(factors):
            raise ShardingError(f"mesh axis {ref} is used more than once")
        used.update(factors)
        covered.append(factors)
    return tuple(sizes), tuple(covered)


def transpose_devices(
    devices: tuple[int, ...], dims: tuple[int, ...], perm: tuple[int, ...]
) -> tuple[int, ...]:
    """``devices`` reshaped to ``dims``, transposed by ``perm``, flattened."""
    if perm == tuple(range(len(dims))):
        return devices
    order = IotaDevices(dims, perm).device_ids()
    return tuple(devices[i] for i in order)


@dataclass(frozen=True, slots=True)
class Sharding:
    """A parsed ``sharding={...}`` value. ``text`` is the source text."""

    kind: ShardingKind
    tile_assignment: TileAssignment | None = None
    last_tile_dim_replicate: bool = False
    last_tile_dims: tuple[SubgroupType, ...] = ()
    maximal_device: int | None = None
    tuple_elements: tuple[Sharding, ...] = ()
    shard_group: tuple[str, int] | None = None  # ("shard_as" | "shard_like", id)
    metadata: tuple[OpMetadata, ...] = ()
    named: NamedMesh | None = None
    text: str = field(default="", compare=False)

    @property
    def is_tuple(self) -> bool:
        return self.kind is ShardingKind.TUPLE

    @property
    def is_replicated(self) -> bool:
        if self.kind is ShardingKind.REPLICATED:
            return True
        if self.kind is ShardingKind.TILED and self.tile_assignment is not None:
            return self.tile_assignment.num_devices == 1 or all(
                d == 1 for d in self.data_tile_dims
            )
        return False

    @property
    def num_subgroup_dims(self) -> int:
        if self.last_tile_dim_replicate:
            return 1
        return len(self.last_tile_dims)

    @property
    def data_tile_dims(self) -> tuple[int, ...]:
        """Tiles per tensor dimension (the tile grid minus subgroup dims)."""
        if self.tile_assignment is None:
            return ()
        dims = self.tile_assignment.dims
        return dims[: len(dims) - self.num_subgroup_dims]

    def __str__(self) -> str:
        return self.text


# --------------------------------------------------------------------------
# Replica groups


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """``replica_groups=`` in any of its three spellings.

    * explicit: ``{{0,1},{2,3}}``
    * iota: ``[num_groups,group_size]<=[reshape]T(perm)``
    * mesh: ``mesh['a'=2,'b'=4] {'a'}`` (groups over the named axes)
    """

    explicit: tuple[tuple[int, ...], ...] | None = None
    iota_shape: tuple[int, int] | None = None
    iota: IotaDevices | None = None
    mesh_axes: tuple[MeshAxis, ...] = ()
    mesh_selected: tuple[str, ...] = ()
    text: str = field(default="", compare=False)
    mesh: NamedMesh | None = None  # the full mesh (device ids) of the mesh form
    mesh_refs: tuple[AxisRef, ...] = ()  # the exact selected axes, sub-axes included

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Expand to explicit groups of logical ids (partition or replica ids)."""
        if self.explicit is not None:
            return self.explicit
        if self.iota_shape is not None and self.iota is not None:
            ids = self.iota.device_ids()
            count, size = self.iota_shape
            return tuple(tuple(ids[g * size : (g + 1) * size]) for g in range(count))
        if self.mesh is not None or self.mesh_axes:
            mesh = self.mesh or NamedMesh(self.mesh_axes, ())
            refs = self.mesh_refs or tuple(AxisRef(name) for name in self.mesh_selected)
            return _mesh_groups(mesh, refs)
        return ()


def _mesh_groups(mesh: NamedMesh, refs: tuple[AxisRef, ...]) -> tuple[tuple[int, ...], ...]:
    """XLA's MeshAxesReplicaGroupList: devices that differ only along ``refs``.

    The mesh's device array is split into the factors the refs need; the
    other factors stay in mesh order and the selected ones move to the end in
    the order written, so each run of ``group size`` devices is one group.
    """
    if mesh.maximal_device is not None:
        return ((mesh.maximal_device,),)
    sizes, covered = split_mesh_axes(mesh.axes, refs)
    chosen = [f for factors in covered for f in factors]
    other = [f for f in range(len(sizes)) if f not in chosen]
    ids = transpose_devices(mesh.devices(), sizes, tuple(other + chosen))
    group_size = math.prod(sizes[f] for f in chosen)
    return tuple(ids[g : g + group_size] for g in range(0, len(ids), group_size))
