"""The frozen IR that HLO text parses into: modules, computations, instructions.

Every node is a frozen, slotted dataclass. Positions are 1-based ``line:col``
into the text the module was parsed from, so findings and errors can point at
the exact spot in a dump file.

Attribute values the parser does not interpret are kept as raw text
(:attr:`Instruction.attributes`), so a new XLA attribute never breaks a parse.
The interpreted ones (sharding, metadata, replica groups, dimensions, channel
id, called computations) are exposed as typed properties, parsed on first use
and cached per distinct text.

The value types live in :mod:`.ir_shape` (shapes, layouts), :mod:`.ir_sharding`
(shardings, meshes, replica groups) and :mod:`.ir_metadata` (metadata, source
locations); they are re-exported here.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields

from hlo_doctor.hlo.attr_cursor import parse_int_list, parse_int_lists
from hlo_doctor.hlo.attr_metadata import parse_metadata
from hlo_doctor.hlo.attr_named import parse_replica_groups
from hlo_doctor.hlo.attr_sharding import parse_sharding
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir_metadata import OpMetadata, SourceLocation, StackFrame, StackFrameTables
from hlo_doctor.hlo.ir_shape import ELEMENT_BITS, Layout, Position, Shape
from hlo_doctor.hlo.ir_sharding import (
    AxisRef,
    IotaDevices,
    MeshAxis,
    NamedMesh,
    ReplicaGroups,
    Sharding,
    ShardingKind,
    SubgroupType,
    TileAssignment,
    split_mesh_axes,
    transpose_devices,
)

__all__ = [
    "CALLED_COMPUTATION_KEYS",
    "ELEMENT_BITS",
    "AxisRef",
    "Computation",
    "HloModule",
    "Instruction",
    "new_instruction",
    "IotaDevices",
    "Layout",
    "MeshAxis",
    "ModuleText",
    "NamedMesh",
    "OpMetadata",
    "Position",
    "ReplicaGroups",
    "Shape",
    "Sharding",
    "ShardingKind",
    "SourceLocation",
    "StackFrame",
    "StackFrameTables",
    "SubgroupType",
    "TileAssignment",
    "attribute_of_each",
    "called_computation_names",
    "split_mesh_axes",
    "transpose_devices",
]

# Attributes whose value names called computations.
CALLED_COMPUTATION_KEYS = frozenset(
    {
        "to_apply",
        "calls",
        "body",
        "condition",
        "branch_computations",
        "true_computation",
        "false_computation",
        "called_computations",
        "select",
        "scatter",
        "comparator",
    }
)


def called_computation_names(attributes: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    names: list[str] = []
    for key, value in attributes:
        if key in CALLED_COMPUTATION_KEYS:
            if value.startswith("{"):
                names.extend(n.strip().lstrip("%") for n in value[1:-1].split(",") if n.strip())
            else:
                names.append(value.lstrip("%"))
    return tuple(names)


def _no_splitter(text: str) -> tuple[tuple[str, str], ...]:
    raise TypeError("this ModuleText was made without an attribute splitter; parse text with parse_module")


def _value_of(pairs: Iterable[tuple[str, str]], key: str) -> str | None:
    """The value of the first ``key`` among raw ``(key, value)`` attribute pairs, or None."""
    for name, value in pairs:
        if name == key:
            return value
    return None


def _no_scanner(text: str, key: str) -> tuple[bool, str | None]:
    return False, None


def _no_multi_scanner(text: str, keys: tuple[str, ...]) -> dict[str, str | None]:
    return {}


class ModuleText:
    """The text a module was parsed from, shared by all its instructions.

    Instructions keep only their character offset; line:col is computed on
    demand from a newline index built the first time one is asked for.
    """

    __slots__ = (
        "text", "path", "frame_tables", "split_attributes", "scan_attribute", "scan_attributes", "_newlines",
        "_positions_asked", "_split_offset", "_split_pairs", "devices",
    )

    def __init__(
        self,
        text: str,
        path: str | None = None,
        split_attributes: Callable[[str], tuple[tuple[str, str], ...]] = _no_splitter,
        scan_attribute: Callable[[str, str], tuple[bool, str | None]] = _no_scanner,
        scan_attributes: Callable[[str, tuple[str, ...]], dict[str, str | None]] = _no_multi_scanner,
    ) -> None:
        self.text = text
        self.path = path
        # How the parser splits an instruction's raw ``, key=value`` text, on first use
        # (hlo_doctor.hlo.parser.split_attributes; the parser hands it over, the IR never imports it).
        self.split_attributes = split_attributes
        # How it reads one attribute from the start of that text without splitting all of it
        # (hlo_doctor.hlo.fast_path.scan_attribute): (True, value or None) when it can tell.
        self.scan_attribute = scan_attribute
        # ... and several in one pass (hlo_doctor.hlo.fast_path.scan_attributes): {key: value} for
        # the keys it can tell.
        self.scan_attributes = scan_attributes
        self.frame_tables: StackFrameTables | None = None
        # The devices the module's header declares (num_partitions x replica_count; None: it
        # declares neither): no iota of a sharding or of replica groups may name more.
        self.devices: int | None = None
        self._newlines: list[int] | None = None
        self._positions_asked = 0
        # The last instruction whose attribute text was split here (its offset) and the pairs: an
        # analysis often reads several attributes of one instruction in a row, and the fast path
        # keeps no split pairs (they would double the IR's memory).
        self._split_offset = -1
        self._split_pairs: tuple[tuple[str, str], ...] = ()

    def attributes_at(self, offset: int, start: int) -> tuple[tuple[str, str], ...]:
        """The split ``, key=value`` text of the instruction at ``offset`` (see
        :meth:`attribute_text`), split once for reads in a row."""
        if offset == self._split_offset:
            return self._split_pairs
        return self._split(offset, self.attribute_text(offset, start), start)

    def attribute_at(self, offset: int, start: int, key: str) -> str | None:
        """Attribute ``key`` of the instruction at ``offset``: from the last split when it is this
        instruction's, else read from the line's start up to that attribute, else split."""
        if offset == self._split_offset:
            pairs = self._split_pairs
        else:
            text = self.attribute_text(offset, start)
            if key + "=" not in text:
                return None
            known, value = self.scan_attribute(text, key)
            if known:
                return value
            pairs = self._split(offset, text, start)
        return _value_of(pairs, key)

    def attributes_of_at(self, offset: int, start: int, keys: tuple[str, ...]) -> tuple[str | None, ...]:
        """Attributes ``keys`` of the instruction at ``offset``, each what :meth:`attribute_at`
        gives, read in one pass from the line's start (a dot's four dims attributes, say)."""
        if offset == self._split_offset:
            return tuple([_value_of(self._split_pairs, key) for key in keys])
        text = self.attribute_text(offset, start)
        present = tuple([key for key in keys if key + "=" in text])
        found = self.scan_attributes(text, present) if present else {}
        if len(found) == len(keys):
            return tuple([found[key] for key in keys])
        return tuple([
            found[key] if key in found else self.attribute_at(offset, start, key) if key in present else None
            for key in keys
        ])

    def _split(self, offset: int, text: str, start: int) -> tuple[tuple[str, str], ...]:
        try:
            pairs = self.split_attributes(text)
        except ParseError as error:  # at <string>:1:col of the attribute text: moved to the file
            if error.line != 1:
                raise
            position = self.position(offset + start + error.col - 1)
            raise ParseError(error.message, path=self.path, line=position.line, col=position.col,
                             source_line=self.line_text(position.line)[:400]) from None
        self._split_offset, self._split_pairs = offset, pairs
        return pairs

    def attribute_text(self, offset: int, start: int) -> str:
        """The ``, key=value`` text that starts ``start`` characters after ``offset``, to the end of its line."""
        text = self.text
        start += offset
        end = text.find("\n", start)
        return text[start : end if end != -1 else len(text)].rstrip(" \t\r")

    def position(self, offset: int) -> Position:
        newlines = self._newlines
        if newlines is None:
            self._positions_asked += 1
            if self._positions_asked <= _COUNTED_POSITIONS:
                # A few positions (a run's findings) are counted, without indexing every line.
                text = self.text
                return Position(text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset))
            newlines = self._newline_index()
        line = bisect_right(newlines, offset - 1)
        line_start = newlines[line - 1] + 1 if line else 0
        return Position(line + 1, offset - line_start + 1)

    def _newline_index(self) -> list[int]:
        if self._newlines is None:
            self._newlines = [m.start() for m in _NEWLINE.finditer(self.text)]
        return self._newlines

    def line_text(self, line: int) -> str:
        """The text of 1-based ``line``, without its newline."""
        newlines = self._newline_index()
        start = newlines[line - 2] + 1 if line > 1 else 0
        end = newlines[line - 1] if line - 1 < len(newlines) else len(self.text)
        return self.text[start:end]


_NEWLINE = re.compile("\n")
_IOTA_DIMS = re.compile(r"<=\[([\d,\s]*)\]")
_COUNTED_POSITIONS = 8  # positions read by counting newlines before the text's newlines are indexed


@dataclass(frozen=True, slots=True)
class Instruction:
    """One HLO instruction.

    ``opcode`` is XLA's opcode string. Sugared async forms such as
    ``fusion-start`` are ``async-start``/``async-update``/``async-done``, as in
    XLA, with the printed spelling in ``printed_opcode``. ``attributes`` keeps
    every ``key=value`` as raw text in source order; the typed properties below
    interpret the ones that carry meaning for sharding analysis.
    """

    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    offset: int  # where the instruction starts in its module's text
    origin: ModuleText = field(compare=False, repr=False)
    is_root: bool = False
    # ", key=value, ..." exactly as written, split into pairs on first use (or the pairs
    # themselves), or an int: where that text starts in the origin's text, counted from
    # ``offset``, running to the end of the line (the parser's fast path keeps no copy:
    # it is split again on each use). Read it through ``attributes``.
    raw_attributes: str | int | tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    # Called computation names, or None to derive them from the attributes.
    called: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    printed_opcode: str | None = None
    literal: str | None = None  # the text inside parameter(...) / constant(...)

    @property
    def position(self) -> Position:
        """Line and column of the instruction in its module's text."""
        return self.origin.position(self.offset)

    @property
    def frame_tables(self) -> StackFrameTables | None:
        return self.origin.frame_tables

    @property
    def attributes(self) -> tuple[tuple[str, str], ...]:
        """Every ``key=value`` as raw text, in source order."""
        raw = self.raw_attributes
        if isinstance(raw, int):
            return self.origin.attributes_at(self.offset, raw)
        if isinstance(raw, str):
            raw = self.origin.split_attributes(raw)
            object.__setattr__(self, "raw_attributes", raw)  # memoize
        return raw

    @property
    def called_computations(self) -> tuple[str, ...]:
        """Names of the computations this instruction calls, in attribute order."""
        called = self.called
        if called is None:
            called = called_computation_names(self.attributes)
            object.__setattr__(self, "called", called)  # memoize
        return called

    def attribute(self, key: str) -> str | None:
        """The raw text of attribute ``key``, or None."""
        raw = self.raw_attributes
        if isinstance(raw, int):
            return self.origin.attribute_at(self.offset, raw, key)
        if isinstance(raw, str):
            if key + "=" not in raw:
                return None
            pairs = self.attributes
        else:
            pairs = raw
        return _value_of(pairs, key)

    def attributes_of(self, keys: tuple[str, ...]) -> tuple[str | None, ...]:
        """The raw text of each attribute in ``keys`` (None where absent), as :meth:`attribute`
        gives them, read in one pass where the line allows."""
        raw = self.raw_attributes
        if isinstance(raw, int):
            return self.origin.attributes_of_at(self.offset, raw, keys)
        return tuple(self.attribute(key) for key in keys)

    @property
    def parameter_number(self) -> int | None:
        if self.opcode != "parameter" or self.literal is None:
            return None
        return int(self.literal)

    def _check_iotas(self, key: str, text: str) -> None:
        """An iota (``<=[dims]``) in ``text`` may name at most the module's declared devices:
        checked before anything is expanded, since an iota costs a few bytes to write."""
        limit = self.origin.devices
        if limit is None or "<=[" not in text:
            return
        for match in _IOTA_DIMS.finditer(text):
            count = math.prod(int(d) for d in match.group(1).split(",") if d)
            if count > limit:
                error = ParseError.at(text, match.start(), f"an iota of {count} devices, more than the "
                                      f"module's {limit} (num_partitions x replica_count)")
                raise self.located(error, key, text) from None

    @property
    def sharding(self) -> Sharding | None:
        text = self.attribute("sharding")
        if text is None:
            return None
        self._check_iotas("sharding", text)
        try:
            return parse_sharding(text)
        except ParseError as error:
            raise self.located(error, "sharding", text) from None

    @property
    def metadata(self) -> OpMetadata | None:
        text = self.attribute("metadata")
        if text is None:
            return None
        try:
            return parse_metadata(text)
        except ParseError as error:
            raise self.located(error, "metadata", text) from None

    @property
    def replica_groups(self) -> ReplicaGroups | None:
        text = self.attribute("replica_groups")
        if text is None:
            return None
        self._check_iotas("replica_groups", text)
        try:
            return parse_replica_groups(text)
        except ParseError as error:
            raise self.located(error, "replica_groups", text) from None

    @property
    def source_pairs(self) -> tuple[tuple[int, int], ...] | None:
        text = self.attribute("source_target_pairs")
        if text is None:
            return None
        try:
            return tuple((a, b) for a, b in parse_int_lists(text))
        except ParseError as error:
            raise self.located(error, "source_target_pairs", text) from None

    @property
    def dimensions(self) -> tuple[int, ...] | None:
        text = self.attribute("dimensions")
        if text is None:
            return None
        try:
            return parse_int_list(text)
        except ParseError as error:
            raise self.located(error, "dimensions", text) from None

    def located(self, error: ParseError, key: str, value: str) -> ParseError:
        """``error``, raised reading the value ``value`` of attribute ``key`` on its own (at
        ``<string>:line:col`` of the value), moved to its place in the module's file."""
        text = self.origin.text
        line_end = text.find("\n", self.offset)
        at = text.find(f"{key}={value}", self.offset, len(text) if line_end == -1 else line_end)
        if at == -1:  # not where the line has it (split over lines): point at the instruction
            start = self.offset
        else:
            value_lines = value.split("\n")
            inside = sum(len(line) + 1 for line in value_lines[: max(0, error.line - 1)]) + error.col - 1
            start = at + len(key) + 1 + min(inside, len(value))
        position = self.origin.position(start)
        return ParseError(f"{key} of {self.name}: {error.message}", path=self.origin.path, line=position.line,
                          col=position.col, source_line=self.origin.line_text(position.line)[:400])

    @property
    def channel_id(self) -> int | None:
        text = self.attribute("channel_id")
        if text is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise self.located(ParseError(f"expected an integer, found {text[:40]!r}"), "channel_id", text) from None

    @property
    def backend_config(self) -> str | None:
        return self.attribute("backend_config")

    @property
    def source(self) -> SourceLocation | None:
        """Where the op came from: inline source_file/line or a stack frame chain."""
        metadata = self.metadata
        if metadata is None:
            return None
        if metadata.stack_frame_id and self.frame_tables is not None:
            frames = self.frame_tables.resolve(metadata.stack_frame_id)
            if frames:
                top = frames[0]
                return SourceLocation(top.file, top.line, top.function, top.column, frames)
        if metadata.source_file is not None and metadata.source_line is not None:
            frame = StackFrame(metadata.source_file, "", metadata.source_line, metadata.source_column)
            return SourceLocation(
                metadata.source_file, metadata.source_line, None, metadata.source_column, (frame,)
            )
        return None


