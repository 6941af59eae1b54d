"""The user's source line of an instruction.

:func:`user_frame` picks the innermost frame of the user's own code from a
:class:`~hlo_doctor.hlo.ir.SourceLocation`, skipping frames of jax, torch,
torch_xla, xla, site-packages and the runner's bootstrap (its
``sitecustomize.py`` wraps the sharding calls).

:func:`frames_of` is the instruction's whole frame chain, innermost first
(the parser resolves ``stack_frame_id`` through the module's tables).

:func:`module_path_of` is the ``nn.Module`` an op of a torch_xla program belongs
to, when the runner wrote its path into the op_name
(``model.layers.0.self_attn.o_proj/aten__mm``); :func:`split_module_path`
splits such an op_name into the path and the op's own name.
"""

from __future__ import annotations

import re

from hlo_doctor.hlo.ir import Instruction, SourceLocation, StackFrame, StackFrameTables

__all__ = ["frames_of", "helper_lines", "is_library_file", "module_path_of", "split_module_path", "user_frame", "user_frame_of"]

_LIBRARY = re.compile(
    r"(?:^|/)(?:site-packages|dist-packages|jax|jaxlib|torch|torch_xla|xla|flax|optax|haiku"
    r"|equinox|_pytest|pluggy|importlib)/"
    r"|(?:^|/)(?:sitecustomize\.py|runpy\.py)$|^<"
)


# "<module path>/<torch_xla op name>": torch_xla's op names start with aten__, xla__ or prim__
# (scoped ones read aten__add.14/aten__add), a module path never does; the runner writes only
# paths of word characters, dots and dashes.
_MODULE_OP_NAME = re.compile(r"^(?!(?:aten|xla|prim)__)([\w.-]+)/((?:aten|xla|prim)__.*)$", re.DOTALL)


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


def helper_lines(tables: StackFrameTables) -> frozenset[tuple[str, int]]:
    """The user's lines inside a helper that several lines of the user's code call: across the
    module's frame chains, a user frame whose caller (the next user frame outwards, library frames
    between skipped) is not always the same line. A layer called in a loop from one line is not
    one; a norm called before the attention and before the MLP is. A caller that is also further
    out in another chain of the line is not another call site: JAX traces a rematerialized
    function again from the line that takes the gradient, an outer frame of the first call."""
    callers: dict[tuple[str, int], set[tuple[str, int]]] = {}
    outer: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for frame_id in tables.stack_frames:
        user = [(frame.file, frame.line) for frame in tables.resolve(frame_id)
                if frame.file and not is_library_file(frame.file)]
        for position, line in enumerate(user[:-1]):
            callers.setdefault(line, set()).add(user[position + 1])
            outer.setdefault(line, set()).update(user[position + 2:])
    return frozenset(line for line, called_from in callers.items() if len(called_from - outer[line]) > 1)


def frames_of(instruction: Instruction) -> tuple[StackFrame, ...]:
    """The instruction's frame chain, innermost first (empty when unknown)."""
    source = instruction.source
    return source.frames if source is not None else ()


def user_frame_of(instruction: Instruction) -> StackFrame | None:
    """:func:`user_frame` of the instruction's source location."""
    return user_frame(instruction.source)


def split_module_path(op_name: str | None) -> tuple[str | None, str]:
    """``model.layers.0.self_attn.o_proj/aten__mm`` -> (``model.layers.0.self_attn.o_proj``, ``aten__mm``).

    The runner (torch_xla) prefixes the op_name of the ops each submodule's forward makes
    with the module's path, relative to the model the program calls. An op_name without one
    (``aten__mm``, ``aten__add.14/aten__add``, JAX's ``jit(step)/dot_general``) comes back
    whole, with None.
    """
    if not op_name:
        return None, op_name or ""
    match = _MODULE_OP_NAME.match(op_name)
    if match is None:
        return None, op_name
    return match.group(1), match.group(2)


def module_path_of(instruction: Instruction) -> str | None:
    """The path of the ``nn.Module`` whose forward made ``instruction`` (None: not known).

    Innermost module first: an op inside ``o_proj`` is ``o_proj``'s, not ``self_attn``'s. A
    parameter has none: it takes the path of the first module torch_xla lowers that reads it,
    which for a program input or a tied weight is not where it comes from.
    """
    metadata = instruction.metadata
    if metadata is None or instruction.opcode == "parameter":
        return None
    return split_module_path(metadata.op_name)[0]
