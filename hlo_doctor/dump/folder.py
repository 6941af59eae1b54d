"""Find the modules and pass snapshots of an XLA dump folder: :func:`load_dump`.

Loading only lists and stats files. Nothing is parsed until asked: a
snapshot's HLO on :meth:`Snapshot.module`, a module's compile options, mesh
and debug options on first access. A file that cannot be read or parsed is
recorded (:attr:`Dump.errors`) and the rest of the dump stays usable; only a
dump that cannot be used at all raises :class:`~hlo_doctor.errors.InputError`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hlo_doctor.dump.mlir import MlirInfo, SdyMesh, parse_meshes, parse_mlir_info, read_declarations
from hlo_doctor.dump.names import (
    DumpFileName,
    FileKind,
    known_module_name,
    parse_compile_dir_name,
    parse_file_name,
    parse_module_dir_name,
)
from hlo_doctor.dump.options import CompileOptions, Topology, debug_options_dict
from hlo_doctor.dump.textproto import Message, TextprotoError, parse_textproto
from hlo_doctor.errors import InputError, one_line
from hlo_doctor.hlo.ir import Shape
from hlo_doctor.hlo.shapes import ShapeSyntaxError, shape_from_text

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import HloModule

RUN_RECORD = "hlo_doctor_run.json"
HEADER_BYTES = 64 * 1024
_COMMENT = re.compile(r"/\*.*?\*/")


class ReportedFailure(Exception):
    """A snapshot's parse failure as another process reported it (its one-line message)."""


def header_attributes(header: str) -> dict[str, str]:
    """The attributes of a module header line, read by the parser's own header rule
    (the raw text ``HloModule.attribute`` would give); {} when the line does not parse."""
    from hlo_doctor.hlo.errors import ParseError
    from hlo_doctor.hlo.parser import parse_header

    try:
        return dict(parse_header(header)[1])
    except ParseError:
        return {}


def header_attribute(header: str, key: str) -> str | None:
    """The raw value of ``key=...`` in a module header line, or None."""
    return header_attributes(header).get(key)


def entry_layout_parameters(header: str) -> tuple[Shape, ...] | None:
    """The parameter shapes in a module header's ``entry_computation_layout={(...)->...}``."""
    return layout_parameters(header_attribute(header, "entry_computation_layout"))


def layout_parameters(layout: str | None) -> tuple[Shape, ...] | None:
    """The parameter shapes of an ``entry_computation_layout`` value ``{(...)->...}``."""
    if layout is None or not layout.startswith("{("):
        return None
    arrow = layout.rfind(")->")
    if arrow < 0:
        return None
    try:
        shape = shape_from_text(_COMMENT.sub("", layout[1 : arrow + 1]))
    except ShapeSyntaxError:
        return None
    return shape.tuple_shapes if shape.is_tuple else None


class Role(str, Enum):
    """Where in the compile pipeline a snapshot was taken."""

    BEFORE_OPTIMIZATIONS = "before_optimizations"
    BEFORE_PROPAGATION = "before_propagation"
    AFTER_PROPAGATION = "after_propagation"
    AFTER_PARTITIONING = "after_partitioning"
    AFTER_OPTIMIZATIONS = "after_optimizations"
    OTHER = "other"


class Partitioner(str, Enum):
    SHARDY = "shardy"
    GSPMD = "gspmd"
    UNKNOWN = "unknown"


# Pass names, as XLA registers them (HloPassInterface::name()).
PROPAGATION_PASSES = frozenset({"sharding-propagation", "shardy-xla"})
PARTITIONING_PASSES = frozenset({"spmd-partitioning", "spmd-partitioner", "tpu-spmd-partitioning"})
# TPU runs propagation before its "xla-partitioner" pipeline dumps anything: the first
# snapshot of that pipeline, right before spmd-prepare, holds the propagated shardings.
TPU_PARTITIONER_PIPELINE = "xla-partitioner"
TPU_PROPAGATED_BEFORE = "spmd-prepare"