def attribute_of_each(instructions: Iterable[Instruction], key: str) -> list[str | None]:
    """``[i.attribute(key) for i in instructions]``, read in one loop that goes to each line's
    text directly (a rule reading every value's sharding)."""
    found: list[str | None] = []
    append = found.append
    for instruction in instructions:
        raw = instruction.raw_attributes
        if raw.__class__ is int:
            append(instruction.origin.attribute_at(instruction.offset, raw, key))
        else:
            append(instruction.attribute(key))
    return found


_FIELDS = ("name", "opcode", "shape", "operands", "offset", "origin", "is_root", "raw_attributes", "called",
           "printed_opcode", "literal")
assert tuple(f.name for f in fields(Instruction)) == _FIELDS, "new_instruction must set every field"
(_set_name, _set_opcode, _set_shape, _set_operands, _set_offset, _set_origin, _set_is_root, _set_raw_attributes,
 _set_called, _set_printed_opcode, _set_literal) = (getattr(Instruction, name).__set__ for name in _FIELDS)
_new_object = object.__new__


def new_instruction(
    name: str, opcode: str, shape: Shape, operands: tuple[str, ...], offset: int, origin: ModuleText,
    is_root: bool, raw_attributes: str | int | tuple[tuple[str, str], ...], literal: str | None,
) -> Instruction:
    """``Instruction(name, opcode, shape, operands, offset, origin, is_root, raw_attributes,
    literal=literal)``, made in half the time: the parser's fast path makes one per line, and a
    frozen dataclass's ``__init__`` pays an ``object.__setattr__`` lookup and call per field."""
    instruction = _new_object(Instruction)
    _set_name(instruction, name)
    _set_opcode(instruction, opcode)
    _set_shape(instruction, shape)
    _set_operands(instruction, operands)
    _set_offset(instruction, offset)
    _set_origin(instruction, origin)
    _set_is_root(instruction, is_root)
    _set_raw_attributes(instruction, raw_attributes)
    _set_called(instruction, None)
    _set_printed_opcode(instruction, None)
    _set_literal(instruction, literal)
    return instruction


