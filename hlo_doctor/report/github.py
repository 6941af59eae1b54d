"""GitHub Actions workflow commands: one ``::warning file=…,line=…::…`` per finding.

GitHub shows each as an annotation on the pull request's diff when the file
is part of the repository: the user's source line when known, else the dump.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hlo_doctor.findings import Finding, Severity
from hlo_doctor.report.paths import relative_path
from hlo_doctor.report.safe import plain, plain_block
from hlo_doctor.report.symptoms import symptom_kinds
from hlo_doctor.report.text import fixes_for

_COMMANDS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(text: str) -> str:
    text = plain_block(text)
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(plain(text)).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding, framework: str | None = None) -> str:
    """The workflow command for one finding; its fix in ``framework`` (``jax``, ``torch_xla``) when
    known, else in each framework it has."""
    properties = []
    if finding.source is not None:
        properties += [f"file={_escape_property(relative_path(finding.source.file))}", f"line={finding.source.line}"]
    elif finding.file is not None:
        properties.append(f"file={_escape_property(relative_path(finding.file))}")
        if finding.line is not None:
            properties.append(f"line={finding.line}")
    properties.append(f"title={_escape_property('hlo-doctor ' + finding.rule)}")
    message = finding.message
    if finding.instruction:
        message += f" [{finding.module}: {finding.instruction}]"
    message += "".join(f"\nSymptoms: {kind.text()}" for kind in symptom_kinds(finding))
    if finding.suggestion is not None:
        message += f"\nFix: {finding.suggestion.summary}"
        for label, code in fixes_for(finding.suggestion, framework):
            message += f"\n{label}: {code}"
    return f"::{_COMMANDS[finding.severity]} {','.join(properties)}::{_escape_data(message)}"


def render_github(findings: Sequence[Finding], frameworks: Mapping[str, str | None] | None = None) -> str:
    """One annotation per finding; ``frameworks``: each module's framework by its key."""
    return "".join(annotation(finding, (frameworks or {}).get(finding.module)) + "\n" for finding in findings)
