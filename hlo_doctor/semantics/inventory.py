"""The communication inventory of a module: what the step sends, and why.

One row per collective, with the role values of :mod:`hlo_doctor.semantics.roles`;
:func:`inventory_document` is the JSON of ``hlo-doctor collectives``
(``schema_version`` 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hlo_doctor.semantics import ModuleSemantics

__all__ = ["SCHEMA_VERSION", "InventoryRow", "inventory_document", "module_rows", "totals_by_role"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class InventoryRow:
    instruction: str
    kind: str
    role: str
    phase: str
    parameters: tuple[str, ...]
    axes: tuple[str, ...] | None
    group_size: int
    crosses_hosts: bool | None
    bytes_per_device: int
    executions: int | None
    source: str | None
    reason: str

    @property
    def bytes_per_step(self) -> int:
        return self.bytes_per_device * (self.executions or 1)

    def as_json(self) -> dict[str, Any]:
        return {
            "instruction": self.instruction,
            "kind": self.kind,
            "role": self.role,
            "phase": self.phase,
            "parameters": list(self.parameters),
            "axes": list(self.axes) if self.axes is not None else None,
            "group_size": self.group_size,
            "crosses_hosts": self.crosses_hosts,
            "bytes_per_device": self.bytes_per_device,
            "executions": self.executions,
            "source": self.source,
            "reason": self.reason,
        }


def module_rows(semantics: ModuleSemantics, source_of=None) -> list[InventoryRow]:  # noqa: ANN001
    """The rows of one module, sorted by bytes per step (largest first).

    ``source_of(instruction)`` may give the user's ``file:line`` of an op.
    """
    params = semantics.parameters
    names = params.names if params is not None else {}
    rows = []
    for role in semantics.roles:
        facts = role.facts
        executions = facts.executions
        source = None
        if source_of is not None and facts.op.op is not None:
            source = source_of(facts.op.outer or facts.op.op)
        rows.append(InventoryRow(
            instruction=facts.instruction,
            kind=facts.effective_kind,
            role=role.role,
            phase=role.phase,
            parameters=tuple(names.get(n, f"parameter {n}") for n in role.parameters),
            axes=facts.op.mesh_axes,
            group_size=facts.op.group_size,
            crosses_hosts=facts.crosses_slow_boundary,
            bytes_per_device=facts.bytes_per_device,
            executions=executions.count if executions.known else None,
            source=source,
            reason=role.reason,
        ))
    rows.sort(key=lambda r: (-r.bytes_per_step, r.instruction))
    return rows


def totals_by_role(rows: Iterable[InventoryRow]) -> dict[str, tuple[int, int]]:
    """role -> (count, bytes per device per step), largest first."""
    totals: dict[str, list[int]] = {}
    for row in rows:
        entry = totals.setdefault(row.role, [0, 0])
        entry[0] += 1
        entry[1] += row.bytes_per_step
    return {k: (v[0], v[1]) for k, v in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def inventory_document(modules: Iterable[tuple[str, list[InventoryRow]]]) -> dict[str, Any]:
    """The JSON document of ``hlo-doctor collectives``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "modules": [
            {"name": name, "collectives": [row.as_json() for row in rows]}
            for name, rows in modules
        ],
    }
