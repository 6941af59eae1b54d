"""Edits of the levers third-party libraries give: Flax logical axis rules, Keras layout maps,
Flax NNX partitioning metadata.

* ``logical-rule``: the rules literal (a list/tuple of ``(logical, mesh axes)`` pairs) written on
  the line, or bound to a name the line uses (followed through plain name-to-name bindings).
  The rule for ``details["logical"]`` gets ``details["mesh_axes"]``; since Flax gives a mesh axis
  to the first rule that claims it, the rule is moved before the first earlier rule that claims
  one of the same mesh axes (or inserted first when missing). The rest is kept in order.
  Refused: no literal (rules chosen at run time, ``A if cond else B``), several, and rules that
  already say so.
* ``layout-map-key``: the ``LayoutMap`` made on the line and the variable it is assigned to get
  ``layout["<key>"] = (<spec>)`` after the last statement of the same block that assigns into it
  (or after the construction). Refused: the key already there.
* ``with-partitioning``: the NNX layer built on the line (a call with ``kernel_init=``, or
  ``details["argument"]``) gets its initializer wrapped in ``nnx.with_partitioning(init, spec)``
  (``nnx.initializers.lecun_normal()`` when it passes none, ``variance_scaling(1.0, "fan_in",
  "normal", out_axis=0)`` for ``nnx.Embed``); ``nnx.Param(init(...))`` becomes
  ``nnx.Param(nnx.with_partitioning(init, spec)(...))``. Refused: already wrapped, no layer.
"""

from __future__ import annotations

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.imports import Imports
from hlo_doctor.fix.locate import CannotEdit, Source, dotted, fit_argument, literal
from hlo_doctor.fix.specs import axes_code, normalize, tuple_code

__all__ = ["layout_map_key", "logical_rule", "with_partitioning"]

_code = cst.Module([]).code_for_node


# -- logical-rule -------------------------------------------------------------------------------
def _is_rules(node: cst.BaseExpression) -> bool:
    value = literal(node)
    return isinstance(value, tuple) and bool(value) and all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
        and (pair[1] is None or isinstance(pair[1], (str, tuple))) for pair in value)


def _rules_literals(source: Source, line: int) -> list[cst.BaseExpression]:
    """The rules literal(s) the line writes or uses: one on the line itself, else the literals the
    names it uses are bound to (through names and both branches of ``A if cond else B``)."""
    on_line = [n for n in source.nodes_on(line, (cst.List, cst.Tuple))
               if isinstance(n, (cst.List, cst.Tuple)) and _is_rules(n)]
    outer = [n for n in on_line if not any(a in on_line for a in source.ancestors(n))]
    if len(outer) > 1:
        raise CannotEdit(f"line {line} writes {len(outer)} rule lists: which one is meant is ambiguous")
    if outer:
        return list(outer)
    statement = source.statement_at(line)
    names = sorted({n.value for part in source.header_parts(statement) for n in source.walk(part)
                    if isinstance(n, cst.Name)})
    found: list[cst.BaseExpression] = []
    for name in names:
        found.extend(_follow(source, statement, cst.Name(name), 4))
    unique = list({id(n): n for n in found}.values())
    if not unique:
        raise CannotEdit(f"line {line} uses no literal logical axis rules")
    return unique


def _follow(source: Source, at: cst.CSTNode, value: cst.BaseExpression, depth: int) -> list[cst.BaseExpression]:
    if depth == 0:
        return []
    if _is_rules(value):
        return [value]
    if isinstance(value, cst.IfExp):
        return _follow(source, at, value.body, depth - 1) + _follow(source, at, value.orelse, depth - 1)
    if isinstance(value, cst.Name):
        bindings = source.resolve(at, value.value)
        if len({id(b.value) for b in bindings}) > 1 and not all(_is_rules(b.value) for b in bindings):
            return []
        return [v for b in bindings for v in _follow(source, b.statement, b.value, depth - 1)]
    return []


def _axes_of(value: object) -> set[str]:
    if value is None:
        return set()
    if isinstance(value, str):
        return {value}
    return {str(v) for v in value} if isinstance(value, (tuple, list)) else set()


def logical_rule(source: Source, edit: SourceEdit, line: int) -> tuple[dict, None, str]:
    """Every rules literal the line may use is made to say so (a literal that already does is left
    alone); refused when all already do."""
    logical = edit.details.get("logical")
    if not isinstance(logical, str):
        raise CannotEdit("the edit names no logical axis")
    changes: dict = {}
    descriptions = []
    for node in _rules_literals(source, line):
        change = _rule_change(source, node, edit, logical)
        if change is not None:
            changes[node] = change[0]
            descriptions.append(f"line {source.lines(node)[0]}: {change[1]}")
    if not changes:
        raise CannotEdit(f"the rules already map {logical!r} to {edit.details.get('mesh_axes')!r} ahead of the "
                         "rules that compete for its mesh axes (already applied?)")
    return changes, None, "; ".join(descriptions)


