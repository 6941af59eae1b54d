"""Analyse the modules of a dump in forked worker processes, a few at a time.

The modules of a dump are independent: no rule reads another module (a
torch_xla dump holds one ``SyncTensorsGraph`` per distinct step graph, a
Keras one a module per initializer). With ``jobs >= 2``, a system with
``os.fork``, two or more modules and at least ``MODULES_MIN_BYTES`` of HLO
text in all, :func:`map_modules` forks up to ``jobs`` workers and hands each
module to one that is free, the biggest modules first. A worker analyses
module after module (so it pays its start, and the caches its first module
fills, once), parses only the snapshots of the module at hand and drops them
when it is done, and sends back, pickled through a pipe, what ``work``
returned; the parent never holds a parsed module. The last module handed out
may use two processes (its rules shared out as for a one-module dump, see
:mod:`hlo_doctor.rules.parallel`): the other workers run out of modules while
it is analysed, and their cores would be idle.

Results come back in module order whatever order the workers finish in.
A module whose worker dies or sends nothing is analysed here instead (a
worker that died is replaced while modules are left), so the report is the
same as a serial run's (tested on every fixture).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
from collections.abc import Callable, Sequence
from typing import TypeVar

from hlo_doctor.rules._forked import REQUEST, can_fork, fork_server, loads, take_answer

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
    work: Callable[[int, int], T],
    sizes: Sequence[int],
    jobs: int,
    *,
    started: Callable[[int], None] | None = None,
) -> list[T]:
    """``[work(i, share) for i in range(len(sizes))]``, the calls shared out to up to ``jobs``
    forked workers (the biggest ``sizes`` first). ``share`` is how many processes module ``i``'s
    work may use in its worker (1, or 2 for the last module handed out), and 0 for a module
    redone here after its worker failed. ``started(i)`` is called here as module ``i``'s work
    begins. ``work`` must return something picklable; its side effects happen in the worker only."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    results: dict[int, T] = {}
    failed: list[int] = []
    workers: dict[int, _Worker] = {}  # answers fd -> worker
    selector = selectors.DefaultSelector()

    def hand_out(worker: _Worker) -> None:
        index = order.pop(0)
        if started is not None:
            started(index)
        worker.send(index, 1 if order else min(jobs, 2))

    def start_worker() -> None:
        inherited = [fd for worker in workers.values() for fd in (worker.requests, worker.answers)]
        worker = _Worker(work, inherited)
        workers[worker.answers] = worker
        selector.register(worker.answers, selectors.EVENT_READ)
        hand_out(worker)

    try:
        while order and len(workers) < jobs:
            start_worker()
        while workers:
            for key, _ in selector.select():
                worker = workers[key.fd]
                answered = worker.receive()
                if answered is _PENDING:
                    continue
                if answered is _GONE:  # the worker died: its module is redone here
                    failed.append(worker.index)
                    selector.unregister(key.fd)
                    del workers[key.fd]
                    worker.stop()
                    if order:
                        start_worker()
                    continue
                result = _unpickle(answered) if answered else None
                if result is None:
                    failed.append(worker.index)
                else:
                    results[worker.index] = result[0]
                if order:
                    hand_out(worker)
                else:
                    selector.unregister(key.fd)
                    del workers[key.fd]
                    worker.stop()
    finally:
        for worker in workers.values():
            worker.stop(kill=True)
        selector.close()
    for index in sorted(failed):  # the worker failed: its module is analysed here
        if started is not None:
            started(index)
        results[index] = work(index, 0)
    return [results[i] for i in range(len(sizes))]


_PENDING = object()  # part of an answer has come
_GONE = object()  # the worker closed its pipe before answering: it died


class _Worker:
    """A forked process that answers module indexes with ``work``'s pickled result, one at a time."""

    def __init__(self, work: Callable[[int, int], object], inherited: Sequence[int]) -> None:
        self.requests, self.answers, self.pid = fork_server(
            lambda index, share: _child_answer(work, index, share), inherited)
        self.index = -1  # the module it is working on
        self._data = bytearray()

    def send(self, index: int, share: int) -> None:
        self.index = index
        self._data.clear()
        # A worker that died after its last answer: its pipe then reads as closed, and the
        # module is redone here.
        with contextlib.suppress(BrokenPipeError):
            os.write(self.requests, REQUEST.pack(index, share))

    def receive(self) -> bytes | object:
        """After its pipe is readable: the whole answer to :meth:`send` (empty: it could not
        answer), ``_PENDING`` while more is to come, or ``_GONE``."""
        chunk = os.read(self.answers, 1 << 20)
        if not chunk:
            return _GONE
        self._data += chunk
        answer = take_answer(self._data)
        return _PENDING if answer is None else answer

    def stop(self, kill: bool = False) -> None:
        """Close its pipes and reap it (killed first when ``kill``: this process was interrupted)."""
        for fd in (self.requests, self.answers):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            if kill:
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


def _child_answer(work: Callable[[int, int], object], index: int, share: int) -> tuple[object]:  # pragma: no cover
    return (work(index, share),)


def _unpickle(data: bytes | bytearray) -> tuple[object] | None:
    result = loads(data)
    return result if isinstance(result, tuple) and len(result) == 1 else None
