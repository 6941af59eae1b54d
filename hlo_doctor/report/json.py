"""The JSON report, schema version 1 (``docs/json-schema-v1.md``, ``schema-v1.json``)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from hlo_doctor.findings import Finding

if TYPE_CHECKING:
    from hlo_doctor.findings import Report

SCHEMA_VERSION = 1

__all__ = ["SCHEMA_VERSION", "finding_to_dict", "render_json", "report_to_dict"]


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    source = finding.source
    suggestion = finding.suggestion
    return {
        "rule": finding.rule,
        "severity": finding.severity.value,
        "module": finding.module,
        "instruction": finding.instruction,
        "related": list(finding.related),
        "file": finding.file,
        "line": finding.line,
        "source": None if source is None else {
            "file": source.file, "line": source.line, "function": source.function,
        },
        "message": finding.message,
        "suggestion": None if suggestion is None else {
            "summary": suggestion.summary, "jax": suggestion.jax, "torch_xla": suggestion.torch_xla,
        },
        "evidence": {key: _plain(value) for key, value in finding.evidence.items()},
        "op_name": finding.op_name,
        "fingerprint": finding.fingerprint,
    }


def report_to_dict(report: Report) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "hlo-doctor", "version": report.tool_version},
        "dump": report.dump,
        "hardware": report.hardware,
        "rules": list(report.rules),
        "modules": [
            {
                "id": m.id,
                "name": m.name,
                "partitioner": m.partitioner,
                "num_partitions": m.num_partitions,
                "snapshots": list(m.snapshots),
                "collectives": {
                    kind: {"count": count, "bytes": nbytes} for kind, (count, nbytes) in m.collectives.items()
                },
                "errors": list(m.errors),
            }
            for m in report.modules
        ],
        "findings": [finding_to_dict(f) for f in report.findings],
        "skipped": [{"rule": s.rule, "module": s.module, "reason": s.reason} for s in report.skipped],
        "errors": [{"path": e.path, "module": e.module, "message": e.message} for e in report.errors],
        "sources": [{"recorded": s.recorded, "local": s.local, "how": s.how} for s in report.sources],
    }


def render_json(report: Report, *, indent: int | None = 2) -> str:
    return json.dumps(report_to_dict(report), indent=indent, sort_keys=False) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
