"""Shape grammar: ``f32[2,<=3,?]{1,0:T(8,128)}``, ``(s32[], token[])``, ``token[]``.

Shapes repeat heavily in real modules, so :func:`shape_from_text` caches by
the exact text. :func:`scan_shape` finds where a shape ends in a larger text
without interpreting it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir_shape import ELEMENT_BITS, Layout, Shape
from hlo_doctor.hlo.lexer import always_matches

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\s*\[([^\]]*)\]")
_SPACE = always_matches(re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/)*", re.S))
_LAYOUT_START = re.compile(r"\{\s*[\d:}]")
_BUFFER = re.compile(r"b\(\s*")
_DIM = re.compile(r"\s*(<=)?\s*(\d+|\?)\s*")
_LAYOUT_MINOR_TO_MAJOR = re.compile(r"\s*(\d+(?:\s*,\s*\d+)*)?")


class ShapeSyntaxError(Exception):
    """Raised internally with an offset into the shape text."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


def scan_layout(text: str, pos: int) -> int:
    """End of a balanced ``{...}`` layout starting at ``pos`` (which is ``{``)."""
    depth = 0
    n = len(text)
    i = pos
    while i < n:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == "\n" and depth == 0:
            break
        i += 1
    raise ShapeSyntaxError(pos, "unterminated layout '{'")


def scan_shape(text: str, pos: int) -> int:
    """Return the end offset of the shape that starts at ``pos``.

    Raises ShapeSyntaxError when no shape starts there.
    """
    if pos < len(text) and text[pos] == "(":
        i = _SPACE(text, pos + 1).end()
        if i < len(text) and text[i] == ")":
            return i + 1
        while True:
            i = scan_shape(text, i)
            i = _SPACE(text, i).end()
            if i < len(text) and text[i] == ",":
                i = _SPACE(text, i + 1).end()
                continue
            if i < len(text) and text[i] == ")":
                return i + 1
            raise ShapeSyntaxError(i, "expected ',' or ')' in tuple shape")
    b = _BUFFER.match(text, pos)
    if b is not None:
        end = _SPACE(text, scan_shape(text, b.end())).end()
        if not text.startswith(")", end):
            raise ShapeSyntaxError(end, "expected ')' to close the buffer shape b(...)")
        return end + 1
    m = _ARRAY.match(text, pos)
    if m is None:
        raise ShapeSyntaxError(pos, "expected a shape such as f32[2,3]")
    end = m.end()
    layout = _LAYOUT_START.match(text, _SPACE(text, end).end())
    if layout is not None:
        end = scan_layout(text, layout.start())
    return end


@lru_cache(maxsize=65536)
def shape_from_text(text: str) -> Shape:
    """Interpret a shape's text; raises ShapeSyntaxError with an offset."""
    shape, end = _parse_shape(text, 0)
    end = _SPACE(text, end).end()
    if end != len(text):
        raise ShapeSyntaxError(end, "unexpected text after shape")
    return shape


def _parse_shape(text: str, pos: int) -> tuple[Shape, int]:
    if pos < len(text) and text[pos] == "(":
        elements: list[Shape] = []
        i = _SPACE(text, pos + 1).end()
        if i < len(text) and text[i] == ")":
            return Shape("tuple"), i + 1
        while True:
            element, i = _parse_shape(text, i)
            elements.append(element)
            i = _SPACE(text, i).end()
            if i < len(text) and text[i] == ",":
                i = _SPACE(text, i + 1).end()
                continue
            if i < len(text) and text[i] == ")":
                return Shape("tuple", tuple_shapes=tuple(elements)), i + 1
            raise ShapeSyntaxError(i, "expected ',' or ')' in tuple shape")
    b = _BUFFER.match(text, pos)
    if b is not None:
        inner, end = _parse_shape(text, b.end())
        end = _SPACE(text, end).end()
        if not text.startswith(")", end):
            raise ShapeSyntaxError(end, "expected ')' to close the buffer shape b(...)")
        return inner, end + 1
    m = _ARRAY.match(text, pos)
    if m is None:
        raise ShapeSyntaxError(pos, "expected a shape such as f32[2,3]")
    element_type = m.group(1)
    if element_type not in ELEMENT_BITS:
        raise ShapeSyntaxError(pos, f"unknown element type '{element_type}'")
    dims: list[int] = []
    dynamic: list[bool] = []
    body = m.group(2)
    if body.strip():
        offset = m.start(2)
        for part in body.split(","):
            d = _DIM.fullmatch(part)
            if d is None:
                raise ShapeSyntaxError(offset, f"bad dimension '{part.strip()}'")
            if d.group(2) == "?":
                dims.append(-1)
                dynamic.append(True)
            else:
                dims.append(int(d.group(2)))
                dynamic.append(d.group(1) is not None)
            offset += len(part) + 1
    end = m.end()
    layout = None
    layout_start = _LAYOUT_START.match(text, _SPACE(text, end).end())
    if layout_start is not None:
        layout_end = scan_layout(text, layout_start.start())
        layout = _layout_from_text(text[layout_start.start() : layout_end])
        end = layout_end
    if not any(dynamic):
        dynamic = []
    return Shape(element_type, tuple(dims), tuple(dynamic), layout), end


@lru_cache(maxsize=4096)
def _layout_from_text(text: str) -> Layout:
    inner = text[1:-1]
    head = inner.split(":", 1)[0]
    m = _LAYOUT_MINOR_TO_MAJOR.fullmatch(head)
    if m is None:
        return Layout((), text)
    numbers = m.group(1)
    minor_to_major = tuple(int(x) for x in numbers.split(",")) if numbers else ()
    return Layout(minor_to_major, text)


def parse_shape(text: str, *, path: str | None = None) -> Shape:
    """Parse a standalone shape string, raising ParseError on bad text."""
    try:
        return shape_from_text(text.strip())
    except ShapeSyntaxError as error:
        raise ParseError.at(text.strip(), error.offset, error.message, path=path) from None
