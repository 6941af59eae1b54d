"""Whether an object goes as soon as its last reference does (no reference cycle)."""

from __future__ import annotations

import gc
import weakref


def freed_without_the_collector(only: list) -> bool:
    """Drop the one object ``only`` holds (its last reference) with the cyclic collector off:
    True when it was freed at once, False when a reference cycle keeps it for a collection."""
    ref = weakref.ref(only[0])
    enabled = gc.isenabled()
    gc.disable()
    try:
        only.clear()
        return ref() is None
    finally:
        if enabled:
            gc.enable()