def role_of(name: DumpFileName) -> Role:
    """The role a dump file name gives its snapshot."""
    if name.kind is FileKind.BEFORE_OPTIMIZATIONS:
        return Role.BEFORE_OPTIMIZATIONS
    if name.kind is FileKind.AFTER_OPTIMIZATIONS:
        return Role.AFTER_OPTIMIZATIONS
    if name.after_pass in PARTITIONING_PASSES:
        return Role.AFTER_PARTITIONING
    if name.after_pass in PROPAGATION_PASSES:
        return Role.AFTER_PROPAGATION
    if name.pipeline == TPU_PARTITIONER_PIPELINE and name.before_pass == TPU_PROPAGATED_BEFORE:
        return Role.AFTER_PROPAGATION
    if name.before_pass in PROPAGATION_PASSES:
        return Role.BEFORE_PROPAGATION
    return Role.OTHER


class DumpError(NamedTuple):
    """A file that could not be used: its path and a one-line message."""

    path: str
    message: str


class Snapshot:
    """One HLO text file: the module as it was at one point of the pipeline."""

    def __init__(
        self,
        path: Path,
        *,
        role: Role,
        size: int,
        ordinal: int | None = None,
        pipeline: str | None = None,
        after_pass: str | None = None,
        before_pass: str | None = None,
        backend: str | None = None,
        timestamp: int | None = None,
    ) -> None:
        self.path = path
        self.role = role
        self.size = size
        self.ordinal = ordinal
        self.pipeline = pipeline
        self.after_pass = after_pass
        self.before_pass = before_pass
        self.backend = backend
        self.timestamp = timestamp
        self._module: HloModule | None = None
        self._failure: Exception | None = None

    @property
    def label(self) -> str:
        """A short name: ``before_optimizations``, ``after_sharding-propagation``, ``cpu_after_optimizations``."""
        if self.role is Role.BEFORE_OPTIMIZATIONS:
            return "before_optimizations"
        if self.role is Role.AFTER_OPTIMIZATIONS:
            return f"{self.backend}_after_optimizations" if self.backend else "after_optimizations"
        if self.after_pass is not None:
            return f"after_{self.after_pass}"
        return self.path.name

    @property
    def parsed(self) -> bool:
        """True once :meth:`module` has succeeded."""
        return self._module is not None

    @property
    def error(self) -> str | None:
        """The one-line error of a failed parse (None if not tried or fine)."""
        return one_line(str(self._failure)) if self._failure is not None else None

    def module(self) -> HloModule:
        """Parse the file (once). Raises ParseError for bad text, InputError if unreadable."""
        if self._module is not None:
            return self._module
        if self._failure is not None:
            raise self._failure
        from hlo_doctor import hlo
        from hlo_doctor.hlo.errors import ParseError

        where = str(self.path)
        try:
            text = _decode(_read_bytes(self.path), where)
            self._module = hlo.parse_module(text, path=where)
        except ParseError as error:
            self._failure = error
        except OSError as error:
            self._failure = InputError(_strerror(error), path=where)
        except (RecursionError, MemoryError) as error:
            self._failure = ParseError(f"too deeply nested or too large ({type(error).__name__})", path=where)
        except Exception as error:  # a parser bug must not take the whole dump down
            self._failure = ParseError(
                f"internal parser error: {type(error).__name__}: {one_line(str(error), 200)}", path=where
            )
        if self._failure is not None:
            raise self._failure
        assert self._module is not None
        return self._module

    def adopt_failure(self, message: str) -> None:
        """Record a parse failure met by another process (a rule worker), unless tried here."""
        if self._module is None and self._failure is None:
            self._failure = ReportedFailure(message)

    def try_module(self) -> HloModule | None:
        """:meth:`module`, or None when the file does not parse (see :attr:`error`)."""
        try:
            return self.module()
        except Exception:
            return None

    @cached_property
    def header(self) -> str:
        """The first line of the file (``HloModule name, attr=...``), read without parsing."""
        try:
            with open(self.path, "rb") as handle:
                head = handle.read(HEADER_BYTES)
        except OSError:
            return ""
        return head.split(b"\n", 1)[0].decode("utf-8", "replace")

    @cached_property
    def first_line(self) -> str:
        """The whole first line (the ``HloModule`` header with every attribute), read without parsing."""
        try:
            with open(self.path, "rb") as handle:
                return handle.readline().decode("utf-8", "replace").rstrip("\n")
        except OSError:
            return ""

    @cached_property
    def header_attributes(self) -> dict[str, str]:
        """The header line's attributes, read without parsing the module."""
        return header_attributes(self.first_line)

    def header_attribute(self, key: str) -> str | None:
        """The raw text of a header attribute (``buffer_donor``, ``num_partitions`` ...), without parsing."""
        return self.header_attributes.get(key)

    @cached_property
    def entry_parameter_shapes(self) -> tuple[Shape, ...] | None:
        """The entry parameters' shapes from the header's ``entry_computation_layout``, read without
        parsing the module; None when the header has none or it does not read."""
        return layout_parameters(self.header_attribute("entry_computation_layout"))

    def __repr__(self) -> str:
        return f"Snapshot({self.path.name!r}, role={self.role.value})"


