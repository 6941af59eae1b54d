"""Compile options, device assignment, topology and debug options of a dumped module.

Read from the text-format files XLA writes next to the HLO:
``module_NNNN.NAME/compile_options.textproto`` (``num_partitions``,
``num_replicas``, ``device_assignment``, ``use_shardy_partitioner``...),
``config.pbtxt`` / ``module_NNNN.NAME.config.pbtxt`` (an ``HloModuleConfigProto``,
GPU compiles; its ``static_device_assignment``), ``topology.textproto`` and
``module_NNNN.NAME.debug_options``. Fields are looked up anywhere in the
message tree, so it does not matter which wrapper message holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hlo_doctor.dump import protowire
from hlo_doctor.dump.textproto import Message
from hlo_doctor.dump.tpu import chip_of_version, decode_tpu_topology

if TYPE_CHECKING:
    from hlo_doctor.dump.tpu import TpuTopology


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """Logical (replica, partition) -> physical device id.

    ``devices[replica][partition]`` as in XLA's ``DeviceAssignment`` (an
    Array2D of replica_count x computation_count). ``device_ids`` flattens it
    replica-major, so with one replica it is the device of each partition.
    """

    devices: tuple[tuple[int, ...], ...]

    @property
    def replica_count(self) -> int:
        return len(self.devices)

    @property
    def computation_count(self) -> int:
        return len(self.devices[0]) if self.devices else 0

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d for row in self.devices for d in row)

    def device(self, replica: int = 0, partition: int = 0) -> int:
        return self.devices[replica][partition]

    def partition_devices(self, replica: int = 0) -> tuple[int, ...]:
        return self.devices[replica]

    def logical_id(self, device: int) -> tuple[int, int] | None:
        """(replica, partition) running on physical ``device``, or None."""
        for replica, row in enumerate(self.devices):
            for partition, d in enumerate(row):
                if d == device:
                    return replica, partition
        return None

    @classmethod
    def from_message(cls, message: Message) -> DeviceAssignment | None:
        """From a ``DeviceAssignmentProto`` (computation_devices { replica_device_ids })."""
        columns: list[list[int]] = []
        for computation in message.get_all("computation_devices"):
            if isinstance(computation, Message):
                columns.append(
                    [int(v) for v in computation.get_all("replica_device_ids") if isinstance(v, int)]
                )
        if not columns:
            return None
        replica_count = message.get("replica_count")
        replicas = replica_count if isinstance(replica_count, int) and replica_count > 0 else len(columns[0])
        if any(len(c) != replicas for c in columns):
            replicas = min(len(c) for c in columns)
        return cls(tuple(tuple(c[r] for c in columns) for r in range(replicas)))


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """The parts of ``CompileOptionsProto`` (or ``config.pbtxt``) hlo-doctor uses."""

    num_partitions: int | None = None
    num_replicas: int | None = None
    device_assignment: DeviceAssignment | None = None
    use_spmd_partitioning: bool | None = None
    use_shardy_partitioner: bool | None = None
    process_count: int | None = None
    process_index: int | None = None
    source: str = ""  # the file it came from
    raw: Message = field(default_factory=Message, compare=False, repr=False)

    @classmethod
    def from_message(cls, message: Message, source: str = "") -> CompileOptions:
        assignment = message.find("device_assignment")
        if not isinstance(assignment, Message):  # HloModuleConfigProto (GPU config.pbtxt)
            assignment = message.find("static_device_assignment")
        return cls(
            num_partitions=_int(message.find("num_partitions")),
            num_replicas=_int(message.find("num_replicas")),
            device_assignment=(
                DeviceAssignment.from_message(assignment) if isinstance(assignment, Message) else None
            ),
            use_spmd_partitioning=_bool(message.find("use_spmd_partitioning")),
            use_shardy_partitioner=_bool(message.find("use_shardy_partitioner")),
            process_count=_int(message.find("process_count")),
            process_index=_first_int(message, ("process_index", "process_id", "task_id")),
            source=source,
            raw=message,
        )


    @classmethod
    def from_binary(cls, data: bytes, source: str = "") -> CompileOptions:
        """From a serialized ``CompileOptionsProto`` (jax 0.7's ``jit_NAME_TS/compile_options.pb``).

        Reads ``executable_build_options`` (3): ``num_replicas`` (4), ``num_partitions`` (5),
        ``use_spmd_partitioning`` (6), ``device_assignment`` (9) and ``use_shardy_partitioner``
        (19). Raises :class:`~hlo_doctor.dump.protowire.WireError` for bytes that do not read.
        """
        build = protowire.as_message(protowire.first(data, 3)) or b""
        assignment = protowire.as_message(protowire.first(build, 9))
        return cls(
            num_partitions=_wire_int(protowire.first(build, 5)),
            num_replicas=_wire_int(protowire.first(build, 4)),
            device_assignment=_binary_assignment(assignment) if assignment is not None else None,
            use_spmd_partitioning=_wire_bool(protowire.first(build, 6)),
            use_shardy_partitioner=_wire_bool(protowire.first(build, 19)),
            source=source,
        )


def _binary_assignment(data: bytes) -> DeviceAssignment | None:
    """A serialized ``DeviceAssignmentProto``: replica_count (1), computation_devices (3)
    of ``replica_device_ids`` (1, packed int64)."""
    columns = [
        [protowire.signed64(v) for v in protowire.packed_varints(column, 1)]
        for column in protowire.all_of(data, 3)
        if isinstance(column, bytes)
    ]
    if not columns or not columns[0]:
        return None
    replicas = min(len(c) for c in columns)
    return DeviceAssignment(tuple(tuple(c[r] for c in columns) for r in range(replicas)))


def _wire_int(value: int | bytes | None) -> int | None:
    return protowire.signed64(value) if isinstance(value, int) else None


def _wire_bool(value: int | bytes | None) -> bool | None:
    return bool(value) if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class Topology:
    """``topology.textproto``: the platform, and process/host ids where the proto names them."""

    platform_name: str | None = None
    platform_version: str | None = None
    topology_type: str | None = None  # platform_specific_topology's type_url
    process_ids: tuple[int, ...] = ()
    host_ids: tuple[int, ...] = ()
    slice_ids: tuple[int, ...] = ()
    source: str = ""
    raw: Message = field(default_factory=Message, compare=False, repr=False)

    @classmethod
    def from_message(cls, message: Message, source: str = "") -> Topology:
        specific = message.find("platform_specific_topology")
        type_url = specific.get("type_url") if isinstance(specific, Message) else None
        return cls(
            platform_name=_str(message.find("platform_name")),
            platform_version=_str(message.find("platform_version")),
            topology_type=_str(type_url),
            process_ids=_ints(message, ("process_index", "process_id", "task_id")),
            host_ids=_ints(message, ("host_id", "host_index")),
            slice_ids=_ints(message, ("slice_index", "slice_id")),
            source=source,
            raw=message,
        )

    @property
    def is_tpu(self) -> bool:
        return (self.platform_name or "").lower() == "tpu" or (
            self.topology_type or "").endswith("TpuPjRtTopologyDescriptionProto")

    @property
    def tpu_chip(self) -> str | None:
        """``v4``, ``v5e``, ``v5p``, ``v6e`` from ``platform_version`` (TPU dumps only)."""
        return chip_of_version(self.platform_version) if self.is_tpu else None

    def tpu_topology(self) -> TpuTopology | None:
        """The chip grid and host blocks from the encoded ``TpuPjRtTopologyDescriptionProto``."""
        if not self.is_tpu:
            return None
        specific = self.raw.find("platform_specific_topology")
        value = specific.get("value") if isinstance(specific, Message) else None
        if not isinstance(value, str):
            return None
        try:
            data = value.encode("latin-1")
        except UnicodeEncodeError:
            return None
        return decode_tpu_topology(data, self.platform_version)


def debug_options_dict(message: Message) -> dict[str, object]:
    """``*.debug_options`` as flag -> value (a repeated flag gives a list)."""
    return message.to_dict()


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return bool(value)
    return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _first_int(message: Message, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _int(message.find(name))
        if value is not None:
            return value
    return None


def _ints(message: Message, names: tuple[str, ...]) -> tuple[int, ...]:
    found: list[int] = []
    for name in names:
        for value in message.find_all(name):
            if isinstance(value, int) and not isinstance(value, bool) and value not in found:
                found.append(value)
    return tuple(sorted(found))
