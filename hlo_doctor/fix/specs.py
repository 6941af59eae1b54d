"""Partition specs as the program writes them, and the ``respec`` edit.

A spec is a tuple of :data:`~hlo_doctor.findings.DimAxes` (per dim: the mesh axes, major
first, or None). :func:`entries` writes it in the program's quote style (``"fsdp"``,
``("fsdp", "replica")``, ``None``); :func:`from_literal` reads one back from a ``P(...)`` call
or a ``mark_sharding`` tuple; :func:`same` compares two, trailing Nones ignored
(``P("fsdp")`` and ``P("fsdp", None)`` shard a matrix the same way).
:func:`reaxes` is the ``axes`` edit: one dim's axes written once, as a string or a tuple of
strings (``batch = "fsdp" if bad else ...``), rewritten where they are written.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from hlo_doctor.findings import DimAxes
from hlo_doctor.fix.locate import CannotEdit, Source, dotted, is_literal, literal

__all__ = ["axes_code", "entries", "from_literal", "reaxes", "respec", "same", "tuple_code"]

Spec = tuple[DimAxes, ...]


def _string(value: str, quote: str) -> str:
    if "\\" in value and quote not in value and not value.endswith("\\") and "\n" not in value:
        return "r" + quote + value + quote  # a regex reads best raw: r"block_\d+/kernel"
    return quote + value.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


def axes_code(axes: DimAxes | str, quote: str) -> str:
    """One dim's entry: None, ``"a"`` or ``("a", "b")``."""
    if axes is None:
        return "None"
    if isinstance(axes, str):
        return _string(axes, quote)
    if len(axes) == 1:
        return _string(axes[0], quote)
    return "(" + ", ".join(_string(a, quote) for a in axes) + ")"


def entries(spec: Spec, quote: str) -> str:
    return ", ".join(axes_code(axes, quote) for axes in spec)


def tuple_code(spec: Spec, quote: str) -> str:
    """A spec as a tuple literal, as ``mark_sharding`` and Keras take it."""
    inner = entries(spec, quote)
    return f"({inner},)" if len(spec) == 1 else f"({inner})"


def normalize(spec: Sequence[object]) -> Spec | None:
    """A literal spec (strings, None, tuples of strings) as a Spec; None when it is not one."""
    out: list[DimAxes] = []
    for entry in spec:
        if entry is None:
            out.append(None)
        elif isinstance(entry, str):
            out.append((entry,))
        elif isinstance(entry, tuple) and all(isinstance(a, str) for a in entry):
            out.append(tuple(entry) if entry else None)
        else:
            return None
    return tuple(out)


def same(a: Sequence[DimAxes] | None, b: Sequence[DimAxes] | None) -> bool:
    if a is None or b is None:
        return a is b
    a_norm, b_norm = normalize(a), normalize(b)
    if a_norm is None or b_norm is None:
        return False
    trim = lambda s: tuple(s[: max([i + 1 for i, x in enumerate(s) if x is not None], default=0)])  # noqa: E731
    return trim(a_norm) == trim(b_norm)


def from_literal(args: Sequence[cst.Arg]) -> Spec | None:
    """The spec written by ``P(...)``'s arguments, None when they are not all literal."""
    values = []
    for arg in args:
        if arg.star or arg.keyword is not None:
            return None
        value = literal(arg.value)
        if not is_literal(value):
            return None
        values.append(value)
    return normalize(values)


def _pspec_names(source: Source) -> set[str]:
    from hlo_doctor.fix.imports import Imports

    names = {"PartitionSpec", "jax.sharding.PartitionSpec", "sharding.PartitionSpec"}
    names.update(local for local, full in Imports(source).names.items() if full.endswith(".PartitionSpec"))
    return names


def candidates(source: Source, line: int) -> list[tuple[cst.CSTNode, Spec, str | None]]:
    """Every partition spec written on ``line``: (the node to rewrite, its spec, the tensor it is
    for when the call says)."""
    found: list[tuple[cst.CSTNode, Spec, str | None]] = []
    pspec = _pspec_names(source)
    for call in source.calls_on(line):
        name = dotted(call.func) or ""
        if name in pspec:
            spec = from_literal(call.args)
            if spec is not None:
                found.append((call, spec, _assigned_to(source, call)))
        elif name.rsplit(".", 1)[-1] == "mark_sharding" and len(call.args) >= 3:
            node = call.args[2].value
            value = literal(node)
            spec = normalize(value) if isinstance(value, tuple) else None
            if spec is not None:
                found.append((node, spec, dotted(call.args[0].value)))
    return found


