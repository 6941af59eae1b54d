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

Findings with equal fingerprints in one run are told apart by their order
(``#2``, ``#3``...), so a baseline counts each occurrence.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import Instruction
    from hlo_doctor.rules.base import Finding, SourceRef

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


def finding_key(rule: str, module: str, source: SourceRef | None, signature: str) -> str:
    where = ""
    if source is not None:
        where = f"{source.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{source.line}:{source.function or ''}"
    text = "\n".join((rule, module_family(module), where, signature))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def occurrence_fingerprints(findings: Sequence[Finding]) -> list[str]:
    """Each finding's fingerprint, with ``#n`` for the n-th repeat of the same one."""
    seen: Counter[str] = Counter()
    result = []
    for finding in findings:
        base = finding.fingerprint or finding_key(finding.rule, finding.module, finding.source, finding.message)
        seen[base] += 1
        result.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return result
