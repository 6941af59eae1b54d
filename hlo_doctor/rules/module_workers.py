"""Analyse the modules of a dump in forked worker processes, a few at a time.

The modules of a dump are independent: no rule reads another module (a
torch_xla dump holds one ``SyncTensorsGraph`` per distinct step graph, a
Keras one a module per initializer). With ``jobs >= 2``, a system with
``os.fork``, two or more modules and at least ``MODULES_MIN_BYTES`` of HLO
text in all, :func:`map_modules` runs ``work(index)`` for each module in a
forked child, at most ``jobs`` at once, the biggest modules first. Each child
parses only its own module's snapshots and sends back, pickled through a
pipe, what ``work`` returned; the parent never holds a parsed module.

Results come back in module order whatever order the children finish in.
A child that dies or sends nothing has its module analysed here instead,
so the report is the same as a serial run's (tested on every fixture).
"""

from __future__ import annotations

import os
import selectors
import signal
from collections.abc import Callable, Sequence
from typing import TypeVar

from hlo_doctor.rules._forked import can_fork, fork_child, loads

__all__ = ["MODULES_MIN_BYTES", "MODULES_MIN_COUNT", "can_fork", "map_modules", "worth_forking"]

MODULES_MIN_BYTES = 4 * 1024 * 1024
"""Below this much HLO text in the whole dump, forking costs more than it saves."""

MODULES_MIN_COUNT = 2
"""One module alone is better served by sharing its rules (:mod:`hlo_doctor.rules.parallel`)."""

T = TypeVar("T")


def worth_forking(sizes: Sequence[int], jobs: int, min_bytes: int | None = None) -> bool:
    """Several modules, several jobs, and enough text to pay for the forks."""
    min_bytes = MODULES_MIN_BYTES if min_bytes is None else min_bytes
    return jobs >= 2 and can_fork() and len(sizes) >= MODULES_MIN_COUNT and sum(sizes) >= min_bytes


def map_modules(
    work: Callable[[int], T],
    sizes: Sequence[int],
    jobs: int,
    *,
    started: Callable[[int], None] | None = None,
) -> list[T]:
    """``[work(i) for i in range(len(sizes))]``, with up to ``jobs`` calls running in forked children
    (the biggest ``sizes`` first). ``started(i)`` is called here as module ``i``'s work begins.
    ``work`` must return something picklable; its side effects happen in the child only."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    results: dict[int, T] = {}
    failed: list[int] = []
    running: dict[int, tuple[int, int, bytearray]] = {}  # read fd -> (index, pid, data)
    selector = selectors.DefaultSelector()
    try:
        while order or running:
            while order and len(running) < jobs:
                index = order.pop(0)
                if started is not None:
                    started(index)
                read_end, pid = _fork(work, index)
                running[read_end] = (index, pid, bytearray())
                selector.register(read_end, selectors.EVENT_READ)
            for key, _ in selector.select():
                fd = key.fd
                index, pid, data = running[fd]
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    data += chunk
                    continue
                selector.unregister(fd)
                os.close(fd)
                del running[fd]
                _, status = os.waitpid(pid, 0)
                result = _unpickle(data) if status == 0 and data else None
                if result is None:
                    failed.append(index)
                else:
                    results[index] = result[0]
    finally:
        for fd, (_, pid, _) in running.items():
            os.close(fd)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        selector.close()
    for index in sorted(failed):  # the child failed: its module is analysed here
        if started is not None:
            started(index)
        results[index] = work(index)
    return [results[i] for i in range(len(sizes))]


def _fork(work: Callable[[int], object], index: int) -> tuple[int, int]:
    return fork_child(lambda: _child_answer(work, index))


def _child_answer(work: Callable[[int], object], index: int) -> tuple[object]:  # pragma: no cover - child
    return (work(index),)


def _unpickle(data: bytes | bytearray) -> tuple[object] | None:
    result = loads(data)
    return result if isinstance(result, tuple) and len(result) == 1 else None