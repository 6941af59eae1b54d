"""torch_xla levers: the model's inputs and FSDPv2's ``shard_output``.

The batch of a torch_xla program is sharded where the program marks the model's inputs
(``xs.mark_sharding`` before the model is called) and, under FSDPv2, by each wrapper's
``shard_output`` (its default marks the output's dim 0 over ``'fsdp'`` alone), at the lines the
runner recorded for the model call and each wrapper.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from hlo_doctor.findings import SourceEdit
from hlo_doctor.program.levers import Lever, calls_on
from hlo_doctor.program.records import record_entries, user_line
from hlo_doctor.program.source import call_name, parsed_program
from hlo_doctor.program.spec_sites import AxesSite, axes_site, parse_spec_text, spec_site
from hlo_doctor.program.suggest import DimAxes, spec_tuple, torch_spec

__all__ = ["torch_input_marks", "torch_static_marks"]


_FSDPV2 = "SpmdFullyShardedDataParallel"


def torch_input_marks(record: Mapping[str, Any] | None, dims: Sequence[DimAxes]) -> Lever | None:
    """``xs.mark_sharding`` of the model's tensor arguments just before the outermost module call,
    and a ``shard_output`` for every FSDPv2 wrapper the program made (its default marks the
    output's dim 0 over ``'fsdp'`` only)."""
    calls = list(record_entries(record, "module_calls"))
    if not calls:
        return None
    top = calls[0]
    where = user_line(top)
    tree = parsed_program(where[0]) if where else None
    if where is None or tree is None:
        return None
    call = next((c for c in calls_on(tree, where[1]) if c.lineno == where[1]), None)
    names = _tensor_arguments(call)
    if not names:
        return None
    marked = _earlier_marks(record, tree, where, names)
    wrapped = any(str(c.get("module_class", "")).endswith(_FSDPV2) for c in calls)
    return _marks_lever(tree, where, names, marked, wrapped, dims)


def torch_static_marks(path: str | None, dims: Sequence[DimAxes], current: Sequence[str]) -> Lever | None:
    """:func:`torch_input_marks` read from the program's source alone (a dump made without the
    runner): the model is the variable an FSDPv2 wrapper is assigned to, its call the first call
    of that variable after it, and the program's own marks of its inputs before that call are
    taken to write the batch axes the dump shows today (``current``, major first)."""
    tree = parsed_program(path)
    if path is None or tree is None:
        return None
    wrapper_names = _imported_as(tree, _FSDPV2)
    models = sorted((n.lineno, t.id) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and isinstance(n.value, ast.Call) and call_name(n.value) in wrapper_names
                    for t in n.targets if isinstance(t, ast.Name))
    if not models:
        return None
    made, model = models[-1]
    call = min((c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                and c.func.id == model and c.lineno > made), key=lambda c: c.lineno, default=None)
    names = _tensor_arguments(call)
    if call is None or not names:
        return None
    where = (path, call.lineno)
    old: tuple = (tuple(current) if current else None, *([None] * (len(dims) - 1)))
    marked: dict[str, tuple[int, tuple]] = {}
    for node in sorted((c for c in ast.walk(tree) if isinstance(c, ast.Call) and call_name(c) == "mark_sharding"
                        and c.lineno < call.lineno), key=lambda c: c.lineno):
        first = node.args[0] if node.args else None
        if current and isinstance(first, ast.Name) and first.id in names:
            marked[first.id] = (node.lineno, old)  # the latest mark before the call, per variable
    return _marks_lever(tree, where, names, marked, True, dims)


def _tensor_arguments(call: ast.Call | None) -> list[str]:
    """The variables a model call passes, positional and keyword, in order."""
    names = [a.id for a in (call.args if call else []) if isinstance(a, ast.Name)]
    names += [k.value.id for k in (call.keywords if call else []) if isinstance(k.value, ast.Name)]
    return list(dict.fromkeys(names))


def _marks_lever(tree: ast.Module, where: tuple[str, int], names: Sequence[str],
                 marked: Mapping[str, tuple[int, tuple]], wrapped: bool, dims: Sequence[DimAxes]) -> Lever:
    spec = spec_tuple(dims)
    edits: list[SourceEdit] = []
    lines: list[str] = []
    unresolved = []
    shared: list[AxesSite] = []
    for n in names:
        if n in marked:  # torch_xla refuses a second mark: the program's own mark is the one to change
            line, old = marked[n]
            site = spec_site(where[0], line, old)
            axes = axes_site(where[0], line, 0, old[0]) if site is None and old and old[0] else None
            if site is not None:
                edits.append(SourceEdit("respec", "torch_xla", target=n, spec=spec, old_spec=old, file=where[0],
                                        line=site.line))
            elif axes is not None:  # (batch_axes, None) with batch_axes = "fsdp" a few lines up
                shared.append(axes)
                edits.append(SourceEdit("axes", "torch_xla", spec=spec[:1], old_spec=old[:1], file=where[0],
                                        line=axes.line, details={"variable": axes.variable}))
            else:
                unresolved.append(f"line {line}")
            lines += [f"xs.clear_sharding({n})  # line {line} marks it {torch_spec(old)}",
                      f"xs.mark_sharding({n}, mesh, {torch_spec(dims)})"]
            continue
        edits.append(SourceEdit("constrain", "torch_xla", target=n, spec=spec, file=where[0], line=where[1],
                                details={"position": "before"}))
        lines.append(f"xs.mark_sharding({n}, mesh, {torch_spec(dims)})")
    wrappers = _constructions(tree, _FSDPV2) if wrapped else []
    output_dims: list[DimAxes] = [dims[0], None, None]
    for line in wrappers:
        if _passes_marks_of(tree, where[0], line, shared):
            continue  # its shard_output marks through the axes the edit above rewrites
        edits.append(SourceEdit("shard-output", "torch_xla", spec=spec_tuple(output_dims), file=where[0], line=line,
                                details={"rank": 3, "attribute": "logits"}))
    if wrappers:
        batch_entry = torch_spec(dims[:1])[1:-2]  # "('replica', 'fsdp')"
        lines += ["def shard_output(output, mesh):  # FSDPv2 calls it with the wrapped module's output",
                  "    real = output.logits if hasattr(output, 'logits') else output",
                  "    real = real[0] if isinstance(real, tuple) else real",
                  f"    xs.mark_sharding(real, mesh, ({batch_entry},) + (None,) * (real.dim() - 1))",
                  "FSDPv2(module, mesh=mesh, shard_output=shard_output)"]
    no_edit = None
    if unresolved:  # a part of the fix cannot be made: none of it is (marks before the call fail on marked inputs)
        no_edit = (f"the program's marks at {', '.join(unresolved)} write their spec through names: change them by "
                   "hand (or clear them before the call, as the code shows)")
    summary = (f"Mark {', '.join(names)} over {torch_spec(dims[:1])[1:-2]} before the model is called at line {where[1]}"
               + (f" ({', '.join(n for n in names if n in marked)} already marked: clear that mark or change it "
                  "where the program makes it)" if marked else "")
               + (" and give each FSDPv2 wrapper a shard_output over the same axes (its default splits the output "
                  "over 'fsdp' alone)" if wrappers else ""))
    return Lever(summary, "\n".join(lines), () if no_edit else tuple(dict.fromkeys(edits)), where, then=True,
                 no_edit=no_edit)


def _passes_marks_of(tree: ast.Module, path: str, line: int, sites: Sequence[AxesSite]) -> bool:
    """The FSDPv2 wrapper on ``line`` passes ``shard_output=f`` for a function ``f`` of the program
    whose every mark takes dim 0's axes from one of ``sites``."""
    if not sites:
        return False
    for call in calls_on(tree, line):
        passed = next((k.value for k in call.keywords if k.arg == "shard_output"), None)
        if not isinstance(passed, ast.Name):
            continue
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == passed.id]
        marks = [m for f in functions for m in ast.walk(f) if isinstance(m, ast.Call)
                 and call_name(m) == "mark_sharding"]
        if len(functions) == 1 and marks and all(
                any(axes_site(path, m.lineno, 0, s.axes) == s for s in sites) for m in marks):
            return True
    return False


def _earlier_marks(record: Mapping[str, Any] | None, tree: ast.Module, where: tuple[str, int],
                   names: Sequence[str]) -> dict[str, tuple[int, tuple]]:
    """The program's own ``xs.mark_sharding(name, ...)`` before the model call, by variable: the
    line the runner recorded and the spec it wrote."""
    marks: dict[str, tuple[int, tuple]] = {}
    for call in record_entries(record, "sharding_calls"):
        line = user_line(call)
        spec = parse_spec_text(str(call.get("spec", "")))
        if call.get("function") != "mark_sharding" or line is None or spec is None or line[0] != where[0] \
                or line[1] >= where[1]:
            continue
        for node in calls_on(tree, line[1]):
            if call_name(node) == "mark_sharding" and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in names:
                marks.setdefault(node.args[0].id, (line[1], spec))
    return marks


def _constructions(tree: ast.Module, class_name: str) -> list[int]:
    """The lines that call ``class_name`` under any name the program imports it as."""
    names = _imported_as(tree, class_name)
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n) in names})


def _imported_as(tree: ast.Module, class_name: str) -> set[str]:
    """``class_name`` and the names the program imports it as."""
    names = {class_name}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {a.asname for a in node.names if a.name == class_name and a.asname}
    return names
