"""SARIF 2.1.0 output, for GitHub code scanning and other SARIF viewers.

Text a viewer shows (messages, names) is made plain (no control
characters); each result sits at the user's source ``file:line`` when the dump knows it,
so code-scanning UIs annotate the Python line; otherwise at the dump's
``file:line``. The dump location is always kept as a related location.
``tool.driver.rules`` carries every selected rule's id, short and full
description, help text and default level.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hlo_doctor._version import __version__
from hlo_doctor.findings import Finding, RuleInfo, Severity
from hlo_doctor.report.paths import relative_path
from hlo_doctor.report.safe import plain, shorten_words
from hlo_doctor.report.symptoms import symptom_kinds

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/hlo-doctor/hlo-doctor"

_LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def sarif_log(
    findings: Sequence[Finding],
    rules: Iterable[RuleInfo],
    *,
    fingerprints: Sequence[str] | None = None,
    base: Path | None = None,
    baseline_states: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The SARIF log as a JSON-ready dict.

    ``baseline_states`` (parallel to ``findings``, when a baseline was applied)
    become each result's ``baselineState``: ``"new"`` or ``"unchanged"``.

    ``fingerprints`` (parallel to ``findings``) become ``partialFingerprints``
    so code scanning tracks a finding across recompiles. Paths under ``base``
    (default: the current directory) are written relative to it.
    """
    base = (base or Path.cwd()).resolve()
    rule_list = sorted(rules, key=lambda r: r.id)
    index = {rule.id: i for i, rule in enumerate(rule_list)}
    results = []
    for position, finding in enumerate(findings):
        result: dict[str, Any] = {
            "ruleId": finding.rule,
            "level": _LEVELS[finding.severity],
            "message": {"text": _message(finding)},
            "locations": [_primary_location(finding, base)],
            "properties": {
                "module": plain(finding.module),
                "evidence": _cut(_jsonable(finding.evidence)),
            },
        }
        if finding.rule in index:
            result["ruleIndex"] = index[finding.rule]
        dump_location = _dump_location(finding, base)
        if finding.source is not None and dump_location is not None:
            result["relatedLocations"] = [dict(dump_location, id=1)]
        if fingerprints is not None:
            result["partialFingerprints"] = {"hloDoctorFinding/v1": fingerprints[position]}
        if baseline_states is not None:
            result["baselineState"] = baseline_states[position]
        if finding.suggestion is not None:
            result["properties"]["suggestion"] = _cut({
                "summary": finding.suggestion.summary,
                "jax": finding.suggestion.jax,
                "torch_xla": finding.suggestion.torch_xla,
            })
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "hlo-doctor",
                        "version": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": [_rule_descriptor(rule) for rule in rule_list],
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }


def render_sarif(findings: Sequence[Finding], rules: Iterable[RuleInfo], **kwargs: Any) -> str:
    return json.dumps(sarif_log(findings, rules, **kwargs), indent=2, sort_keys=False) + "\n"


def _rule_descriptor(rule: RuleInfo) -> dict[str, Any]:
    doc = (rule.doc or rule.summary).strip()
    return {
        "id": rule.id,
        "name": "".join(part.capitalize() for part in rule.id.split("-")),
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": _first_paragraph(doc) or rule.summary},
        "help": {"text": doc, "markdown": doc},
        "defaultConfiguration": {"level": _LEVELS[rule.severity]},
        "properties": {"tags": ["sharding", "xla"]},
    }


def _first_paragraph(doc: str) -> str:
    """The first paragraph of ``doc`` that is not a section heading."""
    for paragraph in doc.split("\n\n"):
        text = " ".join(paragraph.split())
        if text and not text.strip("*#: ").lower().startswith("what it finds"):
            return text
    return ""


def _message(finding: Finding) -> str:
    """The result's text, with no control character (viewers print it as it is)."""
    text = finding.message
    if finding.instruction:
        text = f"{text} [{finding.module}: {finding.instruction}]"
    kinds = symptom_kinds(finding)
    if kinds:
        text += f" Symptoms: {'; '.join(kind.text() for kind in kinds)}."
    if finding.suggestion is not None:
        text += f" Fix: {finding.suggestion.summary}"
    return plain(text)


def _uri(path: str, base: Path) -> str:
    """The file's URI reference, percent-encoded (RFC 3986): a ``#``, ``%``, space, control or
    bidirectional character in a file name stays part of the path."""
    relative = relative_path(path, base)
    candidate = Path(relative)
    if candidate.is_absolute():
        return "file://" + quote(candidate.as_posix(), safe="/")
    return quote(relative, safe="/")


def _location(path: str, line: int | None, base: Path) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(path, base)}}
    if line is not None and line >= 1:
        physical["region"] = {"startLine": line}
    return {"physicalLocation": physical}


def _dump_location(finding: Finding, base: Path) -> dict[str, Any] | None:
    if finding.file is None:
        return None
    location = _location(finding.file, finding.line, base)
    location["message"] = {"text": plain(f"HLO: {finding.instruction or finding.module}")}
    return location


def _primary_location(finding: Finding, base: Path) -> dict[str, Any]:
    if finding.source is not None:
        location = _location(finding.source.file, finding.source.line, base)
    elif finding.file is not None:
        location = _location(finding.file, finding.line, base)
    else:
        location = {}
    if finding.instruction:
        location["logicalLocations"] = [
            {
                "name": plain(finding.instruction),
                "fullyQualifiedName": plain(f"{finding.module}/{finding.instruction}"),
                "kind": "member",
            }
        ]
    return location


def _cut(value: Any) -> Any:
    """``value`` with the long words of its strings shortened (only the JSON report keeps whole names)."""
    if isinstance(value, str):
        return shorten_words(value)
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    return value


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