def _rule_change(source: Source, node: cst.BaseExpression, edit: SourceEdit, logical: str
                 ) -> tuple[cst.CSTNode, str] | None:
    mesh_axes = edit.details.get("mesh_axes")
    if isinstance(mesh_axes, (list, tuple)):
        mesh_axes = tuple(mesh_axes) if len(mesh_axes) != 1 else mesh_axes[0]
    assert isinstance(node, (cst.List, cst.Tuple))
    rules = literal(node)
    assert isinstance(rules, tuple)
    quote = source.quote()
    value_code = "None" if mesh_axes is None else axes_code(mesh_axes if isinstance(mesh_axes, tuple) else (
        mesh_axes,), quote)
    elements = list(node.elements)
    index = next((i for i, pair in enumerate(rules) if pair[0] == logical), None)
    wanted = _axes_of(mesh_axes)
    if index is None:
        pair = cst.parse_expression(f"({axes_code(logical, quote)}, {value_code})")
        sep = elements[0].comma if len(elements) > 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        commas = [e.comma for e in elements]
        commas = [*commas[:-1], sep, commas[-1]]
        new_elements = [cst.Element(value=v, comma=c)
                        for v, c in zip([pair, *(e.value for e in elements)], commas, strict=True)]
        return node.with_changes(elements=new_elements), f"rule ({logical!r}, {mesh_axes!r}) added first"
    entry = elements[index].value
    changed_value = _axes_of(rules[index][1]) != wanted or (rules[index][1] is None) != (mesh_axes is None)
    if changed_value:
        assert isinstance(entry, cst.Tuple)
        entry = entry.with_changes(elements=[entry.elements[0], entry.elements[1].with_changes(
            value=cst.parse_expression(value_code))])
    before = edit.details.get("before")
    if before:
        names = {before} if isinstance(before, str) else set(before)
        blocker = next((i for i in range(index) if rules[i][0] in names), None)
    else:
        blocker = next((i for i in range(index) if _axes_of(rules[i][1]) & wanted), None)
    if not changed_value and blocker is None:
        return None
    values = [e.value for e in elements]
    values[index] = entry
    if blocker is not None:
        values.insert(blocker, values.pop(index))
    new_elements = [e.with_changes(value=v) for e, v in zip(elements, values, strict=True)]  # type: ignore[misc]
    moved = f", moved before {rules[blocker][0]!r}" if blocker is not None else ""
    return node.with_changes(elements=new_elements), f"rule ({logical!r}, {mesh_axes!r}){moved}"


# -- layout-map-key -----------------------------------------------------------------------------
def _assigns_into(source: Source, statement: cst.CSTNode, variable: str) -> list[cst.Assign]:
    found = []
    for node in source.walk(statement):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Subscript) and dotted(target.target.value) == variable:
                    found.append(node)
    return found


def layout_map_key(source: Source, edit: SourceEdit, line: int) -> tuple[dict, None, str]:
    key = edit.details.get("key")
    spec = edit.details.get("spec", edit.spec)
    if not isinstance(key, str) or spec is None:
        raise CannotEdit("the edit gives no LayoutMap key and spec")
    spec = normalize(tuple(spec)) if not isinstance(spec, str) else normalize((spec,))
    if spec is None:
        raise CannotEdit("the edit's spec is not a tuple of mesh axes")
    statement, variable = _layout_map_at(source, line)
    parent = source.parent(statement)
    body = list(getattr(parent, "body", ()))
    start = next(i for i, s in enumerate(body) if s is statement)
    last = statement
    for candidate in body[start:]:
        assigns = _assigns_into(source, candidate, variable)
        for assign in assigns:
            index = assign.targets[0].target
            assert isinstance(index, cst.Subscript)
            element = index.slice[0].slice if index.slice else None
            if isinstance(element, cst.Index) and literal(element.value) == key:
                raise CannotEdit(f"{variable}[{key!r}] is already set on line {source.lines(assign)[0]} "
                                 "(already applied?)")
        if assigns:
            last = candidate
    quote = source.quote()
    code = f"{variable}[{axes_code(key, quote)}] = {tuple_code(spec, quote)}"
    new = cst.parse_statement(code + "\n")
    return {last: [last, new]}, None, f"after line {source.lines(last)[1]}: {code}"


