"""One compiled module of a dump (:class:`DumpModule`) and the dump itself (:class:`Dump`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_doctor.dump.mlir import MlirInfo, SdyMesh, parse_meshes, parse_mlir_info, read_declarations
from hlo_doctor.dump.options import CompileOptions, Topology, debug_options_dict
from hlo_doctor.dump.textproto import Message, TextprotoError, parse_textproto
from hlo_doctor.files import real_path

if TYPE_CHECKING:
    pass
from hlo_doctor.dump import files as dump_files  # read through the module, so a test can stand in for it
from hlo_doctor.dump.protowire import WireError
from hlo_doctor.dump.snapshot import (
    DumpError,
    Partitioner,
    Role,
    Snapshot,
    _snapshot_order,
)


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
        root: Path | None = None,
    ) -> None:
        self.id = module_id
        self.name = name
        self.snapshots: tuple[Snapshot, ...] = tuple(sorted(snapshots, key=_snapshot_order))
        self.folder = folder
        self.debug_options_path = debug_options_path
        self.shardy_dumps = shardy_dumps
        self.config_path = config_path
        self.compile_dir = compile_dir  # jax 0.7: jit_NAME_TS/ with compile_options.pb
        self.root = root  # the dump folder (a real path): no file is read whose real path is outside it
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
        binary = self.compile_dir / "compile_options.pb" if self.compile_dir is not None else None
        if binary is not None and binary.is_file() and self._inside_dump(binary):
            return self._read_binary_options(binary)
        return None

    def _read_binary_options(self, path: Path) -> CompileOptions | None:
        try:
            return CompileOptions.from_binary(dump_files._read_bytes(path), str(path))
        except OSError as error:
            self.add_error(DumpError(str(path), dump_files._strerror(error)))
        except WireError as error:
            self.add_error(DumpError(str(path), f"not a CompileOptionsProto: {error}"))
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
                self.add_error(DumpError(str(self.mlir_path), dump_files._strerror(error)))
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
        """Record a metadata error (found here, or by another process: a rule worker), once."""
        if error not in self._errors:
            self._errors.append(error)

    def release(self) -> None:
        """Drop what was read for this module's analysis (its parsed snapshots, its headers and
        compile options), so the memory can be reused: a long analysis keeps only its summaries.
        What is read again later is read again from the files; errors are recorded once."""
        for snapshot in self.snapshots:
            snapshot.release()
        for cached in ("compile_options", "debug_options", "topology"):
            self.__dict__.pop(cached, None)

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
        return [path for path in found if self._inside_dump(path)]

    def _inside_dump(self, path: Path) -> bool:
        """Whether ``path`` really is in the dump folder; a file a symbolic link takes out of it is
        not read, and recorded as skipped (a dump is untrusted input: it does not choose what is read)."""
        if self.root is None or real_path(path).is_relative_to(self.root):
            return True
        self.add_error(DumpError(str(path), "skipped: a symbolic link that leads out of the dump folder"))
        return False

    def _read_text(self, path: Path) -> str | None:
        try:
            return dump_files._read_bytes(path).decode("utf-8", "replace")
        except OSError as error:
            self.add_error(DumpError(str(path), dump_files._strerror(error)))
            return None

    def _read_textproto(self, path: Path) -> Message | None:
        text = self._read_text(path)
        if text is None:
            return None
        try:
            return parse_textproto(text)
        except TextprotoError as error:
            self.add_error(DumpError(str(path), f"{path}:{error}"))
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
            if key in (module.id, module.name, module.key):
                found = module
        return found

    def __iter__(self) -> Iterator[DumpModule]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)
