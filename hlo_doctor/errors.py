"""InputError: the user's input cannot be used at all (the CLI exits 2).

Raised for a missing path, a folder without HLO modules, a symlink loop, an
unreadable file or folder. ``str(error)`` is always one line, ready for a
CLI error message; per-file problems inside an otherwise usable dump are not
InputErrors but are recorded on the dump (see :mod:`hlo_doctor.dump`).
"""

from __future__ import annotations


def one_line(text: str, limit: int = 500) -> str:
    """Collapse ``text`` to a single line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 3] + "..."
    return flat


class InputError(Exception):
    """Unusable input, with a one-line message (``path: what is wrong``)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        self.message = one_line(message)
        super().__init__(f"{path}: {self.message}" if path else self.message)
