"""RuleContext: one module of a dump, with the analyses rules share.

Each snapshot is parsed at most once (:class:`~hlo_doctor.dump.Snapshot`
caches its module) and each shared analysis is a cached property, built the
first time a rule asks for it, so a dozen rules cost little more than one.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from hlo_doctor.dump import Dump, DumpModule, Role
from hlo_doctor.rules.base import SourceRef

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import HloModule, Instruction, SourceLocation
    from hlo_doctor.rules.hardware import HardwareProfile

__all__ = [
    "AnalysisOptions",
    "CollectiveOp",
    "MeshInfo",
    "RuleContext",
    "is_library_file",
]

COLLECTIVE_KINDS = (
    "all-gather", "all-reduce", "reduce-scatter", "all-to-all",
    "collective-permute", "collective-broadcast", "ragged-all-to-all",
)

# Path pieces of frames that are not the user's code.
_LIBRARY_PARTS = (
    "site-packages", "dist-packages", "/jax/", "/jaxlib/", "/torch/", "/torch_xla/",
    "/xla/", "/flax/", "/optax/", "/equinox/", "/haiku/", "<frozen ", "/bootstrap/sitecustomize.py",
)
_LIBRARY_PREFIXES = ("jax/", "jaxlib/", "torch/", "torch_xla/", "xla/")


def is_library_file(path: str) -> bool:
    """A frame in jax, torch, torch_xla, xla, site-packages or hlo-doctor's run bootstrap."""
    text = path.replace("\\", "/")
    return any(part in text for part in _LIBRARY_PARTS) or text.startswith(_LIBRARY_PREFIXES)


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """Options of one analysis run that rules may read."""

    devices_per_host: int | None = None
    hardware: HardwareProfile | None = None
    verbose: bool = False


