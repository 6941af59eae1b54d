"""The file-name grammar of an XLA dump folder (``--xla_dump_to``).

XLA names every file after its module, ``module_NNNN.NAME``, optionally
behind a ``TIMESTAMP.`` prefix (``--xla_dump_include_timestamp``)::

    [TS.]module_0010.jit_f.before_optimizations.txt
    [TS.]module_0010.jit_f.0001.spmd-partitioner.after_sharding-propagation.before_spmd-partitioning.txt
    [TS.]module_0010.jit_f.0020.copy-insertion.after_adding_copies_to_resolve_interference.txt
    [TS.]module_0010.jit_f.cpu_after_optimizations.txt          (GPU: sm_9.0a_gpu_after_optimizations)
    module_0010.jit_f.debug_options
    module_0010.jit_f.config.pbtxt                              (GPU: HloModuleConfig, device assignment)
    module_0010.jit_f/                                          (module.mlir, compile_options.textproto, ...)
    jit_f_1796161060502/compile_options.pb                      (jax 0.7: the binary compile options)
    shardy/module_0010.jit_f/NN.STAGE.mlir                      (Shardy's own MLIR dumps)

A module NAME may itself contain dots (torch_xla's ``SyncTensorsGraph.12``),
so :func:`parse_file_name` prefers a module prefix it already knows (from the
``before_optimizations`` file, the ``debug_options`` file or the module
folder) and falls back to the grammar otherwise.

Buffer assignments, live ranges, memory reports, thunk sequences, LLVM IR,
object files and kernels are not HLO snapshots and parse to None.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum


class FileKind(str, Enum):
    BEFORE_OPTIMIZATIONS = "before_optimizations"
    PASS = "pass"
    AFTER_OPTIMIZATIONS = "after_optimizations"
    DEBUG_OPTIONS = "debug_options"


@dataclass(frozen=True, slots=True)
class DumpFileName:
    """What a dump file's name says about it."""

    kind: FileKind
    module_id: int
    module_name: str
    timestamp: int | None = None
    ordinal: int | None = None  # the SSSS of a pass snapshot
    pipeline: str | None = None
    after_pass: str | None = None
    before_pass: str | None = None
    backend: str | None = None  # cpu, gpu, sm_9.0a_gpu, tpu... of *_after_optimizations

    @property
    def module_key(self) -> tuple[int, str]:
        return (self.module_id, self.module_name)


_PREFIX = re.compile(r"(?:(?P<ts>\d+)\.)?module_(?P<id>\d+)\.")
_MODULE_DIR = re.compile(r"module_(?P<id>\d+)\.(?P<name>.+)")
# jax 0.7's per-compile folder: jit_NAME_TIMESTAMP/compile_options.pb (+ module.mlir).
_COMPILE_DIR = re.compile(r"(?P<name>.+)_(?P<ts>\d{10,})")
# The part after "module_NNNN.NAME." of a pass snapshot.
_PASS_REST = re.compile(
    r"(?P<ord>\d{4,})\.(?P<pipeline>.+?)\.after_(?P<after>.+?)(?:\.before_(?P<before>.+?))?\.txt"
)
_AFTER_OPT_REST = re.compile(r"(?:(?P<backend>.+?)_)?after_optimizations\.txt")
# Whole-name fallbacks (after the optional timestamp and "module_NNNN.").
_PASS_FULL = re.compile(r"(?P<name>.+?)\." + _PASS_REST.pattern)
_AFTER_OPT_FULL = re.compile(
    r"(?P<name>.+?)\.(?:(?P<backend>sm_\d+\.\d+[a-z]?_gpu|[^.]+?)_)?after_optimizations\.txt"
)
_BEFORE_OPT_FULL = re.compile(r"(?P<name>.+)\.before_optimizations\.txt")
_DEBUG_OPTIONS_FULL = re.compile(r"(?P<name>.+)\.debug_options")


