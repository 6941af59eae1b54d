"""One pass snapshot of a module (:class:`Snapshot`), its role in the pipeline, and header reading."""

from __future__ import annotations

import re
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hlo_doctor.dump.names import (
    DumpFileName,
    FileKind,
)
from hlo_doctor.errors import InputError, one_line
from hlo_doctor.hlo.ir import Shape
from hlo_doctor.hlo.shapes import ShapeSyntaxError, shape_from_text

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import HloModule, Instruction
from hlo_doctor import hlo
from hlo_doctor.dump import files as dump_files  # read through the module, so a test can stand in for it
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.parser import parse_entry_parameters, parse_header

RUN_RECORD = "hlo_doctor_run.json"
HEADER_BYTES = 64 * 1024
_COMMENT = re.compile(r"/\*.*?\*/")


class ReportedFailure(Exception):
    """A snapshot's parse failure as another process reported it (its one-line message)."""


def header_attributes(header: str) -> dict[str, str]:
    """The attributes of a module header line, read by the parser's own header rule
    (the raw text ``HloModule.attribute`` would give); {} when the line does not parse."""

    try:
        return dict(parse_header(header)[1])
    except ParseError:
        return {}


def header_attribute(header: str, key: str) -> str | None:
    """The raw value of ``key=...`` in a module header line, or None."""
    return header_attributes(header).get(key)


def entry_layout_parameters(header: str) -> tuple[Shape, ...] | None:
    """The parameter shapes in a module header's ``entry_computation_layout={(...)->...}``."""
    return layout_parameters(header_attribute(header, "entry_computation_layout"))


def layout_parameters(layout: str | None) -> tuple[Shape, ...] | None:
    """The parameter shapes of an ``entry_computation_layout`` value ``{(...)->...}``."""
    if layout is None or not layout.startswith("{("):
        return None
    arrow = layout.rfind(")->")
    if arrow < 0:
        return None
    try:
        shape = shape_from_text(_COMMENT.sub("", layout[1 : arrow + 1]))
    except ShapeSyntaxError:
        return None
    return shape.tuple_shapes if shape.is_tuple else None


class Role(str, Enum):
    """Where in the compile pipeline a snapshot was taken."""

    BEFORE_OPTIMIZATIONS = "before_optimizations"
    BEFORE_PROPAGATION = "before_propagation"
    AFTER_PROPAGATION = "after_propagation"
    AFTER_PARTITIONING = "after_partitioning"
    AFTER_OPTIMIZATIONS = "after_optimizations"
    OTHER = "other"


class Partitioner(str, Enum):
    SHARDY = "shardy"
    GSPMD = "gspmd"
    UNKNOWN = "unknown"


# Pass names, as XLA registers them (HloPassInterface::name()).
PROPAGATION_PASSES = frozenset({"sharding-propagation", "shardy-xla"})
PARTITIONING_PASSES = frozenset({"spmd-partitioning", "spmd-partitioner", "tpu-spmd-partitioning"})
# TPU runs propagation before its "xla-partitioner" pipeline dumps anything: the first
# snapshot of that pipeline, right before spmd-prepare, holds the propagated shardings.
TPU_PARTITIONER_PIPELINE = "xla-partitioner"
TPU_PROPAGATED_BEFORE = "spmd-prepare"


def role_of(name: DumpFileName) -> Role:
    """The role a dump file name gives its snapshot."""
    if name.kind is FileKind.BEFORE_OPTIMIZATIONS:
        return Role.BEFORE_OPTIMIZATIONS
    if name.kind is FileKind.AFTER_OPTIMIZATIONS:
        return Role.AFTER_OPTIMIZATIONS
    if name.after_pass in PARTITIONING_PASSES:
        return Role.AFTER_PARTITIONING
    if name.after_pass in PROPAGATION_PASSES:
        return Role.AFTER_PROPAGATION
    if name.pipeline == TPU_PARTITIONER_PIPELINE and name.before_pass == TPU_PROPAGATED_BEFORE:
        return Role.AFTER_PROPAGATION
    if name.before_pass in PROPAGATION_PASSES:
        return Role.BEFORE_PROPAGATION
    return Role.OTHER


class DumpError(NamedTuple):
    """A file that could not be used: its path and a one-line message."""

    path: str
    message: str


