"""A compact Markdown summary for pull-request comments and ``$GITHUB_STEP_SUMMARY``.

Names from the dump go into code spans that no backtick can close, and
running text is escaped (:mod:`hlo_doctor.report.safe`), so a file or op
name cannot make a link, an image or a table cell of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hlo_doctor.findings import Finding, Severity
from hlo_doctor.report.safe import md_code, md_fence, md_text
from hlo_doctor.report.text import fixes_for


def _where(finding: Finding, *, in_table: bool) -> str:
    if finding.source is not None:
        place = md_code(f"{finding.source.file.rsplit('/', 1)[-1]}:{finding.source.line}", in_table=in_table)
    elif finding.file is not None:
        place = md_code(f"{finding.file.rsplit('/', 1)[-1]}:{finding.line}", in_table=in_table)
    else:
        place = ""
    if finding.instruction:
        place += " " + md_code(finding.instruction, in_table=in_table)
    return place.strip()


def render_markdown(
    findings: Sequence[Finding],
    *,
    title: str = "hlo-doctor",
    modules: int | None = None,
    baselined: int | None = None,
    frameworks: Mapping[str, str | None] | None = None,
) -> str:
    """A heading with counts, a table of findings, and the fixes in a folded block.

    ``baselined``: how many findings a baseline accepted (None: no baseline). ``frameworks``:
    each module's framework (``jax``, ``torch_xla``, None when unknown) by its key: a finding's
    fix is given in its module's framework only, as the text report gives it.
    """
    counts = Counter(f.severity for f in findings)
    parts = [f"{counts[s]} {s.value}{'s' if counts[s] != 1 else ''}" for s in Severity if counts[s]]
    scope = f" in {modules} module{'s' if modules != 1 else ''}" if modules is not None else ""
    accepted = ""
    if baselined is not None:
        accepted = f", {baselined} accepted by the baseline"
    if not findings:
        return f"### {md_text(title)}: no {'new ' if baselined is not None else ''}findings{scope}{accepted} " \
               ":white_check_mark:\n"
    new = "new " if baselined is not None else ""
    lines = [
        f"### {md_text(title)}: {len(findings)} {new}finding{'s' if len(findings) != 1 else ''}{scope} "
        f"({', '.join(parts)}){accepted}",
        "",
        "| Rule | Severity | Where | Message |",
        "| --- | --- | --- | --- |",
    ]
    for finding in findings:
        lines.append(
            f"| {md_code(finding.rule, in_table=True)} | {finding.severity.value} "
            f"| {_where(finding, in_table=True)} | {md_text(finding.message)} |"
        )
    fixes = [f for f in findings if f.suggestion is not None]
    if fixes:
        lines += ["", "<details><summary>Suggested fixes</summary>", ""]
        for finding in fixes:
            assert finding.suggestion is not None
            chosen = fixes_for(finding.suggestion, (frameworks or {}).get(finding.module))
            label = f" ({md_text(chosen[0][0])})" if len(chosen) == 1 else ""
            lines.append(f"**{md_code(finding.rule)}** {_where(finding, in_table=False)}: "
                         f"{md_text(finding.suggestion.summary)}{label}")
            lines.append("")
            for name, code in chosen:
                if len(chosen) > 1:
                    lines += [f"{md_text(name)}:", ""]
                lines += [*md_fence(code, "python"), ""]
        lines.append("</details>")
    return "\n".join(lines) + "\n"
