"""``metadata={...}``: op type, op name, source file and line, stack frame id."""

from __future__ import annotations

from functools import lru_cache

from hlo_doctor.hlo.attr_cursor import (
    _CACHE_SIZE,
    _METADATA_INT_KEYS,
    _Cursor,
)
from hlo_doctor.hlo.ir_metadata import OpMetadata

__all__ = ["parse_metadata"]


# --------------------------------------------------------------------------
# Metadata


@lru_cache(maxsize=_CACHE_SIZE)
def parse_metadata(text: str) -> OpMetadata:
    """``{op_type="dot" op_name="..." source_file="..." source_line=12 ...}``."""
    cursor = _Cursor(text)
    metadata = _parse_metadata_at(cursor)
    cursor.expect_end("metadata")
    return metadata


def _parse_metadata_at(cursor: _Cursor) -> OpMetadata:
    start = cursor.pos
    cursor.expect("{", "to start metadata")
    strings: dict[str, str] = {}
    ints: dict[str, int] = {}
    while not cursor.eat("}"):
        if cursor.at_end():
            raise cursor.error("expected '}' to end metadata, found end of text")
        cursor.eat(",")
        key_pos = cursor.pos
        key = cursor.parse_optional_word()
        if key is None:
            raise cursor.error(f"expected a metadata attribute name, found {cursor.describe()}")
        cursor.expect("=", f"after metadata attribute {key}")
        if key in ("op_type", "op_name", "source_file"):
            strings[key] = cursor.parse_string(f"for {key}")
        elif key in _METADATA_INT_KEYS:
            value = cursor.parse_int(f"for {key}")
            if key != "source_end_column":
                ints[key] = value
        else:
            cursor.skip_balanced()  # kept in .text only
        if cursor.pos == key_pos:  # pragma: no cover - defensive
            raise cursor.error("metadata parser made no progress")
    return OpMetadata(
        op_type=strings.get("op_type"),
        op_name=strings.get("op_name"),
        source_file=strings.get("source_file"),
        source_line=ints.get("source_line"),
        source_end_line=ints.get("source_end_line"),
        source_column=ints.get("source_column"),
        stack_frame_id=ints.get("stack_frame_id"),
        text=cursor.text[start : cursor.pos],
    )


def _parse_metadata_list(cursor: _Cursor) -> tuple[OpMetadata, ...]:
    """``{op_name="a"}`` or ``{{op_name="b"}, {op_name="c"}}`` (or ``{}``)."""
    save = cursor.pos
    cursor.expect("{", "to start metadata")
    if cursor.peek() == "{":
        entries = [_parse_metadata_at(cursor)]
        while cursor.eat(","):
            entries.append(_parse_metadata_at(cursor))
        cursor.expect("}", "to end the metadata list")
        return tuple(entries)
    if cursor.eat("}"):
        return ()
    cursor.pos = save
    return (_parse_metadata_at(cursor),)
