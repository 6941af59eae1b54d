"""What the HTML report draws, as plain records the analysis fills in.

The analysis (:mod:`hlo_doctor.rules.drawings`, while a module's context is alive) hands
each finding its :class:`FindingPictures`: the dataflow neighbourhood of its op and the
device mesh with its collective's replica groups; each module's summary carries its
communication inventory. :mod:`hlo_doctor.report.html` renders them with
:mod:`hlo_doctor.report.svg`, so a report is drawn from a
:class:`~hlo_doctor.findings.Report` alone, without reading the dump again.

Everything here is text and numbers taken from the dump: the report escapes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["INVENTORY_KEYS", "Dataflow", "Edge", "FindingPictures", "MeshCell", "MeshPicture", "Node", "grid_shape"]

# The keys of a module's communication inventory rows (ModuleSummary.inventory), in column order:
# those of `hlo-doctor collectives` (hlo_doctor.semantics.inventory.InventoryRow.as_json).
INVENTORY_KEYS = ("instruction", "kind", "role", "phase", "parameters", "axes", "group_size", "crosses_hosts",
                  "bytes_per_device", "executions", "source", "reason")


@dataclass(frozen=True, slots=True)
class Node:
    """An op of the dataflow picture: ``key`` (computation/name), its name and ``opcode shape``."""

    key: str
    label: str
    detail: str
    collective: bool = False
    focus: bool = False


@dataclass(frozen=True, slots=True)
class Edge:
    """A value between two ops: its per-device shape and its sharding."""

    source: str
    target: str
    shape: str
    sharding: str


@dataclass(frozen=True, slots=True)
class Dataflow:
    """The ops around a finding's op (producers two steps up, consumers one down) and the values between them."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    title: str


@dataclass(frozen=True, slots=True)
class MeshCell:
    """A device of the mesh: its logical id, its label (``d<physical id>``) and its host (or slice)."""

    logical: int
    label: str
    host: int | None


@dataclass(frozen=True, slots=True)
class MeshPicture:
    """The device mesh as a (rows, columns) grid in mesh order, with a collective's replica groups
    (logical ids)."""

    cells: tuple[MeshCell, ...]
    shape: tuple[int, int]
    groups: tuple[tuple[int, ...], ...]
    title: str
    legend: str


@dataclass(frozen=True, slots=True)
class FindingPictures:
    """The pictures of one finding; ``notes`` says why one is missing when making it failed."""

    dataflow: Dataflow | None = None
    mesh: MeshPicture | None = None
    notes: tuple[str, ...] = ()


def grid_shape(axis_sizes: Sequence[int]) -> tuple[int, int]:
    """(rows, columns) for a mesh: the last axis across, all others down."""
    axis_sizes = [size for size in axis_sizes if size > 1] or [1]
    columns = axis_sizes[-1]
    return (max(1, math.prod(axis_sizes[:-1])), max(1, columns))
