"""Sharding code for suggestions, written with the program's own mesh axis names."""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hlo_doctor.findings import SourceEdit
from hlo_doctor.program.locate import current_finder
from hlo_doctor.program.source import call_name, parsed_program

DimAxes = Sequence[str] | None  # the mesh axes one tensor dim is sharded over (None: not sharded)

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import Instruction


def argument_name(param: Instruction) -> str:
    """How the user knows an entry parameter: JAX records the argument name (``x``) as
    its ``op_name``; otherwise (torch_xla, other tools) the parameter's HLO name."""
    metadata = param.metadata
    if metadata is not None and metadata.op_name and "/" not in metadata.op_name and metadata.op_type is None:
        return metadata.op_name
    return param.name


def python_identifier(name: str, default: str = "param") -> str:
    """``name`` made into a Python identifier for suggested code (``default`` when nothing is left)."""
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned if cleaned and not cleaned[0].isdigit() else default


def _axes_text(axes: DimAxes) -> str:
    if not axes:
        return "None"
    if len(axes) == 1:
        return repr(axes[0])
    return "(" + ", ".join(repr(a) for a in axes) + ")"


def jax_spec(dims: Sequence[DimAxes]) -> str:
    """``P(('fsdp', 'replica'), None)``."""
    return "P(" + ", ".join(_axes_text(a) for a in dims) + ")"


def torch_spec(dims: Sequence[DimAxes]) -> str:
    """``(('fsdp', 'replica'), None)`` (torch_xla partition spec)."""
    inner = ", ".join(_axes_text(a) for a in dims)
    return f"({inner},)" if len(dims) == 1 else f"({inner})"


def constraint_code(dims: Sequence[DimAxes], value: str = "x") -> tuple[str, str]:
    """(JAX, torch_xla) code that constrains ``value`` to the spec."""
    return (
        f"{value} = jax.lax.with_sharding_constraint({value}, NamedSharding(mesh, {jax_spec(dims)}))",
        f"xs.mark_sharding({value}, mesh, {torch_spec(dims)})",
    )


def parameter_code(dims: Sequence[DimAxes], value: str = "param") -> tuple[str, str]:
    """(JAX, torch_xla) code that places a parameter with the spec."""
    jax_code = f"{value} = jax.device_put({value}, NamedSharding(mesh, {jax_spec(dims)}))  # or jit's in_shardings"
    return (jax_code, f"xs.mark_sharding({value}, mesh, {torch_spec(dims)})")


def spec_tuple(dims: Sequence[DimAxes]) -> tuple[tuple[str, ...] | None, ...]:
    """A partition spec as :class:`~hlo_doctor.findings.SourceEdit` holds it: per dim, its axes or None."""
    return tuple(tuple(a) if a else None for a in dims)


def constraint_edit(dims: Sequence[DimAxes], framework: str | None, value: str = "h",
                    **where: object) -> tuple[SourceEdit, ...]:
    """The edit that constrains ``value`` to the spec right after the line that assigns it, in the
    dump's framework (none when the framework is not known: the two spell it differently)."""
    if framework not in ("jax", "torch_xla") or any(a.startswith("<") for axes in dims if axes for a in axes):
        return ()  # a placeholder axis ("<axes of x's batch>") is not code
    return (SourceEdit("constrain", framework, target=value, spec=spec_tuple(dims), **where),)  # type: ignore[arg-type]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# -- the user's own variable ---------------------------------------------------------

@functools.lru_cache(maxsize=32)
def _assignments(tree: ast.Module) -> dict[int, str]:
    """Line -> the one variable its statement assigns, for every line of an assignment."""
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            target = node.target
        else:
            continue
        name = _target_name(target)
        if name is None:
            continue
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            found.setdefault(line, name)
    return found


def _target_name(target: ast.expr) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):  # self.h = ...
        return ast.unparse(target)
    return None


