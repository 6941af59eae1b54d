"""One module's memory per device at its peak: how much, from which source, and what fills it.

:func:`module_memory` takes the peak from XLA's own files where the dump has
them (:mod:`.xla_files`): the buffer assignment (its allocations in the
default memory space add up to XLA's ``Total bytes``), else the
memory-usage report's total; otherwise it estimates the peak from live
ranges in the module's own order (:mod:`.liveness`). The peak is then split
by class (:mod:`.values`) and by item: each parameter, and each value live
in the temporaries' heap at its fullest moment. The classes always add up to
the peak: heap bytes no value uses at that moment (fragmentation, alignment,
nested computations) are an item of ``temporaries``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlo_doctor.hlo.ir import HloModule, Instruction
from hlo_doctor.memory.heap import fullest_moment
from hlo_doctor.memory.liveness import Liveness, module_liveness
from hlo_doctor.memory.values import CLASSES, ValueClasses, classify_values
from hlo_doctor.memory.xla_files import (
    BufferAssignment,
    LiveRanges,
    find_memory_files,
    parse_buffer_assignment,
    parse_live_ranges,
    parse_memory_usage_report,
    read_text,
)

__all__ = ["SOURCE_LABELS", "MemoryItem", "ModuleMemory", "Target", "module_memory"]

FROM_BUFFER_ASSIGNMENT = "xla-buffer-assignment"
FROM_USAGE_REPORT = "xla-memory-usage-report"
ESTIMATE = "estimate"
SOURCE_LABELS = {
    FROM_BUFFER_ASSIGNMENT: "XLA's buffer assignment",
    FROM_USAGE_REPORT: "XLA's memory-usage report",
    ESTIMATE: "estimated from live ranges",
}
"""How each source of the peak is told to people."""
UNUSED_HEAP = "(heap not in use at the peak: fragmentation, alignment, nested computations)"

Describe = Callable[[Instruction], tuple[str, str | None]]  # instruction -> (name for people, source line)


@dataclass(frozen=True, slots=True)
class MemoryItem:
    cls: str
    name: str
    bytes: int
    source: str | None = None
    instruction: str | None = None  # the optimized module's instruction (None for a heap remainder)
    parameter: int | None = None


@dataclass(frozen=True, slots=True)
class Target:
    hardware: str
    hbm_bytes: int

    def headroom(self, peak: int) -> int:
        return self.hbm_bytes - peak


@dataclass(frozen=True, slots=True)
class ModuleMemory:
    """One module's peak per device and what fills it."""

    name: str
    peak_bytes: int
    peak_source: str
    classes: dict[str, int]
    items: tuple[MemoryItem, ...]
    target: Target | None = None
    problems: tuple[str, ...] = field(default=())  # memory files that could not be read

    @property
    def headroom_bytes(self) -> int | None:
        return self.target.headroom(self.peak_bytes) if self.target is not None else None

    def document(self, items: int | None = None) -> dict:
        """The module's entry of ``hlo-doctor memory --format json`` (with the largest ``items``
        items only, when given)."""
        return {
            "name": self.name,
            "peak_bytes": self.peak_bytes,
            "peak_source": self.peak_source,
            "classes": dict(self.classes),
            "items": [{"class": i.cls, "name": i.name, "bytes": i.bytes, "source": i.source}
                      for i in self.items[:items]],
            "target": None if self.target is None else {
                "hardware": self.target.hardware, "hbm_bytes": self.target.hbm_bytes,
                "headroom_bytes": self.target.headroom(self.peak_bytes)},
        }

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> ModuleMemory:
        """The memory :meth:`document` describes (its items without their instructions)."""
        target = document.get("target")
        return cls(
            str(document["name"]), int(document["peak_bytes"]), str(document["peak_source"]),
            {str(k): int(v) for k, v in dict(document.get("classes") or {}).items()},
            tuple(MemoryItem(str(i["class"]), str(i["name"]), int(i["bytes"]), i.get("source"))
                  for i in document.get("items") or ()),
            Target(str(target["hardware"]), int(target["hbm_bytes"])) if target else None,
        )


