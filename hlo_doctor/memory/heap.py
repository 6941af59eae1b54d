"""The temporaries' heap at its fullest moment: which values hold which of its bytes.

XLA's buffer assignment places many values in one heap allocation at offsets,
and its live ranges say when each value lives. At one position of the schedule
the live values may share bytes (an output written over its operand's last
use): those bytes count once, for the newest value. :func:`fullest_moment`
finds the first position at which the values hold the most bytes on their own.

The search is bounded: the plain sum of the live values' sizes at a position is
never less than what they hold on their own, so positions are tried from the
largest sum down, and the search stops when no sum left can reach the best
found. Each position's sharing is counted on a sorted list of taken byte ranges.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Protocol, TypeVar

__all__ = ["PlacedValue", "fullest_moment", "held_bytes"]


class PlacedValue(Protocol):
    """A value placed in the heap (``xla_files.AssignedValue``)."""

    @property
    def size(self) -> int: ...

    @property
    def offset(self) -> int: ...


Value = TypeVar("Value", bound=PlacedValue)


def fullest_moment(spans: Sequence[tuple[Value, tuple[int, int]]], size: int) -> list[tuple[Value, int]]:
    """The values live at the first position (a value's start) where the heap of ``size`` bytes
    holds the most, each with the bytes it holds on its own there (see :func:`held_bytes`).
    ``spans`` pairs each value with its live range ``(start, end)``, both ends included."""
    starts = sorted({start for _, (start, _end) in spans})
    bounds = _live_sums(spans, starts)
    best: list[tuple[Value, int]] = []
    best_bytes, best_position = -1, 0
    for bound, position in sorted(zip(bounds, starts, strict=True), key=lambda pair: (-pair[0], pair[1])):
        bound = min(bound, size)
        if bound < best_bytes:
            break
        if bound == best_bytes and position > best_position:
            continue
        live = held_bytes([(value, start) for value, (start, end) in spans if start <= position <= end], size)
        total = sum(own for _, own in live)
        if total > best_bytes or (total == best_bytes and position < best_position):
            best, best_bytes, best_position = live, total, position
    return best


def held_bytes(live: Sequence[tuple[Value, int]], size: int) -> list[tuple[Value, int]]:
    """The bytes each live value (with its start) holds on its own: values that share bytes of the
    heap count them once, for the newest (the latest start; at equal starts, the lowest offset);
    bytes a (damaged) file places outside the heap's ``size`` do not count. Values holding nothing
    on their own are left out."""
    taken_starts: list[int] = []  # disjoint, sorted [start, end) byte ranges already counted
    taken_ends: list[int] = []
    found = []
    for value, _start in sorted(live, key=lambda pair: (-pair[1], pair[0].offset)):
        low, high = min(value.offset, size), min(value.offset + value.size, size)
        if high <= low:
            continue
        first = bisect_left(taken_ends, low)  # the ranges that touch or overlap [low, high)
        last = bisect_right(taken_starts, high)
        own = high - low
        for begin, end in zip(taken_starts[first:last], taken_ends[first:last], strict=True):
            own -= max(0, min(high, end) - max(low, begin))
        if own <= 0:
            continue
        found.append((value, own))
        if first < last:
            low, high = min(low, taken_starts[first]), max(high, taken_ends[last - 1])
        taken_starts[first:last] = [low]
        taken_ends[first:last] = [high]
    return found


def _live_sums(spans: Sequence[tuple[PlacedValue, tuple[int, int]]], positions: list[int]) -> list[int]:
    """The sum of the sizes of the values live at each position: an upper bound of what they hold
    on their own there (a value never holds more than its size, nor less than nothing)."""
    by_start = sorted((start, max(0, value.size)) for value, (start, _end) in spans)
    by_end = sorted((end, max(0, value.size)) for value, (_start, end) in spans)
    started = [0, *accumulate(size for _, size in by_start)]
    ended = [0, *accumulate(size for _, size in by_end)]
    start_keys = [start for start, _ in by_start]
    end_keys = [end for end, _ in by_end]
    return [started[bisect_right(start_keys, p)] - ended[bisect_left(end_keys, p)] for p in positions]
