"""Trim a dump folder to what hlo-doctor reads.

Kept: HLO text snapshots, ``module_*/module.mlir`` and the Shardy MLIR under
``shardy/``, compile options, topology, debug options, and any other file up to
the size cap. Removed: LLVM IR (``*.ll``), object files, PTX and other
kernels, other (kernel) MLIR, the per-value listing of a buffer assignment
(``-buffer-assignment-values``), GPU thunk sequences and autotuning results,
TPU's extra copies of the optimized module, and non-HLO files over the cap.
XLA's buffer assignment, live ranges and memory-usage report of the optimized
module stay (up to the cap): ``hlo-doctor memory`` reads its peak from them. A GPU compile's ``*.config.pbtxt`` and ``*.gpu_target_config.pbtxt`` stay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hlo_doctor.dump.names import parse_compile_dir_name

DEFAULT_SIZE_CAP = 1 << 20
_DROP_SUFFIXES = (".ll", ".o", ".bc", ".ptx", ".cubin", ".fatbin")
_SIDECAR = "hlo_doctor_run.json"
# Not HLO snapshots, and never read: "...after_optimizations-buffer-assignment-values.txt" etc.
_DROP_NAME_PARTS = ("-buffer-assignment-values",
                    ".thunk_sequence", ".thunk_metadata", ".autotune_results")
# TPU writes the optimized module three more times (before and after buffer assignment,
# after codegen); after_optimizations.txt is the one read.
_DROP_NAME_ENDINGS = (".after_optimizations_after_buffer_assignment.txt", ".oom_intermediate_module.txt",
                      ".after_optimizations_before_buffer_assignment.txt", ".after_codegen.txt")


@dataclass(frozen=True, slots=True)
class TrimReport:
    removed: tuple[str, ...]
    bytes_removed: int
    bytes_kept: int


def is_hlo_text(path: Path) -> bool:
    if path.suffix != ".txt":
        return False
    with open(path, "rb") as f:
        return f.read(64).lstrip().startswith(b"HloModule")


def _is_kept_mlir(relative: Path) -> bool:
    if "shardy" in relative.parts[:-1]:
        return True
    if relative.name == "module.mlir" and len(relative.parts) == 2:
        # module_NNNN.NAME/module.mlir, or jax 0.7's jit_NAME_TIMESTAMP/module.mlir
        return relative.parts[0].startswith("module_") or parse_compile_dir_name(relative.parts[0]) is not None
    return "sdy" in relative.name


def should_remove(path: Path, relative: Path, size_cap: int) -> bool:
    if relative.name == _SIDECAR:
        return False
    if path.suffix in _DROP_SUFFIXES:
        return True
    if any(part in relative.name for part in _DROP_NAME_PARTS):
        return True
    if relative.name.endswith(_DROP_NAME_ENDINGS):
        return True
    if path.suffix == ".mlir":
        return not _is_kept_mlir(relative)
    return path.stat().st_size > size_cap and not is_hlo_text(path)


def trim_dump(dump_dir: str | Path, *, size_cap: int = DEFAULT_SIZE_CAP) -> TrimReport:
    root = Path(dump_dir)
    removed: list[str] = []
    bytes_removed = bytes_kept = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        relative = path.relative_to(root)
        size = path.stat().st_size
        if should_remove(path, relative, size_cap):
            path.unlink()
            removed.append(relative.as_posix())
            bytes_removed += size
        else:
            bytes_kept += size
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
    return TrimReport(tuple(removed), bytes_removed, bytes_kept)
