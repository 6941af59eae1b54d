"""A root cause's symptoms at a glance: one entry per kind of symptom, with its count and bytes.

A finding that explains other rules' findings keeps them under ``evidence["symptoms"]``
(:func:`hlo_doctor.rules.engine.fold_symptoms`), each with its rule, op, message and, for a
collective, its ``kind`` (``activation all-gather``, ``cross-host partial-sum all-reduce``)
and ``wire_bytes_per_step``. The text and HTML reports show :func:`symptom_kinds` instead of
listing every op; ``--verbose`` (text) and the HTML table's details list each one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hlo_doctor.findings import Finding
from hlo_doctor.units import format_bytes

__all__ = ["SymptomKind", "symptom_kinds", "symptoms_of"]


@dataclass(frozen=True, slots=True)
class SymptomKind:
    """The symptoms of one kind: ``kind`` is a collective's role and opcode, or, for a symptom that
    is no collective, ``RULE finding``; ``wire_bytes_per_step`` is None when no symptom of the kind
    has a byte count."""

    kind: str
    count: int
    wire_bytes_per_step: int | None
    rules: tuple[str, ...]

    def text(self) -> str:
        """``15 activation all-gathers, 1.84 MiB per step (activation-all-gather)``."""
        noun = self.kind if self.count == 1 else f"{self.kind}s"
        moved = f", {format_bytes(self.wire_bytes_per_step)} per step" if self.wire_bytes_per_step is not None else ""
        return f"{self.count} {noun}{moved} ({', '.join(self.rules)})"


def symptoms_of(finding: Finding) -> list[Mapping[str, Any]]:
    """The finding's symptom records (``evidence["symptoms"]``), those that are well formed."""
    symptoms = finding.evidence.get("symptoms")
    if not isinstance(symptoms, Sequence) or isinstance(symptoms, str):
        return []
    return [s for s in symptoms if isinstance(s, Mapping) and isinstance(s.get("rule"), str)]


def symptom_kinds(finding: Finding) -> list[SymptomKind]:
    """The finding's symptoms grouped by kind, most bytes first (then most symptoms, then kind)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for symptom in symptoms_of(finding):
        kind = symptom.get("kind")
        groups.setdefault(kind if isinstance(kind, str) and kind else f"{symptom['rule']} finding", []).append(symptom)
    kinds = []
    for kind, members in groups.items():
        sizes = [s.get("wire_bytes_per_step") for s in members]
        counted = [size for size in sizes if isinstance(size, int) and not isinstance(size, bool)]
        rules = tuple(dict.fromkeys(str(s["rule"]) for s in members))
        kinds.append(SymptomKind(kind, len(members), sum(counted) if counted else None, rules))
    kinds.sort(key=lambda k: (-(k.wire_bytes_per_step or 0), -k.count, k.kind))
    return kinds