def called_on(path: str | None, line: int | None) -> str | None:
    """The variable a call statement on ``path``:``line`` passes first (``h`` of
    ``xs.mark_sharding(h, mesh, spec)`` or of a helper ``mark(h, spec)``), or None."""
    tree = parsed_program(path) if line else None
    if tree is None or line is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and node.lineno <= line <= (node.end_lineno or node.lineno) and node.value.args:
            first = node.value.args[0]
            return first.id if isinstance(first, ast.Name) else None
    return None


def scan_carry(path: str | None, line: int | None) -> tuple[str, str, int] | None:
    """For a ``lax.scan(body, init, ...)`` call on ``path``:``line`` whose body is a function the
    program defines (once): (that function's name, its carry parameter, the line of its ``def``)."""
    tree = parsed_program(path) if line else None
    if tree is None or line is None:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n) == "scan"
             and n.lineno <= line <= (n.end_lineno or n.lineno) and n.args and isinstance(n.args[0], ast.Name)]
    if len(calls) != 1:
        return None
    body = calls[0].args[0].id  # type: ignore[attr-defined]
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == body]
    parameters = defs[0].args.posonlyargs + defs[0].args.args if len(defs) == 1 else []
    return (body, parameters[0].arg, defs[0].lineno) if parameters else None


def assigned_name(path: str | None, line: int | None) -> str | None:
    """The variable the statement on ``path``:``line`` assigns (``h`` of ``h = x @ w1.T + b1``), or None."""
    tree = parsed_program(path) if line else None
    return _assignments(tree).get(line) if tree is not None and line is not None else None


def rename_value(code: str | None, placeholder: str, name: str) -> str | None:
    """``code`` with the identifier ``placeholder`` written as ``name`` (not an attribute, not a quoted axis)."""
    if code is None or placeholder == name:
        return code
    # not inside quotes: an axis may be spelled like the variable (P('x', None) constrains x)
    return re.sub(rf"(?<![\w.'\"]){re.escape(placeholder)}(?![\w'\"])", lambda _: name, code)


_UNREAD = {
    "missing": "not found on this machine (pass --path-map RECORDED=LOCAL)",
    "outside": "outside the project and the dump (--show-source-anywhere reads it)",
    "too-big": "too big to parse",
}


def _why_unread(recorded: str | None) -> str | None:
    """Why the program file ``recorded`` was not read (None: it was, or nothing names it)."""
    if not recorded:
        return None
    how = current_finder().find(recorded).how
    return _UNREAD.get(how)


