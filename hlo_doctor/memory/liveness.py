"""Live ranges from a module's own order, and the peak they give: the estimate where XLA wrote none.

A scheduled module (``is_scheduled=true``: every optimized module) prints
each computation's instructions in schedule order; a partitioned module
prints them in a dataflow (topological) order. Either way a value is live
from the instruction that defines it to its last user (an output lives to the
end, a parameter the whole step). Values that are views of another's bytes
(bitcast, get-tuple-element, tuple, the done half of an async pair) have no
buffer of their own and extend their source's range instead. A ``while``,
``call`` or ``conditional`` adds, at its position, the peak of what the
computations it calls need beyond their parameters. An output the header's
``input_output_alias`` gives a donated parameter's buffer (a train step's new
weights and optimizer state) is written into that buffer and adds no bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.hlo.ir_shape import Shape
from hlo_doctor.memory.values import is_view

__all__ = ["LiveValue", "Liveness", "aliased_outputs", "module_liveness"]

_CALLERS = frozenset({"while", "call", "conditional", "async-start"})


@dataclass(frozen=True, slots=True)
class LiveValue:
    instruction: str
    size: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Liveness:
    """The entry's buffers with their ranges, the nested peaks by position, and the peak."""

    values: tuple[LiveValue, ...]
    nested: dict[int, int]  # position -> bytes a called computation needs there
    length: int
    peak_bytes: int
    peak_at: int

    def live_at(self, position: int) -> list[LiveValue]:
        return [v for v in self.values if v.start <= position <= v.end]


_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# input_output_alias={ {0}: (0, {}, may-alias), {1}: (3, {}, must-alias) }: output index -> parameter
_ALIAS = re.compile(r"\{(\d*)\}:\s*\((\d+),\s*\{\}")


def aliased_outputs(module: HloModule) -> dict[int | None, int]:
    """Top-level output index (None: the whole output) -> the entry parameter whose buffer it
    reuses, from the header's ``input_output_alias`` (whole parameters only)."""
    text = module.attribute("input_output_alias")
    if not text:
        return {}
    return {int(index) if index else None: int(number) for index, number in _ALIAS.findall(text)}


def _default_space_bytes(shape: Shape) -> int:
    """The bytes of a shape's leaves that live in the default memory space (device memory): a TPU
    layout's ``S(1)`` puts a leaf in vmem, outside what the peak counts."""
    total = 0
    for leaf in shape.leaves() if shape.is_tuple else (shape,):
        layout = leaf.layout
        space = _MEMORY_SPACE.search(layout.text) if layout is not None else None
        if space is None or space.group(1) == "0":
            total += leaf.byte_size
    return total


def _own_size(instruction: Instruction) -> int:
    if instruction.opcode in ("tuple", "get-tuple-element", "bitcast") or is_view(instruction):
        return 0
    if instruction.opcode in ("while", "optimization-barrier"):
        return 0  # a loop's state and a barrier's value are their operands' buffers
    if instruction.opcode.endswith("-start") or instruction.opcode == "async-start":
        # an async pair's start holds the result it will hand to its done (its last leaf), and the
        # operands it aliases; count the result only
        shape = instruction.shape
        leaves = list(shape.leaves()) if shape.is_tuple else [shape]
        return _default_space_bytes(leaves[-1]) if leaves else 0
    return _default_space_bytes(instruction.shape)


# XLA places each temporary buffer in its heap at an offset aligned to this many bytes (the CPU
# backend's heap offsets are multiples of 64; GPU and TPU align at least as coarsely): a small
# module's peak is mostly that padding. Parameters, constants and outputs get their own allocations.
_ALIGNMENT = 64