def parse_module_dir_name(name: str) -> tuple[int, str] | None:
    """``module_0010.jit_f`` -> ``(10, "jit_f")``; anything else -> None."""
    match = _MODULE_DIR.fullmatch(name)
    if match is None:
        return None
    return int(match["id"]), match["name"]


def parse_compile_dir_name(name: str) -> tuple[str, int] | None:
    """``jit_mlp_1796161060502`` -> ``("jit_mlp", 1796161060502)``; anything else -> None."""
    match = _COMPILE_DIR.fullmatch(name)
    if match is None or name.startswith("module_"):
        return None
    return match["name"], int(match["ts"])


def parse_file_name(name: str, known_names: Collection[str] = ()) -> DumpFileName | None:
    """Interpret one dump file name; None for files that are not HLO snapshots.

    ``known_names`` are module names already seen for this folder (in any
    order); a name that prefixes the file wins over the grammar's guess.
    """
    prefix = _PREFIX.match(name)
    if prefix is None:
        return None
    timestamp = int(prefix["ts"]) if prefix["ts"] else None
    module_id = int(prefix["id"])
    rest = name[prefix.end() :]
    for known in sorted(known_names, key=len, reverse=True):
        if rest.startswith(known + "."):
            parsed = _parse_rest(rest[len(known) + 1 :], module_id, known, timestamp)
            if parsed is not None:
                return parsed
    return _parse_full(rest, module_id, timestamp)


def _parse_rest(rest: str, module_id: int, module_name: str, timestamp: int | None) -> DumpFileName | None:
    if rest == "before_optimizations.txt":
        return DumpFileName(FileKind.BEFORE_OPTIMIZATIONS, module_id, module_name, timestamp)
    if rest == "debug_options":
        return DumpFileName(FileKind.DEBUG_OPTIONS, module_id, module_name, timestamp)
    match = _PASS_REST.fullmatch(rest)
    if match is not None:
        return _pass(match, module_id, module_name, timestamp)
    match = _AFTER_OPT_REST.fullmatch(rest)
    if match is not None:
        return DumpFileName(
            FileKind.AFTER_OPTIMIZATIONS, module_id, module_name, timestamp, backend=match["backend"]
        )
    return None


def _parse_full(rest: str, module_id: int, timestamp: int | None) -> DumpFileName | None:
    match = _PASS_FULL.fullmatch(rest)
    if match is not None:
        return _pass(match, module_id, match["name"], timestamp)
    match = _BEFORE_OPT_FULL.fullmatch(rest)
    if match is not None:
        return DumpFileName(FileKind.BEFORE_OPTIMIZATIONS, module_id, match["name"], timestamp)
    match = _AFTER_OPT_FULL.fullmatch(rest)
    if match is not None:
        return DumpFileName(
            FileKind.AFTER_OPTIMIZATIONS, module_id, match["name"], timestamp, backend=match["backend"]
        )
    match = _DEBUG_OPTIONS_FULL.fullmatch(rest)
    if match is not None:
        return DumpFileName(FileKind.DEBUG_OPTIONS, module_id, match["name"], timestamp)
    return None


def _pass(match: re.Match[str], module_id: int, module_name: str, timestamp: int | None) -> DumpFileName:
    return DumpFileName(
        FileKind.PASS,
        module_id,
        module_name,
        timestamp,
        ordinal=int(match["ord"]),
        pipeline=match["pipeline"],
        after_pass=match["after"],
        before_pass=match["before"],
    )


def known_module_name(name: str) -> str | None:
    """The module name in an unambiguous file name (before_optimizations, debug_options)."""
    prefix = _PREFIX.match(name)
    if prefix is None:
        return None
    rest = name[prefix.end() :]
    for suffix in (".before_optimizations.txt", ".debug_options"):
        if rest.endswith(suffix) and len(rest) > len(suffix):
            return rest[: -len(suffix)]
    return None
