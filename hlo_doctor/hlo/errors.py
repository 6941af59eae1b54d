"""ParseError: the only exception the HLO parser raises on bad text."""

from __future__ import annotations

from hlo_doctor.errors import HloDoctorError


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text``."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    start = text.rfind("\n", 0, offset) + 1
    return line, offset - start + 1


class ParseError(HloDoctorError):
    """Malformed HLO text, with ``path:line:col``, a message and a caret excerpt.

    ``str(error)`` is a single line (``path:line:col: message``), suitable for
    a CLI error line; :meth:`excerpt` gives the offending source line with a
    caret under the column.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int = 1,
        col: int = 1,
        source_line: str = "",
    ) -> None:
        message = " ".join(message.split())  # always one line
        if len(message) > 300:
            message = message[:297] + "..."
        self.message = message
        self.path = path
        self.line = line
        self.col = col
        self.source_line = source_line
        super().__init__(self.location + ": " + message)

    @classmethod
    def at(cls, text: str, offset: int, message: str, *, path: str | None = None) -> ParseError:
        """An error at character ``offset`` of ``text``."""
        line, col = line_col(text, offset)
        start = text.rfind("\n", 0, max(0, min(offset, len(text)))) + 1
        end = text.find("\n", start)
        source_line = text[start : end if end != -1 else len(text)]
        if len(source_line) > 400:
            # Keep the excerpt readable on a 30 MB single line.
            lo = max(0, col - 200)
            source_line = source_line[lo : lo + 400]
            col_in_excerpt = col - lo
            error = cls(message, path=path, line=line, col=col, source_line=source_line)
            error._caret_col = col_in_excerpt
            return error
        return cls(message, path=path, line=line, col=col, source_line=source_line)

    _caret_col: int | None = None

    @property
    def location(self) -> str:
        return f"{self.path or '<string>'}:{self.line}:{self.col}"

    def with_path(self, path: str | None) -> ParseError:
        error = ParseError(
            self.message, path=path, line=self.line, col=self.col, source_line=self.source_line
        )
        error._caret_col = self._caret_col
        return error

    def excerpt(self) -> str:
        """The source line and a caret under the error column."""
        if not self.source_line:
            return ""
        col = self._caret_col if self._caret_col is not None else self.col
        return self.source_line.rstrip("\n") + "\n" + " " * max(0, col - 1) + "^"
