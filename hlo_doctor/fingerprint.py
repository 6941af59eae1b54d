"""Stable fingerprints: the same finding on a recompile of the same program.

Recompiling renumbers everything XLA names: instructions (``dot.3`` becomes
``dot.7``), modules (``module_0012.jit_step``, ``SyncTensorsGraph.33``), and
the dump files. A fingerprint therefore leaves those out and hashes:

* the rule id;
* the module name without its ``module_NNNN.`` prefix and numeric suffixes
  (``SyncTensorsGraph.33`` -> ``SyncTensorsGraph``);
* the user's source location: file name (not its folder, which differs
  between machines and checkouts), line and function, when the dump has one;
* the op's ``op_name`` metadata (``jit(step)/dot_general``, ``aten__addmm``)
  with numeric suffixes removed;
* the shape/sharding signature: the op's opcode, result shape and sharding.

:meth:`Rule.finding <hlo_doctor.rules.base.Rule.finding>` records the user's
line and the op's signature (:func:`finding_signature`); the rule engine
turns them into the finding's fingerprint once the rule has run
(:func:`with_fingerprint`).
Findings with equal fingerprints in one run are told apart by their order
(``#2``, ``#3``...), so a baseline counts each occurrence.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hlo_doctor.findings import Finding, SourceRef

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import Instruction

__all__ = [
    "finding_key",
    "finding_signature",
    "instruction_signature",
    "module_family",
    "occurrence_fingerprints",
    "source_key",
    "with_fingerprint",
]

_MODULE_PREFIX = re.compile(r"^module_\d+\.")
_NUMERIC_SUFFIXES = re.compile(r"(?:[._]\d+)+$")
_NUMBERED_PARTS = re.compile(r"\.\d+\b")


def module_family(module: str) -> str:
    """``module_0003.SyncTensorsGraph.33`` -> ``SyncTensorsGraph``."""
    return _NUMERIC_SUFFIXES.sub("", _MODULE_PREFIX.sub("", module))


def instruction_signature(instruction: Instruction | None) -> str:
    """op_name | opcode | shape | sharding: what identifies the op beyond its name."""
    if instruction is None:
        return ""
    metadata = instruction.metadata
    op_name = metadata.op_name if metadata is not None and metadata.op_name else ""
    sharding = instruction.attribute("sharding") or ""
    return "|".join((_NUMBERED_PARTS.sub("", op_name), instruction.opcode, str(instruction.shape), sharding))


def source_key(source: SourceRef | None) -> str:
    """``file-name:line:function`` of the user's line ('' without one): the folder differs between checkouts."""
    if source is None:
        return ""
    return f"{source.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{source.line}:{source.function or ''}"


def finding_signature(source: SourceRef | None, instruction: Instruction | None, name: str | None = None) -> str:
    """What :meth:`Rule.finding <hlo_doctor.rules.base.Rule.finding>` records for the fingerprint.

    The user's line as the rule found it and the op's signature (its name when it has none).
    """
    return "\n".join((source_key(source), instruction_signature(instruction) or (name or "")))


def _digest(rule: str, module: str, signature: str) -> str:
    text = "\n".join((rule, module_family(module), signature))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def finding_key(rule: str, module: str, source: SourceRef | None, signature: str) -> str:
    return _digest(rule, module, "\n".join((source_key(source), signature)))


def with_fingerprint(finding: Finding, module_name: str) -> Finding:
    """``finding`` with the fingerprint of its recorded signature in module ``module_name``.

    A finding that already has a fingerprint, or records no signature (it was not made by
    ``Rule.finding``), is returned as it is.
    """
    if finding.fingerprint or finding.signature is None:
        return finding
    return dataclasses.replace(finding, fingerprint=_digest(finding.rule, module_name, finding.signature))


def occurrence_fingerprints(findings: Sequence[Finding]) -> list[str]:
    """Each finding's fingerprint, with ``#n`` for the n-th repeat of the same one."""
    seen: Counter[str] = Counter()
    result = []
    for finding in findings:
        base = finding.fingerprint or finding_key(finding.rule, finding.module, finding.source, finding.message)
        seen[base] += 1
        result.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return result
