"""Data inputs split the same way as the step needs them, in another device order.

A ``collective-permute`` in the partitioned module that sends every device's
piece of a data input (through ops that keep each device's rows) to another
device, when something of the step asks for the order it puts the pieces in:

* a sharding constraint of the program: the input's mark and the constraints
  split the same dims over the same mesh axes, listed in another order
  (``('fsdp', 'dp')`` against ``('dp', 'fsdp')``), so each device holds
  another device's rows. torch_xla's FSDPv2 marks its outputs
  ``(extra_data_axis, 'fsdp')``: an input marked ``('fsdp', 'data')`` meets
  it so;
* an all-gather of the permuted rows over the axes the new order lists last
  (a vocab-split table's lookup gathers the ids over the table's axis): a
  gather over some of a dim's axes takes each device's rows whole only when
  those axes are minor, so the partitioner reorders the input first, and the
  looked-up rows back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from hlo_doctor.findings import SourceEdit
from hlo_doctor.graph.collectives import Collective
from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.graph.source import is_library_file
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction, Shape, Sharding, ShardingKind
from hlo_doctor.program.records import user_line
from hlo_doctor.program.spec_sites import (
    argument_line,
    marks_writing,
    normalize,
    parameter_spec_site,
    parse_spec_text,
    spec_site,
)
from hlo_doctor.program.suggest import called_on, jax_spec, parameter_code, python_identifier, spec_tuple, torch_spec
from hlo_doctor.rules._batch import parameter_name
from hlo_doctor.rules._lost_rows import batch_shards
from hlo_doctor.rules._program_layouts import program_constraints
from hlo_doctor.rules.base import Finding, Rule, SourceRef, Suggestion
from hlo_doctor.rules.context import RuleContext, short_path
from hlo_doctor.semantics.batch_dims import BatchAnalysis
from hlo_doctor.semantics.opclasses import LAYOUT_ONLY
from hlo_doctor.units import format_bytes

__all__ = ["Reorder", "reorder_finding", "reordered_inputs"]

DimAxes = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Reorder:
    """One data input that the partitioner permutes into the order the step asks for."""

    input: Instruction
    """The partitioned module's entry parameter."""
    input_axes: DimAxes
    """The mesh axes of each of its dims, in the order its sharding lists them."""
    wanted_axes: DimAxes
    """The same axes, in the order the permute puts them in (the constraints', or the gather's)."""
    permutes: tuple[Collective, ...]
    """The permutes of the input and of values made from it by layout ops (forward and backward), then
    the other permutes between the same two orders."""
    constraints: tuple[tuple[Computation, Instruction], ...]
    """The program's constraints (in the propagated module) whose tiles sit in the wanted order."""
    gather: Collective | None = None
    """Without such constraints: the all-gather of the permuted input over the axes the wanted order
    lists last (a gather over some of a dim's axes takes contiguous rows only when they are minor)."""
    same_as_input: tuple[tuple[Computation, Instruction], ...] = ()
    """The program's constraints in the input's own order (to write in the wanted one too)."""


def reordered_inputs(ctx: RuleContext) -> list[Reorder]:
    """Every data input of ``ctx``'s partitioned module permuted into a constraint's device order."""
    module, mesh = ctx.per_device, ctx.mesh
    if module is None or mesh is None or module.entry is None:
        return []
    data = ctx.semantics.parameters.data
    entry = module.entry.name
    candidates: list[tuple[Collective, Computation, Instruction, Instruction, Sharding]] = []
    for op in ctx.collectives:
        if op.kind != "collective-permute" or op.computation != entry:
            continue
        computation = module.computation(op.computation)
        instruction = computation.get(op.instruction) if computation is not None else None
        if computation is None or instruction is None or not instruction.operands:
            continue
        top = _source(computation, instruction.operands[0], data)
        if top.opcode != "parameter" or top.parameter_number not in data or top.sharding is None:
            continue
        moved = _permuted(top.sharding, op, ctx.num_partitions)
        if moved is not None:
            candidates.append((op, computation, instruction, top, moved))
    # the propagated module (the program's constraints) is read only when a data input is permuted
    constrained, batch = (ctx.sharded, ctx.propagated_batch) if candidates else (None, None)
    if constrained is None or batch is None:
        return []
    found: dict[str, Reorder] = {}
    for op, computation, instruction, top, moved in candidates:
        known = found.get(top.name)
        if known is not None:
            found[top.name] = replace(known, permutes=(*known.permutes, op))
            continue
        reorder = _reorder(top, moved, mesh, constrained, batch, op, _gathers_after(ctx, computation, instruction))
        if reorder is not None:
            found[top.name] = reorder
    return _with_same_moves(ctx, list(found.values()))


