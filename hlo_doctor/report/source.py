"""Which source files a report may quote, and the lines it quotes.

A dump's ``FileNames`` table can name any file on the machine
(``/etc/shadow``, ``~/.ssh/id_rsa``): a report quotes lines only from files
below the project root (the current directory, and the folder of the
nearest ``pyproject.toml`` above it) or the folder of the program the
runner ran. ``--show-source-anywhere`` lifts the limit.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass
from pathlib import Path

from hlo_doctor.report.paths import local_path
from hlo_doctor.report.safe import plain

__all__ = ["SourcePolicy", "source_lines"]


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """The folders whose files may be quoted (every file with ``anywhere``)."""

    roots: tuple[Path, ...]
    anywhere: bool = False

    @classmethod
    def default(cls, program: str | None = None, *, anywhere: bool = False, cwd: Path | None = None) -> SourcePolicy:
        """The current directory, the nearest ``pyproject.toml``'s folder, and ``program``'s folder."""
        cwd = (cwd or Path.cwd()).resolve()
        roots = [cwd]
        project = next((folder for folder in (cwd, *cwd.parents) if (folder / "pyproject.toml").is_file()), None)
        if project is not None and project != cwd:
            roots.append(project)
        if program:
            roots.append(Path(program).resolve().parent)
        return cls(tuple(roots), anywhere)

    def allows(self, path: Path) -> bool:
        if self.anywhere:
            return True
        resolved = path.resolve()
        return any(resolved.is_relative_to(root) for root in self.roots)


def source_lines(recorded: str, line: int, policy: SourcePolicy, context: int = 2) -> list[tuple[int, str]] | None:
    """Lines ``line - context`` .. ``line + context`` of the file ``recorded`` names, made plain.

    None when the file is not here, not allowed by ``policy``, or shorter than ``line``.
    """
    found = local_path(recorded)
    if found is None or not found.is_file() or not policy.allows(found):
        return None
    path = str(found)
    lines = []
    for number in range(max(1, line - context), line + context + 1):
        text = linecache.getline(path, number)
        if not text:
            if number <= line:
                return None
            break
        lines.append((number, plain(text.rstrip("\n").expandtabs(4))))
    return lines
