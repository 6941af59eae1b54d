"""The ``constrain`` edit: pin a variable's sharding right after the statement that assigns it.

JAX: ``h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(...)))``;
torch_xla: ``xs.mark_sharding(h, mesh, (...))``, both written with the names the file already
imports (imports added only when missing) and the program's own mesh variable.

Refused: a line that assigns no variable (``return f(h)``: binding the value first would
change more than one line, so the user is told to), a variable the line does not assign, no mesh
variable visible there, and a statement already followed by the same constraint (applying the
fix twice is a refusal, not a second constraint).
"""

from __future__ import annotations

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.imports import Imports
from hlo_doctor.fix.locate import CannotEdit, Source, dotted
from hlo_doctor.fix.specs import entries, tuple_code

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


def _next_statement(source: Source, statement: cst.CSTNode) -> cst.CSTNode | None:
    parent = source.parent(statement)
    body = getattr(parent, "body", None)
    if not isinstance(body, (list, tuple)):
        return None
    for index, node in enumerate(body):
        if node is statement:
            return body[index + 1] if index + 1 < len(body) else None
    return None


def _constrains(statement: cst.CSTNode | None, target: str) -> bool:
    """Whether ``statement`` is already a sharding constraint or mark of ``target``."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        value = small.value if isinstance(small, (cst.Assign, cst.Expr)) else None
        if isinstance(value, cst.Call) and value.args:
            name = (dotted(value.func) or "").rsplit(".", 1)[-1]
            if name in ("with_sharding_constraint", "mark_sharding", "with_logical_constraint") and \
                    dotted(value.args[0].value) == target:
                return True
    return False


def constrain(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
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
    if _constrains(_next_statement(source, statement), target):
        raise CannotEdit(f"{target} is already constrained right after line {line} (already applied?)")
    if edit.spec is None:
        raise CannotEdit("the edit gives no partition spec")
    mesh = edit.mesh or source.mesh_variable(statement)
    quote = source.quote()
    imports = Imports(source)
    if edit.framework == "torch_xla":
        xs = imports.module_for("torch_xla.distributed.spmd", "xs")
        code = f"{xs}.mark_sharding({target}, {mesh}, {tuple_code(edit.spec, quote)})"
    else:
        wsc = imports.name_for("jax.lax.with_sharding_constraint")
        named = imports.name_for("jax.sharding.NamedSharding")
        pspec = imports.name_for("jax.sharding.PartitionSpec", alias="P")
        code = f"{target} = {wsc}({target}, {named}({mesh}, {pspec}({entries(edit.spec, quote)})))"
    new = cst.parse_statement(code + "\n")
    return {statement: [statement, new]}, imports, f"after line {line}: {code}"
