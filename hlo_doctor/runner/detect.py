"""Tell which framework a script uses from its imports (an AST scan; nothing runs)."""

from __future__ import annotations

import ast
from pathlib import Path

from hlo_doctor.errors import HloDoctorError

JAX = "jax"
TORCH_XLA = "torch_xla"
FRAMEWORKS = (JAX, TORCH_XLA)


class FrameworkError(HloDoctorError, ValueError):
    """The framework could not be told from the script; pass it explicitly."""


def normalize_framework(name: str) -> str:
    """``"torch-xla"``/``"torch_xla"``/``"jax"`` -> the canonical spelling."""
    canonical = name.strip().lower().replace("-", "_")
    if canonical not in FRAMEWORKS:
        raise FrameworkError(f"unknown framework {name!r}; expected one of: jax, torch-xla")
    return canonical


def imported_roots(source: str) -> set[str]:
    """Top-level names of every module the source imports (absolute imports only)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _scan(script: Path, seen: set[Path]) -> set[str]:
    """Imports of the script and, one hop at a time, of modules next to it."""
    script = script.resolve()
    if script in seen or not script.is_file():
        return set()
    seen.add(script)
    try:
        roots = imported_roots(script.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return set()
    found = roots & set(FRAMEWORKS)
    for name in sorted(roots - set(FRAMEWORKS)):
        local = script.parent / f"{name}.py"
        if local.is_file():
            found |= _scan(local, seen)
    return found


def detect_framework(script: str | Path) -> str:
    """``"jax"`` or ``"torch_xla"``; raises FrameworkError when it is neither or both."""
    found = _scan(Path(script), set())
    if len(found) == 1:
        return found.pop()
    if not found:
        raise FrameworkError(
            f"{script}: imports neither jax nor torch_xla; pass the framework explicitly"
        )
    raise FrameworkError(f"{script}: imports both jax and torch_xla; pass the framework explicitly")
