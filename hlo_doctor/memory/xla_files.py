"""XLA's own memory files beside an optimized module: buffer assignment, live ranges, usage report.

XLA writes them next to ``*after_optimizations.txt`` when it dumps a compile
(CPU, GPU and TPU alike), named after it::

    module_0000.jit_f.cpu_after_optimizations-buffer-assignment.txt
    module_0000.jit_f.cpu_after_optimizations-live-range.txt
    module_0000.jit_f.cpu_after_optimizations-memory-usage-report.txt

* The **buffer assignment** lists every allocation (its size, its color, what
  it holds: a parameter, the output, a constant, thread-local scalars, or the
  preallocated temp heap) and the values placed in it with their offset.
* The **live ranges** give the schedule (``InstructionSequence``) and each
  value's ``start-end`` positions in it.
* The **memory-usage report** gives the ``Total bytes`` of each memory space
  (color 0 is the device's HBM; a TPU also has vmem, smem...).

Only files whose names are derived from the module's own optimized snapshot
are read; nothing in a dump decides what is opened. Each parser reads what it
understands and ignores the rest, so a newer XLA's extra lines do not break it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Allocation",
    "AssignedValue",
    "BufferAssignment",
    "LiveRanges",
    "MemoryFiles",
    "find_memory_files",
    "parse_buffer_assignment",
    "parse_live_ranges",
    "parse_memory_usage_report",
]

# The most a memory file may hold before it is not read (a 130-layer model's are a few MB).
MAX_FILE_BYTES = 256 << 20

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_VALUE = re.compile(r"^\s+value: <(\d+) (\S+?)(\{[\d,]*\})? @(\d+)> \(size=(\d+),offset=(\d+)\): (.*)$")
_PARAMETER = re.compile(r"\bparameter (\d+)\b")
_COLOR = re.compile(r"\bcolor (\d+)\b")
_SPACE = re.compile(r"^Memory Space: (\S+) \(color=(\d+)\)")
_TOTAL = re.compile(r"^Total bytes: (\d+)")
# The report of older XLA builds (torch_xla 2.9's): one memory space, no header, this total first.
_TOTAL_USED = re.compile(r"^Total bytes used: (\d+)")
_RANGE = re.compile(r"^\s+(\S+?)(\{[\d,]*\}):(\d+)-(\d+)\s*$")
_SEQUENCE = re.compile(r"^\s+(\d+):(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class AssignedValue:
    """One value placed in an allocation: ``<42 all-gather @0> (size=4194304,offset=0): f32[1024,1024]``."""

    id: int
    instruction: str
    shape_index: str  # "{}" for the whole value, "{0}" for a tuple element
    size: int
    offset: int
    shape: str


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation of the buffer assignment."""

    index: int
    size: int
    color: int
    parameter: int | None  # the entry parameter it holds
    is_output: bool  # "maybe-live-out" or "output shape is"
    is_constant: bool
    is_thread_local: bool
    is_temp: bool  # "preallocated-temp": the heap the schedule's temporaries are packed into
    values: tuple[AssignedValue, ...]


@dataclass(frozen=True, slots=True)
class BufferAssignment:
    allocations: tuple[Allocation, ...]

    def total(self, color: int = 0) -> int:
        """The bytes of all allocations in one memory space: XLA's own ``Total bytes``."""
        return sum(a.size for a in self.allocations if a.color == color)


@dataclass(frozen=True, slots=True)
class LiveRanges:
    """The schedule XLA assigned buffers for, and each value's live range in it."""

    sequence: tuple[str, ...]
    ranges: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (name, index) -> (start, end)


@dataclass(frozen=True, slots=True)
class MemoryFiles:
    """The memory files found for one optimized snapshot (each None when absent)."""

    buffer_assignment: Path | None
    live_range: Path | None
    usage_report: Path | None


def find_memory_files(optimized: Path) -> MemoryFiles:
    """The files XLA wrote beside the optimized snapshot ``optimized`` (``*after_optimizations.txt``)."""
    stem = optimized.name.removesuffix(".txt")

    def beside(suffix: str) -> Path | None:
        path = optimized.with_name(f"{stem}-{suffix}.txt")
        return path if path.is_file() and not path.is_symlink() else None

    return MemoryFiles(beside("buffer-assignment"), beside("live-range"), beside("memory-usage-report"))


def read_text(path: Path) -> str:
    """A memory file's text; OSError, or ValueError when it is too big to be one."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES >> 20} MiB")
    return path.read_text(encoding="utf-8", errors="replace")


def parse_memory_usage_report(text: str) -> dict[int, tuple[str, int]]:
    """``color -> (memory space name, Total bytes)``."""
    spaces: dict[int, tuple[str, int]] = {}
    current: tuple[str, int] | None = None
    for line in text.splitlines():
        space = _SPACE.match(line)
        if space is not None:
            current = (space.group(1), int(space.group(2)))
            continue
        total = _TOTAL.match(line)
        if total is not None and current is not None and current[1] not in spaces:
            spaces[current[1]] = (current[0], int(total.group(1)))
            continue
        used = _TOTAL_USED.match(line)
        if used is not None and current is None and not spaces:
            spaces[0] = ("default", int(used.group(1)))
    return spaces


def parse_buffer_assignment(text: str) -> BufferAssignment:
    """The allocations of a ``*-buffer-assignment.txt`` (the part before its summaries)."""
    allocations: list[Allocation] = []
    header: re.Match[str] | None = None
    values: list[AssignedValue] = []

    def close() -> None:
        if header is None:
            return
        rest = header.group(3)
        parameter = _PARAMETER.search(rest)
        color = _COLOR.search(rest)
        allocations.append(Allocation(
            index=int(header.group(1)), size=int(header.group(2)),
            color=int(color.group(1)) if color else 0,
            parameter=int(parameter.group(1)) if parameter else None,
            is_output="maybe-live-out" in rest or "output shape is" in rest,
            is_constant=", constant" in rest,
            is_thread_local="thread-local" in rest,
            is_temp="preallocated-temp" in rest,
            values=tuple(values),
        ))

    for line in text.splitlines():
        start = _ALLOCATION.match(line)
        if start is not None:
            close()
            header, values = start, []
            continue
        value = _VALUE.match(line)
        if value is not None and header is not None:
            values.append(AssignedValue(
                id=int(value.group(1)), instruction=value.group(2), shape_index=value.group(3) or "{}",
                size=int(value.group(5)), offset=int(value.group(6)), shape=value.group(7).strip(),
            ))
            continue
        if header is not None and line.strip() and not line.startswith(" "):
            close()  # a summary section starts: the allocations are done
            header = None
    close()
    return BufferAssignment(tuple(allocations))


def parse_live_ranges(text: str) -> LiveRanges:
    """The ``InstructionSequence`` and ``BufferLiveRange`` sections of a ``*-live-range.txt``."""
    sequence: list[str] = []
    ranges: dict[tuple[str, str], tuple[int, int]] = {}
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("InstructionSequence:", "BufferLiveRange:"):
            section = stripped
            continue
        if section == "InstructionSequence:":
            match = _SEQUENCE.match(line)
            if match is not None:
                sequence.append(match.group(2))
        elif section == "BufferLiveRange:":
            match = _RANGE.match(line)
            if match is not None:
                ranges[(match.group(1), match.group(2))] = (int(match.group(3)), int(match.group(4)))
    return LiveRanges(tuple(sequence), ranges)