def _with_same_moves(ctx: RuleContext, reorders: list[Reorder]) -> list[Reorder]:
    """Each reorder with the other permutes that move values between the same two device orders (one
    way or back: the input's order meets the constraints' at more than one op, as where a loss reads
    an input that the last layer's output must match)."""
    module, params, batch = ctx.per_device, ctx.semantics.parameters, ctx.semantics.batch
    if not reorders or module is None or module.entry is None or batch is None:
        return reorders
    shards = batch_shards(module.entry, params)
    taken = {op.instruction for r in reorders for op in r.permutes}
    out = []
    for reorder in reorders:
        mapping = _mapping(reorder.permutes[0])
        inverse = {b: a for a, b in mapping.items()}
        same = [op for op in ctx.collectives if op.kind == "collective-permute" and op.instruction not in taken
                and _mapping(op) in (mapping, inverse) and _holds_a_shard(ctx, batch, shards, op)]
        taken |= {op.instruction for op in same}
        out.append(replace(reorder, permutes=(*reorder.permutes, *same)))
    return out


def _holds_a_shard(ctx: RuleContext, batch: BatchAnalysis, shards: dict[int, int], op: Collective) -> bool:
    """Whether ``op`` moves rows of the batch as the inputs are split (each device's shard of a batch
    dim): a value in the input's order or the constraints', not one whose batch a finding says is lost."""
    instruction = ctx.instruction(op.computation, op.instruction)
    if instruction is None or not instruction.operands:
        return False
    operand = ctx.instruction(op.computation, instruction.operands[0])
    if operand is None or operand.shape.is_tuple:
        return False
    return any(dim < operand.shape.rank and operand.shape.dims[dim] == shards.get(param)
               for dim, param in batch.batch_dims((op.computation, operand.name)).items())


def _mapping(op: Collective) -> dict[int, int]:
    return dict(pair for pair in op.logical_groups if len(pair) == 2)


def _permuted(sharding: Sharding, op: Collective, devices: int) -> Sharding | None:
    """``sharding`` with each tile moved to the device ``op`` sends it to, when ``op`` sends every
    device's data to one device and moves some (a reorder, not a ring's shift of part of them)."""
    assignment = sharding.tile_assignment
    if sharding.kind is not ShardingKind.TILED or assignment is None or assignment.num_devices != devices:
        return None
    target = _mapping(op)
    if sorted(target) != list(range(devices)) or sorted(target.values()) != list(range(devices)):
        return None
    if all(source == sent for source, sent in target.items()):
        return None
    ids = tuple(target[d] for d in assignment.device_ids())
    return replace(sharding, tile_assignment=replace(assignment, explicit=ids, iota=None), named=None, text="")


