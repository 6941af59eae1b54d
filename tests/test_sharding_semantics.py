"""Tests for hlo_doctor.graph.sharding: shard shapes, padding, bytes, device groups.

Shardings and shapes are hand-written; every expected value is worked out in
the comment next to it.
"""

from __future__ import annotations

import pytest

from hlo_doctor.graph.sharding import (
    canonicalize,
    device_groups,
    layout,
    layouts,
    replication_factor,
    subgroup_types,
    tiles_per_dim,
)
from hlo_doctor.hlo.attributes import parse_sharding
from hlo_doctor.hlo.ir import Shape, ShardingKind, SubgroupType


def test_2d_iota_with_transpose() -> None:
    sharding = parse_sharding("{devices=[2,4]<=[4,2]T(1,0)}")
    result = layout(sharding, Shape("f32", (6, 10)), num_devices=8)
    assert result.tiles_per_dim == (2, 4)
    # ceil(6/2)=3, ceil(10/4)=3; 3*4-10 = 2 padded columns.
    assert result.shard_dims == (3, 3)
    assert result.padding == (0, 2)
    assert result.padded_elements == 6 * 12 - 60
    assert result.bytes_per_device == 3 * 3 * 4
    assert result.replication_factor == 1
    assert result.num_shards == 8
    # iota(8) as [4,2] transposed: row 0 = 0,2,4,6; row 1 = 1,3,5,7.
    assert result.device_groups() == ((0,), (2,), (4,), (6,), (1,), (3,), (5,), (7,))
    indices = result.device_tile_indices()
    assert indices[2] == (0, 1)
    assert indices[1] == (1, 0)
    assert indices[7] == (1, 3)
    assert result.devices == tuple(range(8))
    assert not result.is_replicated


def test_last_tile_dim_replicate() -> None:
    sharding = parse_sharding("{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}")
    result = layout(sharding, Shape("bf16", (8, 4)), num_devices=4)
    assert subgroup_types(sharding) == (SubgroupType.REPLICATED,)
    assert result.tiles_per_dim == (2, 1)
    assert result.shard_dims == (4, 4)
    assert result.padding == (0, 0)
    assert result.bytes_per_device == 4 * 4 * 2
    assert result.replication_factor == 2
    # Tile (0,0) is on devices 0 and 2, tile (1,0) on 1 and 3.
    assert result.device_groups() == ((0, 2), (1, 3))
    assert result.device_tile_indices() == {0: (0, 0), 2: (0, 0), 1: (1, 0), 3: (1, 0)}


def test_manual_and_replicated_subgroups() -> None:
    sharding = parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}")
    assert tiles_per_dim(sharding, 1) == (2,)
    assert replication_factor(sharding, 8) == 2
    # Only the replicated (last) dim holds copies; data and manual dims differ.
    assert device_groups(sharding, 8) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_uneven_dims_pad() -> None:
    ten = layout(parse_sharding("{devices=[4]<=[4]}"), Shape("u4", (10,)), num_devices=4)
    # ceil(10/4)=3 per device, 12-10=2 padding; 3 four-bit values round up to 2 bytes.
    assert ten.shard_dims == (3,)
    assert ten.padding == (2,)
    assert ten.bytes_per_device == 2
    five = layout(parse_sharding("{devices=[4]<=[4]}"), Shape("f32", (5,)), num_devices=4)
    # ceil(5/4)=2; the last device holds only padding: 8-5=3.
    assert five.shard_dims == (2,)
    assert five.padding == (3,)


def test_tuple_sharding_per_leaf() -> None:
    sharding = parse_sharding("{{replicated}, {devices=[2,1]0,1}}")
    shape = Shape("tuple", tuple_shapes=(Shape("f32", (4, 4)), Shape("s32", (8, 2))))
    first, second = layouts(sharding, shape, num_devices=2)
    assert first.is_replicated
    assert first.shard_dims == (4, 4)
    assert first.bytes_per_device == 64
    assert first.replication_factor == 2
    assert first.device_groups() == ((0, 1),)
    assert second.tiles_per_dim == (2, 1)
    assert second.shard_dims == (4, 2)
    assert second.bytes_per_device == 4 * 2 * 4
    assert second.device_groups() == ((0,), (1,))


