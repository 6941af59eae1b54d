"""Sharding semantics: what a sharding means for one array value.

Given a parsed :class:`~hlo_doctor.hlo.ir.Sharding` and the value's
:class:`~hlo_doctor.hlo.ir.Shape`, these functions answer the questions a
rule asks: how many shards each tensor dimension has, the per-device shard
shape (XLA pads the last shards when a dimension does not divide evenly),
how many bytes each device holds, and which devices hold identical data.

Vocabulary follows XLA's ``HloSharding``: the *tile assignment* is an array
of devices whose leading dims tile the tensor dims and whose trailing
*subgroup* dims (``last_tile_dim_replicate`` or ``last_tile_dims={...}``)
hold replicated, manual, unreduced or maximal copies. Named (v3) shardings
arrive here already lowered to a tile assignment by the parser.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product

from hlo_doctor.errors import ShardingError
from hlo_doctor.hlo.ir import (
    ELEMENT_BITS,
    Shape,
    Sharding,
    ShardingKind,
    SubgroupType,
    TileAssignment,
    transpose_devices,
)

__all__ = [
    "ShardingLayout",
    "canonicalize",
    "device_groups",
    "device_tile_indices",
    "layout",
    "layouts",
    "replication_factor",
    "shard_shape",
    "subgroup_types",
    "tiles_per_dim",
]

# XLA's canonical order of subgroup dims: replicated last, the others by
# their OpSharding enum value (MAXIMAL=1 < MANUAL=4 < UNREDUCED=6).
_SUBGROUP_ORDER = {
    SubgroupType.MAXIMAL: 0,
    SubgroupType.MANUAL: 1,
    SubgroupType.UNREDUCED: 2,
    SubgroupType.REPLICATED: 3,
}


def subgroup_types(sharding: Sharding) -> tuple[SubgroupType, ...]:
    """The kind of each trailing subgroup dim of the tile assignment."""
    if sharding.last_tile_dim_replicate:
        return (SubgroupType.REPLICATED,)
    return sharding.last_tile_dims


def tiles_per_dim(sharding: Sharding, rank: int) -> tuple[int, ...]:
    """Shards per tensor dimension (1 everywhere unless the sharding is tiled)."""
    if sharding.kind is not ShardingKind.TILED:
        return (1,) * rank
    tiles = sharding.data_tile_dims
    if len(tiles) != rank:
        raise ShardingError(
            f"sharding {sharding.text or sharding} tiles {len(tiles)} dims "
            f"but the value has rank {rank}"
        )
    return tiles


def replication_factor(sharding: Sharding, num_devices: int) -> int:
    """How many devices hold each distinct piece of data.

    Replicated: all ``num_devices``; tiled: the product of the replicated
    subgroup dims; maximal, manual and unreduced: 1 (each device's data is
    its own).
    """
    if sharding.kind in (ShardingKind.REPLICATED, ShardingKind.UNKNOWN):
        return num_devices
    if sharding.kind is not ShardingKind.TILED or sharding.tile_assignment is None:
        return 1
    dims = sharding.tile_assignment.dims
    types = subgroup_types(sharding)
    sub_dims = dims[len(dims) - len(types) :]
    return math.prod(d for d, t in zip(sub_dims, types, strict=False) if t is SubgroupType.REPLICATED)


def shard_shape(sharding: Sharding, dims: tuple[int, ...]) -> tuple[int, ...]:
    """The per-device shard dims: each dim divided by its tiles, rounded up."""
    tiles = tiles_per_dim(sharding, len(dims))
    return tuple(-(-d // t) if d >= 0 else d for d, t in zip(dims, tiles, strict=False))


@dataclass(frozen=True, slots=True)
class ShardingLayout:
    """How one array value is laid out over the devices by one sharding.

    * ``tiles_per_dim``: shards along each tensor dim;
    * ``shard_dims``: the dims of each device's shard (ceil division);
    * ``padding``: elements XLA adds along each dim so it divides evenly
      (``shard_dims[i] * tiles_per_dim[i] - dims[i]``);
    * ``replication_factor``: devices that hold each distinct shard;
    * ``bytes_per_device``: the bytes of one shard, padding included;
    * ``devices``: the devices that hold any of the value.
    """

    shape: Shape
    sharding: Sharding
    num_devices: int
    tiles_per_dim: tuple[int, ...]
    shard_dims: tuple[int, ...]
    padding: tuple[int, ...]
    replication_factor: int
    bytes_per_device: int
    devices: tuple[int, ...]

    @property
    def is_manual(self) -> bool:
        return self.sharding.kind is ShardingKind.MANUAL

    @property
    def is_maximal(self) -> bool:
        return self.sharding.kind is ShardingKind.MAXIMAL

    @property
    def is_replicated(self) -> bool:
        """Every device holds the whole value."""
        return self.sharding.kind in (ShardingKind.REPLICATED, ShardingKind.UNKNOWN) or (
            self.sharding.kind is ShardingKind.TILED
            and math.prod(self.tiles_per_dim) == 1
            and self.replication_factor == len(self.devices)
        )

    @property
    def num_shards(self) -> int:
        return math.prod(self.tiles_per_dim)

    @property
    def padded_elements(self) -> int:
        """Elements of padding in the whole padded value."""
        padded = math.prod(s * t for s, t in zip(self.shard_dims, self.tiles_per_dim, strict=False))
        return padded - self.shape.num_elements

    @property
    def shard_shape(self) -> Shape:
        return Shape(self.shape.element_type, self.shard_dims, self.shape.dynamic, self.shape.layout)

    def device_groups(self) -> tuple[tuple[int, ...], ...]:
        """Devices that hold identical data; see :func:`device_groups`."""
        return device_groups(self.sharding, self.num_devices)

    def device_tile_indices(self) -> dict[int, tuple[int, ...]]:
        """Each device's tile index per tensor dim; see :func:`device_tile_indices`."""
        return device_tile_indices(self.sharding, self.num_devices, self.shape.rank)


