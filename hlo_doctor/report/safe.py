"""Text from a dump, made safe for the place it is printed.

A dump is input like any other: its op names, module names, file names and
the source lines it points at can hold terminal escape sequences or markup.
Every format passes such text through one of these functions first:

* :func:`plain` for a terminal or a log (one line), :func:`plain_block` for
  several lines: escape sequences (CSI ``ESC[…m``, OSC ``ESC]0;title BEL``,
  DCS/APC/PM strings, their 8-bit C1 forms) are removed whole, then every
  remaining C0/C1 control character and bidirectional override;
* :func:`md_text` and :func:`md_code` for Markdown (GitHub flavoured),
  in running text and in code spans, in or out of a table;
* :func:`html_text` for HTML.

What a name can cost is capped too (the JSON report alone keeps whole
strings): a run of more than :data:`WORD_LIMIT` characters without a space
(a hostile op_name of megabytes) is cut to its start and end around a marker
that says how much is left out (:func:`shorten_words`), and :func:`plain`
gives at most :data:`LINE_LIMIT` characters. Text that reaches a rich table
is folded per word, which costs the square of a word's length.
"""

from __future__ import annotations

import html
import re

__all__ = ["LINE_LIMIT", "WORD_LIMIT", "html_text", "md_code", "md_fence", "md_text", "plain", "plain_block",
           "rich_text", "shorten_words"]

_ST = r"(?:\x07|\x1b\\|\x9c)"
_SEQUENCES = re.compile(
    r"\x1b\][^\x07\x1b\x9c]*" + _ST + r"?"          # OSC, 7-bit (ended by BEL or ST, or cut off)
    r"|\x9d[^\x07\x1b\x9c]*" + _ST + r"?"           # OSC, 8-bit
    r"|\x1b[P^_X][^\x1b\x9c]*" + _ST + r"?"         # DCS, PM, APC, SOS
    r"|[\x90\x98\x9e\x9f][^\x1b\x9c]*" + _ST + r"?"  # the same, 8-bit
    r"|\x1b\[[0-?]*[ -/]*[@-~]?"                    # CSI
    r"|\x9b[0-?]*[ -/]*[@-~]?"                      # CSI, 8-bit
    r"|\x1b[ -/]*[0-~]?"                            # other escapes (ESC c, ESC ( B, ...)
)
_SEQUENCE_START = re.compile(r"[\x1b\x90\x98\x9b\x9d\x9e\x9f]")  # what every sequence above starts with
# C0 and C1 controls, DEL, and the bidirectional embeddings/overrides/isolates.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_WHITESPACE = re.compile(r"[\t\n\r\x0b\x0c]")


WORD_LIMIT = 1000
LINE_LIMIT = 20_000
_LONG_WORD = re.compile(rf"(?<!\S)\S{{{WORD_LIMIT + 1},}}")  # from a word's start only: linear
_KEPT_END = 40


def shorten_words(text: str) -> str:
    """``text`` with every run of more than :data:`WORD_LIMIT` non-space characters cut to its
    start and its last characters around ``…[N more characters]…``."""
    if len(text) <= WORD_LIMIT:
        return text
    return _LONG_WORD.sub(_shortened, text)


def _shortened(match: re.Match[str]) -> str:
    word = match.group()
    head = WORD_LIMIT - _KEPT_END - 40
    return f"{word[:head]}…[{len(word) - head - _KEPT_END} more characters]…{word[-_KEPT_END:]}"


def _without_sequences(text: str) -> str:
    return _SEQUENCES.sub("", text) if _SEQUENCE_START.search(text) else text


def plain(text: object) -> str:
    """``text`` as one line with no escape sequence or control character (tabs and newlines become spaces),
    its long words shortened and the whole at most :data:`LINE_LIMIT` characters."""
    line = shorten_words(_CONTROLS.sub("", _WHITESPACE.sub(" ", _without_sequences(str(text)))))
    if len(line) > LINE_LIMIT:
        line = f"{line[:LINE_LIMIT - 40]}…[{len(line) - LINE_LIMIT + 40} more characters]"
    return line


def plain_block(text: object) -> str:
    """Like :func:`plain`, keeping newlines (and tabs), with no limit on the whole."""
    return shorten_words(_CONTROLS_BUT_LINES.sub("", _without_sequences(str(text).replace("\r\n", "\n"))))


# ASCII punctuation that means something inline in (GitHub) Markdown.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_AUTOLINK = re.compile(r"(?i)(://|www\.|@)")


def md_text(text: object) -> str:
    """``text`` for running Markdown text or a table cell: inert, on one line.

    Markdown punctuation is backslash-escaped, ``<``, ``>`` and ``&`` become
    entities, and a zero-width space breaks ``://``, ``www.`` and ``@`` so
    GitHub's autolinker does not make a live link of a name.
    """
    escaped = _MD_SPECIAL.sub(r"\\\1", plain(text))
    escaped = escaped.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _AUTOLINK.sub(lambda m: m.group(1)[0] + "\u200b" + m.group(1)[1:], escaped)


def md_code(text: object, *, in_table: bool = False) -> str:
    """``text`` as an inline code span that no backtick inside can close.

    The fence is one backtick longer than the longest run inside (CommonMark),
    padded with spaces; in a table, ``|`` is escaped, which GitHub requires
    even inside code spans. Code spans render ``<img>`` as text.
    """
    body = plain(text)
    if not body:
        return ""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    if in_table:
        body = body.replace("|", "\\|")
    if longest or body.startswith(" ") or body.endswith(" "):
        body = f" {body} "
    return f"{fence}{body}{fence}"


def md_fence(code: object, language: str = "") -> list[str]:
    """``code`` as the lines of a fenced block that no line inside can close."""
    body = plain_block(code)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{language}", *body.splitlines(), fence]


def html_text(text: object) -> str:
    """``text`` for HTML text or a quoted attribute (controls removed, markup escaped)."""
    return html.escape(plain_block(text), quote=True)


def rich_text(text: object) -> str:
    """Text from a dump for a rich table cell: :func:`plain`, with rich markup (``[bold]``) escaped."""
    from rich.markup import escape  # rich is imported by the text reports only

    return escape(plain(text))
