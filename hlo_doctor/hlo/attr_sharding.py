"""``sharding={...}``: replicated, maximal, tiled and tuple shardings (named ones in :mod:`.attr_named`)."""

from __future__ import annotations

import math
from functools import lru_cache

from hlo_doctor.hlo.attr_cursor import (
    _CACHE_SIZE,
    _KIND_WORDS,
    _SUBGROUP_WORDS,
    _Cursor,
    _parse_iota,
)
from hlo_doctor.hlo.attr_metadata import _parse_metadata_list
from hlo_doctor.hlo.attr_named import _parse_named_sharding
from hlo_doctor.hlo.ir_metadata import OpMetadata
from hlo_doctor.hlo.ir_sharding import (
    MAX_DEVICES,
    IotaDevices,
    Sharding,
    ShardingKind,
    SubgroupType,
    TileAssignment,
)

__all__ = ["parse_sharding"]


# --------------------------------------------------------------------------
# Shardings


@lru_cache(maxsize=_CACHE_SIZE)
def parse_sharding(text: str) -> Sharding:
    """Any ``sharding={...}`` value: replicated, maximal, tiled, tuple or named."""
    cursor = _Cursor(text)
    cursor.expect("{", "to start sharding")
    if cursor.peek() in ("{", "}"):
        elements: list[Sharding] = []
        if not cursor.eat("}"):
            while True:
                cursor.skip()
                element_start = cursor.pos
                cursor.expect("{", "to start a tuple element sharding")
                element = _parse_single_sharding(cursor)
                elements.append(_with_text(element, text[element_start : cursor.pos]))
                if cursor.eat("}"):
                    break
                cursor.expect(",", "between tuple element shardings")
        cursor.expect_end("the sharding")
        return Sharding(ShardingKind.TUPLE, tuple_elements=tuple(elements), text=text)
    sharding = _parse_single_sharding(cursor)
    cursor.expect_end("the sharding")
    return _with_text(sharding, text)


def _with_text(sharding: Sharding, text: str) -> Sharding:
    return Sharding(
        sharding.kind,
        tile_assignment=sharding.tile_assignment,
        last_tile_dim_replicate=sharding.last_tile_dim_replicate,
        last_tile_dims=sharding.last_tile_dims,
        maximal_device=sharding.maximal_device,
        tuple_elements=sharding.tuple_elements,
        shard_group=sharding.shard_group,
        metadata=sharding.metadata,
        named=sharding.named,
        text=text,
    )


