"""The lever the user holds: a fix written where the program decides the sharding.

A rule finds *what* is sharded wrongly (an activation's batch dim, a parameter
left whole); the program may decide that sharding somewhere other than the op's
line. The runner's record and the program's source say where:

* Flax linen's logical axis rules, a Keras 3 ``LayoutMap`` key, Flax NNX's
  ``nnx.with_partitioning`` metadata (:mod:`hlo_doctor.program.library_levers`).
* torch_xla: the model's inputs and FSDPv2's ``shard_output``
  (:mod:`hlo_doctor.program.torch_levers`), and a forward hook on a library module
  (:mod:`hlo_doctor.program.module_hooks`).
* JAX: the traced function's own argument, constrained where the function starts.

Each function returns the :class:`~hlo_doctor.findings.SourceEdit` records and the
code to show, or nothing when the program does not say enough.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hlo_doctor.findings import SourceEdit, SourceRef
from hlo_doctor.program.records import record_entries, user_line
from hlo_doctor.program.source import call_name, parsed_program, program_text
from hlo_doctor.program.spec_sites import parameter_spec_site, parse_spec_text, spec_site
from hlo_doctor.program.suggest import DimAxes, jax_spec, spec_tuple, torch_spec

__all__ = [
    "Lever",
    "calls_on",
    "literal_strings",
    "jax_argument_constraint",
    "parameter_respec",
    "mesh_construction_rewritten",
    "user_constraint_respec",
    "with_lever",
]


@dataclass(frozen=True, slots=True)
class Lever:
    """A fix at the place the program decides: its summary, code and edits."""

    summary: str
    code: str
    edits: tuple[SourceEdit, ...]
    line: tuple[str, int] | None = None
    """the user's line the fix goes at, for a finding whose op carries no line of the user's code"""
    then: bool = False
    """keep the rule's own summary after this one (what the fix saves and costs)"""
    no_edit: str | None = None
    """why the edits are not given, when the code is right but its place cannot be edited safely"""


def calls_on(tree: ast.AST, line: int) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)]


def literal_strings(node: ast.expr) -> tuple[str | None, ...] | None:
    """A literal tuple/list of strings and None (``("batch", "length", "embed")``)."""
    if not isinstance(node, (ast.Tuple, ast.List)):
        return None
    values: list[str | None] = []
    for element in node.elts:
        if isinstance(element, ast.Constant) and (element.value is None or isinstance(element.value, str)):
            values.append(element.value)
        else:
            return None
    return tuple(values)


# -- JAX: the traced function's argument ------------------------------------------------

def jax_argument_constraint(source_file: str | None, function: str | None, argument: str,
                            dims: Sequence[DimAxes]) -> SourceEdit | None:
    """A constraint of the traced function's ``argument`` as its body starts (the ``def`` line)."""
    tree = parsed_program(source_file)
    if tree is None or function is None or source_file is None:
        return None
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == function and argument in [a.arg for a in n.args.args + n.args.kwonlyargs]]
    if len(defs) != 1:
        return None
    return SourceEdit("constrain", "jax", target=argument, spec=spec_tuple(dims), file=source_file,
                      line=defs[0].lineno, details={"position": "function-start"})


def with_lever(finding: Any, lever: Lever | None, framework: str | None) -> Any:
    """``finding`` with its suggestion written at the lever (unchanged when there is none)."""
    import dataclasses

    if lever is None or finding.suggestion is None:
        return finding
    code = {"jax": finding.suggestion.jax, "torch_xla": finding.suggestion.torch_xla}
    if framework in code:
        code[framework] = lever.code
    summary = lever.summary + "." + (f" {finding.suggestion.summary}" if lever.then else "")
    suggestion = dataclasses.replace(finding.suggestion, summary=summary, edits=lever.edits, no_edit=lever.no_edit,
                                     **code)
    source, message = finding.source, finding.message
    if source is None and lever.line is not None:
        source = SourceRef(lever.line[0], lever.line[1])
        message = message.replace(_NO_LINE, f" (the op records only library frames; line {lever.line[1]} of your "
                                            "code is where the fix goes)")
    return dataclasses.replace(finding, suggestion=suggestion, source=source, message=message)