def _assigned_to(source: Source, node: cst.CSTNode) -> str | None:
    statement = source.simple_statement_of(node)
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                return dotted(small.targets[0].target)
    return None


def respec(source: Source, line: int, target: str | None, old: Spec | None, new: Spec,
           ) -> tuple[dict[cst.CSTNode, cst.CSTNode], str]:
    """Rewrite the one spec on ``line`` that reads ``old`` to ``new``; CannotEdit when none or several
    do (or when the line already writes ``new``)."""
    quote = source.quote()
    found = candidates(source, line)
    if not found:
        raise CannotEdit(f"line {line} writes no literal partition spec (P(...) or a mark_sharding tuple)")
    matching = [c for c in found if old is None or same(c[1], old)]
    if old is None and len(found) > 1:
        matching = []
    if len(matching) > 1 and target is not None:
        named = [c for c in matching if c[2] == target]
        matching = named or matching
    if not matching:
        if any(same(c[1], new) for c in found):
            raise CannotEdit(f"line {line} already writes {entries(new, quote) or '()'} (already applied?)")
        written = "; ".join(f"({entries(c[1], quote)})" for c in found)
        raise CannotEdit(f"no partition spec on line {line} reads ({entries(old or (), quote)}): it writes {written}")
    if len(matching) > 1:
        raise CannotEdit(f"line {line} writes ({entries(matching[0][1], quote)}) {len(matching)} times: "
                         "which one is meant is ambiguous")
    node, spec, _ = matching[0]
    if isinstance(node, cst.Call):
        parsed = cst.parse_expression(f"f({entries(new, quote)})")
        assert isinstance(parsed, cst.Call)
        replacement: cst.CSTNode = node.with_changes(args=parsed.args)
    else:
        replacement = cst.parse_expression(tuple_code(new, quote))
    written = cst.Module([]).code_for_node(replacement)
    return {node: replacement}, f"line {line}: {cst.Module([]).code_for_node(node)} -> {written}"


def _axes_value(node: cst.CSTNode) -> tuple[str, ...] | None:
    value = literal(node) if isinstance(node, cst.BaseExpression) else None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def reaxes(source: Source, line: int, variable: str | None, old: DimAxes, new: DimAxes,
           ) -> tuple[dict[cst.CSTNode, cst.CSTNode], str]:
    """Rewrite the one literal on ``line`` that writes the axes ``old`` (in the assignment of
    ``variable`` when one is named) to ``new``; CannotEdit when none or several do."""
    if not old or not new:
        raise CannotEdit("the edit names no axes to rewrite")
    statement = source.statement_at(line)
    scope: cst.CSTNode = statement
    if variable is not None and isinstance(statement, cst.SimpleStatementLine):
        assigns = [s for s in statement.body if isinstance(s, cst.Assign)
                   and any(dotted(t.target) == variable for t in s.targets)]
        if len(assigns) != 1:
            raise CannotEdit(f"line {line} does not assign {variable}")
        scope = assigns[0].value
    nodes = [n for n in source.walk(scope) if isinstance(n, (cst.SimpleString, cst.ConcatenatedString, cst.Tuple,
                                                                cst.List)) and source.lines(n)[0] == line]
    axes = [n for n in nodes if _axes_value(n) is not None]
    inner = {id(m) for n in axes for m in source.walk(n) if m is not n}  # "fsdp" of ("data", "fsdp")
    nodes = [n for n in axes if id(n) not in inner]
    writes = [n for n in nodes if _axes_value(n) == tuple(old)]
    quote = source.quote()
    if not writes:
        if any(_axes_value(n) == tuple(new) for n in nodes):
            raise CannotEdit(f"line {line} already writes {axes_code(new, quote)} (already applied?)")
        raise CannotEdit(f"line {line} writes no {axes_code(old, quote)}")
    if len(writes) > 1:
        raise CannotEdit(f"line {line} writes {axes_code(old, quote)} {len(writes)} times: which one is meant is "
                         "ambiguous")
    node = writes[0]
    replacement = cst.parse_expression(axes_code(new, quote))
    return {node: replacement}, (f"line {line}: {cst.Module([]).code_for_node(node)} -> "
                                 f"{cst.Module([]).code_for_node(replacement)}"
                                 + (f" (the axes {variable} holds)" if variable else ""))