def _layout_map_at(source: Source, line: int) -> tuple[cst.CSTNode, str]:
    """The statement on ``line`` that makes a LayoutMap (or assigns a key into one) and the map's variable."""
    calls = source.calls_on(line, "LayoutMap")
    if len(calls) > 1:
        raise CannotEdit(f"line {line} makes several LayoutMaps")
    if calls:
        statement = source.simple_statement_of(calls[0])
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and small.value is calls[0] and len(small.targets) == 1:
                    variable = dotted(small.targets[0].target)
                    if variable is not None:
                        return statement, variable
        raise CannotEdit(f"the LayoutMap on line {line} is not assigned to a variable")
    statement = source.statement_at(line)
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign) and isinstance(small.targets[0].target, cst.Subscript):
                variable = dotted(small.targets[0].target.value)
                bindings = source.resolve(statement, variable) if variable else []
                if variable and bindings and all(
                        isinstance(b.value, cst.Call) and (dotted(b.value.func) or "").endswith("LayoutMap")
                        for b in bindings):
                    return statement, variable
    raise CannotEdit(f"line {line} makes no LayoutMap (nor sets a key of one)")


# -- with-partitioning --------------------------------------------------------------------------
def with_partitioning(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    if edit.spec is None:
        raise CannotEdit("the edit gives no partition spec")
    imports = Imports(source)
    quote = source.quote()
    argument = edit.details.get("argument")
    calls = source.calls_on(line)
    wrap_name = "with_partitioning"
    for call in calls:  # already wrapped?
        if (dotted(call.func) or "").rsplit(".", 1)[-1] == wrap_name and not argument:
            raise CannotEdit(f"line {line} already uses nnx.with_partitioning (already applied?)")
    layers = [c for c in calls if any(a.keyword is not None and a.keyword.value == (argument or "kernel_init")
                                      for a in c.args)]
    if not layers:
        layers = [c for c in calls if (dotted(c.func) or "").rsplit(".", 1)[-1] in (
            "Linear", "LinearGeneral", "Einsum", "Conv", "ConvTranspose", "Embed", "Param")]
    if len(layers) != 1:
        raise CannotEdit(f"line {line} builds no NNX layer or parameter" if not layers else
                         f"line {line} builds {len(layers)} NNX layers: which one is meant is ambiguous")
    call = layers[0]
    nnx = imports.name_for("flax.nnx")
    spec = tuple_code(edit.spec, quote)
    kind = (dotted(call.func) or "").rsplit(".", 1)[-1]
    if kind == "Param" and not argument:
        if not call.args or not isinstance(call.args[0].value, cst.Call):
            raise CannotEdit(f"the nnx.Param on line {line} is not built from an initializer call")
        init_call = call.args[0].value
        wrapped = init_call.with_changes(func=cst.parse_expression(
            f"{nnx}.with_partitioning({_code(init_call.func)}, {spec})"))
        new_call = call.with_changes(args=[call.args[0].with_changes(value=wrapped), *call.args[1:]])
        return {call: new_call}, imports, f"line {line}: nnx.Param's initializer wrapped in with_partitioning {spec}"
    keyword = argument or ("embedding_init" if kind == "Embed" else "kernel_init")
    existing = next((a for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
    if existing is not None:
        if isinstance(existing.value, cst.Call) and (dotted(existing.value.func) or "").endswith(wrap_name):
            raise CannotEdit(f"{keyword} on line {line} is already wrapped in with_partitioning (already applied?)")
        value = cst.parse_expression(f"{nnx}.with_partitioning({_code(existing.value)}, {spec})")
        new_call = call.with_changes(args=[a.with_changes(value=value) if a is existing else a for a in call.args])
        new_call = fit_argument(source, call, new_call, list(call.args).index(existing))
    else:
        default = (f'{nnx}.initializers.variance_scaling(1.0, {quote}fan_in{quote}, {quote}normal{quote}, out_axis=0)'
                   if kind == "Embed" else f"{nnx}.initializers.lecun_normal()")
        value = cst.parse_expression(f"{nnx}.with_partitioning({default}, {spec})")
        args = list(call.args)
        if args and isinstance(args[-1].comma, cst.MaybeSentinel):
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(value=value, keyword=cst.Name(keyword),
                            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                  whitespace_after=cst.SimpleWhitespace(""))))
        new_call = fit_argument(source, call, call.with_changes(args=args), len(args) - 1)
    return {call: new_call}, imports, f"line {line}: {keyword} wrapped in nnx.with_partitioning(..., {spec})"