class DumpModule:
    """One compiled module (``module_NNNN.NAME``): its snapshots and compile metadata."""

    def __init__(
        self,
        module_id: int | None,
        name: str,
        snapshots: list[Snapshot],
        *,
        folder: Path | None = None,
        debug_options_path: Path | None = None,
        shardy_dumps: tuple[Path, ...] = (),
        config_path: Path | None = None,
        compile_dir: Path | None = None,
    ) -> None:
        self.id = module_id
        self.name = name
        self.snapshots: tuple[Snapshot, ...] = tuple(sorted(snapshots, key=_snapshot_order))
        self.folder = folder
        self.debug_options_path = debug_options_path
        self.shardy_dumps = shardy_dumps
        self.config_path = config_path
        self.compile_dir = compile_dir  # jax 0.7: jit_NAME_TS/ with compile_options.pb
        self._errors: list[DumpError] = []

    @property
    def key(self) -> str:
        return f"module_{self.id:04d}.{self.name}" if self.id is not None else self.name

    # -- snapshots by role ------------------------------------------------
    def snapshot(self, role: Role) -> Snapshot | None:
        """The last snapshot with ``role``, or None."""
        found = None
        for snapshot in self.snapshots:
            if snapshot.role is role:
                found = snapshot
        return found

    def before_optimizations(self) -> Snapshot | None:
        return self.snapshot(Role.BEFORE_OPTIMIZATIONS)

    def before_propagation(self) -> Snapshot | None:
        return self.snapshot(Role.BEFORE_PROPAGATION)

    def after_propagation(self) -> Snapshot | None:
        return self.snapshot(Role.AFTER_PROPAGATION)

    def partitioned(self) -> Snapshot | None:
        """The module right after SPMD partitioning (per-device shapes, collectives inserted)."""
        return self.snapshot(Role.AFTER_PARTITIONING)

    def after_optimizations(self) -> Snapshot | None:
        return self.snapshot(Role.AFTER_OPTIMIZATIONS)

    @property
    def backend(self) -> str | None:
        """The backend prefix of the after_optimizations file: cpu, gpu, sm_9.0a_gpu, tpu..."""
        snapshot = self.after_optimizations()
        return snapshot.backend if snapshot is not None else None

    # -- metadata (read on first access) ----------------------------------
    @cached_property
    def compile_options(self) -> CompileOptions | None:
        """From ``compile_options.textproto``, else ``module_NNNN.NAME.config.pbtxt`` / ``config.pbtxt``."""
        for path in self._metadata_paths("compile_options.textproto", "config.pbtxt"):
            message = self._read_textproto(path)
            if message is not None:
                return CompileOptions.from_message(message, str(path))
        if self.compile_dir is not None and (self.compile_dir / "compile_options.pb").is_file():
            return self._read_binary_options(self.compile_dir / "compile_options.pb")
        return None

    def _read_binary_options(self, path: Path) -> CompileOptions | None:
        from hlo_doctor.dump.protowire import WireError

        try:
            return CompileOptions.from_binary(_read_bytes(path), str(path))
        except OSError as error:
            self._errors.append(DumpError(str(path), _strerror(error)))
        except WireError as error:
            self._errors.append(DumpError(str(path), f"not a CompileOptionsProto: {error}"))
        return None

    @cached_property
    def topology(self) -> Topology | None:
        for path in self._metadata_paths("topology.textproto"):
            message = self._read_textproto(path)
            if message is not None:
                return Topology.from_message(message, str(path))
        return None

    @property
    def platform(self) -> str | None:
        """``"tpu"``, ``"gpu"`` or ``"cpu"``: from topology.textproto, else the backend prefix
        of the optimized module; None when the dump says neither."""
        topology = self.topology
        name = (topology.platform_name or "").lower() if topology is not None else ""
        if topology is not None and topology.is_tpu:
            return "tpu"
        if name in ("cuda", "rocm", "gpu"):
            return "gpu"
        backend = self.backend or ""
        if backend.endswith("gpu"):
            return "gpu"
        if backend == "cpu" or name in ("cpu", "host"):
            return "cpu"
        return None

    @property
    def tpu_chip(self) -> str | None:
        """The TPU chip the module was compiled for (``v4``, ``v5e``, ``v5p``, ``v6e``), from
        topology.textproto; None for other platforms or when not named."""
        topology = self.topology
        return topology.tpu_chip if topology is not None else None

    @cached_property
    def debug_options(self) -> dict[str, object]:
        """``module_NNNN.NAME.debug_options`` as flag -> value; {} when absent."""
        if self.debug_options_path is None:
            return {}
        message = self._read_textproto(self.debug_options_path)
        return debug_options_dict(message) if message is not None else {}

    @cached_property
    def mlir_path(self) -> Path | None:
        paths = self._metadata_paths("module.mlir")
        return paths[0] if paths else None

    @cached_property
    def mlir(self) -> MlirInfo | None:
        """Meshes and entry signature from ``module.mlir``; None when absent or unreadable."""
        if self.mlir_path is None:
            return None
        text = self._read_text(self.mlir_path)
        return parse_mlir_info(text) if text is not None else None

    @cached_property
    def meshes(self) -> tuple[SdyMesh, ...]:
        """Shardy meshes from module.mlir, else from the HLO header's ``xla.sdy.meshes``."""
        return self._meshes[0]

    @property
    def meshes_source(self) -> str | None:
        """Where :attr:`meshes` came from: ``module.mlir``, ``hlo_header``, or None."""
        return self._meshes[1]

    @cached_property
    def _meshes(self) -> tuple[tuple[SdyMesh, ...], str | None]:
        if self.mlir_path is not None:
            # Meshes are declared before the first function: a big module.mlir is read only that far.
            try:
                text = read_declarations(self.mlir_path)
            except OSError as error:
                self._errors.append(DumpError(str(self.mlir_path), _strerror(error)))
                text = ""
            meshes = parse_meshes(text)
            if meshes:
                return meshes, "module.mlir"
        for snapshot in self.snapshots:
            if "sdy.mesh" in snapshot.header:
                return parse_meshes(snapshot.header), "hlo_header"
        return (), None

    @property
    def num_partitions(self) -> int | None:
        return self._header_int("num_partitions")

    @property
    def num_replicas(self) -> int | None:
        return self._header_int("num_replicas")

    @property
    def device_assignment(self) -> tuple[int, ...] | None:
        """Physical device of each logical id, replica-major (see :class:`DeviceAssignment`)."""
        options = self.compile_options
        if options is None or options.device_assignment is None:
            return None
        return options.device_assignment.device_ids

    @cached_property
    def partitioner(self) -> Partitioner:
        """Shardy or GSPMD, from compile options, pass names, module.mlir, then the HLO header."""
        options = self.compile_options
        if options is not None and options.use_shardy_partitioner:
            return Partitioner.SHARDY
        passes = {p for s in self.snapshots for p in (s.after_pass, s.before_pass) if p}
        if any(p.startswith("shardy") for p in passes) or self.shardy_dumps:
            return Partitioner.SHARDY
        if "sharding-propagation" in passes:
            return Partitioner.GSPMD
        mlir = self.mlir
        if mlir is not None and mlir.uses_sdy:
            return Partitioner.SHARDY
        if any("xla.sdy." in s.header for s in self.snapshots[:1]):
            return Partitioner.SHARDY
        if options is not None and options.use_spmd_partitioning and options.use_shardy_partitioner is None:
            return Partitioner.GSPMD
        if mlir is not None and mlir.uses_mhlo_sharding:
            return Partitioner.GSPMD
        return Partitioner.UNKNOWN

    @property
    def errors(self) -> tuple[DumpError, ...]:
        """Metadata files that failed to read, and snapshots that failed to parse so far."""
        snapshot_errors = tuple(
            DumpError(str(s.path), s.error) for s in self.snapshots if s.error is not None
        )
        return tuple(self._errors) + snapshot_errors

    @property
    def errors_found(self) -> tuple[DumpError, ...]:
        """Metadata files that failed to read so far (without the snapshots' parse errors)."""
        return tuple(self._errors)

    def add_error(self, error: DumpError) -> None:
        """Record a metadata error found by another process (a rule worker), once."""
        if error not in self._errors:
            self._errors.append(error)

    def parse_all(self) -> tuple[DumpError, ...]:
        for snapshot in self.snapshots:
            snapshot.try_module()
        return self.errors

    # -- helpers -----------------------------------------------------------
    def _metadata_paths(self, *names: str) -> list[Path]:
        found = []
        for name in names:
            if self.folder is not None and (self.folder / name).is_file():
                found.append(self.folder / name)
            elif name == "config.pbtxt" and self.config_path is not None:
                found.append(self.config_path)
            elif name == "module.mlir" and self.compile_dir is not None and (self.compile_dir / name).is_file():
                found.append(self.compile_dir / name)
        return found

    def _read_text(self, path: Path) -> str | None:
        try:
            return _read_bytes(path).decode("utf-8", "replace")
        except OSError as error:
            self._errors.append(DumpError(str(path), _strerror(error)))
            return None

    def _read_textproto(self, path: Path) -> Message | None:
        text = self._read_text(path)
        if text is None:
            return None
        try:
            return parse_textproto(text)
        except TextprotoError as error:
            self._errors.append(DumpError(str(path), f"{path}:{error}"))
            return None

    def _header_int(self, key: str) -> int | None:
        options = self.compile_options
        value = getattr(options, key) if options is not None else None
        if value is None and self.mlir is not None:
            value = getattr(self.mlir, key)
        if value is None:
            for snapshot in self.snapshots:
                marker = f"{key}="
                at = snapshot.header.find(marker)
                if at != -1:
                    digits = snapshot.header[at + len(marker) :].split(",", 1)[0].strip()
                    if digits.isdigit():
                        return int(digits)
        return value

    def __repr__(self) -> str:
        return f"DumpModule({self.key!r}, {len(self.snapshots)} snapshots)"


