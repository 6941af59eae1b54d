"""Fix code in the program's own terms: never an invented variable, mesh or axis name.

A rule writes its fix for the value it judged (``h = jax.lax.with_sharding_constraint(h,
NamedSharding(mesh, P('axis_0', None)))``) and :func:`~hlo_doctor.program.suggest.with_user_variable`
renames it for the line's variable. What is still not the program's after that is a guess: a
variable the program does not have (``h``, ``x``, the HLO's ``p0_1``), a mesh variable it does not
bind, or a positional axis name (``axis_0``) that :mod:`hlo_doctor.graph.mesh` made up for a dump
that names no mesh, when no mesh construction of the program names it. :func:`in_program_terms`
writes each of those as a visible placeholder (``<activation>``, ``<mesh>``, ``<axis 0>``), drops
the edits that would write a made-up axis, and says in the summary what is missing.

The program's names are every identifier of its files (the script and the finding's own file):
variables, parameters, functions, classes, attributes and imports. Framework names a fix may
import (``jax``, ``xs``, ``P``, ``NamedSharding``...) and Python's builtins are always allowed, as
are the names a snippet defines for itself (a ``def shard_output(output, mesh)`` and its locals).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hlo_doctor.program.source import parsed_program, program_mesh_axes

__all__ = ["FRAMEWORK_NAMES", "PLACEHOLDER", "code_names", "in_program_terms", "mesh_axes_in", "mesh_axes_of_shape",
           "program_names"]

PLACEHOLDER = re.compile(r"<[^<>\n]+>")
"""A visible placeholder in fix code: ``<activation>``, ``<mesh>``, ``<axis 0>``."""

FRAMEWORK_NAMES = frozenset({
    "jax", "jnp", "np", "numpy", "lax", "P", "PartitionSpec", "NamedSharding", "Mesh", "mesh_utils", "nn", "nnx",
    "flax", "optax", "keras", "keras_hub", "torch", "torch_xla", "xs", "xm", "xr", "FSDPv2",
    "SpmdFullyShardedDataParallel", "checkpoint_module", "os", "functools",
}) | frozenset(dir(builtins))
"""Names a fix may use without the program having them: framework modules and classes the fix
imports, and Python's builtins."""

# Which role a name plays in fix code, by the call it is passed to: (call name, argument position).
_MESH_SLOTS = {("NamedSharding", 0), ("mark_sharding", 1), ("Mesh", -1)}
_VALUE_PLACEHOLDER = {
    "non-batch-dim-sharding": "<activation>", "activation-all-gather": "<activation>", "reshard-churn": "<activation>",
    "uneven-sharding-padding": "<activation>", "replicated-batch": "<batch input>",
    "replicated-large-parameter": "<parameter>", "exceeds-device-memory": "<parameter>",
    "replicated-optimizer-state": "<optimizer state>",
}


@functools.lru_cache(maxsize=32)
def _tree_names(tree: ast.Module) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return frozenset(names)


def program_names(paths: Iterable[str | None]) -> frozenset[str] | None:
    """Every identifier of the program files at ``paths`` (None: none of them could be read)."""
    trees = [t for t in (parsed_program(p) for p in dict.fromkeys(paths) if p) if t is not None]
    if not trees:
        return None
    return frozenset().union(*(_tree_names(t) for t in trees))


_MESH_NAMES_AT = {"Mesh": 2, "make_mesh": 1, "DeviceMesh": 1}
_OPERATORS = {ast.FloorDiv: lambda a, b: a // b if b else None, ast.Mult: lambda a, b: a * b,
              ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b}


