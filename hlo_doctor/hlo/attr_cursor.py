"""The attribute scanner (:class:`_Cursor`), shared token patterns, integer lists and iotas."""

from __future__ import annotations

import math
import re
from functools import lru_cache

from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir_sharding import (
    MAX_DEVICES,
    IotaDevices,
    ShardingKind,
    SubgroupType,
)
from hlo_doctor.hlo.lexer import always_matches

__all__ = ["parse_int_list", "parse_int_lists"]

_CACHE_SIZE = 8192

# Whitespace and /* comments */ (the printer writes /*index=5*/ in tuples).
_SPACE = re.compile(r"(?:\s+|/\*.*?\*/)*", re.S)
_SPACE_MATCH = always_matches(_SPACE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?\d+")
_INT_LIST = re.compile(r"[+-]?\d+(?:(?:\s|/\*.*?\*/)*,(?:\s|/\*.*?\*/)*[+-]?\d+)*", re.S)
_DQ_STRING = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"', re.S)
_SQ_STRING = re.compile(r"'([^'\\]*(?:\\.[^'\\]*)*)'", re.S)
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|.)", re.S)
_SIMPLE_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "?": "?",
}
# Fast paths for the common exact spellings.
_FAST_INT_LIST = re.compile(r"\{\s*([+-]?\d+(?:\s*,\s*[+-]?\d+)*)?\s*\}")
_FAST_INT_LISTS = re.compile(
    r"\{\s*(?:\{\s*(?:[+-]?\d+(?:\s*,\s*[+-]?\d+)*)?\s*\}(?:\s*,\s*\{\s*(?:[+-]?\d+(?:\s*,\s*[+-]?\d+)*)?\s*\})*)?\s*\}"
)
_INNER_LIST = re.compile(r"\{([^{}]*)\}")
_BARE_VALUE = re.compile(r"[^\s,{}\[\]()]+")
_BRACKET_OR_QUOTE = re.compile(r'[{}\[\]()"]')

_KIND_WORDS = {
    "replicated": ShardingKind.REPLICATED,
    "manual": ShardingKind.MANUAL,
    "maximal": ShardingKind.MAXIMAL,
    "unknown": ShardingKind.UNKNOWN,
    "unreduced": ShardingKind.UNREDUCED,
}
_SUBGROUP_WORDS = {t.value: t for t in SubgroupType}
_METADATA_INT_KEYS = frozenset(
    {"source_line", "source_end_line", "source_column", "source_end_column", "stack_frame_id"}
)


def _unescape(raw: str) -> str:
    """C-style unescaping, as absl::CUnescape does for HLO strings."""
    if "\\" not in raw:
        return raw

    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] == "x" and len(code) > 1:
            return chr(int(code[1:], 16))
        if code[0] in "01234567":
            return chr(int(code, 8))
        return _SIMPLE_ESCAPES.get(code, code)

    return _ESCAPE.sub(replace, raw)


