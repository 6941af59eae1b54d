"""Where the program writes a partition spec: the ``P(...)`` a sharding call's value comes from.

A constraint or a parameter's sharding is often written through names
(``h = with_sharding_constraint(h, hidden)`` with ``hidden = NamedSharding(mesh,
P(None, "data"))`` a few lines up, or behind a variant switch). The fix is to
write a different spec *there*. :func:`spec_site` follows the names back from
a call on a line (assignments in the enclosing functions and the module, both
branches of a conditional) to the ``P(...)``/``PartitionSpec(...)`` literals
whose value is the spec the HLO shows, and returns the one site when exactly
one matches.

A spec may also take one dim's axes from a name (``batch = "fsdp" if bad else ("data",
"fsdp")`` read as ``P(batch, None)`` by the input's sharding and by every constraint, through a
dict of specs or a list of shardings): :func:`axes_site` follows that dim's entry back to the
one literal that writes the axes the HLO shows, so that one edit there changes every spec that
reads it. It is given only when every read of that name in the file is that dim's entry of a
spec, so the edit cannot change anything else.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.program.source import call_name, literal_values, parsed_program, program_text

__all__ = ["AxesSite", "SpecSite", "axes_site", "parameter_axes_site", "parameter_spec_site", "parse_spec_text",
           "spec_site"]

Spec = tuple[tuple[str, ...] | None, ...]
_SPEC_CALLS = ("P", "PartitionSpec")
# The sharding calls and where they take the sharding (Equinox's ``eqx.filter_shard(x, sharding)``
# is ``with_sharding_constraint`` over a pytree's arrays).
_SHARDING_ARGUMENT = {"with_sharding_constraint": 1, "device_put": 1, "NamedSharding": 1, "mark_sharding": 2,
                      "ShapeDtypeStruct": 2, "filter_shard": 1}
_MAX_HOPS = 4


@dataclass(frozen=True, slots=True)
class SpecSite:
    """A ``P(...)`` literal of the program: its line and source text, and the spec it writes."""

    line: int
    text: str
    spec: Spec
    line_text: str


@dataclass(frozen=True, slots=True)
class AxesSite:
    """The literal that writes one dim's mesh axes (``"fsdp"``, ``("data", "fsdp")``) for the specs
    that read it, and the variable it is bound to when they read it through one."""

    line: int
    column: int
    text: str
    axes: tuple[str, ...]
    variable: str | None
    line_text: str


def normalize(spec: Spec) -> Spec:
    """Trailing unsplit dims dropped: ``P('x', None)`` and ``P('x')`` write the same spec."""
    values = list(spec)
    while values and values[-1] is None:
        values.pop()
    return tuple(values)


def parse_spec_text(text: str) -> Spec | None:
    """The spec of ``"P('fsdp', None)"`` / ``"('fsdp', None)"`` as the runner records it, or None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Call):
        return _literal_spec(node.args)
    if isinstance(node, ast.Tuple):
        return _literal_spec(node.elts)
    return None


def _literal_spec(nodes: list[ast.expr]) -> Spec | None:
    spec: list[tuple[str, ...] | None] = []
    for node in nodes:
        if isinstance(node, ast.Constant) and node.value is None:
            spec.append(None)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            spec.append((node.value,))
        elif isinstance(node, (ast.Tuple, ast.List)) and (node.elts == [] or literal_values(node.elts, str)):
            spec.append(literal_values(node.elts, str) or ())
        else:
            return None
    return tuple(spec)


def spec_site(path: str | None, line: int, old_spec: Spec) -> SpecSite | None:
    """The one ``P(...)`` literal writing ``old_spec`` that the sharding call on ``line`` reads."""
    tree = parsed_program(path)
    if tree is None:
        return None
    call = _sharding_call(tree, line)
    argument = _sharding_argument(call) if call is not None else None
    if argument is None:
        return None
    return _unique(tree, argument, line, old_spec, path)


