"""Find the modules and pass snapshots of an XLA dump folder: :func:`load_dump`.

Loading only lists and stats files. Nothing is parsed until asked: a
snapshot's HLO on :meth:`Snapshot.module`, a module's compile options, mesh
and debug options on first access. A file that cannot be read or parsed is
recorded (:attr:`Dump.errors`) and the rest of the dump stays usable; only a
dump that cannot be used at all raises :class:`~hlo_doctor.errors.InputError`.

A snapshot is :class:`Snapshot` (:mod:`.snapshot`), a module and the dump
:class:`DumpModule` and :class:`Dump` (:mod:`.module`); this module finds
them and re-exports them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_doctor.dump.names import (
    DumpFileName,
    FileKind,
    known_module_name,
    parse_compile_dir_name,
    parse_file_name,
    parse_module_dir_name,
)
from hlo_doctor.errors import InputError, one_line

if TYPE_CHECKING:
    pass
from hlo_doctor.dump import files as dump_files  # read through the module, so a test can stand in for it
from hlo_doctor.dump.module import Dump, DumpModule
from hlo_doctor.dump.run_record import checked_run_record
from hlo_doctor.dump.snapshot import (
    HEADER_BYTES,
    PARTITIONING_PASSES,
    PROPAGATION_PASSES,
    RUN_RECORD,
    TPU_PARTITIONER_PIPELINE,
    TPU_PROPAGATED_BEFORE,
    DumpError,
    Partitioner,
    ReportedFailure,
    Role,
    Snapshot,
    entry_layout_parameters,
    header_attribute,
    header_attributes,
    layout_parameters,
    role_of,
)

__all__ = [
    "Dump",
    "DumpError",
    "DumpModule",
    "HEADER_BYTES",
    "PARTITIONING_PASSES",
    "PROPAGATION_PASSES",
    "Partitioner",
    "RUN_RECORD",
    "ReportedFailure",
    "Role",
    "Snapshot",
    "TPU_PARTITIONER_PIPELINE",
    "TPU_PROPAGATED_BEFORE",
    "entry_layout_parameters",
    "header_attribute",
    "header_attributes",
    "layout_parameters",
    "load_dump",
    "role_of",
]


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
        raise InputError(dump_files._strerror(error), path=where) from None
    except ValueError as error:  # embedded NUL in the path
        raise InputError(str(error), path=repr(where)) from None
    if stat.S_ISDIR(info.st_mode):
        return _load_folder(Path(where))
    if stat.S_ISREG(info.st_mode):
        return _load_file(Path(where), info.st_size)
    raise InputError("not a regular file or directory", path=where)


def _load_file(path: Path, size: int) -> Dump:
    try:
        dump_files._check_readable(path)
    except OSError as error:
        raise InputError(dump_files._strerror(error), path=str(path)) from None
    name = parse_file_name(path.name)
    errors: list[DumpError] = []
    if name is not None and name.kind is not FileKind.DEBUG_OPTIONS:
        snapshot = _snapshot(path, name, size)
        parent = path.parent
        root = parent.resolve()
        folder = parent / f"module_{name.module_id:04d}.{name.module_name}"
        debug = parent / f"module_{name.module_id:04d}.{name.module_name}.debug_options"
        config = parent / f"module_{name.module_id:04d}.{name.module_name}.config.pbtxt"
        module = DumpModule(
            name.module_id,
            name.module_name,
            [snapshot],
            folder=folder if folder.is_dir() and _leads_inside(folder, root) else None,
            debug_options_path=debug if debug.is_file() and _leads_inside(debug, root) else None,
            shardy_dumps=_shardy_dumps(parent / "shardy" / folder.name, root, errors),
            config_path=config if config.is_file() else None,
            root=root,
        )
    else:
        stem = path.name
        for suffix in (".txt", ".hlo", ".hlotxt"):
            stem = stem.removesuffix(suffix)
        module = DumpModule(None, stem or path.name, [Snapshot(path, role=Role.OTHER, size=size)])
    return Dump(path, (module,), _read_run_record(path.parent, errors), tuple(errors))


def _load_folder(folder: Path) -> Dump:
    errors: list[DumpError] = []
    try:
        entries = list(os.scandir(folder))
    except OSError as error:
        raise InputError(dump_files._strerror(error), path=str(folder)) from None

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
                errors.append(DumpError(entry.path, dump_files._strerror(error)))
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
            errors.append(DumpError(entry.path, dump_files._strerror(error)))
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
                shardy_dumps=_shardy_dumps(folder / "shardy" / dir_name, root, errors),
                config_path=config_path,
                compile_dir=by_compile_dir.get(key),
                root=root,
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
            for key, (_, path) in zip(modules, sorted(dirs), strict=False):
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


def _shardy_dumps(directory: Path, root: Path, errors: list[DumpError]) -> tuple[Path, ...]:
    """The Shardy ``.mlir`` files of a module: only those really inside the dump folder ``root``
    (a ``shardy/`` folder or file that a symbolic link takes out of it is skipped, and recorded)."""
    try:
        if not directory.is_dir():
            return ()
        if not _leads_inside(directory, root):
            errors.append(DumpError(str(directory), "skipped: a symbolic link that leads out of the dump folder"))
            return ()
        found = []
        for path in sorted(p for p in directory.iterdir() if p.suffix == ".mlir" and p.is_file()):
            if _leads_inside(path, root):
                found.append(path)
            else:
                errors.append(DumpError(str(path), "skipped: a symbolic link that leads out of the dump folder"))
        return tuple(found)
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
        record = json.loads(dump_files._read_bytes(path).decode("utf-8"))
    except OSError as error:
        errors.append(DumpError(str(path), dump_files._strerror(error)))
        return None
    except (UnicodeDecodeError, ValueError) as error:
        errors.append(DumpError(str(path), f"not valid JSON: {one_line(str(error), 200)}"))
        return None
    if not isinstance(record, dict):
        errors.append(DumpError(str(path), "not a JSON object"))
        return None
    record, problems = checked_run_record(record, str(path))
    errors.extend(problems)
    return record
