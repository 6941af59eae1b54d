"""Output formats, one module each. They only render findings; they never build them.

* :mod:`hlo_doctor.report.text`: rich text for a terminal (the default);
* :mod:`hlo_doctor.report.json`: JSON, schema version 1 (``docs/json-schema-v1.md``);
* :mod:`hlo_doctor.report.sarif`: SARIF 2.1.0 for code scanning;
* :mod:`hlo_doctor.report.markdown`: a summary for PR comments and ``$GITHUB_STEP_SUMMARY``;
* :mod:`hlo_doctor.report.github`: GitHub Actions workflow annotations.
"""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hlo_doctor.analysis import Report

FORMATS = ("text", "json", "sarif", "markdown", "github")

__all__ = ["FORMATS", "render"]


def render(report: Report, output_format: str, *, color: bool | None = None, width: int | None = None) -> str:
    """``report`` in ``output_format`` (one of :data:`FORMATS`)."""
    if output_format == "json":
        from hlo_doctor.report.json import render_json

        return render_json(report)
    if output_format == "sarif":
        from hlo_doctor.gate.fingerprint import occurrence_fingerprints
        from hlo_doctor.report.sarif import render_sarif
        from hlo_doctor.rules import discover

        registry = discover()
        rules = [registry.rules[rule_id].rule for rule_id in report.rules if rule_id in registry.rules]
        return render_sarif(report.findings, rules, fingerprints=occurrence_fingerprints(report.findings))
    if output_format == "markdown":
        from hlo_doctor.report.markdown import render_markdown

        return render_markdown(report.findings, modules=len(report.modules))
    if output_format == "github":
        from hlo_doctor.report.github import render_github

        return render_github(report.findings)
    if output_format == "text":
        from hlo_doctor.report.text import render_text

        if color is None:
            color = sys.stdout.isatty()
        if width is None:
            width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
        return render_text(report, color=color, width=width)
    raise ValueError(f"unknown format {output_format!r} (choose {', '.join(FORMATS)})")
