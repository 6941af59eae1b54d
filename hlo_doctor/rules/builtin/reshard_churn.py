"""reshard-churn: the same value resharded back and forth between neighbouring ops."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hlo_doctor.findings import SourceEdit
from hlo_doctor.graph.collectives import Collective
from hlo_doctor.hlo.ir import Instruction
from hlo_doctor.program.records import user_line
from hlo_doctor.program.spec_sites import normalize, parse_spec_text
from hlo_doctor.program.suggest import (
    constraint_code,
    jax_spec,
    rename_value,
    spec_tuple,
    torch_spec,
    with_user_variable,
)
from hlo_doctor.rules._device_order import reorder_finding, reordered_inputs
from hlo_doctor.rules._lost_rows import batch_shards, held_rows
from hlo_doctor.rules._reshards import (
    Reshard,
    constrained_in_turn,
    constraint_after,
    constraint_before,
    rematerialization,
    reshard_chains,
    reshard_step,
    walk_up,
)
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext, calls_sharding_api
from hlo_doctor.semantics.opclasses import RESHARD_COLLECTIVES
from hlo_doctor.units import format_bytes


@dataclass(frozen=True, slots=True)
class ReshardChurnOptions:
    min_bytes: int = 0
    """Ignore chains whose collectives send fewer bytes per device per step in all."""


class ReshardChurn(Rule):
    """A value is resharded back and forth between neighbouring ops.

    **What it finds**

    In the partitioned module, chains of resharding collectives on one value:

    * *back and forth*: an ``all-to-all`` or ``collective-permute`` changes a
      value's layout, and after only elementwise and layout ops (no matmul,
      no reduction) a second one changes it back (the per-device shape
      returns to what it was, or the permutation is undone); consecutive
      flips on the same value are one chain;
    * *involuntary full rematerialization*: an ``all-gather`` whose result
      is only ``dynamic-slice``-d by partition id into a different sharding
      (XLA's fallback when it finds no cheaper reshard; it logs "Involuntary
      full rematerialization"), as a step of such a chain. Alone it is one
      reshard between two layouts, not churn: the data it moves is needed
      (only its bytes past an all-to-all's are waste), and the layout that
      needs it is what a finding names (the batch lost, a feature split),
      or XLA's own choice (an embedding's gradient cut to the table's
      feature shards);
    * *constraints in turn*: the program's own sharding constraints take one
      value through three layouts or more in a row (rows, then the
      sequence, then the features: ``A -> B -> C -> D``) with only
      elementwise and layout ops between, whether or not the value comes
      back: every layout but the last is resharded into for nothing;
    * *the same split in another device order*: a data input split over
      the same mesh axes, on the same dims, as the program's constraints on
      the values it feeds, but listed in another order (``('fsdp', 'data')``
      against ``('data', 'fsdp')``, as torch_xla's FSDPv2 writes its outputs
      with ``extra_data_axis``): each device holds another device's rows, and
      the partitioner permutes the input (a ``collective-permute`` that sends
      every device's piece elsewhere) into the constraints' order, with every
      other permute between the same two orders (the values made in one that
      ops in the other read). One finding, at the input's mark.

    A back-and-forth that no constraint of the program drives, on a value
    that holds more rows of the batch than the input's shard (the batch
    already gathered), is the lost batch's symptom, not churn: the finding
    that names where the batch is lost holds it.

    Collectives that also gather a value of the chain (an ``all-gather`` of
    an intermediate layout) are counted with it. One finding per chain, at
    its first collective; the source line is the sharding constraint that
    feeds it when there is one. For constraints in turn the finding also
    holds what the same constraints cause after them: the gradient's chain
    back through them (JAX constrains a value's cotangent at the same
    lines), the later reshards of values between their layouts and the
    first, and the all-gathers that put the last layout back together. The
    evidence says how many bytes per device the chain sends, and
    ``constraint_lines`` the lines of the constraints that move the value on.

    **Why it hurts**

    Every flip is pure communication that computes nothing; the value ends
    where it started. The usual cause is conflicting sharding constraints
    (``with_sharding_constraint`` / ``mark_sharding`` alternating between
    layouts) or an op whose operands are sharded on different dimensions.
    A full rematerialization also holds the whole tensor on every device.

    **Example**

    ```
    %sharding_constraint.3 = f32[64,256] copy(%add.8)
    %reshape.2 = f32[64,4,64] reshape(%sharding_constraint.3)
    %all-to-all = f32[64,4,64] all-to-all(%reshape.2), dimensions={1}      // rows -> columns
    ...
    %add.9 = f32[256,64] add(%reshape.3, %tanh.9)
    %sharding_constraint.10 = f32[256,64] copy(%add.9)
    %all-to-all.1 = f32[4,64,64] all-to-all(%reshape.6), dimensions={0}    // columns -> rows
    ```

    **Fix**

    Pick one layout for the value and constrain it the same way everywhere
    (or drop the constraint that disagrees, and let propagation choose).
    For the same split in another order, write the input's spec in the
    constraints' order (at its ``mark_sharding``, ``device_put``, or
    ``in_shardings`` entry; the runner's record or the program's source says
    where): the bytes per device are the same, only the devices change.
    The constraint is written at the line that makes the value (its
    constraint, or the op before the first reshard); a reshard carries its
    consumer's line, whose variable is another value, so when no line of
    the program is recorded for the value the code names it ``<value>``.
    For constraints in turn the layout to keep is the one the first
    constraint asks for (the value's own, as it arrives), never one of the
    layouts the others move it to; the finding names their lines, to remove
    or to write that spec on.

    ```python
    # JAX: one layout throughout
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P('x', None)))
    # torch_xla
    xs.mark_sharding(x, mesh, ('x', None))
    ```

    **Options**

    * ``min_bytes`` (int, default 0): ignore chains that send fewer bytes
      per device per step.
    """

    id = "reshard-churn"
    cause_rank = 10
    severity = Severity.WARNING
    reads = frozenset({"per_device", "sharded"})  # sharded: only when a data input is permuted
    summary = "A value is resharded back and forth (all-to-all / permute / all-gather + dynamic-slice)."
    Options = ReshardChurnOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.per_device
        if module is None:
            raise RuleSkipped("no partitioned or after-optimizations snapshot")
        collectives = ctx.collectives
        if not collectives:
            return
        users_of = ctx.semantics.users
        reorders = reordered_inputs(ctx)
        if reorders:
            yield reorder_finding(self, ctx, reorders)
        reordering = {op.instruction for r in reorders for op in r.permutes}

        steps: dict[str, Reshard] = {}
        gathers: dict[tuple[str, str], Collective] = {}  # (computation, operand) -> all-gather
        for op in collectives:
            computation = module.computation(op.computation)
            instruction = computation.get(op.instruction) if computation is not None else None
            if computation is None or instruction is None or op.instruction in reordering:
                continue
            if op.kind in RESHARD_COLLECTIVES:
                step = reshard_step(op, instruction, computation, users_of(computation))
            elif op.kind == "all-gather":
                step = rematerialization(op, instruction, computation, users_of(computation))
                if step is None and instruction.operands:
                    before = walk_up(computation, instruction.operands[0])
                    gathers[(computation.name, before.name)] = op
            else:
                step = None
            if step is not None:
                steps[op.instruction] = step
        for group in _by_constraints(ctx, reshard_chains(steps, users_of), users_of, list(steps.values())):
            finding = self._finding(ctx, group, gathers)
            if finding is not None:
                yield finding

    def _finding(self, ctx: RuleContext, group: _Group, gathers) -> Finding | None:  # noqa: ANN001
        """The finding of one chain and the chains its root cause makes (:class:`_Group`)."""
        executions = ctx.executions
        chain, lines, twins = group.chain, group.lines, group.twins
        first = chain[0][0]
        remat = len(chain) == 1 and first.slice is not None
        if remat and not (twins or group.later):
            # one reshard between two layouts, not churn: the layout that needs it is the finding (its
            # bytes past an all-to-all's are the waste, not all of them), and XLA's own choice otherwise
            return None
        if not group.in_turn and constraint_before(group.kept) is None and _on_repeated_rows(ctx, first):
            # the partitioner's own flips of a value that holds more rows of the batch than the input's
            # shard: a symptom of the lost batch (the finding that names where it is lost), not churn
            return None
        ops = [s.op for s, _ in chain]
        own = {op.instruction for op in ops}
        caused_ops = list({s.op.instruction: s.op for other in (*twins, *group.later) for s, _ in other
                         if s.op.instruction not in own}.values())
        later = list(dict.fromkeys(s.op.instruction for c in group.later for s, _ in c if s.op.instruction not in own))
        values: set[str] = {first.before.name}
        for _, path in chain:
            values |= path
        extra = [g for (comp, name), g in gathers.items() if comp == first.computation.name and name in values]
        reshard_bytes = sum(o.wire_bytes_per_device * executions.get(o.computation, 1) for o in ops + caused_ops)
        gather_bytes = sum(o.wire_bytes_per_device * executions.get(o.computation, 1) for o in extra)
        if reshard_bytes + gather_bytes < self.options.min_bytes:
            return None
        if remat:
            message = (
                f"all-gather {first.op.instruction} gathers {_dims(first.before_dims)} to {_dims(first.instruction.shape.dims)} "
                f"on every device only for dynamic-slice {first.slice.name} to cut it to {_dims(first.after_dims)}: "
                f"an involuntary full rematerialization between two shardings"
            )
        else:
            layouts = [_dims(first.before_dims)] + [_dims(s.after_dims) for s, _ in chain]
            between = "only elementwise ops"
            if any(node is not None and node.opcode in ("pad", "slice")
                   for s, path in chain for node in map(s.computation.get, path)):
                between += " and the padding of a dim the shards do not divide"
            message = (
                f"{first.op.kind} {first.op.instruction} and {len(chain) - 1} more reshard"
                f"{'s' if len(chain) > 2 else ''} flip one value's layout back and forth "
                f"({' -> '.join(layouts)} per device) with {between} in between"
            ) if not group.in_turn else (
                f"the program's sharding constraints reshard one value {len(chain)} times in a row "
                f"({' -> '.join(layouts)} per device: {first.op.kind} {first.op.instruction} and {len(chain) - 1} "
                f"more) with {between} in between: each constraint "
                + (f"at line{'s' if len(lines) > 1 else ''} {_listed(lines)} " if lines else "after the first ")
                + "asks for another layout"
                + (f", and the gradient takes the same {sum(len(t) for t in twins)} reshards back through them"
                   if twins else "")
                + (f"; after them {len(later)} more reshard{'s move' if len(later) > 1 else ' moves'} later values "
                   f"between its layouts and the first ({', '.join(later)})" if later else "")
            )
        if extra:
            message += f"; {len(extra)} all-gather{'s' if len(extra) != 1 else ''} of the same value add to it"
        message += f": {format_bytes(reshard_bytes + gather_bytes)} sent per device per step for nothing"
        # the layout to keep: the one the value starts in; for the program's constraints in turn, the one
        # its first constraint asks for (in a loop the value can arrive in the last one's, from the step before)
        kept = group.kept
        constraint = constraint_before(kept)
        # the line to constrain is the one that makes the value (its constraint, or the op before the first
        # reshard); a reshard's own line is its consumer's, whose variable is another value
        source_from = next((i for i in (constraint, kept.before) if i is not None
                            and ctx.user_source(i)[0] is not None), None)
        makes_value = source_from is not None
        if source_from is None:
            source_from = next((s.instruction for s, _ in chain if ctx.user_source(s.instruction)[0] is not None), None)
            # constraints in turn: that is the first line that moves the value on, and the value it makes is the
            # one to keep in the first layout (torch_xla records no line of the program for a mark itself)
            makes_value = group.in_turn and source_from is not None
        spec = _spec(ctx, kept)
        jax_code, torch_code = constraint_code(spec)
        where = f" (the constraint {constraint.name})" if constraint is not None else ""
        summary = (
            f"Give the value one sharding{where}: constrain it to the same layout at every step, or remove the "
            "constraint that disagrees, so the partitioner has nothing to reshard."
        )
        if group.in_turn:
            summary = (
                f"Keep the value in the layout its first constraint asks for ({_spec_code(ctx, spec)}): the "
                + (f"constraint{'s' if len(lines) > 1 else ''} at line{'s' if len(lines) > 1 else ''} {_listed(lines)} "
                   if lines else "constraints after it ")
                + "move it to "
                "layouts that the ops between them do not compute in; remove them, or write that spec there (each "
                "removed reshard saves its bytes, and propagation then chooses the layout after the last one)."
            )
            # each line that moves the value on gets the kept spec in place, when every one of them is the
            # sharding call itself; a line that calls a helper of the program is for the user to write
            direct = bool(lines) and ctx.framework in ("jax", "torch_xla") and all(
                calls_sharding_api(group.files[line], line) for line in lines) and not any(
                a is not None and any(str(n).startswith("<") for n in a) for a in spec)
            edits = tuple(SourceEdit("constrain", ctx.framework or "jax", spec=spec_tuple(spec), file=group.files[line],
                                     line=line, details={"position": "in-place"}) for line in lines) if direct else ()
            no_edit = None if edits else (
                f"line{'s' if len(lines) > 1 else ''} {_listed(lines)} call{'' if len(lines) > 1 else 's'} a helper "
                "of your program (or could not be read here): write the spec in each call by hand" if lines
                else _NO_EDIT)
        else:
            edits, no_edit, line_summary = _one_layout(ctx, source_from, spec)
            summary += line_summary
        if not makes_value:
            summary += (f" The value is {first.before.name} ({_dims(first.before_dims)} per device); no line of "
                        "your code is recorded for it: constrain it where your code makes it.")
            jax_code = rename_value(jax_code, "x", "<value>") or jax_code
            torch_code = rename_value(torch_code, "x", "<value>") or torch_code
        finding = self.finding(
            ctx,
            message,
            instruction=first.instruction,
            related=tuple(dict.fromkeys(
                [s.op.instruction for s, _ in chain[1:]] + [g.instruction for g in extra]
                + ([first.slice.name] if first.slice is not None else []) + [o.instruction for o in caused_ops]
                + (_gathered_back(ctx, group) if group.in_turn else [])
            )),
            source_from=source_from,
            suggestion=Suggestion(summary=summary, jax="# the layout " + ("its first constraint asks for" if group.in_turn else
                                                         "the value starts in") + f", at every step\n{jax_code}", torch_xla=torch_code, edits=edits, no_edit=no_edit),
            evidence={
                "pattern": "full-rematerialization" if remat else "conflicting-constraints" if group.in_turn
                else "back-and-forth",
                "value_line": makes_value,
                "reshards": len(chain),
                "reshard_kinds": [o.kind for o in ops],
                "layouts_per_device": [list(first.before_dims)] + [list(s.after_dims) for s, _ in chain],
                "reshard_bytes_per_device": reshard_bytes,
                "extra_all_gathers": len(extra),
                "all_gather_bytes_per_device": gather_bytes,
                "wasted_bytes_per_device": reshard_bytes + gather_bytes,
                "mesh_axes": list(first.op.mesh_axes) if first.op.mesh_axes else None,
                **({"constraint_lines": list(lines),
                    "gradient_reshards": list(dict.fromkeys(s.op.instruction for other in twins for s, _ in other)),
                    "later_reshards": later} if group.in_turn else {}),
            },
        )
        # the code names the value's variable only where the source line makes the value
        return with_user_variable(finding, "x") if makes_value else finding


Chain = list[tuple[Reshard, set[str]]]


def _on_repeated_rows(ctx: RuleContext, first: Reshard) -> bool:
    """Whether the value a chain starts from holds more rows of a batch input than the input's shard."""
    params, batch, module = ctx.semantics.parameters, ctx.semantics.batch, ctx.per_device
    entry = module.entry if module is not None else None
    if params is None or batch is None or entry is None or first.before.shape.is_tuple:
        return False
    return held_rows(batch, batch_shards(entry, params), first.computation.name, first.before) is not None


@dataclass(slots=True)
class _Group:
    """A chain, with the chains that the same root cause makes (see :func:`_by_constraints`)."""

    chain: Chain
    in_turn: bool = False  # the program's constraints take the value through three layouts or more
    lines: tuple[int, ...] = ()  # the lines of the constraints that move it on (those the dump records)
    files: dict[int, str] = field(default_factory=dict)  # each of those lines' file
    twins: list[Chain] = field(default_factory=list)  # the gradient's chains back through the same constraints
    later: list[Chain] = field(default_factory=list)  # later values flipped between the last layout and the kept one

    @property
    def kept(self) -> Reshard:
        """The step whose starting layout is the one to keep: for the program's constraints in turn,
        the one its first constraint asks for (in a loop the value can arrive in the last one's)."""
        first = self.chain[0][0]
        return self.chain[1][0] if self.in_turn and constraint_before(first) is None else first

    def moves(self) -> set[tuple]:
        """The changes between the kept layout and each other one the chain takes the value to, both
        ways, per dim, over the mesh axes."""
        kept = self.kept
        return {move for step, _ in self.chain if step.after_dims != kept.before_dims
                for move in (_move(kept.before_dims, step.after_dims, step.op),
                             _move(step.after_dims, kept.before_dims, step.op))}


def _by_constraints(ctx: RuleContext, chains: list[Chain], users_of,  # noqa: ANN001
                    steps: list[Reshard]) -> list[_Group]:
    """The chains, one group per root cause. For the program's constraints taking a value through
    three layouts or more (:func:`constrained_in_turn`): the lines of the constraints that move it on
    (not the first one's, whose layout is the one to keep); the other chains through the same lines
    (JAX constrains a value's gradient as it constrains the value: its chain runs back through them);
    and the later reshards of values between the last layout and the kept one, back and forth or
    once (``steps``: every reshard; the ops after the constraints want the kept layout, the value
    arrives in the last)."""
    groups: list[_Group] = []
    for chain in chains:
        if not constrained_in_turn(chain):
            groups.append(_Group(chain))
            continue
        group = _Group(chain, in_turn=True)
        keep = constraint_before(group.kept)
        kept_line = ctx.user_source(keep)[0] if keep is not None else None
        # each constraint's line; in torch_xla its reshard's (a mark records torch_xla's own frame, and comes
        # after the statement's elementwise op: the reshard carries that statement's line, the mark's call)
        torch = ctx.framework == "torch_xla"
        asked = [(constraint_after(step, users_of(step.computation)), step) for step, _ in chain]
        sources = [ctx.user_source(step.instruction)[0] if torch else
                   ctx.user_source(c)[0] if c is not None else None for c, step in asked]
        group.lines = tuple(sorted({s.line for s in sources if s is not None} - {kept_line.line if kept_line else -1}))
        group.files = {s.line: s.file for s in sources if s is not None}
        twin = next((g for g in groups if set(group.lines) & set(g.lines)), None)
        if twin is not None:
            twin.twins.append(chain)
        else:
            groups.append(group)
    in_turn = [g for g in groups if g.in_turn]
    kept: list[_Group] = []
    for group in groups:
        step = group.chain[0][0]
        if not group.in_turn and len(group.chain) == 2 and step.slice is None:
            owner = next((g for g in in_turn if _move(step.before_dims, step.after_dims, step.op) in g.moves()), None)
            if owner is not None:
                owner.later.append(group.chain)
                continue
        kept.append(group)
    chained = {step.op.instruction for group in groups for step, _ in group.chain} | {
        step.op.instruction for group in in_turn for twin in group.twins for step, _ in twin}
    for step in steps:
        if step.op.instruction in chained or step.slice is not None:
            continue
        owner = next((g for g in in_turn if _move(step.before_dims, step.after_dims, step.op) in g.moves()), None)
        if owner is not None:
            owner.later.append([(step, set())])
    return kept


def _gathered_back(ctx: RuleContext, group: _Group) -> list[str]:
    """The all-gathers that take values in one of the chain's layouts back toward the kept one, on a
    dim that layout split and the kept one does not (the ops after the constraints want the kept
    layout): symptoms of the same cause."""
    module = ctx.per_device
    kept = group.kept.before_dims
    # each layout the chain takes the value to -> the dims it splits that the kept layout does not
    split = {step.after_dims: {d for d, (a, b) in enumerate(zip(kept, step.after_dims, strict=False)) if b < a}
             for step, _ in group.chain if step.after_dims != kept and len(step.after_dims) == len(kept)}
    found = []
    for op in ctx.collectives:
        computation = module.computation(op.computation) if module is not None and op.kind == "all-gather" else None
        gather = computation.get(op.instruction) if computation is not None else None
        operand = computation.get(gather.operands[0]) if computation is not None and gather and gather.operands else None
        if gather is None or operand is None or operand.shape.is_tuple:
            continue
        dims = set(gather.dimensions or ())
        if dims and dims <= split.get(operand.shape.dims, set()):
            found.append(op.instruction)
    return found


def _move(before: tuple[int, ...], after: tuple[int, ...], op: Collective) -> tuple:
    """How a reshard changes each dim (after / before, as a pair), over which mesh axes."""
    return (tuple((a, b) if a != b else None for a, b in zip(before, after, strict=False)) if len(before) == len(after)
            else None, tuple(op.mesh_axes or ()))


def _listed(lines: tuple[int, ...]) -> str:
    return ", ".join(map(str, lines[:-1])) + (" and " if len(lines) > 1 else "") + str(lines[-1])


def _spec_code(ctx: RuleContext, spec: list) -> str:
    return torch_spec(spec) if ctx.framework == "torch_xla" else jax_spec(spec)


_NO_EDIT = ("which of the layouts the value takes is the right one depends on the ops around it: remove or align "
            "the disagreeing constraint by hand")


def _one_layout(ctx: RuleContext, instruction: Instruction | None, spec: list,
                ) -> tuple[tuple[SourceEdit, ...], str | None, str]:
    """The edit when the churn comes from one constraint of the program that writes several
    layouts (``with_sharding_constraint(x, layouts[i % 2])`` in a loop): the runner recorded that
    line with two or more specs of the value's rank, one of them the layout the value starts in;
    that one, written on the line, is what every pass then constrains to. Constraints on different
    lines, or a starting layout the line never writes, are for the user to align (no edit)."""
    if instruction is None or ctx.framework not in ("jax", "torch_xla") or any(
            a is not None and any(name.startswith("<") for name in a) for a in spec):
        return (), _NO_EDIT, ""
    source, _ = ctx.user_source(instruction)
    if source is None:
        return (), _NO_EDIT, ""
    written = set()
    for call in ctx.sharding_calls:
        recorded = parse_spec_text(str(call.get("spec", "")))
        shape = call.get("shape") or ()
        if user_line(call) == (source.file, source.line) and recorded is not None and len(shape) == len(spec):
            written.add(normalize(recorded))
    start = normalize(spec_tuple(spec))
    if len(written) < 2 or start not in written:
        return (), _NO_EDIT, ""
    code = jax_spec(spec) if ctx.framework == "jax" else torch_spec(spec)
    edit = SourceEdit("constrain", ctx.framework, spec=spec_tuple(spec), file=source.file, line=source.line,
                      details={"position": "in-place"})
    return (edit,), None, (f" Line {source.line} writes {len(written)} layouts for it in turn: write {code} there, the "
                           "layout it starts in, so every pass keeps it (the dump cannot show whether a later op "
                           "wanted the other layout: `hlo-doctor fix --verify` recompiles to check that no new "
                           "collective takes the reshards' place).")


def _spec(ctx: RuleContext, step: Reshard) -> list:
    """A partition spec for the value's starting layout: the reshard's mesh axes on the dim that shrank."""
    full = step.after_dims if step.slice is None else step.instruction.shape.dims
    axes = tuple(step.op.mesh_axes) if step.op.mesh_axes else (f"<axis of size {step.op.group_size}>",)
    spec: list = [None] * len(step.before_dims)
    for d, (a, b) in enumerate(zip(step.before_dims, full)):
        if a < b:
            spec[d] = axes
            break
    return spec


def _dims(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, dims)) + "]"


