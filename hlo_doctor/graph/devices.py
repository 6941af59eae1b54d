"""Logical ids -> physical devices -> hosts.

HLO never names physical devices. Tile assignments, replica groups and
``source_target_pairs`` hold *logical* ids: partition ids when the program
has one replica (every SPMD program JAX and torch_xla emit), and in general
the flattened id ``replica * num_partitions + partition``. The compile
options' ``device_assignment`` says which physical device runs each logical
id (XLA's ``DeviceAssignment``, replica-major). JAX sets it to the mesh's
devices, flattened: a mesh built as ``np.array(jax.devices()).reshape(2, 4).T``
compiles with the device assignment ``[0, 4, 1, 5, 2, 6, 3, 7]``, so the
partition group ``{0, 1}`` runs on devices ``{0, 4}``.

Which host a physical device is on comes from, in order: an explicit
``devices_per_host`` (the ``--devices-per-host`` option), the process index
of each device in ``topology.textproto`` when it names more than one
process, then the runner's record (``hlo_doctor_run.json``'s
``devices_per_host``), then a single-process topology (one host). With
``devices_per_host`` N, device ``d`` is on host ``d // N``: PjRt numbers
the devices of a multi-process job process by process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hlo_doctor.dump import DumpModule, Topology

__all__ = ["DeviceMap", "device_map", "topology_process_indices"]


@dataclass(frozen=True, slots=True)
class DeviceMap:
    """Where each logical id runs, and which host each physical device is on.

    * ``logical_to_physical[i]``: the physical device of flattened logical id
      ``i`` (replica-major, as ``DeviceAssignment.device_ids``); identity when
      the dump has no device assignment (``assignment_source`` is then
      ``"identity"``);
    * ``devices_per_host``: devices per host when hosts are evenly sized and
      numbered in order, else None;
    * ``host_of``: physical device -> host (process) index, or None when the
      host layout is unknown;
    * ``num_partitions``: partitions per replica (to split flattened ids);
    * ``host_source``: where the host layout came from: ``"argument"``,
      ``"topology"``, ``"sidecar"``, ``"single-process"`` or None;
    * ``slice_of``: physical device -> slice index (TPU multi-slice: the
      devices of a slice are joined by ICI, slices by DCN), or None when the
      dump says nothing of slices (one slice, or not a TPU);
    * ``platform``: ``"cpu"``, ``"gpu"``, ``"tpu"`` or None when unknown. On
      TPU the slow boundary is the slice, elsewhere the host.
    """

    logical_to_physical: tuple[int, ...]
    devices_per_host: int | None = None
    host_of: dict[int, int] | None = None
    num_partitions: int | None = None
    assignment_source: str = "identity"  # "compile_options" | "config.pbtxt" | "identity"
    host_source: str | None = None
    slice_of: dict[int, int] | None = None
    platform: str | None = None

    @property
    def num_devices(self) -> int:
        return len(self.logical_to_physical)

    @property
    def is_identity(self) -> bool:
        return self.logical_to_physical == tuple(range(len(self.logical_to_physical)))

    def physical_id(self, logical: int) -> int:
        """The physical device of one logical id (itself when out of range)."""
        if 0 <= logical < len(self.logical_to_physical):
            return self.logical_to_physical[logical]
        return logical

    def physical(self, group: Iterable[int]) -> tuple[int, ...]:
        """The physical devices of a group of logical ids, in the group's order."""
        return tuple(self.physical_id(i) for i in group)

    def logical_id(self, device: int) -> int | None:
        """The logical id that runs on physical ``device``, or None."""
        try:
            return self.logical_to_physical.index(device)
        except ValueError:
            return None

    def host(self, device: int) -> int | None:
        """The host of one *physical* device, or None when unknown."""
        if self.host_of is None:
            return None
        return self.host_of.get(device)

    def hosts(self, group: Iterable[int]) -> tuple[int, ...] | None:
        """The sorted distinct hosts of a group of *logical* ids; None when unknown."""
        if self.host_of is None:
            return None
        found: set[int] = set()
        for device in self.physical(group):
            host = self.host_of.get(device)
            if host is None:
                return None
            found.add(host)
        return tuple(sorted(found))

    def spans_hosts(self, group: Iterable[int]) -> bool | None:
        """Whether a group of *logical* ids runs on more than one host (None: unknown)."""
        hosts = self.hosts(group)
        return None if hosts is None else len(hosts) > 1

    def slices(self, group: Iterable[int]) -> tuple[int, ...] | None:
        """The sorted distinct slices of a group of *logical* ids; None when unknown."""
        if self.slice_of is None:
            return None
        found: set[int] = set()
        for device in self.physical(group):
            index = self.slice_of.get(device)
            if index is None:
                return None
            found.add(index)
        return tuple(sorted(found))

    def spans_slices(self, group: Iterable[int]) -> bool | None:
        """Whether a group of *logical* ids runs on more than one slice (None: unknown)."""
        found = self.slices(group)
        return None if found is None else len(found) > 1

    @property
    def slow_boundary(self) -> str:
        """``"slice"`` on TPU (ICI joins the hosts of a slice), else ``"host"``."""
        return "slice" if self.platform == "tpu" else "host"

    def crosses_slow_boundary(self, group: Iterable[int]) -> bool | None:
        """Whether a group of logical ids crosses the slow link: slices on TPU, hosts elsewhere."""
        if self.platform == "tpu":
            spans = self.spans_slices(group)
            return False if spans is None and self.slice_of is None else spans
        return self.spans_hosts(group)


