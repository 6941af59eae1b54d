"""The ``forward-hook`` edit: mark a submodule's output over the batch axes with a forward hook (torch_xla).

For a value no line of the program makes (library code, a Hugging Face layer), the rule names the
module by its path (``target``: ``model.layers.*.self_attn.o_proj``, ``*`` for every layer); the
edit defines, before the statement on the line that calls the model (``details["model"]``, the
model variable), a hook and registers it::

    def shard_batch(module, args, output):
        xs.mark_sharding(output, mesh, (("replica", "fsdp"),) + (None,) * (output.dim() - 1))

    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(shard_batch)

``spec[0]`` holds the axes of the output's dim 0; ``details``: ``module`` (the hooked module's
expression), ``each`` and ``loop`` (the list of layers to loop over and the loop variable
``module`` starts with; absent: ``module`` names one module). The hook returns None, so the module's output is the same
tensor, marked. A function of the same body defined earlier in the scope (an earlier edit's, for
another module) is registered instead of a second copy; another function of that name gets the
hook the name ``shard_batch_<axes>``. A loop variable the scope already binds is renamed
(``layer_``). Imports only when missing.

Refused: no statement on the line or one that does not use the model variable, no spec, no mesh
variable visible there, and the same registration already before the call (applied before).
"""

from __future__ import annotations

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.imports import Imports
from hlo_doctor.fix.locate import CannotEdit, Source, dotted
from hlo_doctor.fix.specs import tuple_code

__all__ = ["forward_hook"]

FUNCTION = "shard_batch"


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node).strip()


def _names_used(source: Source, scope: cst.CSTNode) -> set[str]:
    """Every name the scope's body uses or binds, and its parameters."""
    return {n.value for n in source.walk(scope) if isinstance(n, cst.Name)}


def forward_hook(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    if not edit.spec or edit.spec[0] is None:
        raise CannotEdit("the edit gives no batch axes for the output's dim 0")
    module = str(edit.details.get("module") or "")
    each = edit.details.get("each")
    loop = str(edit.details.get("loop") or "")
    model = edit.details.get("model")
    if not module or model is None or (each and not loop):
        raise CannotEdit("the edit names no module to hook")
    statement = source.statement_at(line)
    if not isinstance(statement, cst.SimpleStatementLine):
        raise CannotEdit(f"line {line} is not a simple statement (the model call)")
    if not any(dotted(n) == model for n in source.walk(statement) if isinstance(n, (cst.Name, cst.Attribute))):
        raise CannotEdit(f"line {line} does not use {model}")
    scope = source.scopes(statement)[0]
    statements = list(source.own_statements(scope))
    before = [s for s in statements if source.lines(s)[0] < source.lines(statement)[0]]
    mesh = edit.mesh or source.mesh_variable(statement)
    imports = Imports(source)
    xs = imports.module_for("torch_xla.distributed.spmd", "xs")
    quote = source.quote()
    batch = tuple_code(edit.spec[:1], quote)
    body = f"    {xs}.mark_sharding(output, {mesh}, {batch} + (None,) * (output.dim() - 1))\n"
    functions = [s for s in statements if isinstance(s, cst.FunctionDef)]
    reuse = next((f.name.value for f in functions if f in before and _code(f.body) == body.strip()), None)
    taken = {b.name for b in source.bindings(scope)} | {f.name.value for f in functions} | set(imports.names)
    axes = edit.spec[0]
    name = reuse or (FUNCTION if FUNCTION not in taken else f"{FUNCTION}_{'_'.join(axes)}")
    while reuse is None and name in taken:
        name += "_"
    if each:
        if not module.startswith(loop + "."):
            raise CannotEdit(f"the hooked module {module} is not reached from the loop variable {loop}")
        variable, used = loop, _names_used(source, scope) | taken
        while variable in used:  # the scope's own variable of that name stays as it is
            variable += "_"
        hooked = variable + module[len(loop):]
        register = f"for {variable} in {each}:\n    {hooked}.register_forward_hook({name})\n"
    else:
        register = f"{module}.register_forward_hook({name})\n"
    new_register = cst.parse_statement(register)
    if reuse is not None and any(_registers(s, each, loop, module, name) for s in before):
        raise CannotEdit(f"{module} already registers {name} before line {line} (already applied?)")
    new: list[cst.CSTNode] = []
    leading = statement.leading_lines
    if reuse is None:
        function = cst.parse_statement(f"def {name}(module, args, output):\n{body}")
        new.append(function.with_changes(leading_lines=leading or [cst.EmptyLine(indent=False)]))
        new.append(new_register.with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
    else:
        new.append(new_register.with_changes(leading_lines=leading))
    new.append(statement.with_changes(leading_lines=()))
    what = f"every {edit.target}" if each else module
    return {statement: new}, imports, (
        f"before line {line}: a forward hook {name} marking the output of {what} over {axes} on dim 0"
        + (" (defined above)" if reuse is not None else ""))


def _registers(statement: cst.CSTNode, each: object, loop: str, module: str, name: str) -> bool:
    """Whether ``statement`` registers ``name`` on the same modules (a loop: under any loop variable)."""
    if not each:
        return _code(statement) == f"{module}.register_forward_hook({name})"
    if not isinstance(statement, cst.For) or not isinstance(statement.target, cst.Name) \
            or _code(statement.iter) != _code(cst.parse_expression(str(each))):
        return False
    variable = statement.target.value
    expected = cst.parse_statement(
        f"for {variable} in {each}:\n    {variable}{module[len(loop):]}.register_forward_hook({name})\n")
    return isinstance(expected, cst.For) and _code(statement.body) == _code(expected.body)
