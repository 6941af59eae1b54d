"""IR values: op metadata, stack frames and source locations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OpMetadata:
    """``metadata={op_type=... op_name=... source_file=... source_line=...}``."""

    op_type: str | None = None
    op_name: str | None = None
    source_file: str | None = None
    source_line: int | None = None
    source_end_line: int | None = None
    source_column: int | None = None
    stack_frame_id: int | None = None
    text: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class StackFrame:
    file: str
    function: str
    line: int
    column: int | None = None


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where an op came from in the user's program.

    ``frames`` is the whole chain, innermost first (as XLA's StackFrames table
    links child to parent). ``file``/``line``/``function`` are the innermost.
    """

    file: str
    line: int
    function: str | None = None
    column: int | None = None
    frames: tuple[StackFrame, ...] = ()


@dataclass(frozen=True, slots=True)
class StackFrameTables:
    """The ``FileNames``/``FunctionNames``/``FileLocations``/``StackFrames`` tables."""

    file_names: Mapping[int, str]
    function_names: Mapping[int, str]
    # id -> (file_name_id, function_name_id, line, column)
    file_locations: Mapping[int, tuple[int, int, int, int | None]]
    # id -> (file_location_id, parent_frame_id)
    stack_frames: Mapping[int, tuple[int, int]]
    # frame id -> its chain, once resolved (the ops of a layer share a few frames)
    resolved: dict[int, tuple[StackFrame, ...]] = field(default_factory=dict, compare=False, repr=False)

    def resolve(self, frame_id: int) -> tuple[StackFrame, ...]:
        """The frame chain from ``frame_id`` up to the root, innermost first."""
        found = self.resolved.get(frame_id)
        if found is None:
            found = self.resolved[frame_id] = self._resolve(frame_id)
        return found

    def _resolve(self, frame_id: int) -> tuple[StackFrame, ...]:
        chain: list[StackFrame] = []
        seen: set[int] = set()
        current = frame_id
        while current and current in self.stack_frames and current not in seen:
            seen.add(current)
            location_id, parent = self.stack_frames[current]
            location = self.file_locations.get(location_id)
            if location is not None:
                file_id, function_id, line, column = location
                chain.append(
                    StackFrame(
                        self.file_names.get(file_id, "?"),
                        self.function_names.get(function_id, "?"),
                        line,
                        column,
                    )
                )
            current = parent
        return tuple(chain)