def test_non_tuple_sharding_on_tuple_shape_applies_to_every_leaf() -> None:
    shape = Shape("tuple", tuple_shapes=(Shape("f32", (4,)), Shape("f32", (6,))))
    result = layouts(parse_sharding("{devices=[2]0,1}"), shape, num_devices=2)
    assert [r.shard_dims for r in result] == [(2,), (3,)]


def test_tuple_arity_mismatch() -> None:
    shape = Shape("tuple", tuple_shapes=(Shape("f32", (4,)),))
    with pytest.raises(ValueError, match="2 elements but the shape has 1 leaves"):
        layouts(parse_sharding("{{replicated}, {replicated}}"), shape, num_devices=2)


def test_maximal() -> None:
    result = layout(parse_sharding("{maximal device=3}"), Shape("f32", (16,)), num_devices=4)
    assert result.is_maximal
    assert result.shard_dims == (16,)
    assert result.bytes_per_device == 64
    assert result.devices == (3,)
    assert result.replication_factor == 1
    assert result.device_groups() == ((3,),)
    assert result.device_tile_indices() == {3: (0,)}


def test_replicated_needs_num_devices() -> None:
    result = layout(parse_sharding("{replicated}"), Shape("f32", (3,)), num_devices=4)
    assert result.is_replicated
    assert result.replication_factor == 4
    assert result.devices == (0, 1, 2, 3)
    assert result.device_groups() == ((0, 1, 2, 3),)
    assert result.bytes_per_device == 12


def test_manual_each_device_alone() -> None:
    result = layout(parse_sharding("{manual}"), Shape("f32", (3,)), num_devices=2)
    assert result.is_manual
    assert result.shard_dims == (3,)
    assert result.device_groups() == ((0,), (1,))


def test_named_sharding_semantics() -> None:
    # b (4 devices) shards dim 0, a (2 devices) replicates: mesh factors (a, b)
    # transposed to (b, a) gives devices 0,4,1,5,2,6,3,7.
    sharding = parse_sharding("{mesh['a'=2,'b'=4], [{'b'}, {}], replicated={'a'}}")
    result = layout(sharding, Shape("f32", (8, 8)), num_devices=8)
    assert result.tiles_per_dim == (4, 1)
    assert result.shard_dims == (2, 8)
    assert result.replication_factor == 2
    assert result.device_groups() == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_rank_mismatch() -> None:
    with pytest.raises(ValueError, match="tiles 2 dims but the value has rank 1"):
        layout(parse_sharding("{devices=[2,2]<=[4]}"), Shape("f32", (4,)), num_devices=4)


def test_canonicalize_like_xla() -> None:
    # These expected forms are what jaxlib 0.10.2's HloSharding prints.
    reordered = canonicalize(
        parse_sharding("{devices=[2,2,2]7,6,5,4,3,2,1,0 last_tile_dims={replicated, manual}}")
    )
    assert reordered.last_tile_dims == (SubgroupType.MANUAL, SubgroupType.REPLICATED)
    assert reordered.tile_assignment is not None
    assert reordered.tile_assignment.device_ids() == (5, 7, 4, 6, 1, 3, 0, 2)
    sorted_groups = canonicalize(parse_sharding("{devices=[2,1,2]3,2,1,0 last_tile_dim_replicate}"))
    assert sorted_groups.tile_assignment is not None
    assert sorted_groups.tile_assignment.device_ids() == (2, 3, 0, 1)
    dropped = canonicalize(parse_sharding("{devices=[2,1]0,1 last_tile_dim_replicate}"))
    assert dropped.tile_assignment is not None
    assert dropped.tile_assignment.dims == (2,)
    assert not dropped.last_tile_dim_replicate
    whole = canonicalize(parse_sharding("{devices=[1,1,4]<=[4] last_tile_dim_replicate}"))
    assert whole.kind is ShardingKind.REPLICATED
    manual = canonicalize(parse_sharding("{devices=[1,2,1]<=[2] last_tile_dims={manual,replicated}}"))
    assert manual.kind is ShardingKind.MANUAL
    merged = canonicalize(parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, manual}}"))
    assert merged.tile_assignment is not None
    assert merged.tile_assignment.dims == (2, 4)
    assert merged.last_tile_dims == (SubgroupType.MANUAL,)
