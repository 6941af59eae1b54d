"""The dump folder a run writes: new or empty, made on demand."""

from __future__ import annotations

from pathlib import Path

from hlo_doctor.errors import ConfigurationError

__all__ = ["prepare_dump_dir"]


def prepare_dump_dir(dump_dir: Path) -> Path:
    """``dump_dir`` resolved and created; ConfigurationError when it is a file or not empty."""
    dump_dir = dump_dir.resolve()
    if dump_dir.exists() and not dump_dir.is_dir():
        raise ConfigurationError(f"{dump_dir}: not a directory")
    if dump_dir.is_dir() and any(dump_dir.iterdir()):
        raise ConfigurationError(f"{dump_dir}: dump folder is not empty; choose a new one")
    dump_dir.mkdir(parents=True, exist_ok=True)
    return dump_dir
