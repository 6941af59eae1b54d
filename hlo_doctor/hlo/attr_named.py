"""Named (v3, Shardy) shardings and mesh-axis replica groups, lowered to tile assignments as XLA does."""

from __future__ import annotations

import math
from functools import lru_cache

from hlo_doctor.hlo.attr_cursor import (
    _CACHE_SIZE,
    _Cursor,
    _parse_iota,
    parse_int_lists,
)
from hlo_doctor.hlo.attr_metadata import _parse_metadata_list
from hlo_doctor.hlo.ir_metadata import OpMetadata
from hlo_doctor.hlo.ir_sharding import (
    MAX_DEVICES,
    AxisRef,
    IotaDevices,
    MeshAxis,
    NamedMesh,
    ReplicaGroups,
    Sharding,
    ShardingKind,
    SubgroupType,
    TileAssignment,
    split_mesh_axes,
    transpose_devices,
)

__all__ = ["parse_replica_groups"]


# -- named (v3) shardings ---------------------------------------------------


def _parse_mesh(cursor: _Cursor) -> NamedMesh:
    """``mesh['a'=2,'b'=4]`` [``, device_ids=(...)``] or ``maximal_mesh[device_id=N]``."""
    pos = cursor.pos
    word = cursor.parse_optional_word()
    if word == "maximal_mesh":
        cursor.expect("[", "after maximal_mesh")
        if cursor.parse_optional_word() != "device_id" or not cursor.eat("="):
            raise cursor.error("expected device_id= in maximal_mesh")
        device = cursor.parse_int("after device_id=")
        cursor.expect("]", "to end maximal_mesh")
        return NamedMesh((), (), maximal_device=device)
    if word != "mesh":
        raise cursor.error("expected 'mesh' or 'maximal_mesh'", pos)
    cursor.expect("[", "after mesh")
    axes: list[MeshAxis] = []
    if not cursor.eat("]"):
        while True:
            name_pos = cursor.pos
            name = cursor.parse_quoted_name("mesh axis name")
            cursor.expect("=", "after a mesh axis name")
            size = cursor.parse_int("mesh axis size")
            if size < 1:
                raise cursor.error(f"mesh axis '{name}' must have a positive size", name_pos)
            if any(axis.name == name for axis in axes):
                raise cursor.error(f"mesh axis '{name}' is defined twice", name_pos)
            axes.append(MeshAxis(name, size))
            if math.prod(axis.size for axis in axes) > MAX_DEVICES:
                raise cursor.error(f"a mesh of more than {MAX_DEVICES} devices", name_pos)
            if cursor.eat("]"):
                break
            cursor.expect(",", "between mesh axes")
    mesh = NamedMesh(tuple(axes), ())
    save = cursor.pos
    if axes and cursor.eat(",") and cursor.peek_word() == "device_ids":
        cursor.parse_optional_word()
        cursor.expect("=", "after device_ids")
        cursor.expect("(", "to start device_ids")
        ids_pos = cursor.pos
        count = mesh.num_devices
        if cursor.peek() == "[":
            iota = _parse_iota(cursor, "the device_ids iota", require_transpose=True)
            cursor.expect(")", "to end device_ids")
            if math.prod(iota.reshape_dims) != count:
                raise cursor.error(
                    f"device_ids iota has {math.prod(iota.reshape_dims)} devices but the "
                    f"mesh has {count}",
                    ids_pos,
                )
            return NamedMesh(mesh.axes, (), device_iota=iota)
        ids = cursor.parse_optional_int_list() or ()
        cursor.expect(")", "to end device_ids")
        if len(ids) != count:
            raise cursor.error(
                f"{len(ids)} device_ids given but the mesh has {count} devices", ids_pos
            )
        return NamedMesh(mesh.axes, (), device_ids=ids)
    cursor.pos = save
    return mesh


def _parse_axis_ref(cursor: _Cursor, mesh: NamedMesh) -> AxisRef:
    """``'a'`` or ``'a':(2)4``; an axis may also be named by its index, ``'0'``."""
    pos = cursor.pos
    name = cursor.parse_quoted_name("mesh axis name")
    names = [axis.name for axis in mesh.axes]
    if name not in names:
        if name.isdigit() and int(name) < len(names):
            name = names[int(name)]
        else:
            raise cursor.error(f"unknown mesh axis '{name}'", pos)
    if not cursor.eat(":"):
        return AxisRef(name)
    cursor.expect("(", "before the sub-axis pre-size")
    pre_size = cursor.parse_int("sub-axis pre-size")
    cursor.expect(")", "after the sub-axis pre-size")
    size = cursor.parse_int("sub-axis size")
    full = mesh.axes[names.index(name)].size
    if pre_size < 1 or size < 1 or full % (pre_size * size):
        raise cursor.error(f"sub-axis '{name}':({pre_size}){size} does not divide '{name}'={full}", pos)
    return AxisRef(name, pre_size, size)


