"""What the user's program says of its mesh, read with ``ast`` when the dump does not.

A dump made without the runner, by a framework that writes no mesh, leaves the
mesh's axes unnamed: :mod:`hlo_doctor.graph.mesh` then infers positional ones
(``axis_0``...). When the program file is at hand (the runner's record, or the
frames of the ops), its mesh constructions name them: ``xs.Mesh(ids, shape,
axis_names)``, ``xs.HybridMesh(..., axis_names=...)``, ``jax.make_mesh(shape,
names)``, ``Mesh(devices, names)`` and Keras' ``DeviceMesh(shape, axis_names)``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import TypeVar

from hlo_doctor.program.locate import READ_LIMIT, current_finder

__all__ = ["call_name", "literal_values", "parsed_program", "program_line", "program_mesh_axes", "program_text",
           "recorded_parameter_path"]

# call name -> the position of its axis names argument (keyword ``axis_names`` always counts)
_MESH_CALLS = {"Mesh": (2, 1), "HybridMesh": (), "make_mesh": (1,), "DeviceMesh": (1,)}


T = TypeVar("T")
Names = tuple[str, ...]
Shape = tuple[int, ...] | None


def _local(path: str | None) -> tuple[str, float] | None:
    """The file read for the recorded ``path`` and its mtime, found and confined by the analysis'
    :class:`~hlo_doctor.program.locate.SourceFinder`; None: not found, not allowed, too big."""
    local = current_finder().local(path) if path else None
    if local is None:
        return None
    try:
        return str(local), local.stat().st_mtime
    except (OSError, ValueError):
        return None


def parsed_program(path: str | None) -> ast.Module | None:
    """The user's program recorded as ``path`` parsed once per version of the file (None: not
    found here, outside the allowed folders, too big, or not Python)."""
    local = _local(path)
    return _parse(*local) if local is not None else None


def call_name(call: ast.Call) -> str:
    """The called name: ``Mesh`` of ``jax.sharding.Mesh(...)`` and of ``Mesh(...)`` ("" for anything else)."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def program_text(path: str | None) -> str | None:
    """The text of the user's program recorded as ``path`` (as :func:`parsed_program` reads it), or None."""
    local = _local(path)
    return _read(*local) if local is not None else None


def program_line(path: str | None, line: int) -> str:
    """Line ``line`` (1-based) of the user's program recorded as ``path``; "" when not read."""
    local = _local(path) if line > 0 else None
    lines = _lines(*local) if local is not None else ()
    return lines[line - 1] if line <= len(lines) else ""


@functools.lru_cache(maxsize=32)
def _read(path: str, mtime: float) -> str | None:
    try:
        file = Path(path)
        if file.stat().st_size > READ_LIMIT:
            return None
        return file.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=32)
def _lines(path: str, mtime: float) -> tuple[str, ...]:
    text = _read(path, mtime)
    return tuple(text.splitlines()) if text is not None else ()


@functools.lru_cache(maxsize=32)
def _parse(path: str, mtime: float) -> ast.Module | None:
    text = _read(path, mtime)
    try:
        return ast.parse(text) if text is not None else None
    except (SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=32)
def _mesh_axes(tree: ast.Module) -> tuple[tuple[Names, Shape], ...]:
    found: list[tuple[Names, Shape]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = call_name(node)
        if name not in _MESH_CALLS:
            continue
        candidates = [kw.value for kw in node.keywords if kw.arg in ("axis_names", "names")]
        candidates += [node.args[i] for i in _MESH_CALLS[name] if i < len(node.args)]
        for candidate in candidates:
            names = _strings(candidate)
            if names:
                entry = (names, _shape(node))
                if entry not in found:
                    found.append(entry)
                break
    return tuple(found)


def _shape(call: ast.Call) -> Shape:
    """The mesh shape a construction writes as literal ints: its shape argument, or ``.reshape(...)`` of its devices."""
    nodes = [kw.value for kw in call.keywords if kw.arg in ("shape", "mesh_shape", "axis_shapes")]
    nodes += list(call.args[:2])
    for node in nodes:
        if isinstance(node, (ast.Tuple, ast.List)):
            ints = literal_values(node.elts, int)
            if ints:
                return ints
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "reshape":
            args = node.args[0].elts if len(node.args) == 1 and isinstance(node.args[0], ast.Tuple) else node.args
            ints = literal_values(args, int)
            if ints:
                return ints
    return None


def literal_values(elements: list[ast.expr], kind: type[T]) -> tuple[T, ...] | None:
    """The values of ``elements`` when every one is a literal of ``kind`` (and there is one), else None."""
    values = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, kind)]
    return tuple(values) if elements and len(values) == len(elements) else None