def with_user_variable(finding, placeholder: str = "h"):  # noqa: ANN001, ANN201 - a Finding
    """``finding`` with its suggested code written for the variable its source line assigns.

    The rules write a constraint for ``placeholder``; the user's line (``out = x @ w1.T + b1``)
    names the value. When the line assigns nothing (``return self.fc2(h)``), or the dump records no
    line of the user's code, the code writes the visible placeholder ``<activation>`` (never a
    made-up name) and the summary says to bind the line's result to a variable.
    """
    suggestion, source = finding.suggestion, finding.source
    if suggestion is None:
        return finding
    if source is None:  # a constraint needs the line that makes the value, and the line names it
        edits = tuple(e for e in suggestion.edits if not (e.kind == "constrain" and e.file is None))
        jax_code = rename_value(suggestion.jax, placeholder, "<activation>")
        torch_code = rename_value(suggestion.torch_xla, placeholder, "<activation>")
        if len(edits) == len(suggestion.edits) and (jax_code, torch_code) == (suggestion.jax, suggestion.torch_xla):
            return finding
        no_edit = suggestion.no_edit if len(edits) == len(suggestion.edits) else (
            "the dump records no line of your code for this op, so there is no line to constrain it at, and no "
            "variable to name (the code writes <activation>)")
        return dataclasses.replace(finding, suggestion=dataclasses.replace(
            suggestion, edits=edits, jax=jax_code, torch_xla=torch_code, no_edit=no_edit))
    name = assigned_name(source.file, source.line)
    mesh = mesh_expression(source.file, source.line)
    if name is None:  # the line names no value: the code says so with a placeholder, never a made-up name
        unread = _why_unread(source.file)
        note = (f" (line {source.line} assigns no variable: bind its result to a variable and constrain that)"
                if unread is None else f" ({source.file} was not read: {unread}; the variable is unknown)")
        if note in suggestion.summary:
            return finding
        edits = tuple(e for e in suggestion.edits if not (e.kind == "constrain" and e.target == placeholder))
        no_edit = suggestion.no_edit
        if len(edits) < len(suggestion.edits):
            no_edit = (f"line {source.line} assigns no variable to constrain" if unread is None
                       else f"{source.file} was not read here ({unread})")
        jax_code = rename_value(suggestion.jax, placeholder, "<activation>")
        torch_code = rename_value(suggestion.torch_xla, placeholder, "<activation>")
        if mesh is not None and mesh != "mesh":
            jax_code, torch_code = rename_value(jax_code, "mesh", mesh), rename_value(torch_code, "mesh", mesh)
        return dataclasses.replace(finding, suggestion=dataclasses.replace(
            suggestion, summary=suggestion.summary + note, edits=edits, no_edit=no_edit, jax=jax_code,
            torch_xla=torch_code))
    edits = tuple(dataclasses.replace(e, target=name, mesh=mesh) if e.kind == "constrain" and e.target == placeholder
                  and e.file is None else e for e in suggestion.edits)
    jax_code = rename_value(suggestion.jax, placeholder, name)
    torch_code = rename_value(suggestion.torch_xla, placeholder, name)
    if mesh is not None and mesh != "mesh":  # a method reaches the mesh through self
        jax_code, torch_code = rename_value(jax_code, "mesh", mesh), rename_value(torch_code, "mesh", mesh)
    renamed = dataclasses.replace(
        suggestion,
        edits=edits,
        jax=jax_code,
        torch_xla=torch_code,
        summary=rename_value(suggestion.summary, placeholder, name) or suggestion.summary,
    )
    return dataclasses.replace(finding, suggestion=renamed)


# -- the mesh as the line can name it --------------------------------------------------

_MESH_BUILDERS = ("Mesh", "make_mesh", "HybridMesh", "DeviceMesh", "create_device_mesh", "create_hybrid_device_mesh")


@functools.lru_cache(maxsize=32)
def _mesh_bindings(tree: ast.Module) -> tuple[frozenset[str], tuple[ast.FunctionDef | ast.AsyncFunctionDef, ...]]:
    """The names a mesh construction is bound to anywhere in the program, and its functions
    (one walk of the program, not one per finding)."""
    bound = frozenset(t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                      and call_name(n.value) in _MESH_BUILDERS for t in n.targets if isinstance(t, ast.Name))
    functions = tuple(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return bound, functions


@functools.lru_cache(maxsize=256)
def _assigned_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    return frozenset(t.id for n in ast.walk(function) if isinstance(n, ast.Assign) for t in n.targets
                     if isinstance(t, ast.Name))


def mesh_expression(source_file: str | None, line: int | None) -> str | None:
    """How code on ``line`` names the program's mesh: a variable a mesh construction is bound to in
    an enclosing function or the module (``mesh``), a parameter of the enclosing function named
    like that variable, or, in a method, the ``self.`` attribute the class stores it in
    (``self.mesh``). None: the line cannot reach a mesh."""
    tree = parsed_program(source_file)
    if tree is None or line is None:
        return None
    bound, functions = _mesh_bindings(tree)
    if not bound:
        return None
    chain = sorted((n for n in functions if n.lineno <= line <= (n.end_lineno or n.lineno)), key=lambda n: -n.lineno)
    for function in chain:
        names = {a.arg for a in function.args.args + function.args.kwonlyargs}
        names |= _assigned_names(function)
        if names & bound:
            return sorted(names & bound)[0]
    module_level = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if module_level & bound:
        return sorted(module_level & bound)[0]
    if chain and chain[0].args.args and chain[0].args.args[0].arg == "self":
        owner = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and chain[0] in c.body), None)
        stored = {t.attr for n in ast.walk(owner) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
                  and n.value.id in bound for t in n.targets
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                  } if owner is not None else set()
        if len(stored) == 1:
            return f"self.{stored.pop()}"
    return None
