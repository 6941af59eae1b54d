"""Who talks to whom in a collective: XLA's group modes, participant groups, and the
mesh axes and hosts they span (for :mod:`hlo_doctor.graph.collectives`)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from hlo_doctor.errors import ShardingError

if TYPE_CHECKING:
    from hlo_doctor.graph.devices import DeviceMap
    from hlo_doctor.graph.mesh import Mesh
    from hlo_doctor.hlo.ir import Instruction

__all__ = ["GroupMode", "group_mode", "participant_groups"]


class GroupMode(str, Enum):
    """XLA's ``CollectiveOpGroupMode``."""

    CROSS_REPLICA = "cross-replica"
    CROSS_PARTITION = "cross-partition"
    CROSS_REPLICA_AND_PARTITION = "cross-replica-and-partition"
    FLATTENED_ID = "flattened-id"


def group_mode(kind: str, channel_id: int | None, use_global_device_ids: bool | None) -> GroupMode:
    """XLA's ``GetCollectiveOpGroupMode`` for one op.

    all-gather, all-reduce and reduce-scatter always carry
    ``use_global_device_ids`` (false when not printed); all-to-all,
    ragged-all-to-all, collective-permute and collective-broadcast never do.
    """
    has_flag = kind in ("all-gather", "all-reduce", "reduce-scatter")
    flag = bool(use_global_device_ids) if has_flag else None
    if channel_id is None:
        if flag:
            raise ShardingError("use_global_device_ids=true needs a channel_id")
        return GroupMode.CROSS_REPLICA
    if flag is None:
        return GroupMode.CROSS_PARTITION
    return GroupMode.FLATTENED_ID if flag else GroupMode.CROSS_REPLICA_AND_PARTITION


def participant_groups(
    groups: tuple[tuple[int, ...], ...], mode: GroupMode, num_replicas: int, num_partitions: int
) -> tuple[tuple[int, ...], ...]:
    """The groups of flattened logical ids (``replica * num_partitions + partition``) that talk.

    As XLA's ``GetParticipatingDevicesGroups``, before the device assignment.
    """
    if not groups:
        if mode is GroupMode.FLATTENED_ID:
            raise ShardingError("replica groups cannot be empty in flattened-id mode")
        count = num_partitions if mode is GroupMode.CROSS_PARTITION else num_replicas
        groups = (tuple(range(count)),)
    P = num_partitions
    out: list[tuple[int, ...]] = []
    if mode is GroupMode.CROSS_REPLICA:
        for group in groups:
            for partition in range(P):
                out.append(tuple(r * P + partition for r in group))
    elif mode is GroupMode.CROSS_PARTITION:
        for group in groups:
            for replica in range(num_replicas):
                out.append(tuple(replica * P + p for p in group))
    elif mode is GroupMode.CROSS_REPLICA_AND_PARTITION:
        for group in groups:
            out.append(tuple(r * P + p for r in group for p in range(P)))
    else:
        out.extend(groups)
    return tuple(out)


def _group_facts(
    op: Instruction,
    kind: str,
    mode: GroupMode,
    num_replicas: int,
    num_partitions: int,
    device_map: DeviceMap | None,
    mesh: Mesh | None,
) -> tuple:
    """Groups (logical, physical), group size, host crossing and mesh axes of one op's groups."""
    if kind == "collective-permute":
        pairs = op.source_pairs or ()
        groups = _permute_groups(pairs, mode, num_replicas, num_partitions)
    else:
        replica_groups = op.replica_groups
        raw = replica_groups.groups() if replica_groups is not None else ()
        groups = participant_groups(raw, mode, num_replicas, num_partitions)
    group_size = max((len(g) for g in groups), default=1)
    if kind == "collective-permute":
        group_size = 2 if groups else 1
    physical = tuple(device_map.physical(g) for g in groups) if device_map is not None else None
    crosses: bool | None = None
    if device_map is not None:
        spans = [device_map.spans_hosts(g) for g in groups]
        crosses = None if any(s is None for s in spans) else any(spans)
    axes: tuple[str, ...] | None = None
    if mesh is not None and num_replicas == 1:
        axes = _permute_axes(mesh, groups) if kind == "collective-permute" else mesh.axes_for_groups(groups)
    return groups, group_size, physical, crosses, axes


def _permute_groups(
    pairs: tuple[tuple[int, int], ...], mode: GroupMode, num_replicas: int, num_partitions: int
) -> tuple[tuple[int, ...], ...]:
    """Source-target pairs in flattened logical ids (one copy per replica or partition)."""
    P = num_partitions
    if mode is GroupMode.CROSS_PARTITION:
        return tuple((r * P + a, r * P + b) for r in range(num_replicas) for a, b in pairs)
    return tuple((a * P + p, b * P + p) for p in range(P) for a, b in pairs)


def _permute_axes(mesh: Mesh, pairs: tuple[tuple[int, ...], ...]) -> tuple[str, ...] | None:
    moved: set[str] = set()
    for a, b in pairs:
        between = mesh.axes_between(a, b)
        if between is None:
            return None
        moved.update(between)
    return tuple(n for n in mesh.axis_names if n in moved)
