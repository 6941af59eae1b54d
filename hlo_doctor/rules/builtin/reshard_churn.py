"""reshard-churn: the same value resharded back and forth between neighbouring ops."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.findings import SourceEdit
from hlo_doctor.graph.collectives import Collective
from hlo_doctor.hlo.ir import Computation, Instruction
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
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics.opclasses import LAYOUT_ONLY, NOT_ELEMENTWISE, RESHARD_COLLECTIVES
from hlo_doctor.units import format_bytes

_MAX_WALK = 64


@dataclass(frozen=True, slots=True)
class ReshardChurnOptions:
    min_bytes: int = 0
    """Ignore chains whose collectives send fewer bytes per device per step in all."""


@dataclass(frozen=True, slots=True)
class _Reshard:
    """One resharding step: a collective (or all-gather + dynamic-slice) from one layout to another."""

    op: Collective
    instruction: Instruction
    computation: Computation
    before: Instruction  # the value before the layout ops that feed the collective
    after: Instruction  # the value after the layout ops that follow it (or the dynamic-slice)
    slice: Instruction | None = None  # all-gather + dynamic-slice: the slice

    @property
    def before_dims(self) -> tuple[int, ...]:
        return self.before.shape.dims

    @property
    def after_dims(self) -> tuple[int, ...]:
        return self.after.shape.dims


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
      full rematerialization").

    Collectives that also gather a value of the chain (an ``all-gather`` of
    an intermediate layout) are counted with it. One finding per chain, at
    its first collective; the source line is the sharding constraint that
    feeds it when there is one. The evidence says how many bytes per device
    the chain sends.

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
    The constraint is written at the line that makes the value (its
    constraint, or the op before the first reshard); a reshard carries its
    consumer's line, whose variable is another value, so when no line of
    the program is recorded for the value the code names it ``<value>``.

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
    reads = frozenset({"per_device"})
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

        steps: dict[str, _Reshard] = {}
        gathers: dict[tuple[str, str], Collective] = {}  # (computation, operand) -> all-gather
        for op in collectives:
            computation = module.computation(op.computation)
            instruction = computation.get(op.instruction) if computation is not None else None
            if computation is None or instruction is None:
                continue
            if op.kind in RESHARD_COLLECTIVES:
                step = _reshard_step(op, instruction, computation, users_of(computation))
            elif op.kind == "all-gather":
                step = _rematerialization(op, instruction, computation, users_of(computation))
                if step is None and instruction.operands:
                    before = _walk_up(computation, instruction.operands[0])
                    gathers[(computation.name, before.name)] = op
            else:
                step = None
            if step is not None:
                steps[op.instruction] = step
        chains = _chains(steps, users_of)
        for chain in chains:
            finding = self._finding(ctx, chain, gathers)
            if finding is not None:
                yield finding

    def _finding(self, ctx: RuleContext, chain: list[tuple[_Reshard, set[str]]], gathers) -> Finding | None:
        executions = ctx.executions
        first = chain[0][0]
        ops = [s.op for s, _ in chain]
        values: set[str] = {first.before.name}
        for _, path in chain:
            values |= path
        extra = [g for (comp, name), g in gathers.items() if comp == first.computation.name and name in values]
        reshard_bytes = sum(o.wire_bytes_per_device * executions.get(o.computation, 1) for o in ops)
        gather_bytes = sum(o.wire_bytes_per_device * executions.get(o.computation, 1) for o in extra)
        if reshard_bytes + gather_bytes < self.options.min_bytes:
            return None
        remat = len(chain) == 1 and first.slice is not None
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
            )
        if extra:
            message += f"; {len(extra)} all-gather{'s' if len(extra) != 1 else ''} of the same value add to it"
        message += f": {format_bytes(reshard_bytes + gather_bytes)} sent per device per step for nothing"
        constraint = _constraint_before(first)
        # the line to constrain is the one that makes the value (its constraint, or the op before the first
        # reshard); a reshard's own line is its consumer's, whose variable is another value
        source_from = next((i for i in (constraint, first.before) if i is not None
                            and ctx.user_source(i)[0] is not None), None)
        makes_value = source_from is not None
        if source_from is None:
            source_from = next((s.instruction for s, _ in chain if ctx.user_source(s.instruction)[0] is not None), None)
        spec = _spec(ctx, first)
        jax_code, torch_code = constraint_code(spec)
        where = f" (the constraint {constraint.name})" if constraint is not None else ""
        summary = (
            f"Give the value one sharding{where}: constrain it to the same layout at every step, or remove the "
            "constraint that disagrees, so the partitioner has nothing to reshard."
        )
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
                + ([first.slice.name] if first.slice is not None else [])
            )),
            source_from=source_from,
            suggestion=Suggestion(summary=summary, jax=f"# the layout the value starts in, at every step\n{jax_code}",
                                  torch_xla=torch_code, edits=edits, no_edit=no_edit),
            evidence={
                "pattern": "full-rematerialization" if remat else "back-and-forth",
                "value_line": makes_value,
                "reshards": len(chain),
                "reshard_kinds": [o.kind for o in ops],
                "layouts_per_device": [list(first.before_dims)] + [list(s.after_dims) for s, _ in chain],
                "reshard_bytes_per_device": reshard_bytes,
                "extra_all_gathers": len(extra),
                "all_gather_bytes_per_device": gather_bytes,
                "wasted_bytes_per_device": reshard_bytes + gather_bytes,
                "mesh_axes": list(first.op.mesh_axes) if first.op.mesh_axes else None,
            },
        )
        # the code names the value's variable only where the source line makes the value
        return with_user_variable(finding, "x") if makes_value else finding


def _reshard_step(op: Collective, instruction: Instruction, computation: Computation, users) -> _Reshard | None:
    if not instruction.operands:
        return None
    before = _walk_up(computation, instruction.operands[0])
    after = _walk_down(instruction, users)
    if op.kind == "all-to-all" and before.shape.dims == after.shape.dims:
        return None  # a layout-preserving all-to-all: not a reshard we can judge
    return _Reshard(op, instruction, computation, before, after)


def _rematerialization(op: Collective, instruction: Instruction, computation: Computation, users) -> _Reshard | None:
    """all-gather whose only use (through layout ops) is a partition-dependent dynamic-slice."""
    if not instruction.operands:
        return None
    current = instruction
    for _ in range(8):
        following = users.get(current.name, [])
        if len(following) != 1:
            return None
        user = following[0]
        if user.opcode == "dynamic-slice" and user.operands and user.operands[0] == current.name:
            if not _depends_on_partition(computation, user.operands[1:]):
                return None
            before = _walk_up(computation, instruction.operands[0])
            return _Reshard(op, instruction, computation, before, user, slice=user)
        if user.opcode not in LAYOUT_ONLY:
            return None
        current = user
    return None


def _depends_on_partition(computation: Computation, names) -> bool:
    stack, seen = list(names), set()
    while stack and len(seen) < 64:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = computation.get(name)
        if node is None:
            continue
        if node.opcode in ("partition-id", "replica-id"):
            return True
        stack.extend(node.operands)
    return False


def _chains(steps: dict[str, _Reshard], users_of) -> list[list[tuple[_Reshard, set[str]]]]:
    """Reshards linked when the second undoes the first on an elementwise-only path; one list per chain."""
    nxt: dict[str, tuple[str, set[str]]] = {}
    has_prev: set[str] = set()
    by_instruction = {(s.computation.name, s.instruction.name): s for s in steps.values()}
    for step in steps.values():
        if step.slice is not None:
            continue
        found = _next_reshard(step, by_instruction, users_of(step.computation))
        if found is None:
            continue
        other, path = found
        if other.slice is None and _undoes(step, other):
            nxt[step.op.instruction] = (other.op.instruction, path)
            has_prev.add(other.op.instruction)
    chains: list[list[tuple[_Reshard, set[str]]]] = []
    for name, step in steps.items():
        if name in has_prev:
            continue
        if step.slice is not None:
            chains.append([(step, set())])
            continue
        if name not in nxt:
            continue
        chain = [(step, set())]
        seen = {name}
        current = name
        while current in nxt:
            following, path = nxt[current]
            if following in seen:
                break
            seen.add(following)
            chain.append((steps[following], path))
            current = following
        chains.append(chain)
    return chains


def _next_reshard(step: _Reshard, by_instruction, users) -> tuple[_Reshard, set[str]] | None:
    """The next reshard of ``step``'s result reached through elementwise and layout ops only."""
    computation = step.computation
    start = step.after
    frontier = [start]
    seen = {start.name}
    while frontier and len(seen) < _MAX_WALK:
        node = frontier.pop(0)
        for user in users.get(node.name, []):
            if user.name in seen:
                continue
            seen.add(user.name)
            other = by_instruction.get((computation.name, user.name))
            if other is not None and other is not step:
                return other, seen - {user.name}
            fed = _feeds_reshard(computation, user, users, by_instruction)
            if fed is not None:
                return fed, seen
            if (user.opcode in NOT_ELEMENTWISE and not _padding_only(user)) or user.opcode in RESHARD_COLLECTIVES \
                    or user.opcode.startswith(("all-", "reduce-scatter", "collective-")):
                continue
            frontier.append(user)
    return None


