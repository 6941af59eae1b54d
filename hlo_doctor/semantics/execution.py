"""How often each computation runs per step: while trip counts through calls and fusions.

A while body runs its trip count times per execution of its caller: XLA's
``known_trip_count`` in the while's ``backend_config`` where XLA wrote it,
else a condition of the form ``compare(i, constant(N)), direction=LT``: then
``ceil((N - i0) / step)``, where ``i0`` is the induction variable's initial
constant in the while's operand tuple (0 where it is not a constant) and
``step`` the constant the body adds to it (1 where the body's update is not
``i + c``). The SPMD partitioner's windowed einsum loops take two windows per
trip (``i`` goes up by 2 to ``N``), so their trip count is ``N / 2``, not ``N``.
Anything else is *unknown*: counted once, and said so (``known`` is False).
Fusion, call, async and conditional computations run once per caller;
reduction bodies are not walked.
"""

from __future__ import annotations

import json
import math
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


_MOVES = ("copy", "bitcast", "convert", "reshape")


def trip_count(instruction: Instruction, by_name: dict[str, Computation],
               caller: Computation | None = None) -> int | None:
    """The trip count of a while op, or None when neither XLA nor the condition states it.

    ``caller``: the computation holding the while, where its initial state is read."""
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
        for position, operand in enumerate(inner.operands):
            bound = _constant(computation, operand)
            if bound is None:
                continue
            others = [o for p, o in enumerate(inner.operands) if p != position]
            element = _state_element(computation, others[0]) if len(others) == 1 else None
            if element is None:
                return max(1, bound)
            body = by_name.get((instruction.attribute("body") or "").lstrip("%"))
            step = _step(body, element) if body is not None else None
            start = _initial(caller, instruction, element) if caller is not None else None
            return max(1, math.ceil((bound - (start or 0)) / (step or 1)))
    return None


def _constant(computation: Computation, name: str) -> int | None:
    """The integer a scalar constant holds (through copies and converts), else None."""
    for _ in range(8):
        found = computation.get(name)
        if found is None:
            return None
        if found.opcode == "constant":
            try:
                return int((found.literal or "").strip())
            except ValueError:
                return None
        if found.opcode not in _MOVES or len(found.operands) != 1:
            return None
        name = found.operands[0]
    return None


def _state_element(computation: Computation, name: str) -> int | None:
    """Which element of the loop state (the computation's tuple parameter) ``name`` reads, else None."""
    for _ in range(8):
        found = computation.get(name)
        if found is None or len(found.operands) != 1:
            return None
        if found.opcode == "get-tuple-element":
            source = computation.get(found.operands[0])
            index = found.attribute("index")
            if source is None or source.opcode != "parameter" or index is None or not index.strip().isdigit():
                return None
            return int(index)
        if found.opcode not in _MOVES:
            return None
        name = found.operands[0]
    return None


def _step(body: Computation, element: int) -> int | None:
    """What the body adds to loop state ``element`` per trip (``i + c``, ``(i + a) + b``...), or None."""
    root = body.root
    if root is None or root.opcode != "tuple" or element >= len(root.operands):
        return None
    name, step = root.operands[element], 0
    for _ in range(16):
        if _state_element(body, name) == element:
            return step if step > 0 else None
        found = body.get(name)
        if found is None:
            return None
        if found.opcode in _MOVES and len(found.operands) == 1:
            name = found.operands[0]
            continue
        if found.opcode != "add" or len(found.operands) != 2:
            return None
        first, second = (_constant(body, o) for o in found.operands)
        if first is not None and second is None:
            step, name = step + first, found.operands[1]
        elif second is not None and first is None:
            step, name = step + second, found.operands[0]
        else:
            return None
    return None


def _initial(caller: Computation, loop: Instruction, element: int) -> int | None:
    """The constant loop state ``element`` starts from (the while's operand tuple), or None."""
    state = caller.get(loop.operands[0]) if loop.operands else None
    if state is None or state.opcode != "tuple" or element >= len(state.operands):
        return None
    return _constant(caller, state.operands[element])


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
                trips = trip_count(instruction, by_name, computation)
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