def _aligned(size: int) -> int:
    return -(-size // _ALIGNMENT) * _ALIGNMENT


def _ranges(computation: Computation) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Each instruction's (definition, last use) and, for a view, the buffer it shares."""
    owner: dict[str, str] = {}
    ranges: dict[str, tuple[int, int]] = {}
    for position, instruction in enumerate(computation.instructions):
        name = instruction.name
        source = name
        if (is_view(instruction) or instruction.opcode in ("while", "optimization-barrier")) and instruction.operands:
            source = owner.get(instruction.operands[0], instruction.operands[0])
        owner[name] = source
        ranges.setdefault(name, (position, position))
        for operand in instruction.operands:
            buffer = owner.get(operand, operand)
            for key in {buffer, operand}:
                if key in ranges:
                    ranges[key] = (ranges[key][0], position)
    return ranges, owner


def _computation_peak(module: HloModule, computation: Computation, depth: int = 0, *,
                      writes_callers_buffer: bool = False) -> int:
    """What a called computation needs beyond its parameters, at its own peak; beyond its result too
    when that is its caller's buffer (a ``call``: the CPU backend's parallel calls write the call's
    result in place), not a while body's new state (held beside the old one)."""
    if depth > 8:
        return 0
    liveness = _liveness(module, computation, depth + 1, count_parameters=False,
                         count_outputs=not writes_callers_buffer)
    return liveness.peak_bytes


def _liveness(module: HloModule, computation: Computation, depth: int, *, count_parameters: bool,
              count_outputs: bool = True) -> Liveness:
    instructions = computation.instructions
    length = len(instructions)
    ranges, owner = _ranges(computation)
    root = computation.root
    outputs = set(root.operands if root is not None and root.opcode == "tuple" else ())
    if root is not None:
        outputs.add(root.name)
    in_place = _written_in_place(module, computation, owner) if count_parameters else set()
    values: list[LiveValue] = []
    nested: dict[int, int] = {}
    for position, instruction in enumerate(instructions):
        if instruction.opcode == "parameter":
            if count_parameters:
                values.append(LiveValue(instruction.name, _default_space_bytes(instruction.shape), 0, length))
            continue
        if instruction.opcode in _CALLERS and depth <= 8:
            extra = 0
            for name in instruction.called_computations:
                called = module.computation(name)
                if called is not None and called is not computation:
                    extra = max(extra, _computation_peak(module, called, depth,
                                                         writes_callers_buffer=instruction.opcode == "call"))
            if extra:
                nested[position] = extra
        size = _own_size(instruction)
        if size <= 0 or instruction.name in in_place:
            continue
        if not count_outputs and instruction.name in outputs:
            continue  # the result of a called computation that writes its caller's buffer, counted there
        start, end = ranges.get(instruction.name, (position, position))
        if instruction.name in outputs:
            end = length
        elif instruction.opcode not in ("parameter", "constant"):
            size = _aligned(size)
        values.append(LiveValue(instruction.name, size, start, end))
    peak, peak_at = _sweep(values, nested, length)
    return Liveness(tuple(values), nested, length, peak, peak_at)


def _written_in_place(module: HloModule, computation: Computation, owner: dict[str, str]) -> set[str]:
    """The buffers of the entry's outputs that reuse a donated parameter's buffer."""
    aliases = aliased_outputs(module)
    root = computation.root
    if not aliases or root is None:
        return set()
    outputs: dict[int | None, str] = {None: root.name}
    if root.opcode == "tuple":
        outputs.update(enumerate(root.operands))
    parameters = {p.name for p in computation.parameters()}
    found = set()
    for index in aliases:
        name = outputs.get(index)
        if name is None:
            continue
        buffer = owner.get(name, name)
        if buffer not in parameters:  # an output that is its own parameter needs nothing
            found.add(buffer)
    return found


def _sweep(values: list[LiveValue], nested: dict[int, int], length: int) -> tuple[int, int]:
    """The largest sum of live bytes over the positions, and the first position it is reached."""
    delta = [0] * (length + 2)
    for value in values:
        delta[value.start] += value.size
        delta[min(value.end, length) + 1] -= value.size
    best = best_at = live = 0
    for position in range(length + 1):
        live += delta[position]
        total = live + nested.get(position, 0)
        if total > best:
            best, best_at = total, position
    return best, best_at


def module_liveness(module: HloModule) -> Liveness | None:
    """The entry computation's liveness in the module's printed order; None without an entry."""
    entry = module.entry
    if entry is None:
        return None
    return _liveness(module, entry, 0, count_parameters=True)