@dataclass(frozen=True, slots=True)
class MeshInfo:
    """A device mesh: named axes (major to minor) and the device ids in row-major order."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    device_ids: tuple[int, ...]
    origin: str  # "module.mlir" | "hlo header" | "run record"

    def axes_for(self, shards: int) -> tuple[str, ...] | None:
        """Mesh axes whose sizes multiply to ``shards`` (one axis preferred, then adjacent runs)."""
        for name, size in zip(self.axis_names, self.shape):
            if size == shards:
                return (name,)
        for start in range(len(self.shape)):
            for stop in range(start + 2, len(self.shape) + 1):
                if math.prod(self.shape[start:stop]) == shards:
                    return self.axis_names[start:stop]
        return None

    def fsdp_axes(self) -> tuple[str, ...] | None:
        """The axes to shard weights over: an axis called fsdp/data/dp, else the biggest axis."""
        for wanted in ("fsdp", "data", "dp", "batch"):
            for name in self.axis_names:
                if name.lower() == wanted:
                    # torch_xla's fsdp+replica meshes: shard over both when the second is 1
                    return (name,)
        if not self.axis_names:
            return None
        best = max(range(len(self.shape)), key=lambda i: self.shape[i])
        return (self.axis_names[best],)


@dataclass(frozen=True, slots=True)
class CollectiveOp:
    """One collective in a snapshot, with the bytes it moves per device (ring estimates).

    A local stand-in until :mod:`hlo_doctor.graph.collectives` lands.
    """

    instruction: Instruction
    kind: str  # all-gather, all-reduce, ... (without -start/-done)
    groups: tuple[tuple[int, ...], ...]
    group_size: int
    bytes: int  # bytes of the collective's data per device (operand or result)
    bytes_on_wire: float  # bytes each device sends (ring algorithm)
    multiplier: int = 1  # executions per step (while loops with a known trip count)
    crosses_hosts: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


class RuleContext:
    """What a rule sees: one :class:`DumpModule` of a :class:`Dump`, and shared analyses."""

    def __init__(self, dump: Dump, module: DumpModule, options: AnalysisOptions | None = None) -> None:
        self.dump = dump
        self.module = module
        self.options = options or AnalysisOptions()

    # -- snapshots (parsed once) -------------------------------------------
    def hlo(self, role: Role) -> HloModule | None:
        """The parsed snapshot with ``role``, or None (absent or failed to parse)."""
        snapshot = self.module.snapshot(role)
        return snapshot.try_module() if snapshot is not None else None

    @cached_property
    def before_optimizations(self) -> HloModule | None:
        return self.hlo(Role.BEFORE_OPTIMIZATIONS)

    @cached_property
    def after_propagation(self) -> HloModule | None:
        return self.hlo(Role.AFTER_PROPAGATION)

    @cached_property
    def partitioned(self) -> HloModule | None:
        return self.hlo(Role.AFTER_PARTITIONING)

    @cached_property
    def after_optimizations(self) -> HloModule | None:
        return self.hlo(Role.AFTER_OPTIMIZATIONS)

    @cached_property
    def only_snapshot(self) -> HloModule | None:
        """A lone HLO file (role OTHER), as when the input is one file."""
        if len(self.module.snapshots) != 1:
            return None
        return self.module.snapshots[0].try_module()

    @cached_property
    def sharded(self) -> HloModule | None:
        """The best module with global shapes and propagated shardings."""
        return self.after_propagation or self.before_optimizations or self.only_snapshot

    @cached_property
    def per_device(self) -> HloModule | None:
        """The best module with per-device shapes: partitioned, else after optimizations."""
        return self.partitioned or self.after_optimizations

    # -- facts about the module -------------------------------------------
    @property
    def backend(self) -> str | None:
        return self.module.backend

    @property
    def is_cpu(self) -> bool:
        backend = self.backend or ""
        return backend == "cpu" or backend.startswith("cpu")

    @cached_property
    def num_partitions(self) -> int:
        value = self.module.num_partitions
        if value is None and self.sharded is not None:
            text = self.sharded.attribute("num_partitions")
            value = int(text) if text and text.isdigit() else None
        return value or 1

    @cached_property
    def framework(self) -> str | None:
        record = self.dump.run_record or {}
        framework = record.get("framework") if isinstance(record, dict) else None
        if isinstance(framework, str):
            return framework.replace("-", "_")
        if self.module.name.startswith("SyncTensorsGraph"):
            return "torch_xla"
        if self.module.name.startswith(("jit_", "pjit_", "xmap_")):
            return "jax"
        return None

    @cached_property
    def debug_options(self) -> dict[str, object]:
        return self.module.debug_options

    @cached_property
    def devices_per_host(self) -> int | None:
        """From the option, else the run record, else the hardware profile."""
        if self.options.devices_per_host:
            return self.options.devices_per_host
        record = self.dump.run_record or {}
        value = record.get("devices_per_host") if isinstance(record, dict) else None
        if isinstance(value, int) and value > 0:
            return value
        if self.options.hardware is not None:
            return self.options.hardware.devices_per_host
        return None

    @cached_property
    def mesh(self) -> MeshInfo | None:
        """The device mesh: Shardy's ``sdy.mesh`` (module.mlir or header), else the run record's."""
        meshes = self.module.meshes
        if meshes:
            chosen = next((m for m in meshes if m.name == "mesh"), meshes[0])
            ids = chosen.device_ids or tuple(range(chosen.num_devices))
            origin = "module.mlir" if self.module.mlir is not None and self.module.mlir.meshes else "hlo header"
            return MeshInfo(chosen.axis_names, chosen.shape, tuple(ids), origin)
        record = self.dump.run_record or {}
        candidates = record.get("meshes") if isinstance(record, dict) else None
        if isinstance(candidates, list):
            for mesh in candidates:
                try:
                    names = tuple(str(n) for n in mesh["axis_names"])
                    shape = tuple(int(s) for s in mesh["shape"])
                except (KeyError, TypeError, ValueError):
                    continue
                if math.prod(shape) == self.num_partitions or len(candidates) == 1:
                    ids = tuple(int(i) for i in mesh.get("device_ids") or range(math.prod(shape)))
                    return MeshInfo(names, shape, ids, "run record")
        return None

    # -- source locations ----------------------------------------------------
    def user_source(self, instruction: Instruction) -> tuple[SourceRef | None, bool]:
        """The innermost frame of the user's code, and whether only library frames were found."""
        location = instruction.source
        if location is None:
            return None, False
        return user_frame(location)

    # -- shared analyses ---------------------------------------------------
    @cached_property
    def collectives(self) -> tuple[CollectiveOp, ...]:
        """Collectives of the per-device module (partitioned, else after optimizations)."""
        from hlo_doctor.rules._analyses import find_collectives

        module = self.per_device
        if module is None:
            return ()
        return find_collectives(module, self.num_partitions, self.devices_per_host)

    @cached_property
    def dot_flops(self) -> float:
        """Per-device FLOPs of dots and convolutions per step (while bodies times their trip count)."""
        from hlo_doctor.rules._analyses import count_flops

        module = self.per_device
        return count_flops(module) if module is not None else 0.0

    @cached_property
    def instructions_by_name(self) -> dict[str, Instruction]:
        """Per-device module instructions by name."""
        module = self.per_device
        if module is None:
            return {}
        return {i.name: i for _, i in module.instructions()}


def user_frame(location: SourceLocation) -> tuple[SourceRef | None, bool]:
    """The innermost user frame of ``location`` and whether every frame was a library's."""
    frames = location.frames or ()
    if not frames:
        if is_library_file(location.file):
            return None, True
        return SourceRef(location.file, location.line, location.function or None), False
    for frame in frames:
        if not is_library_file(frame.file):
            return SourceRef(frame.file, frame.line, frame.function or None), False
    return None, True


_SPLIT = re.compile(r"[\\/]")


def short_path(path: str) -> str:
    """The last two parts of a path, for messages."""
    parts = _SPLIT.split(path)
    return os.path.join(*parts[-2:]) if len(parts) >= 2 else path
