"""Token-level scanning shared by the HLO grammar: whitespace and comments,
names, strings, and the extent of attribute values (balanced ``{...}``,
quoted strings, bare tokens) kept as raw text.

:class:`Scanner` holds the text and a position; every error it raises is a
:class:`ParseError` at ``path:line:col``. Scanning jumps between the
characters that matter with compiled regexes instead of a per-character
Python loop.
"""

from __future__ import annotations

import re
from typing import Protocol, cast

from hlo_doctor.hlo.errors import ParseError

SPACE = re.compile(r"(?:[ \t\r\n]+|//[^\n]*|/\*.*?\*/)*", re.S)


class AlwaysMatches(Protocol):
    """``Pattern.match`` of a pattern that matches at every position (perhaps the empty string)."""

    def __call__(self, string: str, pos: int = 0, /) -> re.Match[str]: ...


def always_matches(pattern: re.Pattern[str]) -> AlwaysMatches:
    """``pattern.match``, typed as never None: for ``(...)*`` patterns such as :data:`SPACE`."""
    return cast(AlwaysMatches, pattern.match)


SPACE_MATCH = always_matches(SPACE)
NAME = re.compile(r"%?([A-Za-z0-9_][\w.\-]*)")
STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
BRACE_EVENT = re.compile(r'[{}"]')
BARE_VALUE_EVENT = re.compile(r'[\s,{}()\[\]"]')
MESH_DEVICE_IDS = re.compile(r",\s*device_ids=\(")
LITERAL_EVENT = re.compile(r'[(){}"]')


class Scanner:
    """A position in one text, with the token-level moves of the grammar."""

    def __init__(self, text: str, path: str | None = None) -> None:
        self.text = text
        self.path = path
        self.pos = 0

    def error(self, message: str, offset: int | None = None) -> ParseError:
        return ParseError.at(self.text, self.pos if offset is None else offset, message, path=self.path)

    def skip_space(self) -> int:
        self.pos = SPACE_MATCH(self.text, self.pos).end()
        return self.pos

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos : self.pos + 1]

    def expect(self, token: str, what: str = "") -> None:
        self.skip_space()
        if not self.text.startswith(token, self.pos):
            found = self.text[self.pos : self.pos + 20].split("\n", 1)[0] or "end of input"
            raise self.error(f"expected '{token}'{what}, found '{found}'")
        self.pos += len(token)

    def parse_optional_keyword(self, word: str) -> bool:
        self.skip_space()
        end = self.pos + len(word)
        if self.text.startswith(word, self.pos) and (
            end >= len(self.text) or not (self.text[end].isalnum() or self.text[end] in "_.-")
        ):
            self.pos = end
            return True
        return False

    def parse_name(self, what: str = "a name") -> str:
        self.skip_space()
        m = NAME.match(self.text, self.pos)
        if m is None:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return m.group(1)

    def parse_string(self) -> str:
        self.skip_space()
        m = STRING.match(self.text, self.pos)
        if m is None:
            raise self.error("expected a quoted string")
        self.pos = m.end()
        return m.group(0)

    def scan_value(self, key: str) -> str:
        text = self.text
        start = self.pos
        c = text[start : start + 1]
        if c == "{":
            end = self.scan_braces(start)
        elif c == '"':
            m = STRING.match(text, start)
            if m is None:
                raise self.error("unterminated string")
            end = m.end()
        elif not c:
            raise self.error(f"expected a value for attribute '{key}'")
        else:
            end = self.scan_bare(start)
            if key == "literal":
                # literal=s32[2]{0} {1, 2}: a shape, then the literal itself.
                i = SPACE_MATCH(text, end).end()
                end = self.scan_braces(i) if text.startswith("{", i) else self.scan_bare(i)
            elif key == "replica_groups" and text.startswith("mesh", start):
                # mesh['a'=2,'b'=4] {'a'}, or with the mesh's devices:
                # mesh['a'=8,'b'=2], device_ids=([2,8]T(1,0)) {'a'}
                end = self.scan_mesh_groups_tail(end)
        if end == start:
            raise self.error(f"expected a value for attribute '{key}'")
        self.pos = end
        return text[start:end]

    def scan_mesh_groups_tail(self, end: int) -> int:
        """After ``mesh[...]``: an optional ``, device_ids=(...)``, then the ``{axes}``."""
        text = self.text
        m = MESH_DEVICE_IDS.match(text, end)
        if m is not None:
            depth = 0
            i = m.end() - 1  # at '('
            while i < len(text):
                if text[i] == "(":
                    depth += 1
                elif text[i] == ")":
                    depth -= 1
                    if depth == 0:
                        end = i + 1
                        break
                elif text[i] == "\n":
                    raise self.error("unterminated device_ids=(...)", m.start())
                i += 1
        i = SPACE_MATCH(text, end).end()
        if text.startswith("{", i):
            end = self.scan_braces(i)
        return end

    def scan_braces(self, start: int) -> int:
        text = self.text
        depth = 0
        i = start
        search = BRACE_EVENT.search
        while True:
            m = search(text, i)
            if m is None:
                raise self.error("unbalanced '{': missing '}'", start)
            c = m.group(0)
            if c == '"':
                s = STRING.match(text, m.start())
                if s is None:
                    raise self.error("unterminated string", m.start())
                i = s.end()
                continue
            i = m.end()
            if c == "{":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return i

    def scan_bare(self, start: int) -> int:
        """A value without spaces: ``kLoop``, ``[2,4]<=[8]``, ``b01f_01io->b01f``."""
        text = self.text
        depth = 0
        i = start
        search = BARE_VALUE_EVENT.search
        while True:
            m = search(text, i)
            if m is None:
                return len(text)
            c = m.group(0)
            if c in "([{":
                depth += 1
                i = m.end()
            elif c in ")]}":
                if depth == 0:
                    return m.start()
                depth -= 1
                i = m.end()
            elif c == '"':
                s = STRING.match(text, m.start())
                if s is None:
                    raise self.error("unterminated string", m.start())
                i = s.end()
            elif depth == 0:
                return m.start()
            else:
                i = m.end()


    def scan_literal(self) -> str:
        """The raw text up to the ')' that closes the opcode's '(' (``self.pos`` is after it)."""
        text = self.text
        start = i = self.pos
        depth = 1
        search = LITERAL_EVENT.search
        while True:
            m = search(text, i)
            if m is None:
                raise self.error("unterminated literal: missing ')'", start)
            c = m.group(0)
            if c == '"':
                string = STRING.match(text, m.start())
                if string is None:
                    raise self.error("unterminated string", m.start())
                i = string.end()
                continue
            i = m.end()
            if c in "({":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    if c != ")":
                        raise self.error("unbalanced '}' in literal", m.start())
                    self.pos = i
                    return text[start : i - 1].strip()


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)
