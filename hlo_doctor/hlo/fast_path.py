"""Regexes of the parser's fast path, and the attribute reads made with them.

XLA prints each instruction on one line, with bare operand names. One regex
match recognises such a line whole (name, shape, opcode, operands, and the
attribute text up to the end of the line), so the common case costs one C
call. Anything the fast path does not recognise (comments between tokens,
attributes that run over several lines, operands written with shapes,
nested instructions, inline computation bodies) goes to the general
recursive-descent path in :mod:`hlo_doctor.hlo.parser`, which accepts the
whole grammar. Both paths build the same IR; the corpus conformance test
holds them to XLA's view.
"""

from __future__ import annotations

import re

_STRING = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_PLAIN = r'[^{}"\n]*'


def _braced(inner: str) -> str:
    """A ``{...}`` group whose nested groups match ``inner`` (unrolled loop)."""
    return r"\{" + _PLAIN + "(?:(?:" + _STRING + ("|" + inner if inner else "") + ")" + _PLAIN + r")*\}"


_BRACED = _braced(_braced(_braced("")))
_BARE = r"(?:[^\s,{}()\[\]\"]|\[[^\]\n]*\])+(?:\([^()\n]*\))?"
_MESH_GROUPS = (
    r"mesh\[[^\]\n]*\](?:,[ \t]*device_ids=\([^()\n]*(?:\([^()\n]*\)[^()\n]*)*\))?[ \t]*\{[^}\n]*\}"
)
# One attribute value on one line: braced (3 levels), quoted, mesh replica
# groups (`mesh['a'=2] {'a'}`), or bare (`kLoop`, `[2,4]<=[4,2]T(1,0)`).
VALUE = "(?:" + _BRACED + "|" + _STRING + "|" + _MESH_GROUPS + "|" + _BARE + ")"

_OPERAND = r"(?:/\*index=\d+\*/)?%?[\w.\-]+"
_SHAPE = r"(?:[a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^}\n]*\})?|\((?:[^()\n]|\([^()\n]*\))*\))"

# Groups: ROOT, name, shape, opcode, operand names | literal text, attributes.
INSTRUCTION_LINE = re.compile(
    r"(ROOT[ \t]+)?%?([A-Za-z0-9_][\w.\-]*)[ \t]*=[ \t]*(" + _SHAPE + r")[ \t]+"
    r"([a-z][a-z0-9\-]*)\((?:((?:" + _OPERAND + r"(?:, *" + _OPERAND + r")*)?)|([^()\n]*))\)[ \t]*"
    # Attributes to the end of the line; a trailing ',' or '=' or a ',' that
    # starts the next line means they go on, which the general path handles.
    r"(,[^\n]*[^\s,=])?[ \t\r]*(?:\Z|\n\s*)(?!,)"
)
# `[ENTRY] %name (params) -> result {` on one line; groups: ENTRY, name.
COMPUTATION_HEADER = re.compile(
    r"(ENTRY[ \t]+)?%?([A-Za-z0-9_][\w.\-]*)(?:[ \t]*\([^\n]*\)[ \t]*->[^\n]*?)?[ \t]*\{[ \t]*(?=\r?\n)"
)
OPERAND_NAME = re.compile(r"[^%, ]+")
BLOCK_COMMENT = re.compile(r"/\*.*?\*/")
ATTRIBUTE = re.compile(r",[ \t]*([A-Za-z_][\w.\-]*)=(" + VALUE + ")")
ATTRIBUTE_LIST = re.compile(r"(?:,[ \t]*[A-Za-z_][\w.\-]*=" + VALUE + r")*[ \t\r]*")


def scan_attribute(text: str, key: str) -> tuple[bool, str | None]:
    """Attribute ``key`` of the raw ``, key=value, ...`` text of one instruction line, read from
    the start and no further than that attribute: ``(True, value)``, ``(True, None)`` when the
    whole text is read and has no ``key``, ``(False, None)`` when the text is not in the common
    form up to there (then :func:`~hlo_doctor.hlo.parser.split_attributes` reads it all, as it would have).

    The value must end where the next attribute's ``,`` starts, or at the end of the text: so it
    is what splitting the whole text gives. A line's first attributes are the ones asked for
    most (``sharding``, ``dimensions``, ``replica_groups``; ``metadata`` comes late), and its
    long ``metadata`` string is then never scanned.
    """
    match = ATTRIBUTE.match
    position, end = 0, len(text)
    while position < end:
        found = match(text, position)
        if found is None:
            return False, None
        position = found.end()
        if found.group(1) == key:
            if position == end or text[position] == ",":
                return True, found.group(2)
            return False, None
    return True, None


def scan_attributes(text: str, keys: tuple[str, ...]) -> dict[str, str | None]:
    """The attributes ``keys`` of the raw ``, key=value, ...`` text of one instruction line, each
    as :func:`scan_attribute` reads it, in one pass from the start that stops once all are found:
    ``{key: value}`` for each key it could tell (a key the whole text lacks is given as None; one
    past the first stretch not in the common form is left out, for :func:`~hlo_doctor.hlo.parser.split_attributes`)."""
    match = ATTRIBUTE.match
    found: dict[str, str | None] = {}
    wanted = len(keys)
    position, end = 0, len(text)
    while position < end:
        hit = match(text, position)
        if hit is None:
            return found
        position = hit.end()
        key = hit.group(1)
        if key in keys and key not in found:
            if position != end and text[position] != ",":
                return found
            found[key] = hit.group(2)
            if len(found) == wanted:
                return found
    return {**dict.fromkeys(keys), **found}
