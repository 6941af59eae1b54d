"""Reading dump files: bytes, text decoding with a useful error, one-line OS errors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hlo_doctor.hlo.errors import ParseError

if TYPE_CHECKING:
    pass


def _read_bytes(path: Path) -> bytes:
    """Every file read goes through here (tests replace it to simulate unreadable files)."""
    with open(path, "rb") as handle:
        return handle.read()


def _check_readable(path: Path) -> None:
    """Open and read one byte; raises OSError (tests replace it to simulate permissions)."""
    with open(path, "rb") as handle:
        handle.read(1)


def _decode(data: bytes, where: str) -> str:
    """UTF-8 text, or a ParseError at the line:col of the first NUL or invalid byte."""
    nul = data.find(b"\x00")
    if nul != -1:
        line, col = _byte_line_col(data, nul)
        raise ParseError(
            f"binary data (NUL byte at byte offset {nul}), not HLO text", path=where, line=line, col=col
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line, col = _byte_line_col(data, error.start)
        raise ParseError(
            f"invalid UTF-8 byte 0x{data[error.start]:02x} at byte offset {error.start}",
            path=where,
            line=line,
            col=col,
        ) from None
    if not text.strip():
        raise ParseError("empty file, expected 'HloModule'", path=where)
    return text


def _byte_line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    col = len(data[start:offset].decode("utf-8", "replace")) + 1
    return line, col


def _strerror(error: OSError) -> str:
    text = error.strerror or str(error)
    return text[:1].lower() + text[1:]
