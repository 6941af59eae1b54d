"""How often each computation runs per step: while trip counts through calls and fusions.

A while body runs its trip count times per execution of its caller: XLA's
``known_trip_count`` in the while's ``backend_config`` where XLA wrote it,
else a condition of the form ``compare(i, constant(N)), direction=LT``.
Anything else is *unknown*: counted once, and said so (``known`` is False).
Fusion, call, async and conditional computations run once per caller;
reduction bodies are not walked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction

__all__ = ["Executions", "backend_config_json", "execution_counts", "trip_count", "walk"]

_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_CALLERS = ("fusion", "call", "async-start", "conditional")


@dataclass(frozen=True, slots=True)
class Executions:
    """Executions of a computation per step; ``known`` is False when a loop's trip count was not written."""

    count: int
    known: bool = True

    def __str__(self) -> str:
        return f"{self.count}" if self.known else f"{self.count} (a loop trip count is unknown)"


def trip_count(instruction: Instruction, by_name: dict[str, Computation]) -> int | None:
    """The trip count of a while op, or None when neither XLA nor the condition states it."""
    match = _TRIP.search(instruction.backend_config or "")
    if match:
        return int(match.group(1))
    condition = instruction.attribute("condition")
    computation = by_name.get((condition or "").lstrip("%"))
    if computation is None:
        return None
    for inner in computation.instructions:
        if inner.opcode != "compare" or inner.attribute("direction") != "LT":
            continue
        for operand in inner.operands:
            const = computation.get(operand)
            if const is not None and const.opcode == "constant" and const.literal:
                try:
                    return max(1, int(const.literal.strip()))
                except ValueError:
                    continue
    return None


def walk(module: HloModule) -> Iterator[tuple[Computation, Instruction, Executions]]:
    """Every instruction reachable from the entry, with how often it runs per step."""
    for computation, times in _visits(module):
        for instruction in computation.instructions:
            yield computation, instruction, times


def _visits(module: HloModule) -> Iterator[tuple[Computation, Executions]]:
    """Each computation reachable from the entry, once per distinct number of runs per step."""
    entry = module.entry
    if entry is None:
        return
    by_name = {c.name: c for c in module.computations}
    seen: set[tuple[str, Executions]] = set()
    stack: list[tuple[Computation, Executions]] = [(entry, Executions(1))]
    while stack:
        computation, times = stack.pop()
        if (computation.name, times) in seen:
            continue
        seen.add((computation.name, times))
        yield computation, times
        for instruction in computation.instructions:
            opcode = instruction.opcode
            if opcode == "while":
                trips = trip_count(instruction, by_name)
                body = (instruction.attribute("body") or "").lstrip("%")
                if body in by_name:
                    inner = Executions(times.count * (trips or 1), times.known and trips is not None)
                    stack.append((by_name[body], inner))
            elif opcode in _CALLERS:
                for name in instruction.called_computations:
                    if name in by_name:
                        stack.append((by_name[name], times))


def execution_counts(module: HloModule) -> dict[str, Executions]:
    """How often each computation reachable from the entry runs per step (the largest count seen)."""
    counts: dict[str, Executions] = {}
    for computation, times in _visits(module):
        if not computation.instructions:
            continue  # nothing of it runs
        found = counts.get(computation.name)
        if found is None or times.count > found.count:
            counts[computation.name] = times
    return counts


def backend_config_json(instruction: Instruction) -> dict:
    """The op's ``backend_config`` as a JSON object ({} when absent or not JSON)."""
    text = instruction.backend_config
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
