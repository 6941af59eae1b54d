"""A forked child that computes one value and sends it back pickled through a pipe.

Shared by :mod:`hlo_doctor.rules.parallel` (some rules of a big module in a child) and
:mod:`hlo_doctor.rules.module_workers` (whole modules in children). The child prints
nothing, writes its pickled answer and leaves with ``os._exit`` (status 0 only when the
answer was written); the parent reads the pipe, waits, and treats a failed child or a
garbled answer as no answer, doing the work itself.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable

__all__ = ["can_fork", "fork_child", "loads"]


def can_fork() -> bool:
    return hasattr(os, "fork")


def fork_child(produce: Callable[[], object]) -> tuple[int, int]:
    """Fork a child that sends ``produce()`` back: (the pipe's read end, the child's pid)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child (its exit status is checked)
        os.close(read_end)
        _serve(produce, write_end)
    os.close(write_end)
    return read_end, pid


def _serve(produce: Callable[[], object], write_end: int) -> None:  # pragma: no cover - child
    status = 1
    try:
        # Nothing is printed here: a stream lock held by another thread of the parent at the
        # fork (a progress bar's refresh) would stay held in this copy.
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives until _exit
        data = pickle.dumps(produce(), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(data)
        status = 0
    except BaseException:  # noqa: BLE001 - the parent does the work itself
        pass
    finally:
        os._exit(status)


def loads(data: bytes | bytearray) -> object | None:
    """The child's answer, or None when it is garbled (the parent then does the work)."""
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - a garbled answer
        return None
