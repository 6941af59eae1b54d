"""The ``constrain`` edit: pin a variable's sharding right after the statement that assigns it.

JAX: ``h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(...)))``;
torch_xla: ``xs.mark_sharding(h, mesh, (...))``, both written with the names the file already
imports (imports added only when missing) and the program's own mesh variable.

Where the statement is already followed by a constraint of the variable to another layout
(``h = with_sharding_constraint(h, hidden)``), that constraint's sharding is rewritten instead of
a second one added. ``details["position"]`` may put the constraint ``"before"`` the statement
that uses the variable (a model call) or at the ``"function-start"`` of the function defined on
the line; ``"in-place"`` rewrites the sharding of the constraint that the line is.

Refused: a line that assigns no variable (``return f(h)``: binding the value first would
change more than one line, so the user is told to), a variable the line does not assign, no mesh
variable visible there, and a constraint to the same literal spec already there (applying the
fix twice is a refusal, not a second constraint).
"""

from __future__ import annotations

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.imports import Imports
from hlo_doctor.fix.locate import CannotEdit, Source, dotted, literal
from hlo_doctor.fix.specs import Spec, entries, from_literal, normalize, same, tuple_code

__all__ = ["assigned_names", "constrain"]


def assigned_names(statement: cst.CSTNode) -> list[str]:
    """The variables (and ``self.x`` attributes) a simple statement assigns."""
    names: list[str] = []

    def add(target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                add(element.value)
        elif isinstance(target, cst.StarredElement):
            add(target.value)
        else:
            name = dotted(target)
            if name is not None:
                names.append(name)

    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    add(target.target)
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                add(small.target)
    return names


def _sibling(source: Source, statement: cst.CSTNode, step: int) -> cst.CSTNode | None:
    """The statement ``step`` places after ``statement`` in the same block (-1: the one before), or None."""
    parent = source.parent(statement)
    body = getattr(parent, "body", None)
    if not isinstance(body, (list, tuple)):
        return None
    for index, node in enumerate(body):
        if node is statement:
            return body[index + step] if 0 <= index + step < len(body) else None
    return None


def _constraint_call(statement: cst.CSTNode | None, target: str) -> cst.Call | None:
    """The sharding constraint or mark of ``target`` that ``statement`` is, if it is one."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    for small in statement.body:
        value = small.value if isinstance(small, (cst.Assign, cst.Expr)) else None
        if isinstance(value, cst.Call) and value.args:
            name = (dotted(value.func) or "").rsplit(".", 1)[-1]
            if name in ("with_sharding_constraint", "mark_sharding", "with_logical_constraint") and \
                    dotted(value.args[0].value) == target:
                return value
    return None


def _constrains(statement: cst.CSTNode | None, target: str) -> bool:
    return _constraint_call(statement, target) is not None


def _constraint_spec(call: cst.Call) -> Spec | None:
    """The literal spec a constraint writes (``NamedSharding(mesh, P(...))``, ``P(...)``, a mark's
    tuple), None when it names a variable or anything else."""
    name = (dotted(call.func) or "").rsplit(".", 1)[-1]
    if name == "mark_sharding":
        value = literal(call.args[2].value) if len(call.args) > 2 else None
        return normalize(value) if isinstance(value, tuple) else None
    if name != "with_sharding_constraint" or len(call.args) < 2:
        return None
    sharding = call.args[1].value
    if isinstance(sharding, cst.Call) and (dotted(sharding.func) or "").endswith("NamedSharding") and \
            len(sharding.args) >= 2:
        sharding = sharding.args[1].value
    if isinstance(sharding, cst.Call) and (dotted(sharding.func) or "").rsplit(".", 1)[-1] in ("P", "PartitionSpec"):
        return from_literal(sharding.args)
    return None


def _already(statement: cst.CSTNode | None, target: str, spec: Spec) -> bool:
    call = _constraint_call(statement, target)
    return call is not None and same(_constraint_spec(call), spec)


def _uses(source: Source, statement: cst.CSTNode, target: str) -> bool:
    return any(dotted(node) == target for node in source.walk(statement) if isinstance(node, (cst.Name, cst.Attribute)))


def _code_for(source: Source, imports: Imports, edit: SourceEdit, target: str, mesh: str) -> str:
    quote = source.quote()
    assert edit.spec is not None
    if edit.framework == "torch_xla":
        xs = imports.module_for("torch_xla.distributed.spmd", "xs")
        return f"{xs}.mark_sharding({target}, {mesh}, {tuple_code(edit.spec, quote)})"
    wsc = imports.name_for("jax.lax.with_sharding_constraint")
    named = imports.name_for("jax.sharding.NamedSharding")
    pspec = imports.name_for("jax.sharding.PartitionSpec", alias="P")
    return f"{target} = {wsc}({target}, {named}({mesh}, {pspec}({entries(edit.spec, quote)})))"


def constrain(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    """``details["position"]``: ``"after"`` (default) the statement that assigns ``target``;
    ``"before"`` the statement on the line that uses ``target`` (a model call); ``"function-start"``:
    first in the body of the function defined on the line (``target`` one of its parameters)."""
    if edit.spec is None:
        raise CannotEdit("the edit gives no partition spec")
    position = edit.details.get("position", "after")
    if position == "function-start":
        return _at_function_start(source, edit, line)
    if position == "before":
        return _before(source, edit, line)
    if position == "in-place":
        return _in_place(source, edit, line)
    statement = source.statement_at(line)
    assigned = assigned_names(statement)
    target = edit.target
    if not assigned:
        first = cst.Module([]).code_for_node(statement).strip().splitlines()[0] if statement else ""
        raise CannotEdit(f"line {line} assigns no variable ({first}): bind its value to a variable "
                         f"first, then constrain that")
    if target is None:
        if len(assigned) != 1:
            raise CannotEdit(f"line {line} assigns {', '.join(assigned)}: the edit does not say which to constrain")
        target = assigned[0]
    if target not in assigned:
        raise CannotEdit(f"line {line} assigns {', '.join(assigned)}, not {target}")
    following = _sibling(source, statement, 1)
    if _already(following, target, edit.spec):
        raise CannotEdit(f"{target} is already constrained to that right after line {line} (already applied?)")
    mesh = edit.mesh or source.mesh_variable(statement)
    imports = Imports(source)
    existing = _constraint_call(following, target)
    if existing is not None:
        return _rewrite(source, imports, edit, existing, mesh)
    code = _code_for(source, imports, edit, target, mesh)
    new = cst.parse_statement(code + "\n")
    return {statement: [statement, new]}, imports, f"after line {line}: {code}"


def _rewrite(source: Source, imports: Imports, edit: SourceEdit, call: cst.Call, mesh: str
             ) -> tuple[dict, Imports, str]:
    """The constraint right after the assignment says another layout: it is the one to change (a
    second constraint below it would reshard twice)."""
    assert edit.spec is not None
    quote = source.quote()
    name = (dotted(call.func) or "").rsplit(".", 1)[-1]
    line = source.lines(call)[0]
    if name == "with_logical_constraint":
        raise CannotEdit(f"line {line} constrains it by logical axes: change the logical axis rules instead")
    if name == "mark_sharding":
        index, value = 2, tuple_code(edit.spec, quote)
    else:
        named = imports.name_for("jax.sharding.NamedSharding")
        pspec = imports.name_for("jax.sharding.PartitionSpec", alias="P")
        index, value = 1, f"{named}({mesh}, {pspec}({entries(edit.spec, quote)}))"
    old = call.args[index].value
    new_call = call.with_changes(args=[a.with_changes(value=cst.parse_expression(value)) if i == index else a
                                       for i, a in enumerate(call.args)])
    return {call: new_call}, imports, (f"line {line}: the constraint's {cst.Module([]).code_for_node(old)} "
                                       f"-> {value}")


def _in_place(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    """The line is the constraint (``x = with_sharding_constraint(x, layouts[i % 2])``): its
    sharding becomes the edit's literal spec."""
    assert edit.spec is not None
    statement = source.statement_at(line)
    calls = [c for c in source.calls_on(line, "with_sharding_constraint", "mark_sharding")
             if c.args and (edit.target is None or dotted(c.args[0].value) == edit.target)]
    if len(calls) != 1:
        raise CannotEdit(f"line {line} is not one sharding constraint of {edit.target or 'a value'}")
    call = calls[0]
    if same(_constraint_spec(call), edit.spec):
        raise CannotEdit(f"line {line} already constrains {dotted(call.args[0].value) or 'it'} to that "
                         "(already applied?)")
    mesh = edit.mesh or ""
    if not mesh and (dotted(call.func) or "").rsplit(".", 1)[-1] != "mark_sharding":  # a mark names its mesh itself
        mesh = source.mesh_variable(statement)
    return _rewrite(source, Imports(source), edit, call, mesh)


def _before(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    assert edit.spec is not None
    statement = source.statement_at(line)
    target = edit.target
    if target is None or not _uses(source, statement, target):
        raise CannotEdit(f"line {line} does not use {target}")
    if _already(statement, target, edit.spec):
        raise CannotEdit(f"line {line} already constrains {target} to that (already applied?)")
    if not isinstance(statement, cst.SimpleStatementLine) and source.lines(statement)[0] != line:
        raise CannotEdit(f"line {line} is inside a compound statement's header")
    previous = _sibling(source, statement, -1)
    while previous is not None and _constrains(previous, target) is False and isinstance(
            previous, cst.SimpleStatementLine) and any(_constrains(previous, t) for t in _names_in(source, previous)):
        previous = _sibling(source, previous, -1)
    if previous is not None and _already(previous, target, edit.spec):
        raise CannotEdit(f"{target} is already constrained to that right before line {line} (already applied?)")
    mesh = edit.mesh or source.mesh_variable(statement)
    imports = Imports(source)
    code = _code_for(source, imports, edit, target, mesh)
    new = cst.parse_statement(code + "\n")
    # the new line goes between the statement's leading comments/blank lines and the statement
    leading = getattr(statement, "leading_lines", ())
    moved = statement.with_changes(leading_lines=()) if leading else statement
    new = new.with_changes(leading_lines=leading)
    return {statement: [new, moved]}, imports, f"before line {line}: {code}"


def _names_in(source: Source, statement: cst.CSTNode) -> list[str]:
    return [n.value for n in source.walk(statement) if isinstance(n, cst.Name)]


def _at_function_start(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    assert edit.spec is not None
    functions = [n for n in source.walk() if isinstance(n, cst.FunctionDef) and source.lines(n.name)[0] == line]
    if len(functions) != 1 or not isinstance(functions[0].body, cst.IndentedBlock):
        raise CannotEdit(f"line {line} defines no function (with an indented body)")
    function = functions[0]
    params = [p.name.value for p in (*function.params.params, *function.params.kwonly_params)]
    target = edit.target
    if target not in params:
        raise CannotEdit(f"{function.name.value} has no parameter {target}")
    body = list(function.body.body)
    index = 1 if body and _is_docstring(body[0]) else 0
    if index < len(body) and _already(body[index], target, edit.spec):
        raise CannotEdit(f"{target} is already constrained as {function.name.value} starts (already applied?)")
    mesh = edit.mesh or source.mesh_variable(body[0] if body else function)
    imports = Imports(source)
    code = _code_for(source, imports, edit, target, mesh)
    new = cst.parse_statement(code + "\n")
    anchor = body[index] if index < len(body) else body[-1]
    replacement = [new, anchor] if index < len(body) else [anchor, new]
    return {anchor: replacement}, imports, f"as {function.name.value} starts (line {line}): {code}"


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))
