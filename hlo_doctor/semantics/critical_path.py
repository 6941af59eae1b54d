"""Collective bytes per device per step, by role, and how many of them sit on the critical path.

A collective's bytes are :attr:`CollectiveFacts.bytes_per_step
<hlo_doctor.semantics.collective_model.CollectiveFacts.bytes_per_step>`: the larger of the
bytes a device sends in and gets out, times the executions per step (the measure
``hlo-doctor diff`` and the module summaries use). A combined (tuple) collective's bytes are
shared among its operands in proportion to their input bytes.

**On the critical path** are the bytes of operands whose value derives from a data input of the
step (:mod:`hlo_doctor.semantics.parameters` decides which entry parameters are data, from the
dataflow, never from names). Such a value exists only once the step's data has arrived and the
compute before the collective has run, so the collective waits for that compute and the compute
after it waits for the collective: activation gathers, tensor-parallel activation sums,
reshards of activations, expert dispatches, pipeline sends, gradient reductions (their operand
is the backward pass's weight gradient) and the loss's all-reduce.

**Prefetchable** (off the critical path) are the bytes of operands that derive from no data
input: from weights, optimizer state and constants only. Those values are known before the step
starts (the previous step's update wrote them), so the scheduler can issue the collective as
early as it likes and overlap it with earlier compute (FSDP's weight gathers: XLA's
latency-hiding scheduler on GPU and TPU prefetches them a layer ahead). The CPU backend runs
collectives synchronously; the split says what *can* overlap, from the dataflow, on a backend
that overlaps. A collective whose device groups all talk only to themselves moves nothing
between devices: its bytes count as prefetchable (no traffic waits on it).

The right fix can send more bytes yet fewer on the critical path: the seed program's fix
gathers each weight instead of the activations (weight-gather bytes up, critical-path bytes
down to zero).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hlo_doctor.graph.dataflow import DataflowGraph
from hlo_doctor.semantics.parameters import EntryParameters
from hlo_doctor.semantics.roles import ROLES, CollectiveRole

__all__ = ["ByteAccount", "CollectiveBytes", "account_bytes"]

_GATHERS = frozenset({"all-gather", "collective-permute"})


@dataclass(frozen=True, slots=True)
class CollectiveBytes:
    """One collective's bytes per device per step, split by role and by critical path.

    ``roles``: bytes per operand role (a combined collective may serve several);
    ``critical``: the bytes of operands derived from a data input; ``prefetchable`` the rest.
    ``parameters``: the entry parameters its main operand serves (the role's).
    """

    computation: str
    instruction: str
    kind: str
    role: str
    phase: str
    bytes_per_step: int
    critical: int
    prefetchable: int
    roles: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)
    parameters: tuple[int, ...] = ()

    @property
    def can_overlap(self) -> bool:
        """Whether all of its bytes are prefetchable (it waits on no compute of the step)."""
        return self.bytes_per_step > 0 and self.critical == 0


@dataclass(frozen=True, slots=True)
class ByteAccount:
    """Every collective of one module with its bytes per device per step (see the module docstring)."""

    collectives: tuple[CollectiveBytes, ...] = ()

    @property
    def total(self) -> int:
        return sum(c.bytes_per_step for c in self.collectives)

    @property
    def critical(self) -> int:
        return sum(c.critical for c in self.collectives)

    @property
    def prefetchable(self) -> int:
        return sum(c.prefetchable for c in self.collectives)

    @property
    def by_role(self) -> dict[str, int]:
        """Bytes per role, in :data:`~hlo_doctor.semantics.roles.ROLES` order; roles with no bytes left out."""
        totals = dict.fromkeys(ROLES, 0)
        for collective in self.collectives:
            for role, nbytes in collective.roles.items():
                totals[role] = totals.get(role, 0) + nbytes
        return {role: nbytes for role, nbytes in totals.items() if nbytes}

    @property
    def overlappable_gathers(self) -> tuple[CollectiveBytes, ...]:
        """The gathers (all-gathers, ring rotations) that wait on no compute: the ones that can be prefetched."""
        return tuple(c for c in self.collectives if c.kind in _GATHERS and c.can_overlap)


def account_bytes(graph: DataflowGraph, params: EntryParameters,
                  roles: tuple[CollectiveRole, ...]) -> ByteAccount:
    """The bytes of every collective in ``roles`` (from :func:`~hlo_doctor.semantics.roles.assign_roles`)."""
    data_mask = params.data_mask()
    out = []
    for role in roles:
        facts = role.facts
        total = facts.bytes_per_step
        operands = facts.operands
        weights = [o.bytes_in for o in operands]
        whole = sum(weights)
        shares = _shares(total, weights) if whole else [total]
        per_role: dict[str, int] = {}
        critical = 0
        for index, share in enumerate(shares):
            operand_role = role.operands[index].role if index < len(role.operands) else role.role
            per_role[operand_role] = per_role.get(operand_role, 0) + share
            if facts.self_only or index >= len(operands):
                continue
            node = graph.id_of(operands[index].key)
            if node is not None and graph.parameter_bits(node) & data_mask:
                critical += share
        out.append(CollectiveBytes(
            computation=facts.computation, instruction=facts.instruction, kind=facts.effective_kind,
            role=role.role, phase=role.phase, bytes_per_step=total, critical=critical,
            prefetchable=total - critical, roles=per_role, parameters=role.parameters,
        ))
    return ByteAccount(tuple(out))


def _shares(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, the rounding left on the last share."""
    whole = sum(weights)
    shares = [total * w // whole for w in weights]
    shares[-1] += total - sum(shares)
    return shares
