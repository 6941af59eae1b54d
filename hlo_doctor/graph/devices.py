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
process, each device's ``process_index`` in the runner's record (deviceless
target compiles), a TPU topology's chip grid (hosts are blocks of chips:
:mod:`hlo_doctor.dump.tpu`), the record's ``devices_per_host``, then a
single-process topology (one host). With ``devices_per_host`` N, device
``d`` is on host ``d // N``: PjRt numbers the devices of a multi-process
GPU/CPU job process by process. On TPU that is a guess, and
:attr:`DeviceMap.host_note` says so.

Slices (TPU multi-slice) come from the record's ``slice_index`` per device,
else from MegaScale device ids (``(slice + 1) * 100000 + local id``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hlo_doctor.dump import protowire
from hlo_doctor.dump.tpu import slice_of as megascale_slices
from hlo_doctor.errors import ConfigurationError

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
      ``"topology"`` (a multi-process CPU topology, or a TPU topology's chip
      grid), ``"sidecar-devices"`` (each device's ``process_index`` as the
      runner recorded it), ``"sidecar"`` (the runner's ``devices_per_host``),
      ``"single-process"`` or None;
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
    def assignment_note(self) -> str | None:
        """The sentence a finding adds when the device assignment was not in the dump
        (jax 0.4, torch_xla): logical ids were taken as device ids. None otherwise."""
        if self.assignment_source != "identity":
            return None
        return "no device assignment in the dump; identity assumed"

    @property
    def host_note(self) -> str | None:
        """The sentence a finding adds when hosts are a guess of contiguous ids on a TPU
        (``--devices-per-host`` or the runner's count), where hosts are blocks of the chip
        grid instead; None when the hosts came from the devices themselves."""
        if self.platform != "tpu" or self.devices_per_host is None:
            return None
        if self.host_source not in ("argument", "sidecar", "single-process"):
            return None
        return (f"hosts assumed to be runs of {self.devices_per_host} contiguous device ids "
                "(--devices-per-host); TPU hosts are blocks of the chip grid, so this is a guess")

    def assumption_notes(self) -> tuple[str, ...]:
        """Every assumption the map makes, as sentences for a finding (possibly none)."""
        return tuple(n for n in (self.assignment_note, self.host_note) if n is not None)

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
    slice_of: dict[int, int] | None = None
    platform = _platform(dump_module, run_record)
    record_per_host = run_record.get("devices_per_host") if run_record is not None else None
    processes = topology_process_indices(topology) if topology is not None else None
    recorded = recorded_devices(run_record)
    tpu_grid = topology.tpu_topology() if topology is not None else None
    if recorded is not None:
        slice_of = {d: s for d, (_, s) in recorded.items() if s is not None} or None
    elif platform == "tpu":
        slice_of = megascale_slices(assignment)
    if devices_per_host is not None:
        if devices_per_host < 1:
            raise ConfigurationError(f"devices_per_host must be positive, not {devices_per_host}")
        per_host, host_source = devices_per_host, "argument"
    elif processes is not None and len(set(processes)) > 1:
        host_of = dict(enumerate(processes))
        per_host = _even_hosts(processes)
        host_source = "topology"
    elif recorded is not None and all(d in recorded for d in assignment):
        host_of = {d: p for d, (p, _) in recorded.items()}
        per_host = _even_run(host_of)
        host_source = "sidecar-devices"
    elif tpu_grid is not None and (grid_hosts := tpu_grid.host_of(assignment)) is not None:
        host_of = grid_hosts
        per_host = _even_run(host_of)
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
        slice_of=slice_of,
        platform=platform,
    )


def recorded_devices(run_record: Mapping[str, object] | None) -> dict[int, tuple[int, int | None]] | None:
    """Device id -> (process_index, slice_index or None) from the runner's sidecar
    ``devices`` list (deviceless target compiles); None when it has none."""
    if run_record is None:
        return None
    devices = run_record.get("devices")
    if not isinstance(devices, list) or not devices:
        return None
    out: dict[int, tuple[int, int | None]] = {}
    for device in devices:
        if not isinstance(device, Mapping):
            return None
        ident, process = device.get("id"), device.get("process_index")
        if not isinstance(ident, int) or not isinstance(process, int):
            return None
        index = device.get("slice_index")
        out[ident] = (process, index if isinstance(index, int) else None)
    return out


def _platform(dump_module: DumpModule | None, run_record: Mapping[str, object] | None) -> str | None:
    platform = dump_module.platform if dump_module is not None else None
    if platform is not None:
        return platform
    target = run_record.get("target") if run_record is not None else None
    if isinstance(target, Mapping):
        name = str(target.get("platform") or "")
        return {"cuda": "gpu", "rocm": "gpu"}.get(name, name or None)
    return None


def _even_run(host_of: Mapping[int, int]) -> int | None:
    """N when every host holds a run of N consecutive device ids in order, else None."""
    ids = sorted(host_of)
    return _even_hosts(tuple(host_of[d] for d in ids)) if ids == list(range(len(ids))) else None


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


def _cpu_topology_processes(data: bytes) -> tuple[int, ...] | None:
    """``CpuTopologyProto``: repeated CpuDevice ``cpu_devices`` (1) with ``process_index`` (2)."""
    devices: list[int] = []
    for device in protowire.all_of(data, 1):  # raises WireError (a ValueError) for bytes that do not read
        if isinstance(device, bytes):
            process = protowire.first(device, 2)
            devices.append(process if isinstance(process, int) else 0)
    return tuple(devices) if devices else None