@dataclass(frozen=True, slots=True)
class Computation:
    name: str
    instructions: tuple[Instruction, ...]
    position: Position
    is_entry: bool = False
    parameter_shapes: tuple[Shape, ...] = ()
    execution_thread: str | None = None
    by_name: Mapping[str, Instruction] = field(default_factory=dict, compare=False, repr=False)
    # The parameters sorted, once asked for (analyses ask it of the entry again and again).
    sorted_parameters: tuple[Instruction, ...] | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def root(self) -> Instruction | None:
        for instruction in self.instructions:
            if instruction.is_root:
                return instruction
        return self.instructions[-1] if self.instructions else None

    def parameters(self) -> list[Instruction]:
        """Parameters ordered by their parameter number (a new list each call; sorted once)."""
        found = self.sorted_parameters
        if found is None:
            params = [i for i in self.instructions if i.opcode == "parameter"]
            found = tuple(sorted(params, key=lambda i: i.parameter_number or 0))
            object.__setattr__(self, "sorted_parameters", found)  # memoize
        return list(found)

    def get(self, name: str) -> Instruction | None:
        return self.by_name.get(name)

    def users(self) -> dict[str, list[Instruction]]:
        """Each value's users in this computation, in program order (made afresh on each call)."""
        users: dict[str, list[Instruction]] = {}
        for instruction in self.instructions:
            for operand in instruction.operands:
                users.setdefault(operand, []).append(instruction)
        return users


@dataclass(frozen=True, slots=True)
class HloModule:
    name: str
    computations: tuple[Computation, ...]
    entry_name: str | None
    attributes: tuple[tuple[str, str], ...] = ()
    frame_tables: StackFrameTables | None = field(default=None, compare=False, repr=False)
    path: str | None = None
    by_name: Mapping[str, Computation] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.by_name and self.computations:
            object.__setattr__(self, "by_name", {c.name: c for c in reversed(self.computations)})

    @property
    def entry(self) -> Computation | None:
        if self.entry_name is not None and self.entry_name in self.by_name:
            return self.by_name[self.entry_name]
        for computation in self.computations:
            if computation.is_entry:
                return computation
        return self.computations[-1] if self.computations else None

    def computation(self, name: str) -> Computation | None:
        return self.by_name.get(name)

    def attribute(self, key: str) -> str | None:
        return _value_of(self.attributes, key)

    def instructions(self) -> Iterator[tuple[Computation, Instruction]]:
        for computation in self.computations:
            for instruction in computation.instructions:
                yield computation, instruction