def _reorder(top: Instruction, moved: Sharding, mesh: Mesh, constrained: HloModule, batch: BatchAnalysis,
             op: Collective, gathers: list[Collective]) -> Reorder | None:
    assert top.sharding is not None
    rank = top.shape.rank
    before, after = dim_axes(top.sharding, rank, mesh), dim_axes(moved, rank, mesh)
    if before is None or after is None or before == after:
        return None
    if any(set(a) != set(b) for a, b in zip(before, after, strict=True)):
        return None  # another split, not the same one in another order
    wanted, own = _split_of(moved), _split_of(top.sharding)
    program = [(c, i) for c, i in program_constraints(constrained, batch) if i.sharding is not None]
    constraints = tuple((c, i) for c, i in program if _split_of(i.sharding) == wanted)  # type: ignore[arg-type]
    if constraints:
        return Reorder(top, before, after, (op,), constraints)
    # no constraint of the program asks for that order: an all-gather of the permuted rows over the axes it
    # lists last does (the rows each device gathers are contiguous only then), else the partitioner's own
    dim = next(d for d, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    gather = next((g for g in gathers if g.mesh_axes and _trailing(after[dim], g.mesh_axes)
                   and not _trailing(before[dim], g.mesh_axes)), None)
    if gather is None:
        return None
    same = tuple((c, i) for c, i in program if _split_of(i.sharding) == own)  # type: ignore[arg-type]
    return Reorder(top, before, after, (op,), (), gather, same)


def _trailing(axes: tuple[str, ...], gathered: tuple[str, ...]) -> bool:
    return len(gathered) < len(axes) and axes[len(axes) - len(gathered):] == tuple(gathered)


_CARRIES = LAYOUT_ONLY | {"convert"}
# Elementwise ops keep each device's rows: an index clamped into the table (JAX writes ``select(lt(i, 0),
# i + n, i)``) is still the input's rows, on the same devices.
_ELEMENTWISE = frozenset({"select", "add", "subtract", "multiply", "compare", "clamp", "maximum", "minimum",
                          "and", "or", "not", "negate", "abs"})


def _source(computation: Computation, name: str, data: frozenset[int] | set[int]) -> Instruction:
    """What ``name`` is made from through ops that keep each device's rows (layout ops, a convert, and
    elementwise ops, followed to an operand that comes from a data input): the data input when found."""
    node = computation.get(name)
    assert node is not None
    return _data_source(computation, node, data, 12) or node


def _data_source(computation: Computation, node: Instruction, data: frozenset[int] | set[int],
                 budget: int) -> Instruction | None:
    if node.opcode == "parameter":
        return node if node.parameter_number in data else None
    if budget <= 0 or not node.operands or node.opcode not in _CARRIES | _ELEMENTWISE:
        return None
    for operand in node.operands if node.opcode in _ELEMENTWISE else node.operands[:1]:
        parent = computation.get(operand)
        if parent is None or parent.opcode in ("constant", "broadcast", "iota"):
            continue
        found = _data_source(computation, parent, data, budget - 1)
        if found is not None:
            return found
    return None


def _gathers_after(ctx: RuleContext, computation: Computation, permute: Instruction) -> list[Collective]:
    """The all-gathers of ``permute``'s result (through ops that keep each device's rows)."""
    users = ctx.semantics.users(computation)
    by_name = {op.instruction: op for op in ctx.collectives if op.computation == computation.name}
    found, frontier, seen = [], [permute], {permute.name}
    while frontier:
        for user in users.get(frontier.pop().name, ()):
            if user.name in seen:
                continue
            seen.add(user.name)
            if user.opcode in _CARRIES:
                frontier.append(user)
            elif user.opcode == "all-gather" and user.name in by_name:
                found.append(by_name[user.name])
    return found


def _split_of(sharding: Sharding) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """The split dims' tile counts and the device of each tile: what two shardings of values of
    different ranks (an input and a constraint after a reshape or a matmul) share when they split the
    same way."""
    assignment = sharding.tile_assignment
    if sharding.kind is not ShardingKind.TILED or assignment is None:
        return None
    data = sharding.data_tile_dims
    return tuple(d for d in data if d > 1), len(assignment.dims) - len(data), assignment.device_ids()


def reorder_finding(rule: Rule, ctx: RuleContext, reorders: list[Reorder]) -> Finding:
    """One finding for the data inputs permuted into another device order (one root cause: the order
    the program writes the batch axes in), at the largest input's first permute."""
    reorders = sorted(reorders, key=lambda r: -r.input.shape.byte_size)
    main = reorders[0]
    executions = ctx.executions
    permutes = [op for r in reorders for op in r.permutes]
    sent = sum(op.wire_bytes_per_device * executions.get(op.computation, 1) for op in permutes)
    dim = next(d for d, (a, b) in enumerate(zip(main.input_axes, main.wanted_axes, strict=True)) if a != b)
    old, new = main.input_axes[dim], main.wanted_axes[dim]
    argument = parameter_name(ctx, main.input, with_shape=False)
    shape = _global_shape(ctx, main.input)
    spec: list = [axes or None for axes in main.wanted_axes]
    edits, no_edit, marked = _input_mark_edits(ctx, reorders, spec)
    # the variable the program marks (unknown when another input of the shape and spec has its own mark)
    alike = [r for r in reorders if _global_shape(ctx, r.input).dims == shape.dims and r.input_axes == main.input_axes]
    written = (called_on(*marked) or (argument if ctx.framework == "jax" else None)) \
        if marked is not None and len(alike) == 1 else None
    name = f"{written} ({argument})" if written and written != argument else argument
    crossing = any(op.crosses_hosts for op in permutes)
    others = [parameter_name(ctx, r.input, with_shape=False) for r in reorders[1:]]
    moved = (f"({permutes[0].instruction}"
             + (f" and {len(permutes) - 1} more between the two orders: values made in one that ops in the other "
                "read" if len(permutes) > 1 else "")
             + (f"; {', '.join(others)} the same way" if others else "")
             + f"), {format_bytes(sent)} per device per step" + (", across hosts" if crossing else ""))
    message = f"the data input {name}, {shape}, is split over {_axes(old)} on dim {dim}, and " + (
        _asked_by_constraints(ctx, main, new, moved) if main.constraints else _asked_by_gather(ctx, main, new, moved))
    gone = (f"the {len(permutes)} permute{'s go' if len(permutes) > 1 else ' goes'} ({format_bytes(sent)} per device "
            "per step). It costs nothing: the split is the same, only which device holds which rows changes")
    target = written or "the input"
    if main.constraints:
        summary = (f"Split {target} over {_axes(new)}, the order the constraints write: each device then already "
                   f"holds the rows the constraints put on it, and {gone} (or write the constraints in the input's "
                   "order).")
    else:
        also = len(main.same_as_input)
        summary = (f"Write the batch as {_axes(new)} wherever the program writes it: {target}'s spec"
                   + (f" and the {also} constraint{'s' if also > 1 else ''} that write{'' if also > 1 else 's'} "
                      f"{_axes(old)} today" if also else "")
                   + f". The gather then takes the rows as they lie, and {gone}.")
    elsewhere = sorted({e.line for e in edits if e.line is not None and (marked is None or e.line != marked[1])})
    if elsewhere:
        summary += f" The spec is written at line{'s' if len(elsewhere) > 1 else ''} {', '.join(map(str, elsewhere))}."
    if ctx.mesh is not None and ctx.mesh.is_inferred:
        summary += (f" The dump names no mesh axes: {', '.join(ctx.mesh.axis_names)} are positional names read from "
                    "the tile assignments; write your mesh's own.")
    jax_code, torch_code = parameter_code(spec, written or python_identifier(argument, "batch"))
    finding = rule.finding(
        ctx, message, instruction=ctx.instruction(permutes[0].computation, permutes[0].instruction),
        related=tuple(dict.fromkeys([op.instruction for op in permutes[1:]] + [r.input.name for r in reorders]
                                    + ([main.gather.instruction] if main.gather is not None else []))),
        source_from=None,
        suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code, edits=edits, no_edit=no_edit),
        evidence={
            "pattern": "device-order",
            "input": name,
            "inputs": [parameter_name(ctx, r.input, with_shape=False) for r in reorders],
            "dim": dim,
            "input_axes": list(old),
            "constraint_axes": list(new),
            "constraints": [c.name for _, c in main.constraints],
            "gather": main.gather.instruction if main.gather is not None else None,
            "constraints_in_input_order": [c.name for _, c in main.same_as_input],
            "reshards": len(permutes),
            "reshard_kinds": [op.kind for op in permutes],
            "reshard_bytes_per_device": sent,
            "wasted_bytes_per_device": sent,
            "mesh_axes": list(new),
            "crosses_hosts": crossing,
        },
    )
    if marked is not None:
        finding = replace(finding, source=SourceRef(*marked), message=finding.message.replace(_NO_LINE, ""))
    return finding


