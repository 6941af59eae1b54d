"""The ``shard-output`` edit: give torch_xla's FSDPv2 wrapper a ``shard_output`` over the batch axes.

FSDPv2 (``SpmdFullyShardedDataParallel``) calls ``shard_output(output, mesh)`` after each wrapped
forward; its default marks the output's dim 0 over ``'fsdp'`` only. The edit defines, just
before the statement (of the enclosing function's own body) that holds the wrapper call::

    def shard_output(output, mesh):
        real = output.logits if hasattr(output, "logits") else output
        real = real[0] if isinstance(real, tuple) else real
        xs.mark_sharding(real, mesh, (("replica", "fsdp"), None, None))

(``details["attribute"]``, e.g. ``logits`` for a Hugging Face ``CausalLMOutputWithPast``: read
when the output has it, so the same function serves the wrapped decoder layers, whose output is a
tensor or a tuple; without it, ``xs.mark_sharding(output, mesh, ...)``; dim 0 over ``spec[0]``'s
axes, ``details["rank"]`` entries) and passes it as ``shard_output=`` (replacing the value when
the call already has one). The function is named ``shard_output`` unless that name is taken in
the scope, then ``shard_output_<axes>``.
A function with the same body defined earlier in the scope (an earlier edit's, for another
wrapper) is passed instead of a second copy. Refused: no FSDPv2 call on the line, no spec, and a
call that already passes such a function (applied before).
"""

from __future__ import annotations

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.imports import Imports
from hlo_doctor.fix.locate import CannotEdit, Source, dotted, fit_argument
from hlo_doctor.fix.specs import tuple_code

__all__ = ["shard_output"]

WRAPPERS = ("FSDPv2", "SpmdFullyShardedDataParallel")


def _is_wrapper(source: Source, call: cst.Call, imports: Imports) -> bool:
    name = dotted(call.func) or ""
    return name.rsplit(".", 1)[-1] in WRAPPERS or imports.names.get(name, "").endswith(
        ".SpmdFullyShardedDataParallel")


def shard_output(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports, str]:
    imports = Imports(source)
    calls = [c for c in source.calls_on(line) if _is_wrapper(source, c, imports)]
    if not calls:
        raise CannotEdit(f"line {line} makes no FSDPv2 / SpmdFullyShardedDataParallel wrapper")
    if len(calls) > 1:
        raise CannotEdit(f"line {line} makes {len(calls)} FSDPv2 wrappers: which one is meant is ambiguous")
    if not edit.spec or edit.spec[0] is None:
        raise CannotEdit("the edit gives no batch axes for the output's dim 0")
    call = calls[0]
    rank = int(edit.details.get("rank") or len(edit.spec))
    spec = (edit.spec[0],) + (None,) * (rank - 1)
    attribute = edit.details.get("attribute")
    output = f"output.{attribute}" if attribute else "output"  # for the description
    anchor = source.top_statement_in_scope(call)
    scope = source.scopes(call)[0]
    taken = {b.name for b in source.bindings(scope)} | {
        s.name.value for s in source.own_statements(scope) if isinstance(s, cst.FunctionDef)}
    axes = edit.spec[0] if isinstance(edit.spec[0], tuple) else (edit.spec[0],)
    name = "shard_output" if "shard_output" not in taken and "shard_output" not in imports.names else \
        "shard_output_" + "_".join(axes)
    existing = next((a for a in call.args if a.keyword is not None and a.keyword.value == "shard_output"), None)
    xs = imports.module_for("torch_xla.distributed.spmd", "xs")
    quote = source.quote()
    marks = tuple_code(spec, quote)
    if attribute:  # a model's output (Hugging Face: .logits); a wrapped layer's: a tensor or a tuple
        body = (f"    real = output.{attribute} if hasattr(output, {quote}{attribute}{quote}) else output\n"
                f"    real = real[0] if isinstance(real, tuple) else real\n"
                f"    {xs}.mark_sharding(real, mesh, {marks})\n")
    else:
        body = f"    {xs}.mark_sharding(output, mesh, {marks})\n"
    reuse = next((s.name.value for s in source.own_statements(scope) if isinstance(s, cst.FunctionDef)
                  and source.lines(s)[0] < source.lines(anchor)[0]
                  and cst.Module([]).code_for_node(s.body).strip() == body.strip()), None)
    if reuse is not None:  # made by an earlier edit (another wrapper) or by the user: pass that one
        name = reuse
    function = cst.parse_statement(f"def {name}(output, mesh):\n{body}").with_changes(
        leading_lines=[cst.EmptyLine(indent=False)])  # set off from the statement above
    if existing is not None:
        passed = dotted(existing.value)
        same = [s for s in source.own_statements(scope) if isinstance(s, cst.FunctionDef) and s.name.value == passed
                and cst.Module([]).code_for_node(s.body).strip() == body.strip()]
        if same:
            raise CannotEdit(f"the wrapper on line {line} already passes shard_output={passed} (already applied?)")
    if existing is not None:
        new_call = call.with_changes(args=[a.with_changes(value=cst.Name(name)) if a is existing else a
                                           for a in call.args])
        new_call = fit_argument(source, call, new_call, list(call.args).index(existing))
    else:
        args = list(call.args)
        if args and isinstance(args[-1].comma, cst.MaybeSentinel):
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        keyword = cst.Arg(value=cst.Name(name), keyword=cst.Name("shard_output"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
        new_call = fit_argument(source, call, call.with_changes(args=[*args, keyword]), len(args))
    if reuse is not None:
        return {call: new_call}, imports, f"line {line}: shard_output={name} (defined above)"
    # The call sits inside ``anchor``: rebuild the anchor with the call replaced, then put the
    # function before it.
    rebuilt = anchor.visit(_Swap({call: new_call}))
    if isinstance(rebuilt, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and not rebuilt.leading_lines:
        rebuilt = rebuilt.with_changes(leading_lines=[cst.EmptyLine(indent=False)])  # a blank line after the new function
    return {anchor: [function, rebuilt]}, imports, (
        f"line {line}: shard_output={name}, a function marking {output}'s dim 0 over {axes} defined "
        f"before line {source.lines(anchor)[0]}")


class _Swap(cst.CSTTransformer):
    def __init__(self, replacements: dict):
        self.by_id = {id(k): v for k, v in replacements.items()}

    def on_leave(self, original_node, updated_node):
        return self.by_id.get(id(original_node), updated_node)
