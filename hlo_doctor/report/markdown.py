"""A compact Markdown summary for pull-request comments and ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hlo_doctor.rules.base import Finding, Severity


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _where(finding: Finding) -> str:
    if finding.source is not None:
        where = f"`{finding.source.file.rsplit('/', 1)[-1]}:{finding.source.line}`"
    elif finding.file is not None:
        where = f"`{finding.file.rsplit('/', 1)[-1]}:{finding.line}`"
    else:
        where = ""
    if finding.instruction:
        where += f" `{finding.instruction}`"
    return where.strip()


def render_markdown(findings: Sequence[Finding], *, title: str = "hlo-doctor", modules: int | None = None) -> str:
    """A heading with counts, a table of findings, and the fixes in a folded block."""
    counts = Counter(f.severity for f in findings)
    parts = [f"{counts[s]} {s.value}{'s' if counts[s] != 1 else ''}" for s in Severity if counts[s]]
    scope = f" in {modules} module{'s' if modules != 1 else ''}" if modules is not None else ""
    if not findings:
        return f"### {title}: no findings{scope} :white_check_mark:\n"
    lines = [
        f"### {title}: {len(findings)} finding{'s' if len(findings) != 1 else ''}{scope} ({', '.join(parts)})",
        "",
        "| Rule | Severity | Where | Message |",
        "| --- | --- | --- | --- |",
    ]
    for finding in findings:
        lines.append(
            f"| `{finding.rule}` | {finding.severity.value} | {_cell(_where(finding))} | {_cell(finding.message)} |"
        )
    fixes = [f for f in findings if f.suggestion is not None]
    if fixes:
        lines += ["", "<details><summary>Suggested fixes</summary>", ""]
        for finding in fixes:
            assert finding.suggestion is not None
            lines.append(f"**`{finding.rule}`** {_where(finding)}: {finding.suggestion.summary}")
            lines.append("")
            for language, code in (("python", finding.suggestion.jax), ("python", finding.suggestion.torch_xla)):
                if code:
                    lines += [f"```{language}", code, "```", ""]
        lines.append("</details>")
    return "\n".join(lines) + "\n"
