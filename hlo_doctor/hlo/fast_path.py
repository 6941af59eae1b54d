"""Regexes of the parser's fast path.

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