@dataclass
class Dump:
    """A loaded dump: its modules (ordered by id), the runner's record, and what failed."""

    path: Path
    modules: tuple[DumpModule, ...]
    run_record: dict[str, object] | None = None
    load_errors: tuple[DumpError, ...] = ()

    @property
    def errors(self) -> tuple[DumpError, ...]:
        """Load-time errors plus every module error found so far (parse on demand)."""
        out = list(self.load_errors)
        for module in self.modules:
            out.extend(module.errors)
        return tuple(out)

    def parse_all(self) -> tuple[DumpError, ...]:
        """Parse every snapshot now; returns :attr:`errors`."""
        for module in self.modules:
            module.parse_all()
        return self.errors

    def module(self, key: int | str) -> DumpModule | None:
        """A module by id, by name, or by ``module_NNNN.NAME``; the last match by name."""
        found = None
        for module in self.modules:
            if key == module.id or key == module.name or key == module.key:
                found = module
        return found

    def __iter__(self) -> Iterator[DumpModule]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)


# --------------------------------------------------------------------------
# Loading


def load_dump(path: str | os.PathLike[str]) -> Dump:
    """Load a dump folder, or a single HLO text file, without parsing anything.

    Raises :class:`InputError` when the path is missing, unreadable, a symlink
    loop, not a file or folder, or holds no HLO module.
    """
    where = os.fspath(path)
    try:
        info = os.stat(where)
    except OSError as error:
        raise InputError(_strerror(error), path=where) from None
    except ValueError as error:  # embedded NUL in the path
        raise InputError(str(error), path=repr(where)) from None
    if stat.S_ISDIR(info.st_mode):
        return _load_folder(Path(where))
    if stat.S_ISREG(info.st_mode):
        return _load_file(Path(where), info.st_size)
    raise InputError("not a regular file or directory", path=where)


