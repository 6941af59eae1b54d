"""Forked children that compute values and send them back pickled through a pipe.

:func:`fork_child` computes one value (:mod:`hlo_doctor.rules.parallel`: some rules of a
big module in a child); :func:`fork_server` answers one request after another
(:mod:`hlo_doctor.rules.module_workers`: whole modules, so that each worker pays its start
once, not once per module). A child prints nothing and leaves with ``os._exit`` (status 0
only when all its answers were written); the parent treats a failed child or a garbled
answer as no answer, doing the work itself.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from collections.abc import Callable, Iterable

__all__ = ["REQUEST", "can_fork", "fork_child", "fork_server", "loads", "take_answer"]


def can_fork() -> bool:
    return hasattr(os, "fork")


def fork_child(produce: Callable[[], object]) -> tuple[int, int]:
    """Fork a child that sends ``produce()`` back: (the pipe's read end, the child's pid)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child (its exit status is checked)
        os.close(read_end)
        _run_child(lambda: _send_one(produce, write_end))
    os.close(write_end)
    return read_end, pid


def _send_one(produce: Callable[[], object], write_end: int) -> None:  # pragma: no cover - child
    data = pickle.dumps(produce(), protocol=pickle.HIGHEST_PROTOCOL)
    with os.fdopen(write_end, "wb") as pipe:
        pipe.write(data)


REQUEST = struct.Struct("<ii")
"""A :func:`fork_server` request: two ints (for a module worker, the module's index and the processes it may use)."""

_ANSWER_LENGTH = struct.Struct("<Q")  # what frames each of fork_server's answers


def fork_server(answer: Callable[[int, int], object], inherited: Iterable[int] = ()) -> tuple[int, int, int]:
    """Fork a child that answers requests: (the requests pipe's write end, the answers pipe's
    read end, the child's pid).

    Each request is two ints (:data:`REQUEST`) written to the first pipe; the child writes
    ``answer(*request)`` pickled, framed by its length (read back with :func:`take_answer`;
    empty: it could not answer that one), to the second, and leaves once the requests pipe is
    closed. ``inherited``: this process's ends of other children's pipes, which the child closes
    (a child holding another's requests pipe open would keep that one waiting for ever).
    """
    requests_read, requests_write = os.pipe()
    answers_read, answers_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child (its exit status is checked)
        for fd in (requests_write, answers_read, *inherited):
            os.close(fd)
        _run_child(lambda: _answer_requests(answer, requests_read, answers_write))
    os.close(requests_read)
    os.close(answers_write)
    return requests_write, answers_read, pid


def _answer_requests(answer: Callable[[int, int], object], requests: int, answers: int) -> None:  # pragma: no cover
    with os.fdopen(requests, "rb") as inbox, os.fdopen(answers, "wb") as outbox:
        while len(request := inbox.read(REQUEST.size)) == REQUEST.size:
            try:
                data = pickle.dumps(answer(*REQUEST.unpack(request)), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - the parent does this one itself
                data = b""
            outbox.write(_ANSWER_LENGTH.pack(len(data)))
            outbox.write(data)
            outbox.flush()


def take_answer(data: bytearray) -> bytes | None:
    """The first whole answer of :func:`fork_server` read so far into ``data`` (then removed from
    it), or None while it has not all come."""
    header = _ANSWER_LENGTH.size
    if len(data) < header:
        return None
    end = header + _ANSWER_LENGTH.unpack_from(data)[0]
    if len(data) < end:
        return None
    answer = bytes(data[header:end])
    del data[:end]
    return answer


def _run_child(body: Callable[[], None]) -> None:  # pragma: no cover - child
    """Run ``body`` in a forked child and leave: status 0 when it returned, 1 when it raised."""
    status = 1
    try:
        # Nothing is printed here: a stream lock held by another thread of the parent at the
        # fork (a progress bar's refresh) would stay held in this copy.
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives until _exit
        body()
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
