"""Where the program files a dump names are on this machine, and whether they may be read.

A dump records the absolute paths of the machine that compiled it (``FileNames``
tables, ``source_file`` metadata, the runner's record): often a cluster, a CI
runner or a colleague's checkout, so the path does not exist here. Each recorded
file is looked for, in order:

1. through ``--path-map RECORDED=LOCAL`` (``[tool.hlo-doctor] path-map``): the entry
   for the file itself, else its longest mapped folder prefix (first, because the user
   said which copy is meant, even where the recorded path exists here too);
2. at the recorded path itself;
3. by the recorded path's longest tail (at least ``folder/file``, never a bare file
   name) that exists below the dump's folder or one of its parents up to the project
   root, or below the current directory (coverage.py's ``[paths]``, made automatic):
   ``/home/ci/work/repo/train/model.py`` -> ``./train/model.py``;
4. as hlo-doctor's own gallery copy of a program of its gallery.

A dump is untrusted input, so every candidate is resolved (``realpath``) and read
only when it lies inside the allowed folders: the project root (the current
directory and the folder of the nearest ``pyproject.toml`` above it), the dump's own
tree, the targets of the user's path maps, the gallery, and the programs that this
invocation ran (the runner). The run record inside the dump never widens them.
``anywhere`` (``--show-source-anywhere``) lifts the limit. Each file's outcome is a
:class:`~hlo_doctor.findings.SourceFile`: found (and how) or not (and why).

The rules read the program deep inside helpers that know only a recorded path, so
the finder of the analysis under way is a context variable, set and reset around
one analysis by :func:`finding_sources` (forked worker processes inherit it);
outside one, :func:`current_finder` confines to the current directory's project
and the gallery.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hlo_doctor.examples.registry import PROGRAMS, local_program_file
from hlo_doctor.files import is_file, real_path
from hlo_doctor.findings import SourceFile

__all__ = [
    "READ_LIMIT",
    "SourceFinder",
    "SourceSettings",
    "current_finder",
    "finding_sources",
    "map_prefix",
    "parse_path_maps",
    "project_roots",
]

READ_LIMIT = 2_000_000
"""A program file bigger than this (bytes) is not read."""

RECORDED, PATH_MAP, SUFFIX, GALLERY = "recorded", "path-map", "suffix", "gallery"
MISSING, OUTSIDE, TOO_BIG = "missing", "outside", "too-big"
FOUND_HOW = (RECORDED, PATH_MAP, SUFFIX, GALLERY)


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """What the user said about finding the program's files (picklable: workers get it)."""

    path_map: tuple[tuple[str, str], ...] = ()
    """(RECORDED, LOCAL) pairs: a recorded file or folder prefix and where it is here"""
    anywhere: bool = False
    """read any file the dump names (``--show-source-anywhere``)"""
    programs: tuple[str, ...] = ()
    """programs this invocation ran (the runner) or the user named: their folders may be read"""
    gallery: bool = True
    """fall back to hlo-doctor's own copy of a gallery program (False: only the user's files)"""


def parse_path_maps(pairs: Iterable[str], option: str = "--path-map") -> tuple[tuple[str, str], ...]:
    """``RECORDED=LOCAL`` strings -> pairs; ValueError (one line) for a malformed one or a
    LOCAL that does not exist."""
    parsed = []
    for pair in pairs:
        recorded, sep, local = pair.partition("=")
        if not sep or not recorded or not local:
            raise ValueError(f"{option} takes RECORDED=LOCAL, not {pair!r}")
        parsed.append(check_path_map(recorded, local, option))
    return tuple(parsed)


def check_path_map(recorded: str, local: str, option: str = "--path-map") -> tuple[str, str]:
    """One path map entry, checked: LOCAL must exist (ValueError, one line, otherwise)."""
    if not os.path.exists(local):
        raise ValueError(f"{option} {recorded}={local}: {local} does not exist")
    return recorded, local


def map_prefix(recorded: str, path_map: Mapping[str, str] | Iterable[tuple[str, str]]) -> str | None:
    """Where ``path_map`` puts ``recorded``: the entry for the file itself, else for its longest
    mapped folder prefix (None: no entry applies)."""
    entries = dict(path_map.items() if isinstance(path_map, Mapping) else path_map)
    if recorded in entries:
        return entries[recorded]
    best = max((p for p in entries if recorded.startswith(p.rstrip("/\\") + "/")), key=len, default=None)
    if best is None:
        return None
    return os.path.join(entries[best], recorded[len(best.rstrip("/\\")) + 1:])


def project_roots(cwd: Path | None = None) -> tuple[Path, ...]:
    """The project root: the current directory and the folder of the nearest ``pyproject.toml``
    above it (real paths)."""
    here = real_path(cwd or Path.cwd())
    project = next((folder for folder in (here, *here.parents) if is_file(folder / "pyproject.toml")), None)
    return (here,) if project is None or project == here else (here, project)


