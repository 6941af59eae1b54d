"""Which source files a report may quote, the lines it quotes, and the list of the program's files.

A dump's ``FileNames`` table can name any file on the machine
(``/etc/shadow``, ``~/.ssh/id_rsa``): a report quotes lines only from files
below the project root (the current directory, and the folder of the
nearest ``pyproject.toml`` above it), the dump's own folder, the targets of
the user's ``--path-map``, or the folder of the program the runner ran *in
this same invocation* (``hlo-doctor run``). The run record inside a dump is
part of the dump, untrusted like the rest: the program it names never widens
the limit. Every check is made on the file's real path (symbolic links
resolved). ``--show-source-anywhere`` lifts the limit.

A file is found as the rules found it (:class:`~hlo_doctor.program.locate.SourceFinder`,
with the same settings), so the line quoted is the line the rules read.
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hlo_doctor.files import is_small_file
from hlo_doctor.findings import SourceFile
from hlo_doctor.program.locate import SourceFinder, SourceSettings, project_roots
from hlo_doctor.report.safe import plain

__all__ = ["SourcePolicy", "project_roots", "source_lines", "sources_summary"]


@dataclass(frozen=True)
class SourcePolicy:
    """The files a report may quote, found the way the analysis found them."""

    finder: SourceFinder

    @classmethod
    def default(cls, program: str | None = None, *, dump: str | None = None, anywhere: bool = False,
                cwd: Path | None = None, path_map: Sequence[tuple[str, str]] = ()) -> SourcePolicy:
        """The project root (the current directory and the nearest ``pyproject.toml``'s folder),
        ``dump``'s folder, the ``path_map`` targets and ``program``'s folder.

        ``program`` must be a program this invocation ran or the user named, never one read from
        the dump (its run record): the dump does not choose what is read.
        """
        settings = SourceSettings(tuple(path_map), anywhere, (program,) if program else ())
        return cls(SourceFinder(settings, dump, cwd))

    @classmethod
    def of(cls, settings: SourceSettings, dump: str | None = None) -> SourcePolicy:
        """The policy of an analysis made with ``settings`` (the same files, found the same way)."""
        return cls(SourceFinder(settings, dump))

    @property
    def roots(self) -> tuple[Path, ...]:
        return self.finder.roots

    @property
    def anywhere(self) -> bool:
        return self.finder.settings.anywhere

    def allows(self, path: Path) -> bool:
        return self.finder.allows(path)


def source_lines(recorded: str, line: int, policy: SourcePolicy, context: int = 2) -> list[tuple[int, str]] | None:
    """Lines ``line - context`` .. ``line + context`` of the file ``recorded`` names, made plain.

    None when the file is not found here, not allowed by ``policy``, not a regular file of at
    most 2 MB, or shorter than ``line``.
    """
    found = policy.finder.local(recorded)
    if found is None or not is_small_file(found):
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


_FOUND = {
    "recorded": "at the recorded path",
    "path-map": "through --path-map",
    "suffix": "by the recorded path's tail",
    "gallery": "hlo-doctor's gallery copy",
}
_NOT_FOUND = {
    "missing": "not found (map it with --path-map RECORDED=LOCAL)",
    "outside": "not read: outside the project and the dump (--show-source-anywhere reads it)",
    "too-big": "not read: over 2 MB",
}
_SHOWN = 4


def sources_summary(sources: Sequence[SourceFile], base: Path | None = None) -> list[str]:
    """One line per way the program's files were found (or why not), for text and HTML (not yet
    made plain): ``program files: a/train.py, a/model.py (by the recorded path's tail)``."""
    base = base or Path.cwd()
    lines = []
    for how, phrase in (*_FOUND.items(), *_NOT_FOUND.items()):
        files = [_shown(s, base) for s in sources if s.how == how]
        if not files:
            continue
        more = f" and {len(files) - _SHOWN} more" if len(files) > _SHOWN else ""
        label = "program files" if len(files) > 1 else "program file"
        lines.append(f"{label}: {', '.join(files[:_SHOWN])}{more} ({phrase})")
    return lines


def _shown(source: SourceFile, base: Path) -> str:
    """A found file as read (relative to ``base`` when below it); one not found as recorded."""
    if source.local is None:
        return source.recorded
    try:
        relative = os.path.relpath(source.local, base)
    except ValueError:  # another drive
        return source.local
    return source.local if relative.startswith("..") else relative
