"""How numbers read in messages and reports."""

from __future__ import annotations


def format_bytes(nbytes: float) -> str:
    """``512 B``, ``768 KiB`` (below a MiB), ``4.69 MiB``, ``1.25 GiB``."""
    if nbytes < 2**10:
        return f"{nbytes:.0f} B"
    if nbytes < 2**20:
        return f"{nbytes / 2**10:.0f} KiB"
    if nbytes < 2**30:
        return f"{nbytes / 2**20:.2f} MiB"
    return f"{nbytes / 2**30:.2f} GiB"
