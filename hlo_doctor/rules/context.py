"""RuleContext: one module of a dump, with the analyses rules share.

Each snapshot is parsed at most once (:class:`~hlo_doctor.dump.Snapshot`
caches its module) and each shared analysis is a cached property, built the
first time a rule asks for it, so a dozen rules cost little more than one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from hlo_doctor.dump import Dump, DumpModule, Role
from hlo_doctor.graph.collectives import Collective, find_collectives
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.devices import DeviceMap, device_map
from hlo_doctor.graph.linking import link_modules, resolve_twin, twin_refs
from hlo_doctor.graph.mesh import Mesh, recover_mesh
from hlo_doctor.graph.source import helper_lines, is_library_file
from hlo_doctor.graph.source import user_frame as innermost_user_frame
from hlo_doctor.program.locate import SourceSettings
from hlo_doctor.program.records import made_by_sharding_call, record_entries, sharding_calls_in
from hlo_doctor.program.source import program_line
from hlo_doctor.program.suggest import argument_name
from hlo_doctor.program.terms import mesh_axes_in
from hlo_doctor.rules.base import SourceRef
from hlo_doctor.semantics import ModuleSemantics
from hlo_doctor.semantics.batch_dims import BatchAnalysis, analyze_data_batch
from hlo_doctor.semantics.cost import module_flops

if TYPE_CHECKING:
    from hlo_doctor.graph.dataflow import DataflowGraph
    from hlo_doctor.hlo.ir import HloModule, Instruction, Shape, SourceLocation, StackFrame
    from hlo_doctor.semantics.hardware import HardwareProfile

__all__ = [
    "AnalysisOptions",
    "RuleContext",
    "is_library_file",
]

PENDING_NAME = "\x00hlo-doctor-pending-name:"


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """Options of one analysis run that rules may read."""

    devices_per_host: int | None = None
    hardware: HardwareProfile | None = None
    verbose: bool = False
    sources: SourceSettings = SourceSettings()
    """how the program's files are found and which folders may be read (the analysis sets up the
    :class:`~hlo_doctor.program.locate.SourceFinder` every read of the program goes through)"""


class RuleContext:
    """What a rule sees: one :class:`DumpModule` of a :class:`Dump`, and shared analyses."""

    def __init__(self, dump: Dump, module: DumpModule, options: AnalysisOptions | None = None) -> None:
        self.dump = dump
        self.module = module
        self.options = options or AnalysisOptions()
        # frame tables (kept, so that their id stays theirs) -> the helper lines of their chains
        self._helpers: dict[int, tuple[object, frozenset[tuple[str, int]]]] = {}
        # Set in a worker process (see hlo_doctor.rules.parallel): names after partitioning
        # are then left to the parent, as placeholder -> (after-propagation key, TwinRef).
        self.pending_names: dict[str, tuple] | None = None

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

    @cached_property
    def global_parameter_shapes(self) -> tuple[Shape, ...] | None:
        """The entry parameters' global shapes, by number: from the header of the after-propagation
        (else before-optimizations) snapshot, read without parsing it; else from :attr:`sharded`."""
        for role in (Role.AFTER_PROPAGATION, Role.BEFORE_OPTIMIZATIONS):
            snapshot = self.module.snapshot(role)
            shapes = snapshot.entry_parameter_shapes if snapshot is not None else None
            if shapes is not None:
                return shapes
        module = self.sharded
        if module is None or module.entry is None:
            return None
        params = module.entry.parameters()
        if [p.parameter_number for p in params] != list(range(len(params))):
            return None
        return tuple(p.shape for p in params)

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
    def argument_names(self) -> dict[int, str]:
        """Entry parameter number -> the user's argument name, from ``before_optimizations``
        (the names as JAX lowered them, before any pass could relabel them); {} without it."""
        # Only the parameter lines are parsed when nothing else needs the module.
        snapshot = self.module.snapshot(Role.BEFORE_OPTIMIZATIONS)
        params = snapshot.entry_parameters() if snapshot is not None else None
        if params is None:
            return {}

        names: dict[int, str] = {}
        for param in params:
            name = argument_name(param)
            if param.parameter_number is not None and name != param.name:
                names[param.parameter_number] = name
        return names

    @cached_property
    def framework(self) -> str | None:
        record = self.dump.run_record or {}
        framework = record.get("framework") if isinstance(record, dict) else None
        if isinstance(framework, str):
            return framework.replace("-", "_")
        # What the lowering wrote: torch_xla's ops carry aten/xla op types, JAX's op names are
        # jit(...) scopes. Without op metadata, the module name, then donated buffers (torch_xla's
        # training steps donate; so do many JAX steps, so it only breaks a tie).
        module = self.per_device or self.sharded
        for index, (_, instruction) in enumerate(module.instructions() if module is not None else ()):
            if index > 2000:
                break
            metadata = instruction.metadata
            if metadata is None:
                continue
            if (metadata.op_type or "").startswith(("aten__", "xla__")):
                return "torch_xla"
            if (metadata.op_name or "").startswith(("jit(", "pjit(")):
                return "jax"
        if self.module.name.startswith("SyncTensorsGraph"):
            return "torch_xla"
        if self.module.name.startswith(("jit_", "pjit_", "xmap_")):
            return "jax"
        for role in (Role.AFTER_PARTITIONING, Role.AFTER_PROPAGATION, Role.BEFORE_OPTIMIZATIONS):
            snapshot = self.module.snapshot(role)
            if snapshot is not None and snapshot.header_attribute("buffer_donor"):
                return "torch_xla"
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
    def mesh(self) -> Mesh | None:
        """The device mesh (module.mlir, the runner's record, replica groups, or inferred)."""
        # The snapshot is parsed only when the dump's declarations do not give the mesh.
        mesh = recover_mesh(self.module, lambda: self.sharded or self.per_device, self.dump.run_record)
        if mesh is not None and mesh.is_inferred:
            names = mesh_axes_in(self.program_files, mesh.axis_sizes)
            if names is not None:  # the program's own mesh construction names the axes
                mesh = Mesh(names, mesh.axis_sizes, mesh.device_ids, "program", mesh.name)
        return mesh

    @cached_property
    def program_path(self) -> str | None:
        """The user's program: the runner's record of the script, else the file of the entry's first user frame."""
        record = self.dump.run_record or {}
        script = record.get("script") if isinstance(record, dict) else None
        if isinstance(script, dict) and isinstance(script.get("path"), str):
            return script["path"]
        module = self.sharded or self.per_device
        for _, instruction in module.instructions() if module is not None else ():
            source, _ = self.user_source(instruction) if instruction.source is not None else (None, False)
            if source is not None:
                return source.file
        return None

    @cached_property
    def dump_program_path(self) -> str | None:
        """:attr:`program_path`, else the user file another module of the dump names: torch_xla
        compiles a step as several modules (the inputs' placement, then the training step), and the
        step's ops often carry only library frames while a small module the program compiled first
        names the program's file. The first module (smallest first) whose ops name a user file gives it."""
        if self.program_path is not None:
            return self.program_path
        cache = self.dump.__dict__.setdefault("_hlo_doctor_program", {})
        if "path" in cache:
            return cache["path"]
        found = None
        for module in sorted((m for m in self.dump.modules if m is not self.module), key=_module_size):
            if _module_size(module) > _MAX_PROGRAM_SEARCH_BYTES:
                break
            try:
                found = RuleContext(self.dump, module, self.options).program_path
            except Exception:  # noqa: BLE001 - a module that cannot be read names no file
                found = None
            if found is not None:
                break
        cache["path"] = found
        return found

    @cached_property
    def program_files(self) -> tuple[str, ...]:
        """The user's program files this module names: :attr:`dump_program_path` first, then every
        other file of the module's stack-frame tables (a model file beside the script that builds
        the mesh); library files left out. Recorded paths: read them through :mod:`hlo_doctor.program`."""
        files = [self.dump_program_path] if self.dump_program_path else []
        module = self.sharded or self.per_device
        tables = module.frame_tables if module is not None else None
        if tables is not None:
            files += tables.file_names.values()
        return tuple(f for f in dict.fromkeys(files) if f and not f.startswith("<") and not is_library_file(f))

    @cached_property
    def sharding_calls(self) -> list[Mapping[str, Any]]:
        """The program's ``with_sharding_constraint`` / ``mark_sharding`` calls: the runner's record of
        them, else (a dump made without the runner) the ones the after-propagation module keeps
        (:func:`hlo_doctor.program.records.sharding_calls_in`)."""
        if self.dump.run_record:
            return list(record_entries(self.dump.run_record, "sharding_calls"))
        module = self.sharded
        return list(sharding_calls_in(module, self.mesh)) if module is not None else []

    @cached_property
    def device_map(self) -> DeviceMap:
        """Logical partition id -> physical device, and each device's host."""
        # Only an explicit --devices-per-host overrides what the dump and the runner's record
        # say per device (TPU hosts are blocks of the chip grid, not runs of ids); the
        # hardware profile's count is the last resort.
        found = device_map(self.module, self.dump.run_record, self.options.devices_per_host or None)
        if found.host_of is None and self.devices_per_host:
            found = device_map(self.module, self.dump.run_record, self.devices_per_host)
        return found

    # -- source locations ----------------------------------------------------
    def user_source(self, instruction: Instruction) -> tuple[SourceRef | None, bool]:
        """The user's line of an op, and whether only library frames were found.

        The frame of the traced function itself (``mlp`` of ``jit_mlp``) when the stack holds
        it: the call site in the user's code, not the body of the user's own helper it called;
        else the innermost frame of the user's code.
        """
        location = instruction.source
        if location is None:
            return None, False
        return user_frame(location, self.traced_function, self._helper_lines(instruction),
                          constraint=made_by_sharding_call(instruction))

    @staticmethod
    def helper_source(instruction: Instruction, reported: SourceRef | None) -> SourceRef | None:
        """The user's innermost line of an op when ``reported`` (its :meth:`user_source`) is another:
        the line of the helper it is in, whose caller's line is reported; else None."""
        innermost = innermost_user_frame(instruction.source)
        if innermost is None or reported is None or (innermost.file, innermost.line) == (reported.file, reported.line):
            return None
        return SourceRef(innermost.file, innermost.line, innermost.function or None)

    def _helper_lines(self, instruction: Instruction) -> frozenset[tuple[str, int]]:
        """:func:`~hlo_doctor.graph.source.helper_lines` of the instruction's module, read once per module."""
        tables = instruction.frame_tables
        if tables is None:
            return frozenset()
        found = self._helpers.get(id(tables))
        if found is None:
            found = self._helpers[id(tables)] = (tables, helper_lines(tables))
        return found[1]

    @cached_property
    def traced_function(self) -> str | None:
        """The function a JAX module traces (``mlp`` of ``jit_mlp``), or None."""
        name = self.module.name.split(".", 1)[0]  # TPU names add ".cl_NNN"
        for prefix in ("jit_", "pjit_"):
            if name.startswith(prefix) and len(name) > len(prefix):
                return name[len(prefix):]
        return None

    # -- shared analyses ---------------------------------------------------
    @cached_property
    def collectives(self) -> tuple[Collective, ...]:
        """Collectives of the per-device module (partitioned, else after optimizations)."""
        module = self.per_device
        if module is None:
            return ()
        return tuple(find_collectives(module, self.device_map, self.mesh))

    @cached_property
    def executions(self) -> dict[str, int]:
        """Per-device module: how often each computation runs per step (while trip counts; 1 when unknown)."""
        return {name: e.count for name, e in self.semantics.executions.items()}

    def partitioned_names(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The names after partitioning of after-propagation instructions ``keys`` (those found).

        The quick pairing of :func:`~hlo_doctor.graph.linking.match_instructions`, else the
        whole-module link. In a worker process (see :mod:`hlo_doctor.rules.parallel`) each name
        is a placeholder, replaced in the finding's name, message, related names and evidence
        when the worker's findings come back: use it in findings only, not to decide anything.
        """
        module = self.after_propagation
        if module is None or not keys:
            return {}
        refs = twin_refs(module, keys)
        if self.pending_names is not None:
            out = {}
            for key, ref in refs.items():
                token = f"{PENDING_NAME}{len(self.pending_names)}"
                self.pending_names[token] = (key, ref)
                out[key] = token
            return out
        return self.resolve_names(refs)

    def resolve_names(self, refs: dict[tuple[str, str], object]) -> dict[tuple[str, str], str]:
        """:meth:`partitioned_names` from the keys' TwinRefs."""
        partitioned = self.partitioned
        if partitioned is None:
            return {}
        found = {key: resolve_twin(partitioned, ref) if ref is not None else None for key, ref in refs.items()}
        if any(name is None for name in found.values()) and self.after_propagation is not None:
            link = link_modules(self.after_propagation, partitioned)
            found = {key: name or link.matched(key) for key, name in found.items()}
        return {key: name[1] for key, name in found.items() if name is not None}

    def instruction(self, computation: str, name: str) -> Instruction | None:
        """An instruction of the per-device module."""
        module = self.per_device
        found = module.computation(computation) if module is not None else None
        return found.get(name) if found is not None else None

    @cached_property
    def semantics(self) -> ModuleSemantics:
        """The analysis layer for this module: collectives, roles, batch facts, costs."""
        return ModuleSemantics(self)

    @cached_property
    def graph(self) -> DataflowGraph | None:
        """The dataflow graph of the per-device module."""
        module = self.per_device
        return build_graph(module) if module is not None else None

    @cached_property
    def sharded_graph(self) -> DataflowGraph | None:
        """The dataflow graph of :attr:`sharded` (global shapes, propagated shardings), built once
        for every rule that reads it."""
        module = self.sharded
        return build_graph(module) if module is not None else None

    @cached_property
    def propagated_batch(self) -> BatchAnalysis | None:
        """The batch dim of each value of :attr:`sharded`: dim 0 of the data inputs, followed through the
        propagated module; computed once for every rule that reads it."""
        module, graph, params = self.sharded, self.sharded_graph, self.semantics.parameters
        if module is None or graph is None or params is None:
            return None
        return analyze_data_batch(self.semantics.view, module, graph, params.data)

    @cached_property
    def dot_flops(self) -> float:
        """Per-device FLOPs of dots and convolutions per step (while bodies times their trip count)."""
        module = self.per_device
        return sum(module_flops(module).values()) if module is not None else 0.0

    @cached_property
    def instructions_by_name(self) -> dict[str, Instruction]:
        """Per-device module instructions by name."""
        module = self.per_device
        if module is None:
            return {}
        return {i.name: i for _, i in module.instructions()}


def user_frame(location: SourceLocation, traced: str | None = None,
               helpers: frozenset[tuple[str, int]] = frozenset(), *,
               constraint: bool = False) -> tuple[SourceRef | None, bool]:
    """The user's frame of ``location`` and whether every frame was a library's.

    The innermost frame of the user's code, unless that line is in a helper of the user's:
    one that only calls a sharding API (``return with_sharding_constraint(x, ...)`` in
    ``constrain``), or one of ``helpers``, lines whose function several lines of the user's
    call (:func:`~hlo_doctor.graph.source.helper_lines`, read from the dump's frames alone).
    Then the helper's caller, walking outwards up to the traced function ``traced`` (``mlp``
    of ``jit_mlp``), which is where the user writes the fix. Past a helper several lines call
    only where the caller's line holds the op's value: the op is a sharding constraint
    (``constraint``: what a constraint helper returns), or the helper's line returns it and the
    caller's line assigns that call's result (``h = dense(x, w)``); an op inside the helper's
    body (a norm's scale multiply, read by ``x = x + mlp(norm(x))``) keeps the helper's line,
    where its value has a name.
    """
    frames = location.frames or ()
    if not frames:
        if is_library_file(location.file):
            return None, True
        return SourceRef(location.file, location.line, location.function or None), False
    user = [frame for frame in frames if not is_library_file(frame.file)]
    if not user:
        return None, True
    chosen = user[0]
    for index, frame in enumerate(user):
        chosen = frame
        function = (frame.function or "").rsplit(".", 1)[-1]
        if function == traced or index + 1 == len(user):
            break
        # past a helper several lines call; past the innermost line when it only calls a sharding API
        # (the body of a constraint helper: a line further out that calls one is the user's own call)
        helper = (frame.file, frame.line) in helpers and (constraint or _hands_back(frame, user[index + 1]))
        if not helper and not (index == 0 and calls_sharding_api(frame.file, frame.line)):
            break
    return SourceRef(chosen.file, chosen.line, chosen.function or None), False


_SHARDING_CALLS = re.compile(r"\b(with_sharding_constraint|mark_sharding|with_logical_constraint|reshard|"
                             r"device_put)\s*\(")


def _hands_back(inner: StackFrame, caller: StackFrame) -> bool:
    """Whether ``inner``'s line returns a value and ``caller``'s line assigns the result of calling
    ``inner``'s function (``return x @ w`` in ``dense``; ``h = dense(x, w)``): the caller's variable
    is then the op's value. False when either line cannot be read here."""
    function = (inner.function or "").rsplit(".", 1)[-1]
    returned = program_line(inner.file, inner.line) if inner.file and inner.line else ""
    calling = program_line(caller.file, caller.line) if caller.file and caller.line else ""
    if not function.isidentifier() or not returned.lstrip().startswith("return "):
        return False
    return re.match(rf"\s*[\w\s,()\[\].]*?(?<![=!<>])=\s*(?:[\w.]+\.)?{re.escape(function)}\(", calling) is not None


def calls_sharding_api(path: str, line: int) -> bool:
    """Whether the source line calls a sharding API (the body of a constraint helper)."""
    text = program_line(path, line) if path and line else ""
    return bool(_SHARDING_CALLS.search(text))


_SPLIT = re.compile(r"[\\/]")


def short_path(path: str) -> str:
    """The last two parts of a path, for messages."""
    parts = _SPLIT.split(path)
    return os.path.join(*parts[-2:]) if len(parts) >= 2 else path


# Do not parse a module bigger than this only to find the program's file name.
_MAX_PROGRAM_SEARCH_BYTES = 20_000_000


def _module_size(module: DumpModule) -> int:
    return sum(snapshot.size for snapshot in module.snapshots)
