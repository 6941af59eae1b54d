"""One model of every collective of a per-device module, in whatever form XLA wrote it.

Built on :func:`hlo_doctor.graph.collectives.find_collectives` (sync ops,
dedicated ``-start``/``-done`` pairs, ``async-start`` wrappers), it adds what
the rules need and used to rebuild each on its own:

* **composite forms**: an all-reduce whose result is only dynamic-sliced is a
  reduce-scatter in effect (CPU's FSDP gradients always take this form);
  an all-gather whose result is dynamic-sliced again is XLA's involuntary
  full rematerialization (a reshard between two shardings);
* **operands**: a combined (tuple) collective gets facts per operand; the
  bytes out of operand ``i`` are its share of the result (exact for one operand);
* **executions per step** (:mod:`hlo_doctor.semantics.execution`), with
  whether the loop trip counts were known;
* **schedule position** in a scheduled module (``is_scheduled=true``): the
  index of the start and of the done in their computation's sequence;
* **the slow boundary**: whether any group crosses hosts (GPU, CPU) or
  slices (TPU), self-pairs of a collective-permute excluded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hlo_doctor.graph.collectives import Collective
from hlo_doctor.graph.dataflow import DataflowGraph, NodeKey
from hlo_doctor.graph.devices import DeviceMap
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction, Shape
from hlo_doctor.hlo.opcodes import COLLECTIVE_OPCODES
from hlo_doctor.semantics.execution import Executions

__all__ = ["CollectiveFacts", "OperandFacts", "collective_facts", "collective_kind"]

# Ops a value passes through unchanged in content on its way to a slice.
_PASS_THROUGH = frozenset({"bitcast", "reshape", "copy", "convert"})


@dataclass(frozen=True, slots=True)
class OperandFacts:
    """One operand of a collective: the value it sends, and its bytes per device."""

    index: int
    key: NodeKey
    shape: Shape
    bytes_in: int
    bytes_out: int


@dataclass(frozen=True, slots=True)
class CollectiveFacts:
    """A collective as it runs, with everything the analysis layer knows of it.

    ``effective_kind`` is ``reduce-scatter`` for an all-reduce that is only
    dynamic-sliced; ``sliced_by`` names that dynamic-slice (also for an
    all-gather + dynamic-slice, where ``rematerialized`` is True).
    ``executions`` is None when the module was not walked from its entry.
    """

    op: Collective
    key: NodeKey
    result_key: NodeKey
    effective_kind: str
    sliced_by: str | None
    rematerialized: bool
    operands: tuple[OperandFacts, ...]
    executions: Executions
    schedule_position: tuple[int, int] | None
    crosses_slow_boundary: bool | None
    self_only: bool

    @property
    def kind(self) -> str:
        return self.op.kind

    @property
    def instruction(self) -> str:
        return self.op.instruction

    @property
    def computation(self) -> str:
        return self.op.computation

    @property
    def bytes_per_device(self) -> int:
        """The larger of the bytes in and out per device per execution."""
        return max(self.op.bytes_in_per_device, self.op.bytes_out_per_device)

    @property
    def bytes_per_step(self) -> int:
        return self.bytes_per_device * self.executions.count

    @property
    def wire_bytes_per_step(self) -> int:
        return self.op.wire_bytes_per_device * self.executions.count

    @property
    def talking_groups(self) -> tuple[tuple[int, ...], ...]:
        """The logical groups that exchange data (self-pairs of a permute left out)."""
        groups = self.op.logical_groups
        if self.op.kind == "collective-permute":
            return tuple(g for g in groups if len(set(g)) > 1)
        return tuple(g for g in groups if len(g) > 1)


def collective_facts(
    module: HloModule,
    graph: DataflowGraph,
    collectives: tuple[Collective, ...],
    device_map: DeviceMap,
    executions: dict[str, Executions],
    users_of: Callable[[Computation], dict[str, list[Instruction]]] = Computation.users,
) -> tuple[CollectiveFacts, ...]:
    """The facts of every collective found in ``module``, in the finder's order. ``users_of`` gives a
    computation's users by value name (:meth:`~hlo_doctor.hlo.ir.Computation.users`, perhaps kept)."""
    scheduled = (module.attribute("is_scheduled") or "").strip() == "true"
    positions: dict[str, dict[str, int]] = {}
    by_groups: dict[tuple[tuple[int, ...], ...], tuple[bool, bool | None]] = {}
    out = []
    for op in collectives:
        computation = module.computation(op.computation)
        if computation is None:
            continue
        users = users_of(computation)
        start = computation.get(op.instruction)
        if start is None:
            continue
        result_name = op.done or op.instruction
        sliced = _slice_after(users, result_name)
        if op.kind == "all-reduce" and sliced is not None:
            effective = "reduce-scatter"
        else:
            effective = op.kind
        position = None
        if scheduled:
            index = positions.get(computation.name)
            if index is None:
                index = positions[computation.name] = {i.name: n for n, i in enumerate(computation.instructions)}
            position = (index.get(op.instruction, -1), index.get(result_name, -1))
        # A module's collectives share a few group layouts: each is judged once.
        groups = op.logical_groups
        judged = by_groups.get(groups)
        if judged is None:
            judged = by_groups[groups] = _crossing(groups, device_map)
        talking, crosses = judged
        out.append(CollectiveFacts(
            op=op,
            key=(computation.name, op.instruction),
            result_key=(computation.name, result_name),
            effective_kind=effective,
            sliced_by=sliced,
            rematerialized=op.kind == "all-gather" and sliced is not None,
            operands=_operands(op, start, computation),
            executions=executions.get(computation.name, Executions(1, False)),
            schedule_position=position,
            crosses_slow_boundary=crosses,
            self_only=not talking,
        ))
    return tuple(out)


