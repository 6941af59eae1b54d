"""A tiny, tolerant reader for protobuf text format (``*.textproto``, ``*.pbtxt``).

XLA writes ``compile_options.textproto``, ``topology.textproto``,
``config.pbtxt`` and ``*.debug_options`` in this format. We have no schemas,
so a message is kept as an ordered multimap of field name -> value, where a
value is a nested :class:`Message`, a ``str``, an ``int``, a ``float`` or a
``bool``. Enum values stay as their identifier text (``EFFORT_O2``).

Tolerated: ``#`` comments, an optional ``:`` before ``{``, ``<...>`` message
brackets, ``,``/``;`` separators, ``[ext.name]`` / ``[type.googleapis.com/x]``
field names, list values ``[1, 2]`` and adjacent string concatenation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Union

from hlo_doctor.errors import HloDoctorError

Value = Union["Message", str, int, float, bool]


class TextprotoError(HloDoctorError, ValueError):
    """Malformed text format, with a 1-based ``line:col``."""

    def __init__(self, message: str, line: int, col: int) -> None:
        self.message = message
        self.line = line
        self.col = col
        super().__init__(f"{line}:{col}: {message}")


class Message:
    """An ordered multimap of field name -> value (repeated fields repeat)."""

    __slots__ = ("fields",)

    def __init__(self, fields: list[tuple[str, Value]] | None = None) -> None:
        self.fields: list[tuple[str, Value]] = fields or []

    def get(self, name: str, default: Value | None = None) -> Value | None:
        """The last value of field ``name`` (proto3 semantics for a scalar), or ``default``."""
        found = default
        for key, value in self.fields:
            if key == name:
                found = value
        return found

    def get_all(self, name: str) -> list[Value]:
        return [value for key, value in self.fields if key == name]

    def find(self, name: str) -> Value | None:
        """The first value of ``name`` anywhere in the tree, depth first."""
        for value in self.find_all(name):
            return value
        return None

    def find_all(self, name: str) -> Iterator[Value]:
        for key, value in self.fields:
            if key == name:
                yield value
            if isinstance(value, Message):
                yield from value.find_all(name)

    def to_dict(self) -> dict[str, object]:
        """Plain dict; a field that repeats becomes a list, messages become dicts."""
        counts: dict[str, int] = {}
        for key, _ in self.fields:
            counts[key] = counts.get(key, 0) + 1
        out: dict[str, object] = {}
        repeated: dict[str, list[object]] = {}
        for key, value in self.fields:
            plain = value.to_dict() if isinstance(value, Message) else value
            if counts[key] > 1:
                if key not in repeated:
                    repeated[key] = []
                    out[key] = repeated[key]
                repeated[key].append(plain)
            else:
                out[key] = plain
        return out

    def __contains__(self, name: object) -> bool:
        return any(key == name for key, _ in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"Message({self.fields!r})"


MAX_DEPTH = 100  # protobuf's default recursion limit
_TOKEN = re.compile(
    r"""
    (?P<space>(?:\s+|\#[^\n]*)+)
  | (?P<string>"[^"\\\n]*(?:\\.[^"\\\n]*)*"|'[^'\\\n]*(?:\\.[^'\\\n]*)*')
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fFuUlL]*(?![\w.]))
  | (?P<ident>[-]?[A-Za-z_][\w.]*)
  | (?P<extension>\[[A-Za-z_][\w./]*\])
  | (?P<punct>[{}<>\[\]:,;])
    """,
    re.X,
)

_ESCAPES = {
    "n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11,
    "\\": 92, "'": 39, '"': 34, "?": 63,
}


def _unescape(body: str) -> str:
    """C-style escapes to bytes, then UTF-8 (Latin-1 where bytes are not UTF-8)."""
    if "\\" not in body:
        return body
    out = bytearray()
    i = 0
    n = len(body)
    while i < n:
        ch = body[i]
        if ch != "\\" or i + 1 >= n:
            out += ch.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "01234567":
            j = i + 1
            while j < n and j < i + 4 and body[j] in "01234567":
                j += 1
            out.append(int(body[i + 1 : j], 8) & 0xFF)
            i = j
        elif nxt in "xX":
            j = i + 2
            while j < n and j < i + 4 and body[j] in "0123456789abcdefABCDEF":
                j += 1
            out.append(int(body[i + 2 : j] or "0", 16) & 0xFF)
            i = j
        else:
            out += nxt.encode("utf-8")
            i += 2
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return out.decode("latin-1")


def _scalar(kind: str, text: str) -> Value:
    if kind == "string":
        return _unescape(text[1:-1])
    if kind == "number":
        stripped = text.rstrip("fFuUlL") if not text.lower().startswith(("0x", "-0x", "+0x")) else text
        try:
            if stripped.lower().lstrip("+-").startswith("0x"):
                return int(stripped, 16)
            if any(c in stripped for c in ".eE"):
                return float(stripped)
            return int(stripped)
        except ValueError:
            return text
    if text in ("true", "True", "t"):
        return True
    if text in ("false", "False", "f"):
        return False
    return text


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        n = len(text)
        while pos < n:
            match = _TOKEN.match(text, pos)
            if match is None:
                raise self._error(pos, f"unexpected character {text[pos]!r}")
            kind = match.lastgroup or ""
            if kind != "space":
                self.tokens.append((kind, match.group(), pos))
            pos = match.end()
        self.i = 0
        self.depth = 0

    def _error(self, offset: int, message: str) -> TextprotoError:
        line = self.text.count("\n", 0, offset) + 1
        col = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return TextprotoError(message, line, col)

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            raise self._error(len(self.text), "unexpected end of input")
        self.i += 1
        return token

    def accept(self, punct: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "punct" and token[1] == punct:
            self.i += 1
            return True
        return False

    def message(self, close: str | None) -> Message:
        fields: list[tuple[str, Value]] = []
        while True:
            token = self.peek()
            if token is None:
                if close is not None:
                    raise self._error(len(self.text), f"expected {close!r} before end of input")
                return Message(fields)
            if token[0] == "punct" and close is not None and token[1] == close:
                self.i += 1
                return Message(fields)
            if token[0] == "punct" and token[1] in ",;":
                self.i += 1
                continue
            kind, text, offset = self.take()
            if kind == "ident":
                name = text
            elif kind == "extension":
                name = text[1:-1]
            elif kind == "number" and text.isdigit():
                # An unknown field printed by its number (TPU compile options: ``493: 1``,
                # ``493 { ... }``): kept under the number's text.
                name = text
            else:
                raise self._error(offset, f"expected a field name, got {text!r}")
            has_colon = self.accept(":")
            for value in self.values(has_colon):
                fields.append((name, value))

    def values(self, has_colon: bool) -> list[Value]:
        token = self.peek()
        if token is None:
            raise self._error(len(self.text), "expected a value before end of input")
        kind, text, offset = token
        if kind == "punct" and text in "{<[":
            self.depth += 1
            if self.depth > MAX_DEPTH:  # as protobuf's own parsers do: no recursion without end
                raise self._error(offset, f"nested more than {MAX_DEPTH} levels deep")
            try:
                self.i += 1
                if text != "[":
                    return [self.message("}" if text == "{" else ">")]
                items: list[Value] = []
                while not self.accept("]"):
                    if self.accept(","):
                        continue
                    items.extend(self.values(True))
                return items
            finally:
                self.depth -= 1
        if not has_colon:
            raise self._error(offset, f"expected ':' or '{{' after a field name, got {text!r}")
        self.i += 1
        if kind == "string":
            pieces = [_scalar(kind, text)]
            while (nxt := self.peek()) is not None and nxt[0] == "string":
                self.i += 1
                pieces.append(_scalar("string", nxt[1]))
            return ["".join(str(p) for p in pieces)]
        if kind in ("number", "ident"):
            return [_scalar(kind, text)]
        raise self._error(offset, f"expected a value, got {text!r}")


def parse_textproto(text: str) -> Message:
    """Parse protobuf text format into a :class:`Message`; raises :class:`TextprotoError`."""
    return _Reader(text).message(None)