def _parse_axis_ref_set(cursor: _Cursor, mesh: NamedMesh, *, allow_open: bool) -> tuple[tuple[AxisRef, ...], bool]:
    """``{'a', 'b':(1)2, ?}``: the refs and whether the set is open (``?``)."""
    cursor.expect("{", "to start a list of mesh axes")
    refs: list[AxisRef] = []
    is_open = False
    if cursor.eat("}"):
        return (), False
    while True:
        if allow_open and cursor.eat("?"):
            is_open = True
            cursor.expect("}", "after '?' (it must come last)")
            return tuple(refs), is_open
        refs.append(_parse_axis_ref(cursor, mesh))
        if cursor.eat("}"):
            return tuple(refs), is_open
        cursor.expect(",", "between mesh axes")


def _parse_named_sharding(cursor: _Cursor) -> Sharding:
    start = cursor.pos
    mesh = _parse_mesh(cursor)
    metadata: tuple[OpMetadata, ...] = ()
    if mesh.maximal_device is not None:
        if cursor.eat(","):
            if cursor.parse_optional_word() != "metadata" or not cursor.eat("="):
                raise cursor.error("expected metadata= after maximal_mesh[...]")
            metadata = _parse_metadata_list(cursor)
        cursor.expect("}", "to end the sharding")
        return Sharding(ShardingKind.MAXIMAL, maximal_device=mesh.maximal_device,
                        metadata=metadata, named=mesh)

    all_axes = tuple(AxisRef(axis.name) for axis in mesh.axes)
    dim_refs: list[tuple[AxisRef, ...]] = []
    open_dims: list[bool] = []
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    manual: tuple[AxisRef, ...] = ()
    reduction: str | None = None

    cursor.eat(",")
    word = cursor.peek_word()
    if word in ("replicated", "unreduced", "manual") and not _followed_by_equal(cursor):
        # The fully replicated / unreduced / manual spellings.
        cursor.parse_optional_word()
        if word == "unreduced":
            unreduced = all_axes
        elif word == "manual":
            manual = all_axes
        if cursor.eat(","):
            if cursor.parse_optional_word() != "metadata" or not cursor.eat("="):
                raise cursor.error(f"expected metadata= after '{word}'")
            metadata = _parse_metadata_list(cursor)
        cursor.expect("}", "to end the sharding")
    else:
        if cursor.peek() == "[":
            cursor.expect("[", "to start the dimension shardings")
            if not cursor.eat("]"):
                while True:
                    refs, is_open = _parse_axis_ref_set(cursor, mesh, allow_open=True)
                    dim_refs.append(refs)
                    open_dims.append(is_open)
                    if cursor.eat("]"):
                        break
                    cursor.expect(",", "between dimension shardings")
            first = False
        else:
            first = True  # newer XLA: attributes without a dimension list
        while not cursor.eat("}"):
            if not first:
                cursor.expect(",", "before the next named sharding attribute")
            first = False
            cursor.skip()
            pos = cursor.pos
            name = cursor.parse_optional_word()
            if name is None or not cursor.eat("="):
                raise cursor.error(
                    "expected replicated=, unreduced=, manual= or metadata= in named sharding",
                    pos,
                )
            if name == "metadata":
                metadata += _parse_metadata_list(cursor)
                continue
            if name == "unreduced" and cursor.peek_word() is not None:
                reduction = cursor.parse_optional_word()
                if cursor.peek() != "{":
                    unreduced = all_axes
                    continue
            if name not in ("replicated", "unreduced", "manual"):
                raise cursor.error(
                    f"unknown named sharding attribute '{name}=': expected replicated=, "
                    "unreduced=, manual= or metadata=",
                    pos,
                )
            refs, _ = _parse_axis_ref_set(cursor, mesh, allow_open=False)
            if name == "replicated":
                replicated += refs
            elif name == "unreduced":
                unreduced += refs
            else:
                manual += refs

    named = NamedMesh(
        mesh.axes,
        tuple(tuple(ref.name for ref in refs) for refs in dim_refs),
        replicated_axes=tuple(ref.name for ref in replicated),
        unreduced_axes=tuple(ref.name for ref in unreduced),
        device_ids=mesh.device_ids,
        manual_axes=tuple(ref.name for ref in manual),
        dim_refs=tuple(dim_refs),
        replicated_refs=replicated,
        unreduced_refs=unreduced,
        manual_refs=manual,
        open_dims=tuple(open_dims),
        device_iota=mesh.device_iota,
        unreduced_reduction=reduction,
    )
    try:
        return _lower_named(named, metadata)
    except ValueError as error:
        raise cursor.error(str(error), start) from None


def _followed_by_equal(cursor: _Cursor) -> bool:
    save = cursor.pos
    cursor.parse_optional_word()
    result = cursor.peek() == "="
    cursor.pos = save
    return result