def _crossing(groups: tuple[tuple[int, ...], ...], device_map: DeviceMap) -> tuple[bool, bool | None]:
    """Whether any group has devices that talk (not only to themselves), and whether one of
    those crosses the slow boundary (None: unknown)."""
    talking = [g for g in groups if len(set(g)) > 1]
    crosses: bool | None = False
    for group in talking:
        spans = device_map.crosses_slow_boundary(group)
        if spans is None:
            crosses = None
            break
        if spans:
            crosses = True
            break
    return bool(talking), crosses


def _slice_after(users: dict[str, list[Instruction]], name: str) -> str | None:
    """The dynamic-slice that is the only reader of ``name`` (through bitcasts, reshapes, copies)."""
    current = name
    for _ in range(4):
        readers = users.get(current, ())
        if len(readers) != 1:
            return None
        reader = readers[0]
        if reader.opcode == "dynamic-slice":
            return reader.name
        if reader.opcode not in _PASS_THROUGH:
            return None
        current = reader.name
    return None


def _operands(op: Collective, start: Instruction, computation) -> tuple[OperandFacts, ...]:
    names = start.operands
    if op.kind in ("collective-permute", "ragged-all-to-all"):
        names = names[:1]
    found = []
    for index, name in enumerate(names):
        operand = computation.get(name)
        if operand is None or operand.shape.element_type in ("token", "u32") and operand.shape.rank == 0:
            continue
        found.append((index, name, operand.shape))
    total_in = sum(s.byte_size for _, _, s in found) or 1
    out_total = op.bytes_out_per_device
    return tuple(
        OperandFacts(index, (computation.name, name), shape, shape.byte_size,
                     out_total if len(found) == 1 else out_total * shape.byte_size // total_in)
        for index, name, shape in found
    )


def collective_kind(instruction: Instruction, module: HloModule | None = None) -> str | None:
    """all-gather, all-reduce, ... for a collective or the start of one; None otherwise (and for a done)."""
    opcode = instruction.opcode
    if opcode in COLLECTIVE_OPCODES:
        return opcode
    if opcode.endswith("-start") and opcode[: -len("-start")] in COLLECTIVE_OPCODES:
        return opcode[: -len("-start")]
    if opcode == "async-start":
        printed = instruction.printed_opcode or ""
        if printed.endswith("-start") and printed[: -len("-start")] in COLLECTIVE_OPCODES:
            return printed[: -len("-start")]
        if module is not None:
            for name in instruction.called_computations:
                called = module.computation(name)
                root = called.root if called is not None else None
                if root is not None and root.opcode in COLLECTIVE_OPCODES:
                    return root.opcode
    return None
