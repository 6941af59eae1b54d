"""Which source files a report may quote, and the lines it quotes.

A dump's ``FileNames`` table can name any file on the machine
(``/etc/shadow``, ``~/.ssh/id_rsa``): a report quotes lines only from files
below the project root (the current directory, and the folder of the
nearest ``pyproject.toml`` above it), the dump's own folder, or the folder of
the program the runner ran *in this same invocation* (``hlo-doctor run``).
The run record inside a dump is part of the dump, untrusted like the rest:
the program it names never widens the limit. Every check is made on the
file's real path (symbolic links resolved). ``--show-source-anywhere`` lifts
the limit.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass
from pathlib import Path

from hlo_doctor.files import is_file, is_small_file, real_path
from hlo_doctor.report.paths import local_path
from hlo_doctor.report.safe import plain

__all__ = ["SourcePolicy", "project_roots", "source_lines"]


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """The folders whose files may be quoted (every file with ``anywhere``)."""

    roots: tuple[Path, ...]
    anywhere: bool = False

    @classmethod
    def default(cls, program: str | None = None, *, dump: str | None = None, anywhere: bool = False,
                cwd: Path | None = None) -> SourcePolicy:
        """The project root (the current directory and the nearest ``pyproject.toml``'s folder),
        ``dump``'s folder, and ``program``'s folder.

        ``program`` must be a program this invocation ran or the user named, never one read from
        the dump (its run record): the dump does not choose what is read.
        """
        roots = list(project_roots(cwd))
        if dump:
            dump_path = real_path(dump)
            roots.append(dump_path if not is_file(dump_path) else dump_path.parent)
        if program:
            roots.append(real_path(program).parent)
        return cls(tuple(roots), anywhere)

    def allows(self, path: Path) -> bool:
        if self.anywhere:
            return True
        resolved = real_path(path)
        return any(resolved.is_relative_to(root) for root in self.roots)


def project_roots(cwd: Path | None = None) -> tuple[Path, ...]:
    """The project root: the current directory and the folder of the nearest ``pyproject.toml``
    above it (real paths)."""
    here = real_path(cwd or Path.cwd())
    project = next((folder for folder in (here, *here.parents) if is_file(folder / "pyproject.toml")), None)
    return (here,) if project is None or project == here else (here, project)


def source_lines(recorded: str, line: int, policy: SourcePolicy, context: int = 2) -> list[tuple[int, str]] | None:
    """Lines ``line - context`` .. ``line + context`` of the file ``recorded`` names, made plain.

    None when the file is not here, not allowed by ``policy``, not a regular file of at most 8 MB
    (``linecache`` reads it whole), or shorter than ``line``.
    """
    found = local_path(recorded)
    if found is None or not is_small_file(found) or not policy.allows(found):
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
