"""HLO text -> frozen IR. The public entry point is :func:`parse_module`."""

from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir import (
    Computation,
    HloModule,
    Instruction,
    Layout,
    OpMetadata,
    Position,
    ReplicaGroups,
    Shape,
    Sharding,
    ShardingKind,
    SourceLocation,
    StackFrame,
    TileAssignment,
)
from hlo_doctor.hlo.parser import parse_module

__all__ = [
    "Computation",
    "HloModule",
    "Instruction",
    "Layout",
    "OpMetadata",
    "ParseError",
    "Position",
    "ReplicaGroups",
    "Shape",
    "Sharding",
    "ShardingKind",
    "SourceLocation",
    "StackFrame",
    "TileAssignment",
    "parse_module",
]