_NO_LINE = " (the dump records only library frames for this op, no line of your code)"


# -- the user's own constraint that writes the wrong spec --------------------------------

def user_constraint_respec(record: Mapping[str, Any] | None, source_file: str | None, source_line: int | None,
                           shape: Sequence[int], batch_dim: int, dims: Sequence[DimAxes],
                           framework: str | None, constraint_line: int | None = None) -> Lever | None:
    """The program's own constraint on this value, a few lines on, that splits a feature dim and
    leaves the batch dim whole: the fix is its spec, written where the program writes it.

    The runner records each ``with_sharding_constraint`` / ``mark_sharding`` call with its
    spec, the value's shape and the stack (a dump made without the runner keeps them in its ops:
    :func:`~hlo_doctor.program.records.sharding_calls_in`); the one that counts is the first after
    the finding's line, in its file, on a value of the dot's shape, or the one on
    ``constraint_line``: the constraint the value reaches in the dataflow (a gradient's dot,
    whose line is its layer's, reaches the transpose of the constraint before it).
    """
    if source_file is None or source_line is None or framework not in ("jax", "torch_xla"):
        return None
    candidates = []
    for call in record_entries(record, "sharding_calls"):
        where = user_line(call)
        spec = parse_spec_text(str(call.get("spec", "")))
        if where is None or spec is None or tuple(call.get("shape") or ()) != tuple(shape):
            continue
        file, line = where
        if file != source_file or not (source_line < line <= source_line + 5 or line == constraint_line):
            continue
        whole_batch = batch_dim >= len(spec) or spec[batch_dim] is None
        if whole_batch and any(axes for d, axes in enumerate(spec) if d != batch_dim):
            candidates.append((line, spec))
    if not candidates:
        return None
    line, old_spec = min(candidates, key=lambda c: (c[0] != constraint_line, c[0]))
    site = spec_site(source_file, line, old_spec)
    if site is None:
        return None
    new_spec = spec_tuple(dims)
    written = (jax_spec(dims) if site.text.startswith(("P(", "PartitionSpec(")) else torch_spec(dims))
    if site.text.startswith("PartitionSpec("):
        written = "PartitionSpec(" + written[2:]
    code = site.line_text.strip().replace(site.text, written, 1)
    edit = SourceEdit("respec", framework, spec=new_spec, old_spec=old_spec, file=source_file, line=site.line)
    summary = (f"Line {line} constrains this value to {site.text}, which splits a feature dim and leaves batch dim "
               f"{batch_dim} whole on every device: write {written} where line {site.line} makes that spec, so the "
               "value stays batch-sharded like its input; the partitioner then gathers the weight instead, which "
               "does not wait for the layer before and can be prefetched")
    return Lever(summary, code, (edit,))


def parameter_respec(program: str | None, argument: str, dims: Sequence[DimAxes], framework: str | None,
                     function: str | None = None) -> Lever | None:
    """The replicated spec the program writes for the JAX argument ``argument`` (its
    ``jax.ShapeDtypeStruct(..., sharding=...)``, ``jax.device_put`` or its entry of the traced
    ``function``'s ``in_shardings``), written sharded instead."""
    if framework != "jax":
        return None
    site = parameter_spec_site(program, argument, (), function)
    if site is None or program is None:
        return None
    written = jax_spec(dims)
    if site.text.startswith("PartitionSpec("):
        written = "PartitionSpec(" + written[2:]
    code = site.line_text.strip().replace(site.text, written, 1)
    edit = SourceEdit("respec", framework, target=argument, spec=spec_tuple(dims), old_spec=(), file=program,
                      line=site.line)
    summary = (f"Line {site.line} writes {site.text} (replicated) for {argument}: write {written} there, so each device "
               "holds its shard and the partitioner gathers the weight where it is used")
    return Lever(summary, code, (edit,))