def _constant(node: ast.expr, constants: Mapping[str, int]) -> int | None:
    """The int an expression of literals and the module's int constants is (``DEVICES // 2``)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _constant(node.left, constants), _constant(node.right, constants)
        return None if left is None or right is None else _OPERATORS[type(node.op)](left, right)
    return None


def mesh_axes_of_shape(path: str | None, sizes: Sequence[int]) -> tuple[str, ...] | None:
    """The axis names of the one mesh construction of the program whose shape is ``sizes`` (None:
    none or several). The shape is its shape argument, or the ``.reshape(...)`` of its devices,
    written with literals and module-level int constants (``(2, DEVICES // 2)``). An axis written
    with size 1 is left out (a dump never shows it: ``Mesh(devices.reshape(n, 1), ('fsdp',
    'replica'))`` is a mesh of one axis, 'fsdp'), and a size the source does not fix (``n``)
    matches any size, its place in the construction telling which."""
    tree = parsed_program(path)
    if tree is None:
        return None
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and type(n.value.value) is int
                 for t in n.targets if isinstance(t, ast.Name)}
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in _MESH_NAMES_AT:
            continue
        at = _MESH_NAMES_AT[name]
        if name == "Mesh" and len(node.args) < 3:  # JAX's Mesh(devices, axis_names), not xs.Mesh(ids, shape, names)
            at = 1
        names_node = next((k.value for k in node.keywords if k.arg in ("axis_names", "names")), None)
        if names_node is None and len(node.args) > at:
            names_node = node.args[at]
        shape_node = next((k.value for k in node.keywords if k.arg in ("shape", "mesh_shape", "axis_shapes",
                                                                       "devices")), None)
        if shape_node is None and len(node.args) > at - 1:
            shape_node = node.args[at - 1]
        dims = _shape_elements(shape_node)
        if not isinstance(names_node, (ast.Tuple, ast.List)) or dims is None:
            continue
        names = [e.value for e in names_node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(names) != len(names_node.elts) or len(names) != len(dims):
            continue
        shape = [_constant(e, constants) for e in dims]
        if len(names) == len(sizes) and shape == list(sizes):
            found.add(tuple(names))
            continue
        kept = [(axis, size) for axis, size in zip(names, shape, strict=True) if size != 1]
        if len(kept) == len(sizes) and all(size in (None, want) for (_, size), want in zip(kept, sizes, strict=True)):
            found.add(tuple(axis for axis, _ in kept))
    return found.pop() if len(found) == 1 else None


def _shape_elements(node: ast.expr | None) -> list[ast.expr] | None:
    """The dims a mesh construction's shape argument writes: a tuple or list, or the arguments of
    the ``.reshape(...)`` its devices argument ends with."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return list(node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "reshape":
        if len(node.args) == 1 and isinstance(node.args[0], (ast.Tuple, ast.List)):
            return list(node.args[0].elts)
        return list(node.args) or None
    return None


def mesh_axes_in(paths: Iterable[str | None], sizes: tuple[int, ...]) -> tuple[str, ...] | None:
    """The axis names of the one mesh of shape ``sizes`` that the program's files build, read as
    :func:`~hlo_doctor.program.source.program_mesh_axes` and :func:`mesh_axes_of_shape` read one
    file (the mesh is often built in the script, the model in another file); None when no file
    builds one, or the files build several with different names."""
    found = {names for path in dict.fromkeys(paths) if path
             for names in [program_mesh_axes(path, sizes) or mesh_axes_of_shape(path, sizes)] if names}
    return found.pop() if len(found) == 1 else None


def _parseable(code: str) -> ast.Module | None:
    """``code`` parsed with each placeholder read as a name (None: not Python)."""
    try:
        return ast.parse(PLACEHOLDER.sub(lambda m: "_" * len(m.group(0)), code))
    except SyntaxError:
        return None


def _own_names(tree: ast.Module) -> set[str]:
    """Names the snippet defines for itself: functions, lambda and comprehension variables."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif isinstance(node, ast.comprehension):
            own |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return own


def _free_names(tree: ast.Module) -> list[ast.Name]:
    """The name nodes of the snippet that refer to something outside it: not a function's own
    parameter or local (``def shard_output(output, mesh)``), a lambda's, or a comprehension's."""
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            if not isinstance(node, ast.Lambda):
                local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            inner |= {id(n) for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in local}
    own = _own_names(tree)
    free = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in inner and n.id not in own
            and n.id.strip("_")]
    # A name only assigned (``mesh = jax.make_mesh(...)``, a keyword fragment ``kernel_init=...``)
    # defines what it names; a name read (``h = wsc(h, ...)``) must be the program's.
    read = {n.id for n in free if not isinstance(n.ctx, ast.Store)}
    return [n for n in free if n.id in read]


def code_names(code: str) -> tuple[set[str], set[str]] | None:
    """The names fix ``code`` refers to (placeholders aside), and those used as a mesh; None: not Python."""
    tree = _parseable(code)
    if tree is None:
        return None
    free = _free_names(tree)
    used = {n.id for n in free}
    free_ids = {id(n) for n in free}
    meshes: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        for position, argument in enumerate(node.args):
            if (name, position) in _MESH_SLOTS and id(argument) in free_ids:
                meshes.add(argument.id)  # type: ignore[attr-defined]
        meshes |= {k.value.id for k in node.keywords if k.arg == "mesh" and id(k.value) in free_ids}  # type: ignore[attr-defined]
    return used, meshes


def _rename(code: str | None, renames: dict[str, str]) -> str | None:
    """``code`` with each free name of ``renames`` written as its placeholder: in the code (the
    snippet's own parameters and keyword names stay) and in its comments."""
    if code is None or not renames:
        return code
    tree = _parseable(code)
    if tree is None:
        return code
    lines = code.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    spans = sorted(((starts[n.lineno - 1] + n.col_offset, len(n.id), renames[n.id]) for n in _free_names(tree)
                    if n.id in renames), reverse=True)
    for start, length, placeholder in spans:  # columns are of the UTF-8 text; fix code is ASCII
        code = code[:start] + placeholder + code[start + length:]
    renamed = []
    for line in code.split("\n"):
        head, hash_, comment = line.partition("#")
        for name, placeholder in renames.items():
            comment = re.sub(rf"(?<![\w.'\"<]){re.escape(name)}(?![\w'\">])", placeholder, comment)
        renamed.append(head + hash_ + comment)
    return "\n".join(renamed)


def _axis_placeholder(index: int) -> str:
    return f"<axis {index}>"


def _unaxed(code: str | None, positional: Sequence[str]) -> str | None:
    """``code`` with each quoted positional axis name written as its placeholder."""
    if code is None:
        return None
    for index, axis in enumerate(positional):
        code = re.sub(rf"(['\"]){re.escape(axis)}\1", _axis_placeholder(index), code)
    return code


def _edit_axes(edit: Any) -> set[str]:
    axes: set[str] = set()
    for spec in (edit.spec, edit.old_spec):
        for dim in spec or ():
            axes |= set(dim or ())
    for key in ("axis_names", "mesh_axes"):
        value = edit.details.get(key) if edit.details else None
        if isinstance(value, (tuple, list)):
            axes |= {a for a in value if isinstance(a, str)}
    return axes


def in_program_terms(finding: Any, programs: Iterable[str | None], positional_axes: Sequence[str] = (),
                     framework: str | None = None) -> Any:
    """``finding`` with its fix code naming only what the program names (module docstring).

    ``programs``: the program's files (the script, the finding's file); ``positional_axes``: the
    made-up names of a mesh the dump does not name and no mesh construction of the program names
    (empty when the names are the program's: the rule context's mesh already carries the names a
    construction gives, see :func:`mesh_axes_in`), written as placeholders; ``framework``: the dump's
    (``jax``, ``torch_xla``), whose code the reports print: the summary tells only what that code
    lacks (both codes get placeholders)."""
    suggestion = finding.suggestion
    if suggestion is None or not (suggestion.jax or suggestion.torch_xla):
        return finding
    source = finding.source
    known = program_names([*programs, source.file if source is not None else None])
    missing: list[str] = []
    jax_code, torch_code = suggestion.jax, suggestion.torch_xla
    edits, no_edit = suggestion.edits, suggestion.no_edit
    made_up = [a for a in positional_axes if any(re.search(rf"(['\"]){re.escape(a)}\1", c or "")
                                                   for c in (jax_code, torch_code))]
    if made_up:
        jax_code, torch_code = _unaxed(jax_code, positional_axes), _unaxed(torch_code, positional_axes)
        missing.append("the mesh axis names (the dump names none and no mesh construction of the program "
                       "names them: " + ", ".join(f"{_axis_placeholder(positional_axes.index(a))} is {a}"
                                                  for a in made_up) + ")")
        kept = tuple(e for e in edits if not _edit_axes(e) & set(positional_axes))
        if len(kept) < len(edits):
            edits, no_edit = kept, no_edit or ("the dump names no mesh axes and the program's mesh construction "
                                               "does not name them: write your mesh's axis names in the code")
    renames: dict[str, str] = {}
    spoken: dict[str, set[str]] = {}  # name -> the frameworks whose code uses it
    for label, code in (("JAX", jax_code), ("torch_xla", torch_code)):
        read = code_names(code) if code else None
        if read is None:
            continue
        used, meshes = read
        for name in sorted(used - FRAMEWORK_NAMES - (known or frozenset())):
            spoken.setdefault(name, set()).add(label)
            if name in meshes or "mesh" in name.lower():
                renames.setdefault(name, "<mesh>")
            elif name in ("model", "module", "layer"):
                renames.setdefault(name, f"<{name}>")
            else:
                renames.setdefault(name, _VALUE_PLACEHOLDER.get(finding.rule, "<value>"))
    jax_code, torch_code = _rename(jax_code, renames), _rename(torch_code, renames)
    shown = {"jax": "JAX", "torch_xla": "torch_xla"}.get(framework or "")
    told = {n for n in renames if shown is None or shown in spoken.get(n, set())}
    values = sorted(n for n, p in renames.items() if p != "<mesh>" and n in told)
    if values:
        where = "the program could not be read" if known is None else "the program has no such name"
        missing.append(f"the variable{_in_code(spoken, values)} ({', '.join(values)}: {where}; written "
                       f"{', '.join(dict.fromkeys(renames[n] for n in values))})")
    meshes_renamed = [n for n, p in renames.items() if p == "<mesh>" and n in told]
    if meshes_renamed:
        missing.append(f"the mesh variable{_in_code(spoken, meshes_renamed)} (written <mesh>)")
    if not missing:
        if renames:  # placeholders in the other framework's code only: nothing to tell
            return dataclasses.replace(finding, suggestion=dataclasses.replace(
                suggestion, jax=jax_code, torch_xla=torch_code, edits=edits, no_edit=no_edit))
        return finding
    summary = suggestion.summary + " Not known from the program: " + "; ".join(missing) + "."
    return dataclasses.replace(finding, suggestion=dataclasses.replace(
        suggestion, summary=summary, jax=jax_code, torch_xla=torch_code, edits=edits, no_edit=no_edit))


def _in_code(spoken: Mapping[str, set[str]], names: Sequence[str]) -> str:
    """`` of the JAX code`` when only one framework's code uses ``names`` (the other's is the program's)."""
    frameworks = set().union(*(spoken.get(n, set()) for n in names))
    return f" of the {frameworks.pop()} code" if len(frameworks) == 1 else ""