def _asked_by_constraints(ctx: RuleContext, reorder: Reorder, new: tuple[str, ...], moved: str) -> str:
    lines = sorted({(s.file, s.line) for _, c in reorder.constraints for s in [ctx.user_source(c)[0]]
                    if s is not None})
    return (f"{len(reorder.constraints)} of the program's sharding constraints on values it feeds split that dim "
            f"over the same axes in another order, {_axes(new)}"
            + (f" (line{'s' if len(lines) > 1 else ''} {', '.join(str(n) for _, n in lines[:3])})" if lines else "")
            + ": each device holds another device's rows, so the partitioner permutes the input into the "
            f"constraints' order {moved}")


def _asked_by_gather(ctx: RuleContext, reorder: Reorder, new: tuple[str, ...], moved: str) -> str:
    gather = reorder.gather
    assert gather is not None and gather.mesh_axes
    axes = _axes(tuple(gather.mesh_axes))
    where = gather.op_name.rsplit("/", 1)[-1] if gather.op_name else None
    return (f"the step all-gathers its rows over {axes} alone ({gather.instruction}"
            + (f", in {where}" if where else "") + f"), which takes each device's rows whole only where {axes} "
            f"is listed last: the partitioner permutes the input into {_axes(new)} for it {moved}")


def _caller(calls: list, call: Mapping[str, Any], where: tuple[str, int]) -> tuple[str, int]:
    """The line that calls the program's helper the mark is made in, when other lines call it too (the
    innermost line is the helper's body, the same for every mark it makes); else ``where``."""
    frames = [(f.get("file"), f.get("line")) for f in call.get("stack") or () if isinstance(f, Mapping)]
    user = [f for f in frames if isinstance(f[0], str) and isinstance(f[1], int) and not is_library_file(f[0])]
    if len(user) < 2:
        return where
    callers = {tuple(f.get("line") for f in (c.get("stack") or ())[1:2] if isinstance(f, Mapping))
               for c in calls if user_line(c) == where}
    return user[1] if len(callers) > 1 else where