def marks_writing(path: str | None, old_spec: Spec) -> list[tuple[int, SpecSite]]:
    """Every ``mark_sharding(name, mesh, spec)`` of the program whose spec literal (followed through
    names) writes ``old_spec``: (the call's line, the literal's :class:`SpecSite`). A dump made without
    the runner records no mark of an input; the program's source does."""
    tree = parsed_program(path)
    if tree is None:
        return []
    found = []
    for call in (c for c in ast.walk(tree) if isinstance(c, ast.Call) and call_name(c) == "mark_sharding"):
        argument = _sharding_argument(call)
        site = _unique(tree, argument, call.lineno, old_spec, path) \
            if call.args and isinstance(call.args[0], ast.Name) and argument is not None else None
        if site is not None:
            found.append((call.lineno, site))
    return found


def _sharding_call(tree: ast.Module, line: int) -> ast.Call | None:
    """The one outermost sharding call on ``line`` (``with_sharding_constraint(x, NamedSharding(...))``
    is one call: the NamedSharding inside it is its argument)."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line
             and call_name(n) in _SHARDING_ARGUMENT]
    inner = {id(m) for c in calls for m in ast.walk(c) if m is not c}
    outer = [c for c in calls if id(c) not in inner]
    return outer[0] if len(outer) == 1 else None


def parameter_spec_site(path: str | None, name: str, old_spec: Spec, function: str | None = None) -> SpecSite | None:
    """The one ``P(...)`` literal writing ``old_spec`` for the sharding of the argument ``name``: the
    program's ``name = jax.ShapeDtypeStruct(..., sharding=...)`` or ``name = jax.device_put(x, ...)``
    (any of them, when the program places it more than once), or, for the traced ``function``,
    its entry of ``jax.jit(function, in_shardings=(...))`` (or of the decorator's)."""
    tree = parsed_program(path)
    if tree is None:
        return None
    candidates = [(made.lineno, argument) for made in _argument_constructions(tree, name)
                  if (argument := _sharding_argument(made.value)) is not None]  # type: ignore[arg-type]
    candidates += _in_shardings_entries(tree, function, name)
    return _unique_of(tree, candidates, old_spec, path)


def argument_line(path: str | None, name: str) -> int | None:
    """The line of the program's one ``name = jax.ShapeDtypeStruct(...)`` / ``jax.device_put(...)``."""
    tree = parsed_program(path)
    made = _argument_constructions(tree, name) if tree is not None else []
    return made[0].lineno if len(made) == 1 else None


def _argument_constructions(tree: ast.Module, name: str) -> list[ast.Assign]:
    """Every ``name = jax.ShapeDtypeStruct(...)`` / ``name = jax.device_put(...)`` of the program."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
            and isinstance(n.value, ast.Call) and call_name(n.value) in ("ShapeDtypeStruct", "device_put")]


def _in_shardings_entries(tree: ast.Module, function: str | None, name: str) -> list[tuple[int, ast.expr]]:
    """The entries for the argument ``name`` of ``function`` in the ``in_shardings`` tuples the
    program jits it with (``jax.jit(function, in_shardings=...)``, ``@partial(jax.jit, in_shardings=...)``)."""
    if not function:
        return []
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    if len(defs) != 1:
        return []
    params = [a.arg for a in defs[0].args.posonlyargs + defs[0].args.args]
    if name not in params:
        return []
    index = params.index(name)
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and call_name(c) == "jit" and c.args
             and isinstance(c.args[0], ast.Name) and c.args[0].id == function]
    calls += [d for d in defs[0].decorator_list if isinstance(d, ast.Call)]
    found = []
    for call in calls:
        given = next((k.value for k in call.keywords if k.arg == "in_shardings"), None)
        if given is None:
            continue
        for line, value, _, _ in _possible_values(tree, given, call.lineno, 0):
            if isinstance(value, (ast.Tuple, ast.List)) and index < len(value.elts) \
                    and not isinstance(value.elts[index], ast.Starred):
                found.append((line, value.elts[index]))
    return found


def _unique_of(tree: ast.Module, candidates: list[tuple[int, ast.expr]], old_spec: Spec,
               path: str | None) -> SpecSite | None:
    """The one spec literal writing ``old_spec`` that any of ``candidates`` (line, expression) may be."""
    wanted = normalize(old_spec)
    found: dict[tuple[int, int], ast.expr] = {}
    for line, node in candidates:
        found.update({(c.lineno, c.col_offset): c for c in _spec_literals(tree, node, line, 0)})
    return _site(found, wanted, path)


def _sharding_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in ("sharding", "shardings", "partition_spec"):
            return keyword.value
    index = _SHARDING_ARGUMENT.get(call_name(call), 1)
    return call.args[index] if index < len(call.args) else None


def _unique(tree: ast.Module, node: ast.expr, line: int, old_spec: Spec, path: str | None) -> SpecSite | None:
    return _unique_of(tree, [(line, node)], old_spec, path)


def _site(found: dict[tuple[int, int], ast.expr], wanted: Spec, path: str | None) -> SpecSite | None:
    matches = [c for c in found.values() if (s := _written_spec(c)) is not None and normalize(s) == wanted]
    if len(matches) != 1 or path is None:
        return None
    call = matches[0]
    source = program_text(path) or ""
    lines = source.splitlines()
    line_text = lines[call.lineno - 1] if call.lineno <= len(lines) else ""
    text = ast.get_source_segment(source, call) or ""
    spec = _written_spec(call)
    assert spec is not None
    return SpecSite(call.lineno, text, spec, line_text)


def _written_spec(node: ast.expr) -> Spec | None:
    """The spec a ``P(...)`` call or a torch_xla tuple partition spec writes, when literal."""
    if isinstance(node, ast.Call):
        return _literal_spec(node.args)
    if isinstance(node, ast.Tuple):
        return _literal_spec(node.elts)
    return None


def _possible_values(tree: ast.Module, node: ast.expr, line: int, hops: int, variable: str | None = None,
                     ) -> Iterator[tuple[int, ast.expr, str | None, int]]:
    """What ``node`` may evaluate to: followed through names (their latest assignment before
    ``line``) and both branches of conditionals, each with the line it is written on, the last
    name it was read through and the hops used (at most ``_MAX_HOPS``)."""
    if hops > _MAX_HOPS:
        return
    if isinstance(node, ast.IfExp):
        yield from _possible_values(tree, node.body, line, hops + 1, variable)
        yield from _possible_values(tree, node.orelse, line, hops + 1, variable)
    elif isinstance(node, ast.Name):
        value = _latest_assignment(tree, node.id, line)
        if value is not None:
            yield from _possible_values(tree, value[1], value[0], hops + 1, node.id)
    else:
        yield line, node, variable, hops


def _spec_literals(tree: ast.Module, node: ast.expr, line: int, hops: int) -> Iterator[ast.expr]:
    """The P(...) calls (or torch_xla spec tuples) ``node`` may evaluate to, following names to
    their latest assignment."""
    for value_line, value, _, used in _possible_values(tree, node, line, hops):
        if isinstance(value, ast.Call) and call_name(value) in _SPEC_CALLS or isinstance(value, ast.Tuple):
            yield value
        elif isinstance(value, ast.Call) and call_name(value) == "NamedSharding" and len(value.args) >= 2:
            yield from _spec_literals(tree, value.args[1], value_line, used + 1)
        elif isinstance(value, ast.Subscript):  # specs[kind], layouts[i % 2]: any of the container's entries
            for entry_line, entry, _, _ in _possible_values(tree, value.value, value_line, used + 1):
                for item in _container_entries(entry):
                    yield from _spec_literals(tree, item, entry_line, used + 1)


def _container_entries(node: ast.expr) -> list[ast.expr]:
    """The values of a dict / list / tuple literal (none for anything else)."""
    if isinstance(node, ast.Dict):
        return [v for v in node.values if v is not None]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e for e in node.elts if not isinstance(e, ast.Starred)]
    return []


# -- one dim's axes, written once and read by several specs -------------------------------

def axes_site(path: str | None, line: int, dim: int, old_axes: tuple[str, ...]) -> AxesSite | None:
    """The one literal writing ``old_axes`` that dim ``dim`` of the spec read by the sharding call
    on ``line`` comes from."""
    tree = parsed_program(path)
    if tree is None:
        return None
    call = _sharding_call(tree, line)
    argument = _sharding_argument(call) if call is not None else None
    if argument is None:
        return None
    return _unique_axes(tree, argument, line, dim, old_axes, path)


def parameter_axes_site(path: str | None, name: str, dim: int, old_axes: tuple[str, ...]) -> AxesSite | None:
    """:func:`axes_site` for the sharding the program writes for the argument ``name`` (as
    :func:`parameter_spec_site` finds it)."""
    tree = parsed_program(path)
    constructions = _argument_constructions(tree, name) if tree is not None else []
    made = constructions[0] if len(constructions) == 1 else None
    argument = _sharding_argument(made.value) if made is not None else None  # type: ignore[arg-type]
    if tree is None or made is None or argument is None:
        return None
    return _unique_axes(tree, argument, made.lineno, dim, old_axes, path)


def _unique_axes(tree: ast.Module, node: ast.expr, line: int, dim: int, old_axes: tuple[str, ...],
                 path: str | None) -> AxesSite | None:
    found: dict[tuple[int, int], tuple[ast.expr, str | None]] = {}
    for spec in _spec_literals(tree, node, line, 0):
        entries = spec.args if isinstance(spec, ast.Call) else spec.elts  # type: ignore[attr-defined]
        if dim < len(entries) and not any(isinstance(e, ast.Starred) for e in entries[:dim + 1]):
            for literal, variable in _axes_literals(tree, entries[dim], spec.lineno):
                if _axes_of(literal) == tuple(old_axes):
                    found[(literal.lineno, literal.col_offset)] = (literal, variable)
    if len(found) != 1 or path is None:
        return None
    literal, variable = next(iter(found.values()))
    if variable is not None and not _read_only_as_entry(tree, variable, dim):
        return None
    source = program_text(path) or ""
    lines = source.splitlines()
    return AxesSite(literal.lineno, literal.col_offset, ast.get_source_segment(source, literal) or "",
                    tuple(old_axes), variable, lines[literal.lineno - 1] if literal.lineno <= len(lines) else "")


def _axes_literals(tree: ast.Module, node: ast.expr, line: int) -> Iterator[tuple[ast.expr, str | None]]:
    """The string / tuple-of-strings literals a spec entry may evaluate to, with the last name
    they were read through."""
    for _, value, variable, _ in _possible_values(tree, node, line, 0):
        if _axes_of(value) is not None:
            yield value, variable


def _axes_of(node: ast.expr) -> tuple[str, ...] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def _read_only_as_entry(tree: ast.Module, variable: str, dim: int) -> bool:
    """Every read of ``variable`` is entry ``dim`` of a ``P(...)`` or of a spec tuple."""
    entries: set[int] = set()
    for node in ast.walk(tree):
        items = node.args if isinstance(node, ast.Call) and call_name(node) in _SPEC_CALLS else \
            node.elts if isinstance(node, ast.Tuple) else None
        item = items[dim] if items is not None and dim < len(items) else None
        if isinstance(item, ast.Name) and item.id == variable:
            entries.add(id(item))
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == variable and isinstance(n.ctx, ast.Load)]
    return bool(reads) and all(id(n) in entries for n in reads)


def _latest_assignment(tree: ast.Module, name: str, line: int) -> tuple[int, ast.expr] | None:
    best: tuple[int, ast.expr] | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.lineno < line and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name \
                and (best is None or node.lineno > best[0]):
            best = (node.lineno, node.value)
    return best