class SourceFinder:
    """Finds (and confines) the program files one dump names; each answer is kept."""

    def __init__(self, settings: SourceSettings | None = None, dump: str | os.PathLike[str] | None = None,
                 cwd: Path | None = None, *, remember: bool = True) -> None:
        self.settings = settings or SourceSettings()
        self.remember = remember  # keep each answer (for one analysis: the files do not change meanwhile)
        self.cwd = real_path(cwd or Path.cwd())
        project = project_roots(self.cwd)
        roots = list(project)
        self.dump_folder: Path | None = None
        if dump is not None:
            dump_path = real_path(dump)
            self.dump_folder = dump_path.parent if is_file(dump_path) else dump_path
            roots.append(self.dump_folder)
        roots += [real_path(local) for _, local in self.settings.path_map]
        if self.settings.gallery:
            roots.append(real_path(PROGRAMS))
        roots += [real_path(program).parent for program in self.settings.programs]
        self.roots: tuple[Path, ...] = tuple(dict.fromkeys(roots))
        self.bases = self._bases(project)
        self._found: dict[str, SourceFile] = {}

    def _bases(self, project: tuple[Path, ...]) -> tuple[Path, ...]:
        """Where a recorded path's tail is looked for: the dump's folder and its parents up to the
        project root (when the dump is inside it), then the current directory and the project's."""
        bases: list[Path] = []
        if self.dump_folder is not None:
            bases.append(self.dump_folder)
            top = next((root for root in reversed(project) if self.dump_folder.is_relative_to(root)), None)
            if top is not None:
                bases += [p for p in self.dump_folder.parents if p.is_relative_to(top)]
        bases += project
        return tuple(dict.fromkeys(bases))

    def allows(self, path: str | os.PathLike[str]) -> bool:
        """Whether the file at ``path`` (resolved) lies inside the allowed folders."""
        if self.settings.anywhere:
            return True
        resolved = real_path(path)
        return any(resolved.is_relative_to(root) for root in self.roots)

    def local(self, recorded: str | None) -> Path | None:
        """The file to read for ``recorded``, or None (not found, not allowed, too big)."""
        if not recorded:
            return None
        found = self.find(recorded)
        return Path(found.local) if found.local is not None else None

    def find(self, recorded: str) -> SourceFile:
        """Where ``recorded`` is here and how it was found, or why it is not read."""
        known = self._found.get(recorded)
        if known is None:
            known = self._search(recorded)
            if self.remember:
                self._found[recorded] = known
        return known

    def found(self) -> tuple[SourceFile, ...]:
        """Every file looked for so far, in the order first asked."""
        return tuple(self._found.values())

    def _search(self, recorded: str) -> SourceFile:
        failure = MISSING
        for how, candidate in self._candidates(recorded):
            if not is_file(candidate):
                continue
            if not self.allows(candidate):
                failure = OUTSIDE if failure == MISSING else failure
                continue
            try:
                size = os.stat(candidate).st_size
            except (OSError, ValueError):
                continue
            if size > READ_LIMIT:
                failure = TOO_BIG
                continue
            return SourceFile(recorded, str(candidate), how)
        return SourceFile(recorded, None, failure)

    def _candidates(self, recorded: str) -> Iterator[tuple[str, Path]]:
        # A path map the user wrote comes first: it says which copy is meant, even where the
        # recorded path also exists here (the checkout that made the dump, on the same machine).
        mapped = map_prefix(recorded, self.settings.path_map)
        if mapped is not None:
            yield PATH_MAP, Path(mapped)
        yield RECORDED, self.cwd / recorded  # an absolute path stays itself
        parts = [part for part in PurePosixPath(recorded.replace("\\", "/")).parts if part not in ("/", "")]
        if parts and ":" in parts[0]:  # a Windows drive
            parts = parts[1:]
        # Tails of at least two parts (folder/file), longest first, so a bare file name never
        # matches an unrelated file of the same name; none that climbs out with "..".
        for start in range(max(0, len(parts) - 1)):
            tail = parts[start:]
            if ".." in tail:
                continue
            for base in self.bases:
                yield SUFFIX, base.joinpath(*tail)
        if self.settings.gallery:
            gallery = local_program_file(recorded)
            if gallery is not None:
                yield GALLERY, gallery


_CURRENT: ContextVar[SourceFinder | None] = ContextVar("hlo_doctor_source_finder", default=None)


@contextmanager
def finding_sources(finder: SourceFinder) -> Iterator[SourceFinder]:
    """Have the rules read the program through ``finder`` within the block (one analysis)."""
    token = _CURRENT.set(finder)
    try:
        yield finder
    finally:
        _CURRENT.reset(token)


def current_finder() -> SourceFinder:
    """The finder of the analysis under way; outside one, a confined default for the current
    directory (the project root and the gallery, no dump)."""
    finder = _CURRENT.get()
    return finder if finder is not None else _default_finder(str(real_path(Path.cwd())))


@functools.lru_cache(maxsize=4)
def _default_finder(cwd: str) -> SourceFinder:
    return SourceFinder(SourceSettings(), None, Path(cwd), remember=False)
