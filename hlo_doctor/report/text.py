"""The text report (rich): a summary table, then one panel per finding."""

from __future__ import annotations

import io
import linecache
from collections import Counter
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from hlo_doctor.report.paths import local_path, relative_path
from hlo_doctor.rules.base import Finding, Severity

if TYPE_CHECKING:
    from hlo_doctor.analysis import Report

__all__ = ["print_text", "render_text"]

_STYLES = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
_CONTEXT = 2
_HLO_WIDTH = 240


def render_text(report: Report, *, color: bool = False, width: int = 100) -> str:
    """The report as text (ANSI colours only when ``color``)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, soft_wrap=False)
    print_text(report, console)
    return buffer.getvalue()


def print_text(report: Report, console: Console) -> None:
    console.print(_summary(report))
    for finding in report.findings:
        console.print(_panel(finding))
    if report.verbose and report.skipped:
        table = Table(title="Rules that did not judge a module", title_justify="left", show_edge=False)
        table.add_column("rule")
        table.add_column("module")
        table.add_column("why")
        for skip in report.skipped:
            table.add_row(skip.rule, skip.module, skip.reason)
        console.print(table)
    for error in report.errors:
        console.print(Text(f"error: {error.path}: {error.message}", style="red"))
    counts = Counter(f.severity for f in report.findings)
    if report.findings:
        parts = [f"{counts[s]} {s.value}{'s' if counts[s] != 1 else ''}" for s in Severity if counts[s]]
        console.print(Text(f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''} "
                           f"({', '.join(parts)}) in {len(report.modules)} module"
                           f"{'s' if len(report.modules) != 1 else ''}", style="bold"))
    else:
        console.print(Text(f"no findings in {len(report.modules)} module{'s' if len(report.modules) != 1 else ''} "
                           f"({len(report.rules)} rules)", style="bold green"))


def _summary(report: Report) -> Group:
    modules = Table(title=f"hlo-doctor {report.tool_version}: {relative_path(report.dump)}", title_justify="left",
                    show_edge=False)
    modules.add_column("module")
    modules.add_column("partitioner")
    modules.add_column("partitions", justify="right")
    modules.add_column("collectives (count, bytes per device)")
    for module in report.modules:
        collectives = ", ".join(
            f"{kind} x{count} {_bytes(nbytes)}" for kind, (count, nbytes) in module.collectives.items()
        ) or "none"
        modules.add_row(module.key, module.partitioner, str(module.num_partitions or "?"), collectives)
    by_rule = Counter(f.rule for f in report.findings)
    rules = Table(show_edge=False)
    rules.add_column("rule")
    rules.add_column("findings", justify="right")
    for rule_id in sorted(set(report.rules) | set(by_rule)):
        rules.add_row(rule_id, str(by_rule.get(rule_id, 0)))
    return Group(modules, Text(""), rules, Text(""))


def _panel(finding: Finding) -> Panel:
    parts: list = [Text(finding.message)]
    where = []
    if finding.source is not None:
        function = f" in {finding.source.function}" if finding.source.function else ""
        where.append(f"source: {relative_path(finding.source.file)}:{finding.source.line}{function}")
    if finding.file is not None:
        instruction = f" ({finding.instruction})" if finding.instruction else ""
        where.append(f"dump:   {relative_path(finding.file)}:{finding.line}{instruction}")
    if where:
        parts.append(Text("\n".join(where), style="dim"))
    source = _source_excerpt(finding)
    if source is not None:
        parts.append(source)
    hlo = _hlo_excerpt(finding)
    if hlo is not None:
        parts.append(hlo)
    if finding.related:
        parts.append(Text("related: " + ", ".join(finding.related), style="dim"))
    if finding.evidence:
        evidence = Table(show_header=False, show_edge=False, box=None, pad_edge=False)
        evidence.add_column(style="dim")
        evidence.add_column()
        for key, value in finding.evidence.items():
            evidence.add_row(key, _value(value))
        parts.append(evidence)
    if finding.suggestion is not None:
        parts.append(Text("fix: " + finding.suggestion.summary, style="green"))
        for label, code in (("JAX", finding.suggestion.jax), ("torch_xla", finding.suggestion.torch_xla)):
            if code:
                parts.append(Text(f"# {label}", style="dim"))
                parts.append(Syntax(code, "python", theme="ansi_dark", background_color="default", word_wrap=True))
    title = Text.assemble((finding.rule, "bold"), " ", (finding.severity.value, _STYLES[finding.severity]),
                          f"  {finding.module}")
    return Panel(Group(*parts), title=title, title_align="left", border_style=_STYLES[finding.severity])


def _source_excerpt(finding: Finding) -> Syntax | None:
    """The user's source line with context, when the file exists here."""
    source = finding.source
    if source is None:
        return None
    found = local_path(source.file)
    if found is None:
        return None
    path = str(found)
    lines = []
    first = max(1, source.line - _CONTEXT)
    for number in range(first, source.line + _CONTEXT + 1):
        text = linecache.getline(path, number)
        if not text and number <= source.line:
            return None
        if text:
            lines.append(text.rstrip("\n"))
    if not lines:
        return None
    return Syntax("\n".join(lines), "python", line_numbers=True, start_line=first,
                  highlight_lines={source.line}, theme="ansi_dark", background_color="default", word_wrap=True)


def _hlo_excerpt(finding: Finding) -> Text | None:
    if finding.file is None or finding.line is None:
        return None
    text = linecache.getline(finding.file, finding.line).strip()
    if not text:
        return None
    if len(text) > _HLO_WIDTH:
        text = text[: _HLO_WIDTH - 3] + "..."
    return Text(text, style="cyan", overflow="fold")


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _bytes(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"
