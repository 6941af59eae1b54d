"""Memory per device: the peak of each module, what fills it, and the target's memory.

The layer sits between the analysis layer (:mod:`hlo_doctor.semantics`) and
the rules: it reads XLA's own memory files beside an optimized module
(:mod:`.xla_files`), estimates live ranges where there are none
(:mod:`.liveness`), classes every value from the dataflow (:mod:`.values`),
and puts them together per module (:mod:`.breakdown`).
"""

from __future__ import annotations

from hlo_doctor.memory.breakdown import (
    ESTIMATE,
    FROM_BUFFER_ASSIGNMENT,
    FROM_USAGE_REPORT,
    SOURCE_LABELS,
    MemoryItem,
    ModuleMemory,
    Target,
    module_memory,
)
from hlo_doctor.memory.values import CLASSES, reaches_only_updates

__all__ = [
    "CLASSES",
    "ESTIMATE",
    "FROM_BUFFER_ASSIGNMENT",
    "FROM_USAGE_REPORT",
    "SOURCE_LABELS",
    "MemoryItem",
    "ModuleMemory",
    "Target",
    "module_memory",
    "reaches_only_updates",
]
