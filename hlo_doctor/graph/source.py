"""The user's source line of an instruction.

:func:`user_frame` picks the innermost frame of the user's own code from a
:class:`~hlo_doctor.hlo.ir.SourceLocation`, skipping frames of jax, torch,
torch_xla, xla, site-packages and the runner's bootstrap (its
``sitecustomize.py`` wraps the sharding calls).

:func:`frames_of` is the instruction's whole frame chain, innermost first
(the parser resolves ``stack_frame_id`` through the module's tables).
"""

from __future__ import annotations

import re

from hlo_doctor.hlo.ir import Instruction, SourceLocation, StackFrame

__all__ = ["frames_of", "is_library_file", "user_frame", "user_frame_of"]

_LIBRARY = re.compile(
    r"(?:^|/)(?:site-packages|dist-packages|jax|jaxlib|torch|torch_xla|xla|flax|optax|haiku"
    r"|equinox|_pytest|pluggy|importlib)/"
    r"|(?:^|/)(?:sitecustomize\.py|runpy\.py)$|^<"
)


def is_library_file(path: str) -> bool:
    """Whether ``path`` belongs to a framework or library rather than the user."""
    return bool(_LIBRARY.search(path.replace("\\", "/"))) or "/hlo-doctor-run-" in path


def user_frame(source: SourceLocation | None) -> StackFrame | None:
    """The innermost frame of the user's code in ``source``, or None."""
    if source is None:
        return None
    frames = source.frames or (StackFrame(source.file, source.function or "", source.line, source.column),)
    for frame in frames:
        if frame.file and not is_library_file(frame.file):
            return frame
    return None


def frames_of(instruction: Instruction) -> tuple[StackFrame, ...]:
    """The instruction's frame chain, innermost first (empty when unknown)."""
    source = instruction.source
    return source.frames if source is not None else ()


def user_frame_of(instruction: Instruction) -> StackFrame | None:
    """:func:`user_frame` of the instruction's source location."""
    return user_frame(instruction.source)
