"""Reshards of one value in the partitioned module, linked into chains (for ``reshard-churn``).

A reshard is a collective that only moves a value to another layout: an
``all-to-all`` or ``collective-permute``, or an ``all-gather`` whose result is
only ``dynamic-slice``-d by partition id (XLA's involuntary full
rematerialization). Two reshards are one chain when the second takes the
first's result through elementwise and layout ops alone and either undoes it
(the value goes back and forth) or, both made by the program's own sharding
constraints, takes it to a third layout (``A -> B -> C``: the middle one was
resharded into for nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hlo_doctor.graph.collectives import Collective
from hlo_doctor.hlo.ir import Computation, Instruction
from hlo_doctor.program.records import made_by_sharding_call
from hlo_doctor.semantics.opclasses import LAYOUT_ONLY, NOT_ELEMENTWISE, RESHARD_COLLECTIVES

__all__ = ["Reshard", "constrained_in_turn", "constraint_after", "constraint_before", "rematerialization",
           "reshard_chains", "reshard_step", "walk_up"]

_MAX_WALK = 64


@dataclass(frozen=True, slots=True)
class Reshard:
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


def reshard_step(op: Collective, instruction: Instruction, computation: Computation, users) -> Reshard | None:
    if not instruction.operands:
        return None
    before = walk_up(computation, instruction.operands[0])
    after = _walk_down(instruction, users)
    if op.kind == "all-to-all" and before.shape.dims == after.shape.dims:
        return None  # a layout-preserving all-to-all: not a reshard we can judge
    return Reshard(op, instruction, computation, before, after)


def rematerialization(op: Collective, instruction: Instruction, computation: Computation, users) -> Reshard | None:
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
            before = walk_up(computation, instruction.operands[0])
            return Reshard(op, instruction, computation, before, user, slice=user)
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


def reshard_chains(steps: dict[str, Reshard], users_of) -> list[list[tuple[Reshard, set[str]]]]:
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
        if other.slice is None and (_undoes(step, other) or _constrained_in_turn(step, other)):
            nxt[step.op.instruction] = (other.op.instruction, path)
            has_prev.add(other.op.instruction)
    chains: list[list[tuple[Reshard, set[str]]]] = []
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


def _next_reshard(step: Reshard, by_instruction, users) -> tuple[Reshard, set[str]] | None:
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


def _feeds_reshard(computation: Computation, node: Instruction, users, by_instruction) -> Reshard | None:
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


def _undoes(first: Reshard, second: Reshard) -> bool:
    if first.op.kind == "collective-permute" and second.op.kind == "collective-permute":
        a = set(first.instruction.source_pairs or ())
        b = set(second.instruction.source_pairs or ())
        return bool(a) and {(t, s) for s, t in a} == b
    return (
        second.after_dims == first.before_dims
        and first.after_dims != first.before_dims
        and second.after.shape.element_type == first.before.shape.element_type
    )


def _constrained_in_turn(first: Reshard, second: Reshard) -> bool:
    """Whether the program's own constraints make both reshards, one after the other on one value
    (A -> B -> C): the second takes the value to a third layout the first never had, so the middle
    one is resharded into for nothing, however the chain ends."""
    before_first, before_second = constraint_before(first), constraint_before(second)
    return (before_first is not None and before_second is not None and before_first is not before_second
            and first.after_dims != first.before_dims
            and second.after_dims not in (second.before_dims, first.after_dims))


def walk_up(computation: Computation, name: str) -> Instruction:
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


def constraint_before(step: Reshard) -> Instruction | None:
    """The sharding constraint (JAX's copy, torch_xla's custom-call Sharding) the chain starts from."""
    computation = step.computation
    node: Instruction | None = step.before
    for _ in range(8):
        if node is None:
            return None
        if _made_by_constraint(node):
            return node
        if node.opcode not in ("reshape", "transpose", "bitcast", "copy") or not node.operands:
            return None
        node = computation.get(node.operands[0])
    return None


def constraint_after(step: Reshard, users) -> Instruction | None:  # noqa: ANN001 - users: name -> its users
    """The sharding constraint that takes the reshard's result (through layout ops): the one that
    asked for the layout the reshard makes."""
    node = step.after
    for _ in range(8):
        if _made_by_constraint(node):
            return node
        following = users.get(node.name, [])
        if len(following) != 1 or following[0].opcode not in ("reshape", "transpose", "bitcast", "copy"):
            return None
        node = following[0]
    return None


def constrained_in_turn(chain: list[tuple[Reshard, set[str]]]) -> bool:
    """Whether the chain is the program's constraints taking one value through three layouts or more
    (not a value sent back and forth between two)."""
    layouts = {chain[0][0].before_dims, *(step.after_dims for step, _ in chain)}
    return len(chain) > 1 and len(layouts) > 2 and sum(constraint_before(step) is not None for step, _ in chain) > 1


def _made_by_constraint(node: Instruction) -> bool:
    """Whether a sharding constraint of the program made ``node``: the constraint itself, or an op of
    its lowering (the reshapes around its all-to-all carry its op_name), so that a walk through
    layout ops stops at it (:func:`~hlo_doctor.rules._program_layouts.is_program_constraint` is the
    constraint alone)."""
    if made_by_sharding_call(node):
        return True
    # beyond its metadata's last part: an op named after the constraint, or nested in its name scope
    op_name = (node.metadata.op_name or "") if node.metadata is not None else ""
    return "sharding_constraint" in op_name or node.name.startswith("sharding_constraint") or (
        node.opcode == "custom-call" and "Sharding" in (node.attribute("custom_call_target") or ""))
