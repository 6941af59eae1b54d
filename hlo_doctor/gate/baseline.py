"""Baselines: accept today's findings, fail only on new ones (like ruff's/mypy's baselines).

A baseline file records each finding's fingerprint (see
:mod:`hlo_doctor.fingerprint`) with enough context to read it; a later
run ignores findings whose fingerprint is recorded, and reports the recorded
ones that are gone as fixed. The fingerprint hashes the user's line, so an entry also records
the finding's op (``op_name | opcode | shape | sharding``): a finding whose fingerprint is not
recorded but whose rule, module family and op are, the line moved by an edit above it, is the
recorded finding (as :mod:`hlo_doctor.gate.matching` matches them), not a new one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_doctor._version import __version__
from hlo_doctor.errors import InputError
from hlo_doctor.files import write_atomically
from hlo_doctor.findings import Finding
from hlo_doctor.fingerprint import module_family, occurrence_fingerprints
from hlo_doctor.gate.matching import op_signature

BASELINE_VERSION = 1


@dataclass(frozen=True, slots=True)
class BaselineEntry:
    fingerprint: str
    rule: str
    module: str
    instruction: str | None
    source: str | None
    message: str
    op: str | None = None
    """the finding's op signature, when it has one (baselines written before it have none)"""


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """Findings split by a baseline: still reported, accepted, and recorded-but-gone."""

    new: tuple[Finding, ...]
    baselined: tuple[Finding, ...]
    fixed: tuple[BaselineEntry, ...]


def write_baseline(findings: Sequence[Finding], path: str | Path) -> int:
    """Record ``findings`` in ``path``; returns how many were written."""
    entries = []
    for finding, fingerprint in zip(findings, occurrence_fingerprints(findings), strict=False):
        source = f"{finding.source.file}:{finding.source.line}" if finding.source is not None else None
        entries.append(
            {
                "fingerprint": fingerprint,
                "rule": finding.rule,
                "module": finding.module,
                "instruction": finding.instruction,
                "source": source,
                "message": finding.message,
                "op": op_signature(finding),
            }
        )
    document = {"schema_version": BASELINE_VERSION, "tool": {"name": "hlo-doctor", "version": __version__},
                "findings": entries}
    try:
        write_atomically(path, json.dumps(document, indent=2) + "\n")
    except InputError as error:
        raise InputError(f"cannot write the baseline: {error}") from None
    return len(entries)


def read_baseline(path: str | Path, dump: str = "DUMP") -> tuple[BaselineEntry, ...]:
    """The entries of the baseline file ``path``; InputError when it is missing (saying how to
    create it from ``dump``), unreadable or not a baseline."""
    try:
        document: Any = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: baseline file not found; create it with "
                         f"`hlo-doctor check {dump} --write-baseline {path}`") from None
    except OSError as error:
        raise InputError(f"{path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not a baseline file: {error}") from None
    if not isinstance(document, dict) or document.get("schema_version") != BASELINE_VERSION:
        raise InputError(f"{path}: not an hlo-doctor baseline (schema_version {BASELINE_VERSION} expected)")
    entries = document.get("findings", [])
    if not isinstance(entries, list):
        raise InputError(f"{path}: malformed baseline: \"findings\" must be a list")
    return tuple(_entry(entry, number, path) for number, entry in enumerate(entries))


# An entry's keys and whether each may be null (absent counts as null).
_ENTRY_KEYS = {"fingerprint": False, "rule": False, "module": False, "instruction": True, "source": True,
               "message": True, "op": True}


def _entry(entry: Any, number: int, path: str | Path) -> BaselineEntry:
    """Entry ``number`` of the baseline, each value checked to be a string (or null where it may be)."""
    where = f"{path}: malformed baseline entry {number}"
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected an object, not {type(entry).__name__}")
    for key, nullable in _ENTRY_KEYS.items():
        value = entry.get(key)
        if value is None and not nullable:
            raise InputError(f"{where}: \"{key}\" is missing")
        if value is not None and not isinstance(value, str):
            raise InputError(f"{where}: \"{key}\" must be a string{' or null' if nullable else ''}, "
                             f"not {type(value).__name__}")
    return BaselineEntry(
        fingerprint=entry["fingerprint"],
        rule=entry["rule"],
        module=entry["module"],
        instruction=entry.get("instruction"),
        source=entry.get("source"),
        message=entry.get("message") or "",
        op=entry.get("op"),
    )


def apply_baseline(findings: Sequence[Finding], baseline: Sequence[BaselineEntry]) -> BaselineResult:
    recorded = {entry.fingerprint: entry for entry in baseline}
    matched: set[str] = set()
    accepted_ids: set[int] = set()
    for index, fingerprint in enumerate(occurrence_fingerprints(findings)):
        if fingerprint in recorded and fingerprint not in matched:
            accepted_ids.add(index)
            matched.add(fingerprint)
    by_op: dict[tuple, list[BaselineEntry]] = {}
    for entry in baseline:
        if entry.fingerprint not in matched and entry.op:
            by_op.setdefault((entry.rule, module_family(entry.module), entry.op), []).append(entry)
    for index, finding in enumerate(findings):
        op = op_signature(finding)
        candidates = by_op.get((finding.rule, module_family(finding.module), op)) if op else None
        if index not in accepted_ids and candidates:
            accepted_ids.add(index)
            matched.add(candidates.pop(0).fingerprint)  # the same op at another line: the recorded finding
    new = tuple(f for i, f in enumerate(findings) if i not in accepted_ids)
    accepted = tuple(f for i, f in enumerate(findings) if i in accepted_ids)
    fixed = tuple(entry for entry in baseline if entry.fingerprint not in matched)
    return BaselineResult(new, accepted, fixed)