def _lower_named(named: NamedMesh, metadata: tuple[OpMetadata, ...]) -> Sharding:
    """The tile assignment equal to a named sharding (XLA's V3ToV2Sharding).

    The mesh is split into the factors the refs need. The tile grid is the
    dimension shardings (their factors in the order written), then the
    manual, unreduced and replicated subgroups (factors in mesh order); every
    factor that no ref names is replicated. Subgroups of size 1 are dropped.
    """
    groups = [*named.dim_refs, named.manual_refs, named.unreduced_refs, named.replicated_refs]
    flat = tuple(ref for refs in groups for ref in refs)
    sizes, covered = split_mesh_axes(named.axes, flat)
    by_ref = iter(covered)
    dim_factors = [[f for _ in refs for f in next(by_ref)] for refs in named.dim_refs]
    manual = sorted(f for _ in named.manual_refs for f in next(by_ref))
    unreduced = sorted(f for _ in named.unreduced_refs for f in next(by_ref))
    used = {f for factors in covered for f in factors}
    replicated = sorted(set(range(len(sizes))) - used | {f for _ in named.replicated_refs for f in next(by_ref)})

    tile_dims = [math.prod(sizes[f] for f in factors) for factors in dim_factors]
    perm = [f for factors in dim_factors for f in factors]
    subgroups: list[SubgroupType] = []
    for kind, factors in (
        (SubgroupType.MANUAL, manual),
        (SubgroupType.UNREDUCED, unreduced),
        (SubgroupType.REPLICATED, replicated),
    ):
        size = math.prod(sizes[f] for f in factors)
        perm += factors
        if size > 1:  # a subgroup of one device is no subgroup (XLA drops it)
            tile_dims.append(size)
            subgroups.append(kind)

    data_tiles = math.prod(tile_dims[: len(dim_factors)])
    if data_tiles == 1 and len(set(subgroups)) <= 1:
        only = subgroups[0] if subgroups else SubgroupType.REPLICATED
        lowered = {
            SubgroupType.REPLICATED: ShardingKind.REPLICATED,
            SubgroupType.MANUAL: ShardingKind.MANUAL,
            SubgroupType.UNREDUCED: ShardingKind.UNREDUCED,
        }[only]
        return Sharding(lowered, metadata=metadata, named=named)

    if named.device_ids is None and named.device_iota is None:
        identity = tuple(range(len(sizes)))
        iota = IotaDevices(sizes, None if tuple(perm) == identity else tuple(perm))
        assignment = TileAssignment(tuple(tile_dims), iota=iota)
    else:
        devices = transpose_devices(named.devices(), sizes, tuple(perm))
        assignment = TileAssignment(tuple(tile_dims), explicit=devices)
    replicate_last = subgroups == [SubgroupType.REPLICATED]
    return Sharding(
        ShardingKind.TILED,
        tile_assignment=assignment,
        last_tile_dim_replicate=replicate_last,
        last_tile_dims=() if replicate_last else tuple(subgroups),
        metadata=metadata,
        named=named,
    )


# --------------------------------------------------------------------------
# Replica groups


@lru_cache(maxsize=_CACHE_SIZE)
def parse_replica_groups(text: str) -> ReplicaGroups:
    """``{{0,1},{2,3}}``, ``[2,4]<=[8]``/``[4,2]<=[2,4]T(1,0)`` or ``mesh[...] {'a'}``."""
    cursor = _Cursor(text)
    first = cursor.peek()
    if first == "{":
        return ReplicaGroups(explicit=parse_int_lists(text), text=text)
    if first == "[":
        shape_pos = cursor.pos
        shape = cursor.parse_bracketed_ints("the replica group shape")
        if len(shape) != 2:
            raise cursor.error(
                "iota replica groups need [num_groups,group_size], "
                f"got {len(shape)} dims",
                shape_pos,
            )
        cursor.expect("<=", "after the replica group shape")
        iota_pos = cursor.pos
        iota = _parse_iota(cursor, "the iota reshape dims", require_transpose=True)
        if math.prod(iota.reshape_dims) != shape[0] * shape[1]:
            raise cursor.error(
                f"iota has {math.prod(iota.reshape_dims)} devices but "
                f"[{shape[0]},{shape[1]}] needs {shape[0] * shape[1]}",
                iota_pos,
            )
        cursor.expect_end("the replica groups")
        return ReplicaGroups(iota_shape=(shape[0], shape[1]), iota=iota, text=text)
    if cursor.peek_word() in ("mesh", "maximal_mesh"):
        mesh = _parse_mesh(cursor)
        refs_pos = cursor.pos
        refs, _ = _parse_axis_ref_set(cursor, mesh, allow_open=False)
        cursor.expect_end("the replica groups")
        try:
            split_mesh_axes(mesh.axes, refs)
        except ValueError as error:
            raise cursor.error(str(error), refs_pos) from None
        group_size = math.prod(
            ref.size if ref.size is not None else _axis_size(mesh, ref.name) for ref in refs
        )
        if group_size <= 1:
            raise cursor.error(
                f"mesh replica groups need more than one device per group, got {group_size}",
                refs_pos,
            )
        return ReplicaGroups(
            mesh_axes=mesh.axes,
            mesh_selected=tuple(ref.name for ref in refs),
            text=text,
            mesh=mesh,
            mesh_refs=refs,
        )
    raise cursor.error(f"expected replica groups ({{...}}, [...]<=[...] or mesh[...]), found {cursor.describe()}")


def _axis_size(mesh: NamedMesh, name: str) -> int:
    return next(axis.size for axis in mesh.axes if axis.name == name)