_NO_LINE = " (the dump records only library frames for this op, no line of your code)"


def _axes(axes: tuple[str, ...]) -> str:
    return "(" + ", ".join(repr(a) for a in axes) + ")" if len(axes) > 1 else repr(axes[0])


def _global_shape(ctx: RuleContext, param: Instruction) -> Shape:
    """The input's shape as the program wrote it (:attr:`RuleContext.global_parameter_shapes`)."""
    shapes, number = ctx.global_parameter_shapes, param.parameter_number
    return shapes[number] if shapes is not None and number is not None and number < len(shapes) else param.shape


def _input_mark_edits(ctx: RuleContext, reorders: list[Reorder], spec: list
                      ) -> tuple[tuple[SourceEdit, ...], str | None, tuple[str, int] | None]:
    """The program's own marks of the inputs (the runner's record, or the sharding calls the dump keeps):
    each call on a value of an input's shape whose spec lists the input's axes, rewritten in place; and
    the line of the first (the largest input's)."""
    framework = ctx.framework if ctx.framework in ("jax", "torch_xla") else "jax"
    calls = ctx.sharding_calls
    edits: dict[tuple[str, int], SourceEdit] = {}
    first: tuple[str, int] | None = None
    unwritable: tuple[str, int] | None = None
    for reorder in reorders:
        old = tuple(axes or None for axes in reorder.input_axes)
        shape = _global_shape(ctx, reorder.input)
        for call in calls:
            recorded = parse_spec_text(str(call.get("spec", "")))
            where = user_line(call)
            if recorded is None or where is None or tuple(call.get("shape") or ()) != tuple(shape.dims) \
                    or normalize(recorded) != normalize(old):
                continue
            site = spec_site(where[0], where[1], recorded)
            if site is None:
                where = _caller(calls, call, where)
                site = spec_site(where[0], where[1], recorded)
            if site is None:
                unwritable = unwritable or where
                continue
            edits.setdefault((where[0], site.line), SourceEdit("respec", framework, spec=spec_tuple(spec),
                                                               old_spec=recorded, file=where[0], line=site.line))
            first = first or (where[0], site.line)
        argument = parameter_name(ctx, reorder.input, with_shape=False)
        site = parameter_spec_site(ctx.program_path, argument, old, ctx.traced_function) \
            if ctx.framework == "jax" and ctx.program_path else None
        if site is not None and ctx.program_path:  # JAX: the argument's ShapeDtypeStruct / device_put / in_shardings
            edits.setdefault((ctx.program_path, site.line), SourceEdit(
                "respec", "jax", spec=spec_tuple(spec), old_spec=old, file=ctx.program_path, line=site.line))
            # the line that makes the argument (its spec may be written on another)
            first = first or (ctx.program_path, argument_line(ctx.program_path, argument) or site.line)
    if not edits and unwritable is None and ctx.framework == "torch_xla":
        # a dump made without the runner: the program's own marks that write the input's spec
        for reorder in reorders:
            old = tuple(axes or None for axes in reorder.input_axes)
            for path in ctx.program_files:
                for line, site in marks_writing(path, old):
                    edits.setdefault((path, site.line), SourceEdit(
                        "respec", "torch_xla", spec=spec_tuple(spec), old_spec=old, file=path, line=site.line))
                    first = first or (path, line)
    if edits:
        return tuple(edits.values()), None, first
    if unwritable is not None:
        code = torch_spec(spec) if ctx.framework == "torch_xla" else jax_spec(spec)
        return (), (f"the input is marked at {short_path(unwritable[0])}:{unwritable[1]} with a spec the code "
                    f"computes there: write {code} for it by hand"), unwritable
    return (), ("no mark of the input is recorded, and none was found in your code: write the spec where your "
                "code shards the input (its mark_sharding, device_put or in_shardings)"), None
