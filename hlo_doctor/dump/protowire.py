"""A minimal protobuf wire-format reader: enough to pull a few fields out of the
binary protos XLA and PjRt write (``compile_options.pb``, the encoded
``platform_specific_topology`` of ``topology.textproto``), without a protobuf
dependency or the schemas.

:func:`fields` splits one message into ``(field number, wire type, value)``:
varints as ``int``, length-delimited fields as ``bytes`` (a nested message, a
string or packed scalars: the caller knows which), fixed 32/64-bit fields as
``int`` (their little-endian bits). Malformed input raises :class:`WireError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.errors import HloDoctorError

__all__ = ["Field", "WireError", "fields", "first", "all_of", "packed_varints", "varint", "as_message"]

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5


class WireError(HloDoctorError, ValueError):
    """Bytes that are not a protobuf message."""


@dataclass(frozen=True, slots=True)
class Field:
    number: int
    wire_type: int
    value: int | bytes


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def fields(data: bytes) -> Iterator[Field]:
    """The fields of one message, in order (a repeated field repeats)."""
    pos = 0
    while pos < len(data):
        key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == VARINT:
            value, pos = varint(data, pos)
            yield Field(number, wire, value)
        elif wire == LENGTH_DELIMITED:
            length, pos = varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            yield Field(number, wire, data[pos : pos + length])
            pos += length
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            if pos + size > len(data):
                raise WireError("truncated fixed-width field")
            yield Field(number, wire, int.from_bytes(data[pos : pos + size], "little"))
            pos += size
        else:  # groups (3, 4) are long deprecated and never written by XLA
            raise WireError(f"unsupported wire type {wire}")


def all_of(data: bytes, number: int) -> list[int | bytes]:
    """Every value of field ``number``."""
    return [f.value for f in fields(data) if f.number == number]


def first(data: bytes, number: int) -> int | bytes | None:
    """The last value of a singular field ``number`` (protobuf's merge rule), or None."""
    found: int | bytes | None = None
    for f in fields(data):
        if f.number == number:
            found = f.value
    return found


def as_message(value: int | bytes | None) -> bytes | None:
    """A length-delimited value as bytes; None for a missing or scalar one."""
    return value if isinstance(value, bytes) else None


def packed_varints(data: bytes, number: int) -> list[int]:
    """A repeated integer field, packed (one length-delimited run) or not."""
    out: list[int] = []
    for f in fields(data):
        if f.number != number:
            continue
        if isinstance(f.value, int):
            out.append(f.value)
        else:
            pos = 0
            while pos < len(f.value):
                value, pos = varint(f.value, pos)
                out.append(value)
    return out


def signed64(value: int) -> int:
    """An int64 field's varint as a signed number (negative values use 10 bytes)."""
    return value - (1 << 64) if value >= 1 << 63 else value