# -- the program's mesh construction, rewritten in its own style --------------------------

_MESH_CALLS = {"Mesh": (0, 1), "make_mesh": (0, 1), "DeviceMesh": (0, 1), "HybridMesh": (None, None)}


def mesh_construction_line(source_file: str | None, axis_names: Sequence[str]) -> int | None:
    """The line of the one mesh construction of the program that names exactly ``axis_names`` (a
    dump made without the runner: no record says where the mesh was built). None: none or several."""
    tree = parsed_program(source_file)
    if tree is None:
        return None
    lines = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or call_name(node) not in _MESH_CALLS:
            continue
        written = [k.value for k in node.keywords if k.arg in ("axis_names", "names")] + list(node.args)
        if any(literal_strings(w) == tuple(axis_names) for w in written if isinstance(w, (ast.Tuple, ast.List))):
            lines.add(node.lineno)
    return lines.pop() if len(lines) == 1 else None


def mesh_construction_rewritten(source_file: str | None, line: int | None,
                                details: Mapping[str, Any]) -> str | None:
    """The mesh construction on ``line`` as it should read: its axes in the new order
    (``details["permutation"]``: the old position of each new axis) with the shape permuted the
    same way, or, for ``device_order: "host-major"``, the device array reshaped to the mesh
    shape without its transpose. None when the construction is not one of the known forms.

    ``Mesh(devices.reshape(2, n // 2), ("tp", "dp"))`` -> ``Mesh(devices.reshape(n // 2, 2), ('dp', 'tp'))``;
    ``jax.make_mesh((4, 2), names)``, ``keras.distribution.DeviceMesh(shape, names)`` and
    ``xs.Mesh(ids, shape, names)`` likewise.
    """
    tree = parsed_program(source_file)
    text = program_text(source_file)
    if tree is None or text is None or line is None:
        return None
    calls = [c for c in calls_on(tree, line) if c.lineno == line and call_name(c) in ("Mesh", "make_mesh", "DeviceMesh")]
    if len(calls) != 1:
        return None
    call = calls[0]
    torch_mesh = call_name(call) == "Mesh" and len(call.args) >= 3  # xs.Mesh(ids, shape, names)
    shape_at, names_at = (1, 2) if torch_mesh else (0, 1)
    if len(call.args) <= names_at or not isinstance(call.args[names_at], (ast.Tuple, ast.List)):
        return None
    new = copy.deepcopy(call)
    names = new.args[names_at]
    shape = new.args[shape_at]
    if "permutation" in details:
        order = list(details["permutation"])
        if len(order) != len(names.elts):  # type: ignore[attr-defined]
            return None
        names.elts = [names.elts[i] for i in order]  # type: ignore[attr-defined]
        if isinstance(shape, (ast.Tuple, ast.List)) and len(shape.elts) == len(order):
            shape.elts = [shape.elts[i] for i in order]
        elif _reshape(shape) is not None and len(_reshape(shape).args) == len(order):  # type: ignore[union-attr]
            reshape = _reshape(shape)
            reshape.args = [reshape.args[i] for i in order]  # type: ignore[union-attr]
        else:
            return None
    elif details.get("device_order") == "host-major" and "shape" in details:
        base = shape.value if isinstance(shape, ast.Attribute) and shape.attr == "T" else None
        reshape = _reshape(base) if base is not None else None
        if base is None or reshape is None:
            return None
        reshape.args = [ast.Constant(int(v)) for v in details["shape"]]
        new.args[shape_at] = base
    else:
        return None
    segment = ast.get_source_segment(text, call)
    lines = text.splitlines()
    if segment is None or call.end_lineno != call.lineno:
        return None
    return lines[line - 1].strip().replace(segment, ast.unparse(new), 1)


def _reshape(node: ast.expr | None) -> ast.Call | None:
    """``X.reshape(...)`` (the call), or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "reshape":
        return node
    return None