def layout(sharding: Sharding, shape: Shape, num_devices: int) -> ShardingLayout:
    """The layout of an array ``shape`` under a non-tuple ``sharding``.

    ``num_devices`` is the program's partition count: replicated and
    unknown shardings put the value on all of them.
    """
    if shape.is_tuple or sharding.is_tuple:
        raise ShardingError("layout() takes an array shape and a non-tuple sharding; use layouts()")
    dims = shape.dims
    tiles = tiles_per_dim(sharding, len(dims))
    shard = shard_shape(sharding, dims)
    padding = tuple(s * t - d if d >= 0 else 0 for s, t, d in zip(shard, tiles, dims, strict=False))
    bits = ELEMENT_BITS.get(shape.element_type, 0)
    elements = math.prod(max(d, 0) for d in shard)
    return ShardingLayout(
        shape=shape,
        sharding=sharding,
        num_devices=num_devices,
        tiles_per_dim=tiles,
        shard_dims=shard,
        padding=padding,
        replication_factor=replication_factor(sharding, num_devices),
        bytes_per_device=(elements * bits + 7) // 8,
        devices=_holding_devices(sharding, num_devices),
    )


def layouts(sharding: Sharding, shape: Shape, num_devices: int) -> tuple[ShardingLayout, ...]:
    """One layout per array leaf of ``shape``, depth first.

    A tuple sharding gives one sharding per leaf (XLA flattens nested tuple
    shardings); a non-tuple sharding on a tuple shape applies to every leaf.
    """
    leaves = list(shape.leaves())
    if not sharding.is_tuple:
        return tuple(layout(sharding, leaf, num_devices) for leaf in leaves)
    elements = list(_flatten(sharding))
    if len(elements) != len(leaves):
        raise ShardingError(
            f"tuple sharding has {len(elements)} elements but the shape has {len(leaves)} leaves"
        )
    return tuple(layout(s, leaf, num_devices) for s, leaf in zip(elements, leaves, strict=False))


def _flatten(sharding: Sharding) -> Iterator[Sharding]:
    if sharding.is_tuple:
        for element in sharding.tuple_elements:
            yield from _flatten(element)
    else:
        yield sharding


def _holding_devices(sharding: Sharding, num_devices: int) -> tuple[int, ...]:
    if sharding.kind is ShardingKind.MAXIMAL:
        return (sharding.maximal_device,) if sharding.maximal_device is not None else ()
    if sharding.kind is ShardingKind.TILED and sharding.tile_assignment is not None:
        return tuple(sorted(set(sharding.tile_assignment.device_ids())))
    return tuple(range(num_devices))


def _tile_array(sharding: Sharding) -> Iterator[tuple[tuple[int, ...], int]]:
    """(tile-grid index, device) for every tile, row-major."""
    assignment = sharding.tile_assignment
    assert assignment is not None
    devices = assignment.device_ids()
    yield from zip(product(*(range(d) for d in assignment.dims)), devices, strict=False)


def device_tile_indices(
    sharding: Sharding, num_devices: int, rank: int
) -> dict[int, tuple[int, ...]]:
    """For each device that holds data, its tile index along each tensor dim.

    Replicated, unknown, manual and unreduced values have one tile (index 0
    everywhere) on every device; a maximal one only on its device.
    """
    if sharding.kind is ShardingKind.TILED and sharding.tile_assignment is not None:
        tiles_per_dim(sharding, rank)  # checks the rank
        return {device: index[:rank] for index, device in _tile_array(sharding)}
    zero = (0,) * rank
    return {device: zero for device in _holding_devices(sharding, num_devices)}


