"""Atomic file output: a reader sees the old file or the whole new one, never a part."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from hlo_doctor.errors import InputError

__all__ = ["exists", "is_file", "is_small_file", "real_path", "write_atomically"]


def is_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (after links); False, never an error, for a path that
    cannot be looked at: a component over the system's limit, a NUL byte, no permission."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def is_small_file(path: str | os.PathLike[str], limit: int = 8_000_000) -> bool:
    """Whether ``path`` is a regular file of at most ``limit`` bytes: one a dump names may be read
    whole (``linecache`` does) without reading forever (``/dev/zero``, a FIFO) or a huge log."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size <= limit


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` exists (after links), False for a path that cannot be looked at."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` with every symbolic link resolved (``realpath``), for checks of where a file
    really is; a path that cannot be resolved (a loop, a NUL byte) is made absolute as it is."""
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError, RuntimeError):
        return Path(os.path.abspath(path))


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``.

    Only a regular file (or a new path) is replaced so: a character device (``/dev/null``,
    a terminal) or a FIFO is written into, as a shell's ``>`` would; anything else is refused.

    The file keeps the mode of the one it replaces (a new one gets the umask's).
    Raises :class:`InputError` (one line) when the folder cannot be written.
    """
    path = Path(path)
    try:
        kind = path.stat().st_mode
    except (OSError, ValueError):
        kind = None  # a new file (or one that cannot be looked at: the write below says why)
    if kind is not None and not stat.S_ISREG(kind):
        _write_through(path, kind, text)
        return
    temporary: str | None = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        os.replace(temporary, path)
        temporary = None
    except OSError as error:
        raise InputError(f"{path}: {error.strerror or error}") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _write_through(path: Path, kind: int, text: str) -> None:
    """Write into what is not a regular file (a terminal, ``/dev/null``, a FIFO) instead of
    replacing it with one; a folder or socket is refused."""
    if not (stat.S_ISCHR(kind) or stat.S_ISFIFO(kind)):
        raise InputError(f"{path}: not a regular file, device or pipe; cannot write a report there")
    try:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
    except OSError as error:
        raise InputError(f"{path}: {error.strerror or error}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
