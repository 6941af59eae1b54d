"""Dump folder -> modules and pass snapshots. The entry point is :func:`load_dump`.

Nothing is parsed on load: :meth:`Snapshot.module` parses one snapshot's HLO
text on demand, and a module's compile options, mesh and debug options are
read on first access.
"""

from hlo_doctor.dump.folder import (
    Dump,
    DumpError,
    DumpModule,
    Partitioner,
    Role,
    Snapshot,
    load_dump,
    role_of,
)
from hlo_doctor.dump.mlir import (
    MlirInfo,
    MlirValue,
    SdyMesh,
    parse_meshes,
    parse_mlir_info,
)
from hlo_doctor.dump.names import (
    DumpFileName,
    FileKind,
    parse_file_name,
    parse_module_dir_name,
)
from hlo_doctor.dump.options import CompileOptions, DeviceAssignment, Topology
from hlo_doctor.dump.textproto import Message, TextprotoError, parse_textproto

__all__ = [
    "CompileOptions",
    "DeviceAssignment",
    "Dump",
    "DumpError",
    "DumpFileName",
    "DumpModule",
    "FileKind",
    "Message",
    "MlirInfo",
    "MlirValue",
    "Partitioner",
    "Role",
    "SdyMesh",
    "Snapshot",
    "TextprotoError",
    "Topology",
    "load_dump",
    "parse_file_name",
    "parse_meshes",
    "parse_mlir_info",
    "parse_module_dir_name",
    "parse_textproto",
    "role_of",
]