def device_groups(sharding: Sharding, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """Groups of devices that hold identical data, one per distinct piece.

    Tiled: the devices that differ only along replicated subgroup dims (one
    group per data tile and per manual/unreduced/maximal subgroup index),
    each sorted, in tile order. Replicated/unknown: one group of all
    devices. Maximal: its one device. Manual and unreduced: every device
    alone (each holds its own data or its own partial value).
    """
    kind = sharding.kind
    if kind in (ShardingKind.REPLICATED, ShardingKind.UNKNOWN):
        return (tuple(range(num_devices)),)
    if kind is ShardingKind.MAXIMAL:
        return ((sharding.maximal_device,),) if sharding.maximal_device is not None else ()
    if kind in (ShardingKind.MANUAL, ShardingKind.UNREDUCED):
        return tuple((d,) for d in range(num_devices))
    if kind is not ShardingKind.TILED or sharding.tile_assignment is None:
        raise ShardingError(f"device groups are undefined for a {kind.value} sharding")
    dims = sharding.tile_assignment.dims
    types = subgroup_types(sharding)
    first_sub = len(dims) - len(types)
    distinct = [
        i for i in range(len(dims))
        if i < first_sub or types[i - first_sub] is not SubgroupType.REPLICATED
    ]
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, device in _tile_array(sharding):
        groups.setdefault(tuple(index[i] for i in distinct), []).append(device)
    return tuple(tuple(sorted(g)) for g in groups.values())


def canonicalize(sharding: Sharding) -> Sharding:
    """The sharding in XLA's canonical form, as ``HloSharding`` stores it.

    XLA (``HloSharding::Subgroup``/``PartialTile``) merges subgroup dims of
    the same kind, orders them (maximal, manual, unreduced, replicated),
    drops those of size 1, sorts the devices inside each replicated group,
    and turns a sharding whose data is not split into ``{replicated}``,
    ``{manual}`` or ``{unreduced}`` when one subgroup kind is left. The
    result has an explicit device list; ``text`` is kept.
    """
    if sharding.is_tuple:
        return _replace(sharding, tuple_elements=tuple(canonicalize(e) for e in sharding.tuple_elements))
    if sharding.kind is not ShardingKind.TILED or sharding.tile_assignment is None:
        return sharding
    dims = sharding.tile_assignment.dims
    devices = sharding.tile_assignment.device_ids()
    types = subgroup_types(sharding)
    first_sub = len(dims) - len(types)
    data_dims = dims[:first_sub]

    order = list(range(first_sub))
    merged: list[tuple[SubgroupType, int]] = []
    for kind in sorted(set(types), key=_SUBGROUP_ORDER.__getitem__):
        axes = [first_sub + i for i, t in enumerate(types) if t is kind]
        order += axes
        size = math.prod(dims[a] for a in axes)
        if size > 1:
            merged.append((kind, size))
    devices = transpose_devices(devices, dims, tuple(order))
    new_dims = data_dims + tuple(size for _, size in merged)
    new_types = tuple(kind for kind, _ in merged)
    if new_types and new_types[-1] is SubgroupType.REPLICATED:
        size = new_dims[-1]
        devices = tuple(
            d for start in range(0, len(devices), size) for d in sorted(devices[start : start + size])
        )
    if math.prod(data_dims) == 1 and len(new_types) == 1:
        only = {
            SubgroupType.REPLICATED: ShardingKind.REPLICATED,
            SubgroupType.MANUAL: ShardingKind.MANUAL,
            SubgroupType.UNREDUCED: ShardingKind.UNREDUCED,
        }.get(new_types[0])
        if only is not None:
            return Sharding(only, shard_group=sharding.shard_group, metadata=sharding.metadata,
                            named=sharding.named, text=sharding.text)
    replicate_last = new_types == (SubgroupType.REPLICATED,)
    return _replace(
        sharding,
        tile_assignment=TileAssignment(new_dims, explicit=devices),
        last_tile_dim_replicate=replicate_last,
        last_tile_dims=() if replicate_last else new_types,
    )


def _replace(sharding: Sharding, **changes: object) -> Sharding:
    fields = {
        name: getattr(sharding, name)
        for name in (
            "kind", "tile_assignment", "last_tile_dim_replicate", "last_tile_dims",
            "maximal_device", "tuple_elements", "shard_group", "metadata", "named", "text",
        )
    }
    fields.update(changes)
    return Sharding(**fields)
