"""Paths in reports: map the paths a dump recorded to files on this machine.

Dumps record absolute paths of the machine that compiled (a CI runner, a
colleague's checkout). When such a path does not exist here, the longest
tail of it that exists below the base folder (the current directory) is
taken instead: ``/home/ci/work/repo/train/model.py`` -> ``train/model.py``.
Reports then show and link paths relative to the base, which is what code
scanning and workflow annotations need.
"""

from __future__ import annotations

from pathlib import Path

from hlo_doctor.files import exists


def local_path(recorded: str, base: Path | None = None) -> Path | None:
    """The file (or folder) on this machine that ``recorded`` names, or None.

    A path below ``base`` is taken as it is; otherwise the longest tail of it
    found below ``base`` wins over the recorded path itself (another checkout
    of the same files may exist on this machine).
    """
    path = Path(recorded)
    base = (base or Path.cwd()).resolve()
    if path.is_absolute() and exists(path):
        try:
            path.resolve().relative_to(base)
            return path
        except ValueError:
            pass
    parts = path.parts[1:] if path.is_absolute() else path.parts
    # Tails of at least two parts (folder/file), so a bare file name never
    # matches an unrelated file of the same name.
    for start in range(max(1, len(parts) - 1)):
        candidate = base.joinpath(*parts[start:])
        if exists(candidate):
            return candidate
    return path if exists(path) else None


def relative_path(recorded: str, base: Path | None = None) -> str:
    """``recorded`` relative to ``base`` when it maps below it; else as recorded (posix)."""
    base = (base or Path.cwd()).resolve()
    found = local_path(recorded, base)
    if found is not None:
        try:
            return found.resolve().relative_to(base).as_posix()
        except ValueError:
            pass
    return Path(recorded).as_posix()
