"""Output formats, one module each. They only render findings; they never build them.

* :mod:`hlo_doctor.report.text`: concise text for a terminal, ruff style (the default);
* :mod:`hlo_doctor.report.json`: JSON, schema version 1 (``docs/json-schema-v1.md``);
* :mod:`hlo_doctor.report.sarif`: SARIF 2.1.0 for code scanning;
* :mod:`hlo_doctor.report.markdown`: a summary for PR comments and ``$GITHUB_STEP_SUMMARY``;
* :mod:`hlo_doctor.report.github`: GitHub Actions workflow annotations;
* :mod:`hlo_doctor.report.html`: one self-contained HTML file with pictures.

Text taken from the dump is made safe for each format by :mod:`hlo_doctor.report.safe`.
"""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING

from hlo_doctor.errors import ConfigurationError
from hlo_doctor.fingerprint import occurrence_fingerprints
from hlo_doctor.report.github import render_github
from hlo_doctor.report.html import render_html
from hlo_doctor.report.json import render_json
from hlo_doctor.report.markdown import render_markdown
from hlo_doctor.report.sarif import render_sarif
from hlo_doctor.report.text import render_text

if TYPE_CHECKING:
    from hlo_doctor.findings import Report
    from hlo_doctor.report.source import SourcePolicy

FORMATS = ("text", "json", "sarif", "markdown", "github", "html")

__all__ = ["FORMATS", "render"]


def render(
    report: Report,
    output_format: str,
    *,
    color: bool | None = None,
    width: int | None = None,
    quiet: bool = False,
    sources: SourcePolicy | None = None,
) -> str:
    """``report`` in ``output_format`` (one of :data:`FORMATS`).

    ``quiet`` leaves out the text summary; ``sources`` says which source files
    text and HTML may quote (default: :meth:`SourcePolicy.default`).
    """
    if output_format == "json":
        return render_json(report)
    if output_format == "sarif":
        rules = report.rule_info  # the analysis described the rules it ran
        if report.baselined is None:
            return render_sarif(report.findings, rules, fingerprints=occurrence_fingerprints(report.findings))
        findings = sorted((*report.findings, *report.baselined), key=lambda f: f.sort_key)
        accepted = {id(f) for f in report.baselined}
        states = ["unchanged" if id(f) in accepted else "new" for f in findings]
        return render_sarif(findings, rules, fingerprints=occurrence_fingerprints(findings), baseline_states=states)
    if output_format == "markdown":
        baselined = None if report.baselined is None else len(report.baselined)
        return render_markdown(report.findings, modules=len(report.modules), baselined=baselined,
                               frameworks=_frameworks(report))
    if output_format == "html":
        return render_html(report, sources=sources)
    if output_format == "github":
        return render_github(report.findings, _frameworks(report))
    if output_format == "text":
        if color is None:
            color = sys.stdout.isatty()
        if width is None:
            width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
        return render_text(report, color=color, width=width, quiet=quiet, sources=sources)
    raise ConfigurationError(f"unknown format {output_format!r} (choose {', '.join(FORMATS)})")


def _frameworks(report: Report) -> dict[str, str | None]:
    """Each module's framework by its key (what findings name as their module)."""
    return {module.key: module.framework for module in report.modules}