def module_memory(
    name: str,
    optimized: HloModule | None,
    optimized_path: Path | None,
    partitioned: HloModule | None,
    parameter_classes: Mapping[int, str],
    describe: Describe,
    target: Target | None = None,
) -> ModuleMemory | None:
    """The memory of one module (see the module docstring); None when it has no per-device snapshot.

    ``optimized`` is the after-optimizations module (its instruction names are the buffer
    assignment's), ``partitioned`` the module after SPMD partitioning (estimated in dataflow
    order when there is no optimized one); ``parameter_classes`` maps entry parameter numbers
    to ``weights``, ``optimizer_state`` or ``inputs``.
    """
    problems: list[str] = []
    assignment: BufferAssignment | None = None
    ranges: LiveRanges | None = None
    report: dict[int, tuple[str, int]] | None = None
    if optimized_path is not None:
        files = find_memory_files(optimized_path)
        for path, parse in ((files.buffer_assignment, parse_buffer_assignment), (files.live_range, parse_live_ranges),
                            (files.usage_report, parse_memory_usage_report)):
            if path is None:
                continue
            try:
                parsed = parse(read_text(path))
            except (OSError, ValueError) as error:
                problems.append(f"{path}: {error}")
                continue
            if isinstance(parsed, BufferAssignment):
                assignment = parsed if parsed.allocations else None
            elif isinstance(parsed, LiveRanges):
                ranges = parsed
            else:
                report = parsed
    module = optimized or partitioned
    if module is None or module.entry is None:
        return None
    values = classify_values(module, parameter_classes)
    liveness = module_liveness(module)
    if assignment is not None and optimized is not None:
        peak, items = _from_assignment(assignment, ranges, optimized, values, liveness, parameter_classes, describe)
        source = FROM_BUFFER_ASSIGNMENT
    else:
        peak, items = _estimate(module, values, liveness, parameter_classes, describe)
        source = ESTIMATE
        total = report.get(0) if report else None
        if total is not None:
            source = FROM_USAGE_REPORT
            if total[1] > peak:
                items.append(MemoryItem("temporaries", "(XLA's total less what the estimate attributes)",
                                        total[1] - peak))
            peak = total[1]
    items.sort(key=lambda i: (-i.bytes, i.cls, i.name))
    classes = {cls: 0 for cls in CLASSES}
    for item in items:
        classes[item.cls] += item.bytes
    classes = {cls: size for cls, size in classes.items() if size}
    return ModuleMemory(name, peak, source, classes, tuple(items), target, tuple(problems))


def _parameter_item(instruction: Instruction, size: int, parameter_classes: Mapping[int, str],
                    describe: Describe) -> MemoryItem:
    number = instruction.parameter_number
    label, source = describe(instruction)
    cls = parameter_classes.get(number, "inputs") if number is not None else "inputs"
    return MemoryItem(cls, label, size, source, instruction.name, number)


class _Definitions:
    """Where a module's values are defined: its entry, else the first other computation with the name
    (indexed once, on the first value not in the entry)."""

    def __init__(self, module: HloModule) -> None:
        self.module = module
        self._nested: dict[str, str] | None = None

    def nested(self, name: str) -> str | None:
        if self._nested is None:
            self._nested = {}
            for computation in self.module.computations:
                if not computation.is_entry:
                    for instruction in computation.instructions:
                        self._nested.setdefault(instruction.name, computation.name)
        return self._nested.get(name)


def _value_item(definitions: _Definitions, instruction_name: str, suffix: str, size: int, values: ValueClasses,
                describe: Describe) -> MemoryItem:
    entry = definitions.module.entry
    instruction = entry.get(instruction_name) if entry is not None else None
    cls = values.by_name.get(instruction_name, "temporaries")
    if instruction is None:
        where = definitions.nested(instruction_name)
        label = instruction_name + suffix + (f" (in {where})" if where else "")
        return MemoryItem(cls, label, size, None, instruction_name)
    label, source = describe(instruction)
    return MemoryItem(cls, label + suffix, size, source, instruction_name)


