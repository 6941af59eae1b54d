"""Every collective of a module: who talks to whom, over which mesh axes, and how many bytes.

:func:`find_collectives` walks every computation (while bodies, fusions,
async wrapped computations included) and reports one :class:`Collective` per
collective, in any of its three forms:

* ``sync``: ``all-gather(...)``, ``all-reduce``, ``reduce-scatter``,
  ``all-to-all``, ``ragged-all-to-all``, ``collective-permute``,
  ``collective-broadcast``;
* ``start-done``: the dedicated ``all-gather-start``/``-done``,
  ``all-reduce-start``/``-done``, ``collective-permute-start``/``-done``;
* ``async-wrapped``: ``async-start`` whose called computation's root is a
  collective (also the sugared ``reduce-scatter-start``, ``all-to-all-start``
  ...); reported once, named by the start op, not again for the inner op.
  TPU's ``async-collective-start`` fusions are reported the same way;
* ``start-done`` also covers TPU multi-slice MegaScale transfers: a host-transfer
  ``send`` carrying ``_xla_megascale_transfer_type`` is the DCN part of a
  collective between slices (see :mod:`hlo_doctor.graph.tpu_collectives`).

**Groups.** Replica groups mean what XLA's ``GetCollectiveOpGroupMode`` says
(``collective_ops_utils.cc``):

=====================  ========================  ================================
channel_id             use_global_device_ids     group ids are
=====================  ========================  ================================
absent                 absent/false              replica ids (kCrossReplica), one
                                                 group per partition
present                not an attribute of the   partition ids (kCrossPartition),
                       op (all-to-all, permute,  one group per replica
                       broadcast)
present                false (all-gather,        replica ids, each with *all*
                       all-reduce,               partitions (kCrossReplicaAndPartition)
                       reduce-scatter)
present                true                      flattened ids replica*P+partition
                                                 (kFlattenedID)
=====================  ========================  ================================

``logical_groups`` are always in flattened logical ids (``replica *
num_partitions + partition``): partition ids for one replica. An empty
``replica_groups={}`` is one group of every replica (or partition, in
kCrossPartition mode). ``physical_groups`` map them through the device
assignment (:class:`~hlo_doctor.graph.devices.DeviceMap`).

**Bytes** are per device, from the operand and result shapes (tuple and
combined collectives sum their leaves). Wire bytes follow the ring model with
``n`` the group size: all-gather ``(n-1)/n * out``, reduce-scatter ``(n-1)/n
* in``, all-reduce ``2(n-1)/n * in``, all-to-all and ragged-all-to-all
``(n-1)/n * in``, collective-permute and collective-broadcast ``in``; rounded
down to whole bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from hlo_doctor.graph import tpu_collectives
from hlo_doctor.graph.collective_groups import GroupMode, _group_facts, group_mode, participant_groups
from hlo_doctor.hlo.attr_cursor import parse_int_list
from hlo_doctor.hlo.attr_metadata import parse_metadata
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.opcodes import COLLECTIVE_OPCODES

if TYPE_CHECKING:
    from hlo_doctor.graph.devices import DeviceMap
    from hlo_doctor.graph.mesh import Mesh
    from hlo_doctor.hlo.ir import Computation, HloModule, Instruction, Shape, SourceLocation

__all__ = ["Collective", "Form", "GroupMode", "find_collectives", "group_mode", "participant_groups"]

# Dedicated async pairs: start opcode -> (collective kind, done opcode).
_START_DONE = {
    "all-gather-start": ("all-gather", "all-gather-done"),
    "all-reduce-start": ("all-reduce", "all-reduce-done"),
    "collective-permute-start": ("collective-permute", "collective-permute-done"),
}
_IS_SYNC = re.compile(r'"is_sync"\s*:\s*(true|false)')
# What _describe reads of an op, in one pass over its line.
_DESCRIBED = ("channel_id", "use_global_device_ids", "replica_groups", "source_target_pairs", "dimensions",
              "backend_config", "metadata")


class Form(str, Enum):
    SYNC = "sync"
    START_DONE = "start-done"
    ASYNC_WRAPPED = "async-wrapped"


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective operation as it runs.

    ``instruction`` is the op itself, or the start op of an async pair
    (``done`` names its done op). ``groups`` are in flattened logical ids;
    for collective-permute they are the ``(source, target)`` pairs.
    ``dimension`` is the gathered (all-gather), scattered (reduce-scatter) or
    split/concat (all-to-all) tensor dim, else None. ``mesh_axes`` is None
    when no mesh was given or the groups match no axis combination.
    ``crosses_hosts`` is None when the host layout is unknown. ``is_sync``
    reads GPU's ``backend_config`` ``"is_sync"`` (None when absent).
    """

    kind: str
    form: Form
    computation: str
    instruction: str
    done: str | None
    mode: GroupMode
    logical_groups: tuple[tuple[int, ...], ...]
    physical_groups: tuple[tuple[int, ...], ...] | None
    group_size: int
    mesh_axes: tuple[str, ...] | None
    dimension: int | None
    bytes_in_per_device: int
    bytes_out_per_device: int
    wire_bytes_per_device: int
    crosses_hosts: bool | None
    is_sync: bool | None
    channel_id: int | None
    use_global_device_ids: bool
    op_name: str | None = None
    # The op (the wrapped one of an async-start) and its outer op, for what is read on demand.
    op: Instruction | None = field(default=None, compare=False, repr=False)
    outer: Instruction | None = field(default=None, compare=False, repr=False)

    @property
    def is_async(self) -> bool:
        return self.form is not Form.SYNC

    @property
    def source(self) -> SourceLocation | None:
        """Where the op came from (its metadata's frames), resolved on first read."""
        outer, op = self.outer, self.op
        found = outer.source if outer is not None else None
        return found or (op.source if op is not None else None)


