"""Where the program writes a partition spec: the ``P(...)`` a sharding call's value comes from.

A constraint or a parameter's sharding is often written through names
(``h = with_sharding_constraint(h, hidden)`` with ``hidden = NamedSharding(mesh,
P(None, "data"))`` a few lines up, or behind a variant switch). The fix is to
write a different spec *there*. :func:`spec_site` follows the names back from
a call on a line (assignments in the enclosing functions and the module, both
branches of a conditional) to the ``P(...)``/``PartitionSpec(...)`` literals
whose value is the spec the HLO shows, and returns the one site when exactly
one matches.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.rules._program import call_name, parsed_program, program_text

__all__ = ["SpecSite", "parameter_spec_site", "parse_spec_text", "spec_site"]

Spec = tuple[tuple[str, ...] | None, ...]
_SPEC_CALLS = ("P", "PartitionSpec")
_SHARDING_ARGUMENT = {"with_sharding_constraint": 1, "device_put": 1, "NamedSharding": 1, "mark_sharding": 2,
                      "ShapeDtypeStruct": 2}
_MAX_HOPS = 4


@dataclass(frozen=True, slots=True)
class SpecSite:
    """A ``P(...)`` literal of the program: its line and source text, and the spec it writes."""

    line: int
    text: str
    spec: Spec
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
        elif isinstance(node, (ast.Tuple, ast.List)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            spec.append(tuple(e.value for e in node.elts))  # type: ignore[union-attr]
        else:
            return None
    return tuple(spec)


def spec_site(path: str | None, line: int, old_spec: Spec) -> SpecSite | None:
    """The one ``P(...)`` literal writing ``old_spec`` that the sharding call on ``line`` reads."""
    tree = parsed_program(path)
    if tree is None:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line
             and call_name(n) in _SHARDING_ARGUMENT]
    if len(calls) != 1:
        return None
    argument = _sharding_argument(calls[0])
    if argument is None:
        return None
    return _unique(tree, argument, line, old_spec, path)


def parameter_spec_site(path: str | None, name: str, old_spec: Spec) -> SpecSite | None:
    """The one ``P(...)`` literal writing ``old_spec`` for the sharding of the argument ``name``: the
    program's ``name = jax.ShapeDtypeStruct(..., sharding=...)`` or ``name = jax.device_put(x, ...)``."""
    tree = parsed_program(path)
    if tree is None:
        return None
    made = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
            and isinstance(n.value, ast.Call) and call_name(n.value) in ("ShapeDtypeStruct", "device_put")]
    if len(made) != 1:
        return None
    argument = _sharding_argument(made[0].value)  # type: ignore[arg-type]
    return _unique(tree, argument, made[0].lineno, old_spec, path) if argument is not None else None


def _sharding_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg in ("sharding", "shardings", "partition_spec"):
            return keyword.value
    index = _SHARDING_ARGUMENT.get(call_name(call), 1)
    return call.args[index] if index < len(call.args) else None


def _unique(tree: ast.Module, node: ast.expr, line: int, old_spec: Spec, path: str | None) -> SpecSite | None:
    wanted = normalize(old_spec)
    found = {(c.lineno, c.col_offset): c for c in _spec_literals(tree, node, line, 0)}
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


def _spec_literals(tree: ast.Module, node: ast.expr, line: int, hops: int) -> Iterator[ast.expr]:
    """The P(...) calls (or torch_xla spec tuples) ``node`` may evaluate to, following names to
    their latest assignment."""
    if hops > _MAX_HOPS:
        return
    if isinstance(node, ast.Call) and call_name(node) in _SPEC_CALLS or isinstance(node, ast.Tuple):
        yield node
    elif isinstance(node, ast.Call) and call_name(node) == "NamedSharding" and len(node.args) >= 2:
        yield from _spec_literals(tree, node.args[1], line, hops + 1)
    elif isinstance(node, ast.IfExp):
        yield from _spec_literals(tree, node.body, line, hops + 1)
        yield from _spec_literals(tree, node.orelse, line, hops + 1)
    elif isinstance(node, ast.Name):
        value = _latest_assignment(tree, node.id, line)
        if value is not None:
            yield from _spec_literals(tree, value[1], value[0], hops + 1)


def _latest_assignment(tree: ast.Module, name: str, line: int) -> tuple[int, ast.expr] | None:
    best: tuple[int, ast.expr] | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.lineno < line and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name \
                and (best is None or node.lineno > best[0]):
            best = (node.lineno, node.value)
    return best