class _Cursor:
    """A position in an attribute text, with the primitive matchers."""

    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -- errors -----------------------------------------------------------

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError.at(self.text, self.pos if pos is None else pos, message)

    def describe(self) -> str:
        """What sits at the cursor, for error messages."""
        self.skip()
        if self.pos >= len(self.text):
            return "end of text"
        return repr(self.text[self.pos : self.pos + 12])

    # -- primitives -------------------------------------------------------

    def skip(self) -> None:
        self.pos = _SPACE_MATCH(self.text, self.pos).end()

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos : self.pos + 1]

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def eat(self, punct: str) -> bool:
        self.skip()
        if self.text.startswith(punct, self.pos):
            self.pos += len(punct)
            return True
        return False

    def expect(self, punct: str, context: str) -> None:
        if not self.eat(punct):
            raise self.error(f"expected '{punct}' {context}, found {self.describe()}")

    def parse_optional_word(self) -> str | None:
        self.skip()
        match = _WORD.match(self.text, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        return match.group()

    def peek_word(self) -> str | None:
        self.skip()
        match = _WORD.match(self.text, self.pos)
        return match.group() if match else None

    def parse_int(self, what: str) -> int:
        self.skip()
        match = _INT.match(self.text, self.pos)
        if match is None:
            raise self.error(f"expected an integer {what}, found {self.describe()}")
        self.pos = match.end()
        return int(match.group())

    def parse_optional_int_list(self) -> tuple[int, ...] | None:
        """``1,2,3`` (no brackets); None when no integer is here."""
        self.skip()
        match = _INT_LIST.match(self.text, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        body = match.group()
        if "/*" in body:
            body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        return tuple(int(v) for v in body.split(","))

    def parse_int_list(self, what: str) -> tuple[int, ...]:
        values = self.parse_optional_int_list()
        if values is None:
            raise self.error(f"expected a list of integers {what}, found {self.describe()}")
        return values

    def parse_bracketed_ints(self, what: str, *, allow_empty: bool = False) -> tuple[int, ...]:
        """``[1,2,3]``."""
        self.expect("[", f"to start {what}")
        values = self.parse_optional_int_list()
        if values is None:
            if not allow_empty:
                raise self.error(f"expected a non-empty list of integers in {what}")
            values = ()
        self.expect("]", f"to end {what}")
        return values

    def parse_string(self, what: str) -> str:
        """A double-quoted string, unescaped."""
        self.skip()
        match = _DQ_STRING.match(self.text, self.pos)
        if match is None:
            raise self.error(f"expected a quoted string {what}, found {self.describe()}")
        self.pos = match.end()
        return _unescape(match.group(1))

    def parse_quoted_name(self, what: str) -> str:
        """A single- (or double-) quoted axis name, unescaped."""
        self.skip()
        match = _SQ_STRING.match(self.text, self.pos) or _DQ_STRING.match(self.text, self.pos)
        if match is None:
            raise self.error(f"expected a quoted {what}, found {self.describe()}")
        self.pos = match.end()
        return _unescape(match.group(1))

    def skip_balanced(self) -> None:
        """Skip one value: a quoted string, a balanced {...}/[...]/(...) or a bare token."""
        self.skip()
        text, start = self.text, self.pos
        if start >= len(text):
            raise self.error("expected a value, found end of text")
        first = text[start]
        if first == '"':
            self.parse_string("value")
            return
        if first not in "{[(":
            match = _BARE_VALUE.match(text, start)
            if match is None:
                raise self.error(f"expected a value, found {self.describe()}")
            self.pos = match.end()
            return
        depth = 0
        pos = start
        while True:
            match = _BRACKET_OR_QUOTE.search(text, pos)
            if match is None:
                raise self.error(f"unbalanced '{first}'", start)
            char = match.group()
            if char == '"':
                self.pos = match.start()
                self.parse_string("value")
                pos = self.pos
                continue
            depth += 1 if char in "{[(" else -1
            pos = match.end()
            if depth == 0:
                self.pos = pos
                return

    def expect_end(self, what: str) -> None:
        if not self.at_end():
            raise self.error(f"unexpected text after {what}: {self.describe()}")


# --------------------------------------------------------------------------
# Integer lists


@lru_cache(maxsize=_CACHE_SIZE)
def parse_int_list(text: str) -> tuple[int, ...]:
    """``{0,1}`` or ``{}`` as a tuple of ints."""
    match = _FAST_INT_LIST.fullmatch(text.strip())
    if match is not None:
        body = match.group(1)
        return tuple(int(v) for v in body.split(",")) if body else ()
    cursor = _Cursor(text)
    values = _parse_braced_ints(cursor)
    cursor.expect_end("the list")
    return values


@lru_cache(maxsize=_CACHE_SIZE)
def parse_int_lists(text: str) -> tuple[tuple[int, ...], ...]:
    """``{{0,1},{1,2}}`` or ``{}`` as a tuple of int tuples."""
    stripped = text.strip()
    if _FAST_INT_LISTS.fullmatch(stripped):
        inner = stripped[1:-1]
        return tuple(
            tuple(int(v) for v in body.split(",")) if body.strip() else ()
            for body in _INNER_LIST.findall(inner)
        )
    cursor = _Cursor(text)
    cursor.expect("{", "to start a list of lists")
    lists: list[tuple[int, ...]] = []
    if not cursor.eat("}"):
        while True:
            lists.append(_parse_braced_ints(cursor))
            if cursor.eat("}"):
                break
            cursor.expect(",", "between lists")
    cursor.expect_end("the list of lists")
    return tuple(lists)


def _parse_braced_ints(cursor: _Cursor) -> tuple[int, ...]:
    cursor.expect("{", "to start a list of integers")
    values = cursor.parse_optional_int_list() or ()
    cursor.expect("}", "to end a list of integers")
    return values


def _parse_iota(cursor: _Cursor, what: str, *, require_transpose: bool) -> IotaDevices:
    """``[4,2]T(1,0)`` (the part after ``<=``)."""
    reshape_pos = cursor.pos
    reshape = cursor.parse_bracketed_ints(what)
    if any(d < 0 for d in reshape):
        raise cursor.error(f"{what} must not be negative")
    if math.prod(reshape) > MAX_DEVICES:  # checked before anything is expanded: an iota is cheap to write
        raise cursor.error(f"{what}: an iota of {math.prod(reshape)} devices, more than {MAX_DEVICES}", reshape_pos)
    perm: tuple[int, ...] | None = None
    if cursor.peek() == "T" and cursor.peek_word() == "T":
        cursor.parse_optional_word()
        cursor.expect("(", "after T to start the iota transpose")
        perm_pos = cursor.pos
        perm = cursor.parse_int_list("in the iota transpose")
        cursor.expect(")", "to end the iota transpose")
        if sorted(perm) != list(range(len(reshape))):
            raise cursor.error(
                f"iota transpose {list(perm)} is not a permutation of the "
                f"{len(reshape)} reshape dims",
                perm_pos,
            )
        if perm == tuple(range(len(reshape))):
            perm = None
    elif require_transpose and len(reshape) > 1:
        raise cursor.error("expected 'T(' after a multi-dimensional iota reshape")
    return IotaDevices(reshape, perm)
