"""Stable finding fingerprints: moved to :mod:`hlo_doctor.fingerprint`, re-exported here."""

from hlo_doctor.fingerprint import (
    finding_key,
    finding_signature,
    instruction_signature,
    module_family,
    occurrence_fingerprints,
    source_key,
    with_fingerprint,
)

__all__ = [
    "finding_key",
    "finding_signature",
    "instruction_signature",
    "module_family",
    "occurrence_fingerprints",
    "source_key",
    "with_fingerprint",
]