class Snapshot:
    """One HLO text file: the module as it was at one point of the pipeline."""

    def __init__(
        self,
        path: Path,
        *,
        role: Role,
        size: int,
        ordinal: int | None = None,
        pipeline: str | None = None,
        after_pass: str | None = None,
        before_pass: str | None = None,
        backend: str | None = None,
        timestamp: int | None = None,
    ) -> None:
        self.path = path
        self.role = role
        self.size = size
        self.ordinal = ordinal
        self.pipeline = pipeline
        self.after_pass = after_pass
        self.before_pass = before_pass
        self.backend = backend
        self.timestamp = timestamp
        self._module: HloModule | None = None
        self._failure: Exception | None = None
        self._parsed_once = False  # parsed here or in a worker process, perhaps since released

    @property
    def label(self) -> str:
        """A short name: ``before_optimizations``, ``after_sharding-propagation``, ``cpu_after_optimizations``."""
        if self.role is Role.BEFORE_OPTIMIZATIONS:
            return "before_optimizations"
        if self.role is Role.AFTER_OPTIMIZATIONS:
            return f"{self.backend}_after_optimizations" if self.backend else "after_optimizations"
        if self.after_pass is not None:
            return f"after_{self.after_pass}"
        return self.path.name

    @property
    def parsed(self) -> bool:
        """True once :meth:`module` has succeeded."""
        return self._module is not None

    @property
    def parsed_once(self) -> bool:
        """True once the file has parsed, here or in a worker process, even if the module
        was released since (see :meth:`release`)."""
        return self._parsed_once or self._module is not None

    def release(self) -> None:
        """Drop the parsed module and the header read from the file, so their memory can be
        reused; a later :meth:`module` parses the file again (and the header is read again on
        use). A parse failure is kept."""
        if self._module is not None:
            self._parsed_once = True
            self._module = None
        for cached in _HEADER_CACHES:
            self.__dict__.pop(cached, None)

    def adopt_parsed(self) -> None:
        """Record that another process (a module worker) parsed the file."""
        self._parsed_once = True

    @property
    def error(self) -> str | None:
        """The one-line error of a failed parse (None if not tried or fine)."""
        return one_line(str(self._failure)) if self._failure is not None else None

    def module(self) -> HloModule:
        """Parse the file (once). Raises ParseError for bad text, InputError if unreadable."""
        if self._module is not None:
            return self._module
        if self._failure is not None:
            raise self._failure

        where = str(self.path)
        try:
            text = dump_files._decode(dump_files._read_bytes(self.path), where)
            self._module = hlo.parse_module(text, path=where)
        except ParseError as error:
            self._failure = error
        except OSError as error:
            self._failure = InputError(dump_files._strerror(error), path=where)
        except (RecursionError, MemoryError) as error:
            self._failure = ParseError(f"too deeply nested or too large ({type(error).__name__})", path=where)
        except Exception as error:  # a parser bug must not take the whole dump down
            self._failure = ParseError(
                f"internal parser error: {type(error).__name__}: {one_line(str(error), 200)}", path=where
            )
        if self._failure is not None:
            raise self._failure
        assert self._module is not None
        return self._module

    def adopt_failure(self, message: str) -> None:
        """Record a parse failure met by another process (a rule worker), unless tried here."""
        if self._module is None and self._failure is None:
            self._failure = ReportedFailure(message)

    def entry_parameters(self) -> list[Instruction] | None:
        """The ENTRY computation's parameters, ordered by number, without parsing the whole file
        when it is not parsed yet (only the parameter lines are; their positions are then not
        the file's). Falls back to :meth:`try_module` when those lines do not read alone;
        None when the file does not parse."""
        if self._module is None and self._failure is None:
            where = str(self.path)
            try:
                text = dump_files._decode(dump_files._read_bytes(self.path), where)
                found = parse_entry_parameters(text, path=where)
            except Exception:  # noqa: BLE001 - the whole parse below reports what is wrong
                found = None
            if found is not None:
                return found
        module = self.try_module()
        return module.entry.parameters() if module is not None and module.entry is not None else None

    def try_module(self) -> HloModule | None:
        """:meth:`module`, or None when the file does not parse (see :attr:`error`)."""
        try:
            return self.module()
        except Exception:
            return None

    @cached_property
    def header(self) -> str:
        """The first line of the file (``HloModule name, attr=...``), read without parsing."""
        try:
            with open(self.path, "rb") as handle:
                head = handle.read(HEADER_BYTES)
        except OSError:
            return ""
        return head.split(b"\n", 1)[0].decode("utf-8", "replace")

    @cached_property
    def first_line(self) -> str:
        """The whole first line (the ``HloModule`` header with every attribute), read without parsing."""
        try:
            with open(self.path, "rb") as handle:
                return handle.readline().decode("utf-8", "replace").rstrip("\n")
        except OSError:
            return ""

    @cached_property
    def header_attributes(self) -> dict[str, str]:
        """The header line's attributes, read without parsing the module."""
        return header_attributes(self.first_line)

    def header_attribute(self, key: str) -> str | None:
        """The raw text of a header attribute (``buffer_donor``, ``num_partitions`` ...), without parsing."""
        return self.header_attributes.get(key)

    @cached_property
    def entry_parameter_shapes(self) -> tuple[Shape, ...] | None:
        """The entry parameters' shapes from the header's ``entry_computation_layout``, read without
        parsing the module; None when the header has none or it does not read."""
        return layout_parameters(self.header_attribute("entry_computation_layout"))

    def __repr__(self) -> str:
        return f"Snapshot({self.path.name!r}, role={self.role.value})"


_HEADER_CACHES = ("header", "first_line", "header_attributes", "entry_parameter_shapes")
"""The cached properties read from the file's first line, which :meth:`Snapshot.release` drops."""


def _snapshot_order(snapshot: Snapshot) -> tuple[int, int, int, str]:
    if snapshot.role is Role.BEFORE_OPTIMIZATIONS:
        rank = 0
    elif snapshot.role is Role.AFTER_OPTIMIZATIONS:
        rank = 2
    else:
        rank = 1
    return (rank, snapshot.ordinal if snapshot.ordinal is not None else -1, snapshot.timestamp or 0, snapshot.path.name)