def _load_file(path: Path, size: int) -> Dump:
    try:
        _check_readable(path)
    except OSError as error:
        raise InputError(_strerror(error), path=str(path)) from None
    name = parse_file_name(path.name)
    if name is not None and name.kind is not FileKind.DEBUG_OPTIONS:
        snapshot = _snapshot(path, name, size)
        parent = path.parent
        folder = parent / f"module_{name.module_id:04d}.{name.module_name}"
        debug = parent / f"module_{name.module_id:04d}.{name.module_name}.debug_options"
        config = parent / f"module_{name.module_id:04d}.{name.module_name}.config.pbtxt"
        module = DumpModule(
            name.module_id,
            name.module_name,
            [snapshot],
            folder=folder if folder.is_dir() else None,
            debug_options_path=debug if debug.is_file() else None,
            shardy_dumps=_shardy_dumps(parent / "shardy" / folder.name),
            config_path=config if config.is_file() else None,
        )
    else:
        stem = path.name
        for suffix in (".txt", ".hlo", ".hlotxt"):
            stem = stem.removesuffix(suffix)
        module = DumpModule(None, stem or path.name, [Snapshot(path, role=Role.OTHER, size=size)])
    return Dump(path, (module,), _read_run_record(path.parent, []), ())


def _load_folder(folder: Path) -> Dump:
    errors: list[DumpError] = []
    try:
        entries = list(os.scandir(folder))
    except OSError as error:
        raise InputError(_strerror(error), path=str(folder)) from None

    files: dict[str, os.DirEntry[str]] = {}
    module_dirs: dict[tuple[int, str], Path] = {}
    root = folder.resolve()
    compile_dirs: dict[str, list[tuple[int, Path]]] = {}
    for entry in entries:
        if entry.is_symlink() and not _leads_inside(Path(entry.path), root):
            if entry.name == RUN_RECORD or parse_file_name(entry.name) is not None or \
                    parse_module_dir_name(entry.name) is not None:
                errors.append(DumpError(entry.path, "skipped: a symbolic link that leads out of the dump folder"))
            continue
        try:
            is_dir = entry.is_dir()
            is_file = not is_dir and entry.is_file()
        except OSError as error:
            if parse_file_name(entry.name) is not None:
                errors.append(DumpError(entry.path, _strerror(error)))
            continue
        if is_dir:
            key = parse_module_dir_name(entry.name)
            if key is not None:
                module_dirs[key] = Path(entry.path)
            compile_dir = parse_compile_dir_name(entry.name)
            if compile_dir is not None:
                compile_dirs.setdefault(compile_dir[0], []).append((compile_dir[1], Path(entry.path)))
        elif is_file:
            files[entry.name] = entry
        elif entry.is_symlink() and parse_file_name(entry.name) is not None:
            errors.append(DumpError(entry.path, "broken symbolic link"))

    known = {n for n in map(known_module_name, files) if n is not None}
    known.update(name for _, name in module_dirs)

    grouped: dict[tuple[int, str], list[Snapshot]] = {}
    debug_paths: dict[tuple[int, str], Path] = {}
    for file_name in sorted(files):
        name = parse_file_name(file_name, known)
        if name is None:
            continue
        entry = files[file_name]
        if name.kind is FileKind.DEBUG_OPTIONS:
            debug_paths[name.module_key] = Path(entry.path)
            continue
        try:
            size = entry.stat().st_size
        except OSError as error:
            errors.append(DumpError(entry.path, _strerror(error)))
            continue
        grouped.setdefault(name.module_key, []).append(_snapshot(Path(entry.path), name, size))

    if not grouped:
        if errors:
            raise InputError(f"no readable HLO modules ({errors[0].path}: {errors[0].message})", path=str(folder))
        raise InputError("no HLO modules found", path=str(folder))

    config = folder / "config.pbtxt"
    by_compile_dir = _pair_compile_dirs(sorted(grouped), compile_dirs)
    modules = []
    for key in sorted(grouped):
        module_id, module_name = key
        dir_name = f"module_{module_id:04d}.{module_name}"
        module_config = folder / f"{dir_name}.config.pbtxt"  # GPU: one HloModuleConfig each
        if module_config.name in files:
            config_path: Path | None = module_config
        else:
            config_path = config if config.is_file() else None
        modules.append(
            DumpModule(
                module_id,
                module_name,
                grouped[key],
                folder=module_dirs.get(key),
                debug_options_path=debug_paths.get(key),
                shardy_dumps=_shardy_dumps(folder / "shardy" / dir_name),
                config_path=config_path,
                compile_dir=by_compile_dir.get(key),
            )
        )
    run_record = _read_run_record(folder, errors)
    return Dump(folder, tuple(modules), run_record, tuple(errors))