def _from_assignment(
    assignment: BufferAssignment, ranges: LiveRanges | None, module: HloModule, values: ValueClasses,
    liveness: Liveness | None, parameter_classes: Mapping[int, str], describe: Describe,
) -> tuple[int, list[MemoryItem]]:
    entry = module.entry
    assert entry is not None
    parameters = {p.parameter_number: p for p in entry.parameters()}
    own_ranges = {v.instruction: (v.start, v.end) for v in liveness.values} if liveness is not None else {}
    definitions = _Definitions(module)
    items: list[MemoryItem] = []
    for allocation in assignment.allocations:
        if allocation.color != 0:
            continue
        if allocation.parameter is not None and allocation.parameter in parameters:
            items.append(_parameter_item(parameters[allocation.parameter], allocation.size, parameter_classes,
                                         describe))
            continue
        if allocation.is_temp:
            items.extend(_heap_items(allocation, ranges, own_ranges, definitions, values, describe))
            continue
        largest = max(allocation.values, key=lambda v: v.size, default=None)
        if largest is None:
            items.append(MemoryItem("temporaries", f"(allocation {allocation.index})", allocation.size))
            continue
        suffix = largest.shape_index if largest.shape_index != "{}" else ""
        item = _value_item(definitions, largest.instruction, suffix, allocation.size, values, describe)
        if allocation.is_output:
            item = MemoryItem("outputs", item.name, item.bytes, item.source, item.instruction)
        elif allocation.is_constant or allocation.is_thread_local:
            item = MemoryItem("temporaries", item.name, item.bytes, item.source, item.instruction)
        items.append(item)
    return assignment.total(0), items


def _heap_items(allocation, ranges: LiveRanges | None, own_ranges: dict[str, tuple[int, int]],
                definitions: _Definitions,
                values: ValueClasses, describe: Describe) -> list[MemoryItem]:
    """The values in the temporaries' heap at its fullest moment, and the bytes no value uses then."""
    spans = []
    for value in allocation.values:
        span = None
        if ranges is not None:
            span = ranges.ranges.get((value.instruction, value.shape_index))
        if span is None:
            span = own_ranges.get(value.instruction)
        if span is not None:
            spans.append((value, span))
    best = fullest_moment(spans, allocation.size)
    items = []
    for value, size in best:
        suffix = value.shape_index if value.shape_index != "{}" else ""
        items.append(_value_item(definitions, value.instruction, suffix, size, values, describe))
    used = sum(i.bytes for i in items)
    if allocation.size > used:
        items.append(MemoryItem("temporaries", UNUSED_HEAP, allocation.size - used))
    return items


def _estimate(module: HloModule, values: ValueClasses, liveness: Liveness | None,
              parameter_classes: Mapping[int, str], describe: Describe) -> tuple[int, list[MemoryItem]]:
    entry = module.entry
    if liveness is None or entry is None:
        return 0, []
    definitions = _Definitions(module)
    items: list[MemoryItem] = []
    for value in liveness.live_at(liveness.peak_at):
        instruction = entry.get(value.instruction)
        if instruction is not None and instruction.opcode == "parameter":
            items.append(_parameter_item(instruction, value.size, parameter_classes, describe))
        else:
            items.append(_value_item(definitions, value.instruction, "", value.size, values, describe))
    nested = liveness.nested.get(liveness.peak_at, 0)
    if nested:
        caller = entry.instructions[liveness.peak_at].name if liveness.peak_at < len(entry.instructions) else "?"
        items.append(MemoryItem("temporaries", f"(inside the computations {caller} calls)", nested, None, caller))
    return liveness.peak_bytes, items
