"""The heap's fullest moment, against a byte-by-byte count on random heaps (small, hand-made:
values with offsets and live ranges, some sharing bytes, some past the heap's end)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from hlo_doctor.memory.heap import fullest_moment, held_bytes


@dataclass(frozen=True)
class Value:
    id: int
    offset: int
    size: int


def _count_bytes(live: list[tuple[Value, int]], size: int) -> list[tuple[Value, int]]:
    """Each byte of the heap goes to the newest live value that covers it."""
    taken: set[int] = set()
    found = []
    for value, _start in sorted(live, key=lambda pair: (-pair[1], pair[0].offset)):
        own = set(range(min(value.offset, size), min(value.offset + value.size, size))) - taken
        if own:
            found.append((value, len(own)))
            taken |= own
    return found


def _every_position(spans: list[tuple[Value, tuple[int, int]]], size: int) -> list[tuple[Value, int]]:
    best: list[tuple[Value, int]] = []
    best_bytes = -1
    for position in sorted({start for _, (start, _end) in spans}):
        live = _count_bytes([(v, start) for v, (start, end) in spans if start <= position <= end], size)
        total = sum(own for _, own in live)
        if total > best_bytes:
            best, best_bytes = live, total
    return best


def _random_heap(rng: random.Random) -> tuple[list[tuple[Value, tuple[int, int]]], int]:
    size = rng.randint(1, 64)
    spans = []
    for number in range(rng.randint(0, 24)):
        offset = rng.randint(0, size + 4)  # some past the end: a damaged file
        value = Value(number, offset, rng.randint(0, 24))
        start = rng.randint(0, 30)
        spans.append((value, (start, start + rng.randint(0, 12))))
    return spans, size


@pytest.mark.parametrize("seed", range(400))
def test_fullest_moment_is_the_byte_count_at_every_position(seed):
    spans, size = _random_heap(random.Random(seed))
    assert fullest_moment(spans, size) == _every_position(spans, size)


def test_shared_bytes_count_once_for_the_newest():
    operand, output = Value(0, 0, 8), Value(1, 4, 8)  # the output written over the operand's tail
    assert held_bytes([(operand, 0), (output, 3)], 16) == [(output, 8), (operand, 4)]
    # Touching ranges share nothing; a value wholly under newer ones holds nothing and is left out.
    assert held_bytes([(Value(2, 0, 4), 5), (Value(3, 4, 4), 5), (Value(4, 2, 4), 1)], 16) == [
        (Value(2, 0, 4), 4), (Value(3, 4, 4), 4)]


def test_the_first_of_equal_moments_wins():
    early, late = Value(0, 0, 8), Value(1, 8, 8)
    assert fullest_moment([(early, (0, 1)), (late, (5, 6))], 16) == [(early, 8)]