def find_collectives(
    hlo_module: HloModule,
    device_map: DeviceMap | None = None,
    mesh: Mesh | None = None,
) -> list[Collective]:
    """Every collective of ``hlo_module``, in computation and instruction order.

    ``device_map`` gives physical groups and host crossing; ``mesh`` the
    mesh axes (only meaningful for one replica, where logical ids are
    partition ids).
    """
    num_partitions = _module_int(hlo_module, "num_partitions")
    num_replicas = _module_int(hlo_module, "num_replicas")
    if num_partitions is None:
        num_partitions = (device_map.num_partitions if device_map is not None else None) or 1
    if num_replicas is None:
        if device_map is not None and device_map.num_devices and num_partitions:
            num_replicas = max(1, device_map.num_devices // num_partitions)
        else:
            num_replicas = 1

    wrapped_roots: set[tuple[str, str]] = set()  # (computation, instruction) reported via async-start
    for computation in hlo_module.computations:
        for instruction in computation.instructions:
            opcode = instruction.opcode
            if opcode == "async-start":
                inner = _wrapped_collective(hlo_module, instruction)
                if inner is not None:
                    wrapped_roots.add(inner)
            elif opcode == "fusion" and tpu_collectives.is_async_collective_fusion(instruction):
                inner = tpu_collectives.fused_collective(hlo_module, instruction, COLLECTIVE_OPCODES)
                if inner is not None:
                    wrapped_roots.add(inner)

    out: list[Collective] = []
    memo: dict = {}  # replica groups repeat across a module's collectives
    for computation in hlo_module.computations:
        users: dict[str, list[Instruction]] | None = None
        for instruction in computation.instructions:
            opcode = instruction.opcode
            if opcode in COLLECTIVE_OPCODES:
                if (computation.name, instruction.name) in wrapped_roots:
                    continue
                found = _describe(
                    instruction, instruction, computation, computation, Form.SYNC, None,
                    num_replicas, num_partitions, device_map, mesh, memo=memo,
                )
            elif opcode in _START_DONE:
                kind, done_opcode = _START_DONE[opcode]
                users = users if users is not None else computation.users()
                done = _follow(users, instruction, {done_opcode})
                found = _describe(
                    instruction, instruction, computation, computation, Form.START_DONE, done,
                    num_replicas, num_partitions, device_map, mesh, kind=kind, memo=memo,
                )
            elif opcode == "async-start":
                inner = _wrapped_collective(hlo_module, instruction)
                if inner is None:
                    continue
                inner_computation = hlo_module.computation(inner[0])
                assert inner_computation is not None
                op = inner_computation.get(inner[1])
                assert op is not None
                users = users if users is not None else computation.users()
                done = _follow(users, instruction, {"async-done"})
                found = _describe(
                    op, instruction, inner_computation, computation, Form.ASYNC_WRAPPED, done,
                    num_replicas, num_partitions, device_map, mesh, memo=memo,
                )
            elif opcode == "fusion" and tpu_collectives.is_async_collective_fusion(instruction):
                inner = tpu_collectives.fused_collective(hlo_module, instruction, COLLECTIVE_OPCODES)
                if inner is None:
                    continue
                inner_computation = hlo_module.computation(inner[0])
                assert inner_computation is not None
                op = inner_computation.get(inner[1])
                assert op is not None
                users = users if users is not None else computation.users()
                done = next((u.name for u in users.get(instruction.name, ())
                             if u.name.startswith(tpu_collectives.ASYNC_COLLECTIVE_DONE)), None)
                found = _describe(
                    op, instruction, inner_computation, computation, Form.ASYNC_WRAPPED, done,
                    num_replicas, num_partitions, device_map, mesh, memo=memo,
                )
            elif opcode == "send" and (megascale := tpu_collectives.megascale_kind(instruction)) is not None:
                users = users if users is not None else computation.users()
                found = _describe_megascale(instruction, megascale, computation, users, device_map, mesh)
            else:
                continue
            out.append(found)
    return out


def _describe_megascale(
    send: Instruction,
    kind: str,
    computation: Computation,
    users: dict[str, list[Instruction]],
    device_map: DeviceMap | None,
    mesh: Mesh | None,
) -> Collective:
    """A MegaScale DCN transfer (``send`` + ``recv`` of one rendezvous) as a collective between slices."""
    physical = tpu_collectives.megascale_physical_groups(send)
    logical: tuple[tuple[int, ...], ...] = ()
    if device_map is not None and physical:
        ids = [[device_map.logical_id(d) for d in group] for group in physical]
        if all(i is not None for group in ids for i in group):
            logical = tuple(tuple(i for i in group if i is not None) for group in ids)
    n = max((len(g) for g in physical), default=1)
    bytes_in = _operand_bytes(send, computation, range(1))
    recv = tpu_collectives.megascale_recv(computation, send)
    bytes_out = _first_leaf_bytes(recv.shape) if recv is not None else bytes_in
    if kind == "all-gather":
        wire = (n - 1) * bytes_out // n
    elif kind == "all-reduce":
        wire = 2 * (n - 1) * bytes_in // n
    elif kind in ("reduce-scatter", "all-to-all"):
        wire = (n - 1) * bytes_in // n
    else:
        wire = bytes_in if n > 1 else 0
    done = None
    if recv is not None:
        done = next((u.name for u in users.get(recv.name, ()) if u.opcode == "recv-done"), None)
    crosses = None
    if device_map is not None and logical:
        spans = [device_map.spans_hosts(g) for g in logical]
        crosses = None if any(x is None for x in spans) else any(spans)
    axes = mesh.axes_for_groups(logical) if mesh is not None and logical else None
    metadata = send.metadata
    return Collective(
        kind=kind,
        form=Form.START_DONE,
        computation=computation.name,
        instruction=send.name,
        done=done,
        mode=GroupMode.FLATTENED_ID,
        logical_groups=logical,
        physical_groups=physical or None,
        group_size=n,
        mesh_axes=axes,
        dimension=None,
        bytes_in_per_device=bytes_in,
        bytes_out_per_device=bytes_out,
        wire_bytes_per_device=wire,
        crosses_hosts=crosses,
        is_sync=None,
        channel_id=send.channel_id,
        use_global_device_ids=True,
        op_name=metadata.op_name if metadata is not None else None,
        op=send,
        outer=send,
    )


def _module_int(module: HloModule, key: str) -> int | None:
    text = module.attribute(key)
    return int(text) if text is not None and text.strip().isdigit() else None


def _wrapped_collective(module: HloModule, start: Instruction) -> tuple[str, str] | None:
    for name in start.called_computations:
        called = module.computation(name)
        root = called.root if called is not None else None
        if called is not None and root is not None and root.opcode in COLLECTIVE_OPCODES:
            return called.name, root.name
    return None


def _follow(users: dict[str, list[Instruction]], start: Instruction, done_opcodes: set[str]) -> str | None:
    """The done op at the end of a start's chain (through async-update ops)."""
    current = start
    for _ in range(64):
        nxt = None
        for user in users.get(current.name, ()):
            if user.opcode in done_opcodes:
                return user.name
            if user.opcode == "async-update":
                nxt = user
        if nxt is None:
            return None
        current = nxt
    return None


def _describe(
    op: Instruction,
    outer: Instruction,
    op_computation: Computation,
    outer_computation: Computation,
    form: Form,
    done: str | None,
    num_replicas: int,
    num_partitions: int,
    device_map: DeviceMap | None,
    mesh: Mesh | None,
    *,
    kind: str | None = None,
    memo: dict | None = None,
) -> Collective:
    kind = kind or op.opcode
    # The op's attributes in one pass over its line (the group, channel and flag come first).
    channel_text, global_text, replica_groups, pairs, dims_text, config, metadata_text = op.attributes_of(_DESCRIBED)
    channel_id = _channel_id(op, channel_text)
    global_ids = (global_text or "").strip() == "true"
    mode = group_mode(kind, channel_id, global_ids)

    group_text = pairs if kind == "collective-permute" else replica_groups
    memo_key = (kind, mode, group_text, num_replicas, num_partitions)
    facts = memo.get(memo_key) if memo is not None else None
    if facts is None:
        facts = _group_facts(op, kind, mode, num_replicas, num_partitions, device_map, mesh)
        if memo is not None:
            memo[memo_key] = facts
    groups, group_size, physical, crosses, axes = facts

    bytes_in, bytes_out = _bytes(kind, op, op_computation)
    n = group_size
    if kind == "all-gather":
        wire = (n - 1) * bytes_out // n
    elif kind == "reduce-scatter":
        wire = (n - 1) * bytes_in // n
    elif kind == "all-reduce":
        wire = 2 * (n - 1) * bytes_in // n
    elif kind in ("all-to-all", "ragged-all-to-all"):
        wire = (n - 1) * bytes_in // n
    else:  # collective-permute, collective-broadcast
        wire = bytes_in if n > 1 else 0

    dimension = None
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        dims = _read(op, "dimensions", dims_text, parse_int_list) if dims_text is not None else None
        dimension = dims[0] if dims else None

    own_metadata = _read(op, "metadata", metadata_text, parse_metadata) if metadata_text is not None else None
    own_sync = _sync_flag(config)
    if outer is op:
        metadata, is_sync = own_metadata, own_sync
    else:
        outer_sync = _is_sync(outer)
        metadata = outer.metadata or own_metadata
        is_sync = outer_sync if outer_sync is not None else own_sync
    return Collective(
        kind=kind,
        form=form,
        computation=outer_computation.name,
        instruction=outer.name,
        done=done,
        mode=mode,
        logical_groups=groups,
        physical_groups=physical,
        group_size=group_size,
        mesh_axes=axes,
        dimension=dimension,
        bytes_in_per_device=bytes_in,
        bytes_out_per_device=bytes_out,
        wire_bytes_per_device=wire,
        crosses_hosts=crosses,
        is_sync=is_sync,
        channel_id=channel_id,
        use_global_device_ids=global_ids,
        op_name=metadata.op_name if metadata is not None else None,
        op=op,
        outer=outer,
    )


def _operand_bytes(op: Instruction, computation: Computation, indices: range | None = None) -> int:
    total = 0
    for index, name in enumerate(op.operands):
        if indices is not None and index not in indices:
            continue
        operand = computation.get(name)
        if operand is not None:
            total += operand.shape.byte_size
    return total


def _bytes(kind: str, op: Instruction, computation: Computation) -> tuple[int, int]:
    """Bytes in and out per device."""
    shape = op.shape
    if op.opcode == "all-gather-start":
        # (operands, results): one tuple element each, nested for combined ops
        if shape.is_tuple and len(shape.tuple_shapes) == 2:
            return _operand_bytes(op, computation), shape.tuple_shapes[1].byte_size
        return _operand_bytes(op, computation), shape.byte_size
    if op.opcode == "collective-permute-start":
        # (operand, result, u32[] contexts...)
        if shape.is_tuple and len(shape.tuple_shapes) >= 2:
            return _operand_bytes(op, computation, range(1)), shape.tuple_shapes[1].byte_size
        return _operand_bytes(op, computation, range(1)), shape.byte_size
    if kind == "collective-permute":
        # operand 0 is the data; in-place forms add output buffer and offsets
        return _operand_bytes(op, computation, range(1)), _first_leaf_bytes(shape)
    if kind == "ragged-all-to-all":
        # (input, output, input_offsets, send_sizes, output_offsets, recv_sizes)
        return _operand_bytes(op, computation, range(1)), shape.byte_size
    return _operand_bytes(op, computation), shape.byte_size


def _first_leaf_bytes(shape: Shape) -> int:
    return shape.tuple_shapes[0].byte_size if shape.is_tuple and shape.tuple_shapes else shape.byte_size


def _is_sync(instruction: Instruction) -> bool | None:
    return _sync_flag(instruction.backend_config)


def _sync_flag(config: str | None) -> bool | None:
    """GPU's ``"is_sync"`` in a ``backend_config`` (None when absent)."""
    if not config:
        return None
    match = _IS_SYNC.search(config)
    return None if match is None else match.group(1) == "true"


_Value = TypeVar("_Value")


def _read(op: Instruction, key: str, text: str, parse: Callable[[str], _Value]) -> _Value:
    """``parse(text)`` of ``op``'s attribute ``key``, its ParseError at the value's place in the file."""
    try:
        return parse(text)
    except ParseError as error:
        raise op.located(error, key, text) from None


def _channel_id(op: Instruction, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise op.located(ParseError(f"expected an integer, found {text[:40]!r}"), "channel_id", text) from None