def _pair_compile_dirs(
    keys: list[tuple[int, str]], compile_dirs: dict[str, list[tuple[int, Path]]]
) -> dict[tuple[int, str], Path]:
    """Each module's ``jit_NAME_TS/`` folder: the folders of one name, in timestamp order,
    go to that name's modules in id order (both follow compile order). A name whose
    folder and module counts differ is left unpaired rather than guessed."""
    out: dict[tuple[int, str], Path] = {}
    for name, dirs in compile_dirs.items():
        modules = [key for key in keys if key[1] == name]
        if len(modules) == len(dirs):
            for key, (_, path) in zip(modules, sorted(dirs)):
                if (path / "compile_options.pb").is_file() or (path / "module.mlir").is_file():
                    out[key] = path
    return out


def _snapshot(path: Path, name: DumpFileName, size: int) -> Snapshot:
    return Snapshot(
        path,
        role=role_of(name),
        size=size,
        ordinal=name.ordinal,
        pipeline=name.pipeline,
        after_pass=name.after_pass,
        before_pass=name.before_pass,
        backend=name.backend,
        timestamp=name.timestamp,
    )


def _snapshot_order(snapshot: Snapshot) -> tuple[int, int, int, str]:
    if snapshot.role is Role.BEFORE_OPTIMIZATIONS:
        rank = 0
    elif snapshot.role is Role.AFTER_OPTIMIZATIONS:
        rank = 2
    else:
        rank = 1
    return (rank, snapshot.ordinal if snapshot.ordinal is not None else -1, snapshot.timestamp or 0, snapshot.path.name)