_SLICE_DIM = re.compile(r"\[0:(\d+)(?::1)?\]")
_PAD_DIM = re.compile(r"0_(\d+)(?:_0)?")


def _padding_only(instruction: Instruction) -> bool:
    """A ``slice`` that keeps each dim's head, or a ``pad`` that only appends to each dim's end: what the
    partitioner puts around a reshard of a dim its shard count does not divide (the value's content
    unchanged, its padding dropped or added back)."""
    if instruction.opcode == "slice":
        text = (instruction.attribute("slice") or "").strip("{} ")
        dims = [d.strip() for d in text.split(",")] if text else []
        return bool(dims) and all(_SLICE_DIM.fullmatch(d) for d in dims)
    if instruction.opcode == "pad":
        text = instruction.attribute("padding") or ""
        return bool(text) and all(_PAD_DIM.fullmatch(d) for d in text.split("x"))
    return False


def _feeds_reshard(computation: Computation, node: Instruction, users, by_instruction) -> _Reshard | None:
    """The reshard that ``node`` feeds through layout ops (reshape/transpose around an all-to-all)."""
    current = node
    for _ in range(4):
        if current.opcode not in LAYOUT_ONLY:
            return None
        following = users.get(current.name, [])
        for user in following:
            found = by_instruction.get((computation.name, user.name))
            if found is not None:
                return found
        if len(following) != 1:
            return None
        current = following[0]
    return None