def device_map(
    dump_module: DumpModule | None,
    run_record: Mapping[str, object] | None = None,
    devices_per_host: int | None = None,
    *,
    num_devices: int | None = None,
) -> DeviceMap:
    """The device map of one dumped module.

    The device assignment comes from ``compile_options.textproto`` (or GPU's
    ``config.pbtxt``); without one, logical ids are taken as device ids over
    ``num_devices`` (default: replicas x partitions, else the record's
    ``device_count``). Hosts: see the module docstring for the order.
    """
    assignment: tuple[int, ...] | None = None
    assignment_source = "identity"
    num_partitions: int | None = None
    topology = None
    if dump_module is not None:
        assignment = dump_module.device_assignment
        options = dump_module.compile_options
        if assignment is not None and options is not None:
            assignment_source = "config.pbtxt" if options.source.endswith("config.pbtxt") else "compile_options"
        num_partitions = dump_module.num_partitions
        topology = dump_module.topology
    if assignment is None:
        count = num_devices
        if count is None and dump_module is not None and num_partitions is not None:
            count = num_partitions * (dump_module.num_replicas or 1)
        if count is None and run_record is not None:
            recorded = run_record.get("device_count")
            count = recorded if isinstance(recorded, int) else None
        assignment = tuple(range(count or 0))

    host_of: dict[int, int] | None = None
    per_host: int | None = None
    host_source: str | None = None
    record_per_host = run_record.get("devices_per_host") if run_record is not None else None
    processes = topology_process_indices(topology) if topology is not None else None
    if devices_per_host is not None:
        if devices_per_host < 1:
            raise ValueError(f"devices_per_host must be positive, not {devices_per_host}")
        per_host, host_source = devices_per_host, "argument"
    elif processes is not None and len(set(processes)) > 1:
        host_of = dict(enumerate(processes))
        per_host = _even_hosts(processes)
        host_source = "topology"
    elif isinstance(record_per_host, int) and record_per_host > 0:
        per_host, host_source = record_per_host, "sidecar"
    elif processes is not None and len(processes) >= len(assignment) > 0:
        per_host, host_source = len(processes), "single-process"
    if per_host is not None and host_of is None:
        devices = set(assignment) | set(range(len(assignment)))
        host_of = {d: d // per_host for d in sorted(devices)}
    return DeviceMap(
        logical_to_physical=assignment,
        devices_per_host=per_host,
        host_of=host_of,
        num_partitions=num_partitions,
        assignment_source=assignment_source,
        host_source=host_source,
    )


def _even_hosts(processes: tuple[int, ...]) -> int | None:
    """N when device d is on process d // N for every device, else None."""
    count = len(set(processes))
    if len(processes) % count:
        return None
    size = len(processes) // count
    if all(p == d // size for d, p in enumerate(sorted(processes))) and list(processes) == sorted(processes):
        return size
    return None


def topology_process_indices(topology: Topology) -> tuple[int, ...] | None:
    """Process index of each device (by device id) from ``topology.textproto``.

    Reads ``CpuTopologyProto`` (``cpu_devices { process_index: 2,
    local_hardware_id: 3 }``), which the textproto carries as the serialized
    bytes of a ``google.protobuf.Any``, and a ``process_index`` per device
    where the topology is written out as text. None when the topology names
    no devices.
    """
    specific = topology.raw.find("platform_specific_topology")
    type_url = topology.topology_type or ""
    if specific is not None and type_url.endswith("CpuTopologyProto"):
        value = specific.get("value") if hasattr(specific, "get") else None
        if isinstance(value, str):
            try:
                return _cpu_topology_processes(value.encode("latin-1"))
            except (UnicodeEncodeError, ValueError):
                return None
    return None


# -- a minimal protobuf wire-format reader, for CpuTopologyProto only --------


def _cpu_topology_processes(data: bytes) -> tuple[int, ...] | None:
    devices: list[int] = []
    for field, wire, value in _fields(data):
        if field == 1 and wire == 2:  # repeated CpuDevice cpu_devices = 1
            process = 0
            assert isinstance(value, bytes)
            for sub_field, sub_wire, sub_value in _fields(value):
                if sub_field == 2 and sub_wire == 0:  # int32 process_index = 2
                    assert isinstance(sub_value, int)
                    process = sub_value
            devices.append(process)
    return tuple(devices) if devices else None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((field, wire, value))
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            out.append((field, wire, data[pos : pos + length]))
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out
