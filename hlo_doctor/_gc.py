"""Pausing Python's cyclic garbage collector while big acyclic structures are built.

A parsed module is millions of long-lived objects without reference cycles.
Building it, or the graph and analyses over it, allocates so many small
objects that the collector would run again and again and rescan all of them,
for nothing to free; it is paused for that time and works as usual after.
"""

from __future__ import annotations

import gc

__all__ = ["paused_gc"]


class paused_gc:  # noqa: N801 - used like a function: ``with paused_gc():``
    """Disable the cyclic collector inside a ``with`` block (re-enabled after, if it was on).

    A plain class rather than ``@contextmanager``: leaving the block then
    allocates nothing the collector tracks, so re-enabling it does not at once
    start a scan of every object the block made (exactly as an inline
    ``gc.disable()`` / ``finally: gc.enable()`` behaves).
    """

    __slots__ = ("_enabled",)

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, exc_type, exc, traceback) -> None:  # noqa: ANN001
        if self._enabled:
            gc.enable()
