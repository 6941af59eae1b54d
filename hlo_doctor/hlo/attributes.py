"""Interpreters for the attribute values that carry sharding meaning.

Each function takes the raw text after ``key=`` as the HLO printer writes it
and returns a frozen IR value. They raise only :class:`ParseError`, with
offsets relative to the given text, and they are cached per distinct text:
a big module repeats the same few shardings thousands of times.

The grammar follows XLA's ``hlo_parser.cc`` (``ParseSharding``,
``ParseSingleSharding``, ``ParseMesh``, ``ParseCollectiveDeviceListBase``,
``ParseMetadata``). Where XLA silently accepts nonsense (a device list
shorter than the tile grid, an iota larger than it), we reject it: shardings
are where the meaning matters.

A named (v3, Shardy) sharding keeps its mesh form in :attr:`Sharding.named`
and is also lowered to the equivalent tile assignment, as XLA's
``V3ToV2Sharding`` does, so later stages read one representation.

The scanner and integer lists are in :mod:`.attr_cursor`, metadata in
:mod:`.attr_metadata`, shardings in :mod:`.attr_sharding` and named
shardings and replica groups in :mod:`.attr_named`; this module gathers them.
"""

from hlo_doctor.hlo.attr_cursor import parse_int_list, parse_int_lists
from hlo_doctor.hlo.attr_metadata import parse_metadata
from hlo_doctor.hlo.attr_named import parse_replica_groups
from hlo_doctor.hlo.attr_sharding import parse_sharding

__all__ = [
    "parse_int_list",
    "parse_int_lists",
    "parse_metadata",
    "parse_replica_groups",
    "parse_sharding",
]