def _undoes(first: _Reshard, second: _Reshard) -> bool:
    if first.op.kind == "collective-permute" and second.op.kind == "collective-permute":
        a = set(first.instruction.source_pairs or ())
        b = set(second.instruction.source_pairs or ())
        return bool(a) and {(t, s) for s, t in a} == b
    return (
        second.after_dims == first.before_dims
        and first.after_dims != first.before_dims
        and second.after.shape.element_type == first.before.shape.element_type
    )


def _walk_up(computation: Computation, name: str) -> Instruction:
    node = computation.get(name)
    assert node is not None
    for _ in range(8):
        if node.opcode not in ("reshape", "transpose", "bitcast") or not node.operands:
            break
        parent = computation.get(node.operands[0])
        if parent is None:
            break
        node = parent
    return node


def _walk_down(instruction: Instruction, users) -> Instruction:
    node = instruction
    for _ in range(8):
        following = users.get(node.name, [])
        if len(following) != 1 or following[0].opcode not in ("reshape", "transpose", "bitcast"):
            break
        node = following[0]
    return node


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


def _constraint_before(step: _Reshard) -> Instruction | None:
    """The sharding constraint (JAX's copy, torch_xla's custom-call Sharding) the chain starts from."""
    computation = step.computation
    node: Instruction | None = step.before
    for _ in range(8):
        if node is None:
            return None
        metadata = node.metadata
        op_name = (metadata.op_name or "") if metadata is not None else ""
        if "sharding_constraint" in op_name or node.name.startswith("sharding_constraint") or (
            node.opcode == "custom-call" and "Sharding" in (node.attribute("custom_call_target") or "")
        ):
            return node
        if node.opcode not in ("reshape", "transpose", "bitcast", "copy") or not node.operands:
            return None
        node = computation.get(node.operands[0])
    return None


def _spec(ctx: RuleContext, step: _Reshard) -> list:
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


