"""Pausing Python's cyclic garbage collector while big acyclic structures are built.

A parsed module is millions of long-lived objects without reference cycles.
Building it, or the graph and analyses over it, allocates so many small
objects that the collector would run again and again and rescan all of them,
for nothing to free; it is paused for that time and works as usual after.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused_gc"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-enable it after, if it was on)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