def _strings(node: ast.expr) -> tuple[str, ...] | None:
    return literal_values(node.elts, str) if isinstance(node, (ast.Tuple, ast.List)) else None


def program_mesh_axes(path: str | None, sizes: tuple[int, ...]) -> Names | None:
    """The axis names of the one mesh of this shape that the program at ``path`` builds, if one.

    A construction counts when it writes the same shape as literal ints, or, for a 1-D mesh,
    when it names one axis (nothing to misorder).
    """
    tree = parsed_program(path)
    if tree is None:
        return None
    matching = {names for names, shape in _mesh_axes(tree)
                if len(names) == len(sizes) and (shape == sizes or (shape is None and len(sizes) == 1))}
    return next(iter(matching)) if len(matching) == 1 else None


_NNX_STATE = re.compile(r"^(\w+)\.states\[\d+\]\[(\d+)\]$")
_KERAS_STATE = re.compile(r"^state\[(\d+)\]\[(\d+)\]$")


def recorded_parameter_path(record: dict | None, traced: str | None, op_name: str | None,
                            shape: tuple[int, ...] | None) -> str | None:
    """The variable path of a positionally named parameter, from the runner's record.

    ``nnx.jit`` names its parameters ``model.states[0][i]``; the runner records the state
    leaves of each ``nnx.jit`` call in that order (``blocks/0/w_in/kernel``). Keras 3's JAX
    trainer names them ``state[g][i]``: variable ``i`` of group ``g`` of the state its jitted
    ``train_step``/``test_step``/``predict_step`` gets (trainable variables first), which the
    runner records per function (``keras.states``). The entry counts only when its function is
    the traced one and its shape is the parameter's.
    """
    if not isinstance(record, dict) or not op_name:
        return None
    keras = _KERAS_STATE.match(op_name)
    if keras is not None:
        return _keras_state_path(record, traced, int(keras.group(1)), int(keras.group(2)), shape)
    match = _NNX_STATE.match(op_name)
    if match is None:
        return None
    argument, index = match.group(1), int(match.group(2))
    for call in record.get("nnx_jit_calls") or ():
        if not isinstance(call, dict) or str(call.get("function", "")).rsplit(".", 1)[-1] != traced:
            continue
        for recorded in call.get("arguments") or ():
            if not isinstance(recorded, dict) or recorded.get("name") != argument:
                continue
            for leaf in recorded.get("leaves") or ():
                if isinstance(leaf, dict) and leaf.get("index") == index and leaf.get("path"):
                    return _if_shape(leaf, shape)
    return None


def _keras_state_path(record: dict, traced: str | None, group: int, index: int,
                      shape: tuple[int, ...] | None) -> str | None:
    keras = record.get("keras")
    states = keras.get("states") if isinstance(keras, dict) else None
    for state in states if isinstance(states, list) else ():
        if not isinstance(state, dict) or state.get("function") != traced:
            continue
        groups = state.get("groups")
        if not isinstance(groups, list) or group >= len(groups) or not isinstance(groups[group], dict):
            continue
        variables = groups[group].get("variables")
        if isinstance(variables, list) and index < len(variables) and isinstance(variables[index], dict):
            path = _if_shape(variables[index], shape, required=True)
            if path is not None:
                return path
    return None


def _if_shape(entry: dict, shape: tuple[int, ...] | None, required: bool = False) -> str | None:
    """The entry's path, unless its recorded shape differs from the parameter's (or, ``required``,
    either shape is unknown)."""
    path = entry.get("path")
    recorded = entry.get("shape")
    if not path:
        return None
    if shape is None or not isinstance(recorded, list):
        return None if required else str(path)
    return str(path) if tuple(recorded) == tuple(shape) else None