def _parse_single_sharding(cursor: _Cursor) -> Sharding:
    """The body of one ``{...}`` after its '{', up to and including its '}'."""
    start = cursor.pos
    word = cursor.peek_word()
    if word in ("mesh", "maximal_mesh"):
        return _parse_named_sharding(cursor)

    kinds: list[tuple[ShardingKind, int]] = []
    device: int | None = None
    dims: tuple[int, ...] | None = None
    explicit: tuple[int, ...] | None = None
    iota: IotaDevices | None = None
    replicate_last = False
    subgroups: tuple[SubgroupType, ...] = ()
    subgroups_pos = -1
    shard_group: tuple[str, int] | None = None
    metadata: tuple[OpMetadata, ...] = ()

    while not cursor.eat("}"):
        if cursor.at_end():
            raise cursor.error("expected '}' to end sharding, found end of text")
        pos = cursor.pos
        word = cursor.parse_optional_word()
        if word is None:
            raise cursor.error(f"unexpected {cursor.describe()} in sharding")
        if cursor.eat("="):
            if word == "device":
                device = cursor.parse_int("after device=")
            elif word == "devices":
                if dims is not None:
                    raise cursor.error("devices= given twice", pos)
                dims, explicit, iota = _parse_tile_assignment(cursor)
            elif word == "metadata":
                metadata += _parse_metadata_list(cursor)
            elif word == "last_tile_dims":
                subgroups_pos = pos
                subgroups = _parse_subgroup_types(cursor)
            else:
                raise cursor.error(
                    f"unknown sharding attribute '{word}=': expected device=, devices=, "
                    "metadata= or last_tile_dims=",
                    pos,
                )
        elif word in _KIND_WORDS:
            kinds.append((_KIND_WORDS[word], pos))
        elif word == "last_tile_dim_replicate":
            replicate_last = True
        elif word in ("shard_as", "shard_like"):
            shard_group = (word, cursor.parse_int(f"after {word}"))
        else:
            raise cursor.error(f"unexpected '{word}' in sharding", pos)

    if len({kind for kind, _ in kinds}) > 1:
        raise cursor.error(
            "conflicting sharding kinds: " + " and ".join(k.value for k, _ in kinds), kinds[1][1]
        )
    kind = kinds[0][0] if kinds else ShardingKind.TILED
    if kind is ShardingKind.MAXIMAL:
        if device is None or dims is not None:
            raise cursor.error("maximal shardings must have exactly one device= assigned", start)
        return Sharding(kind, maximal_device=device, shard_group=shard_group, metadata=metadata)
    if device is not None:
        raise cursor.error("device= is only valid in a maximal sharding", start)
    if kind is not ShardingKind.TILED:
        if dims is not None:
            raise cursor.error(f"{kind.value} shardings must not have devices assigned", start)
        return Sharding(kind, shard_group=shard_group, metadata=metadata)
    if dims is None:
        raise cursor.error("expected a sharding kind or devices=[...] in sharding", start)
    if replicate_last and subgroups:
        raise cursor.error(
            "last_tile_dim_replicate and last_tile_dims= cannot both be given", subgroups_pos
        )
    if len(subgroups) + replicate_last > len(dims):
        raise cursor.error(
            f"{len(subgroups) + replicate_last} subgroup dims but the tile grid has "
            f"only {len(dims)} dims",
            start,
        )
    return Sharding(
        ShardingKind.TILED,
        tile_assignment=TileAssignment(dims, explicit, iota),
        last_tile_dim_replicate=replicate_last,
        last_tile_dims=subgroups,
        shard_group=shard_group,
        metadata=metadata,
    )


def _parse_tile_assignment(
    cursor: _Cursor,
) -> tuple[tuple[int, ...], tuple[int, ...] | None, IotaDevices | None]:
    """``[2,2]0,1,2,3`` or ``[2,2]<=[4]`` or ``[2,2]<=[2,2]T(1,0)``."""
    dims_pos = cursor.pos
    dims = cursor.parse_bracketed_ints("the tile assignment dims")
    if any(d < 1 for d in dims):
        raise cursor.error("tile assignment dims must be positive", dims_pos)
    count = math.prod(dims)
    if count > MAX_DEVICES:
        raise cursor.error(f"a tile grid of {count} tiles: more than {MAX_DEVICES} devices", dims_pos)
    if cursor.eat("<="):
        iota_pos = cursor.pos
        iota = _parse_iota(cursor, "the iota reshape dims", require_transpose=True)
        if math.prod(iota.reshape_dims) != count:
            raise cursor.error(
                f"iota has {math.prod(iota.reshape_dims)} devices but the tile grid "
                f"{list(dims)} has {count} tiles",
                iota_pos,
            )
        return dims, None, iota
    list_pos = cursor.pos
    devices = cursor.parse_int_list("after devices=[...]: device ids or <=[...]")
    if len(devices) != count:
        raise cursor.error(
            f"{len(devices)} device ids given but the tile grid {list(dims)} has {count} tiles",
            list_pos,
        )
    if count <= 1:
        raise cursor.error("non-maximal shardings must have more than one device assigned", list_pos)
    return dims, devices, None


def _parse_subgroup_types(cursor: _Cursor) -> tuple[SubgroupType, ...]:
    cursor.expect("{", "to start last_tile_dims")
    types: list[SubgroupType] = []
    if cursor.eat("}"):
        return ()
    while True:
        pos = cursor.pos
        word = cursor.parse_optional_word()
        if word not in _SUBGROUP_WORDS:
            raise cursor.error(
                "expected replicated, manual, maximal or unreduced in last_tile_dims", pos
            )
        types.append(_SUBGROUP_WORDS[word])
        if cursor.eat("}"):
            return tuple(types)
        cursor.expect(",", "between last_tile_dims entries")