def _shardy_dumps(directory: Path) -> tuple[Path, ...]:
    try:
        if not directory.is_dir():
            return ()
        root = directory.resolve()
        return tuple(sorted(p for p in directory.iterdir() if p.suffix == ".mlir" and p.is_file()
                            and (not p.is_symlink() or _leads_inside(p, root))))
    except OSError:
        return ()


def _leads_inside(link: Path, root: Path) -> bool:
    """Whether the symbolic link ``link`` resolves to a path inside ``root`` (a resolved folder)."""
    try:
        return link.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a loop
        return False


def _read_run_record(folder: Path, errors: list[DumpError]) -> dict[str, object] | None:
    path = folder / RUN_RECORD
    try:
        if path.is_symlink() and not _leads_inside(path, folder.resolve()):
            return None  # noted by the folder scan
        if not path.is_file():
            return None
        record = json.loads(_read_bytes(path).decode("utf-8"))
    except OSError as error:
        errors.append(DumpError(str(path), _strerror(error)))
        return None
    except (UnicodeDecodeError, ValueError) as error:
        errors.append(DumpError(str(path), f"not valid JSON: {one_line(str(error), 200)}"))
        return None
    if not isinstance(record, dict):
        errors.append(DumpError(str(path), "not a JSON object"))
        return None
    return record


def _read_bytes(path: Path) -> bytes:
    """Every file read goes through here (tests replace it to simulate unreadable files)."""
    with open(path, "rb") as handle:
        return handle.read()


def _check_readable(path: Path) -> None:
    """Open and read one byte; raises OSError (tests replace it to simulate permissions)."""
    with open(path, "rb") as handle:
        handle.read(1)


def _decode(data: bytes, where: str) -> str:
    """UTF-8 text, or a ParseError at the line:col of the first NUL or invalid byte."""
    from hlo_doctor.hlo.errors import ParseError

    nul = data.find(b"\x00")
    if nul != -1:
        line, col = _byte_line_col(data, nul)
        raise ParseError(
            f"binary data (NUL byte at byte offset {nul}), not HLO text", path=where, line=line, col=col
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line, col = _byte_line_col(data, error.start)
        raise ParseError(
            f"invalid UTF-8 byte 0x{data[error.start]:02x} at byte offset {error.start}",
            path=where,
            line=line,
            col=col,
        ) from None
    if not text.strip():
        raise ParseError("empty file, expected 'HloModule'", path=where)
    return text


def _byte_line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    col = len(data[start:offset].decode("utf-8", "replace")) + 1
    return line, col


def _strerror(error: OSError) -> str:
    text = error.strerror or str(error)
    return text[:1].lower() + text[1:]
