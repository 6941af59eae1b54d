"""The text report, concise the way ruff's is.

Per finding::

    train.py:49:9: warning non-batch-dim-sharding dot dot_general.0 (f32[160,960]) leaves ...
       |
    48 |     def mlp(x, w1, b1, w2, b2):
    49 |         h = x @ w1.T + b1
       |         ^^^^^^^^^^^^^^^^^
    50 |         if args.variant == "fixed":
       |
      fix: Constrain the output of dot_general.0 ... (JAX)
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(('fsdp', 'replica'), None)))
      bytes: 600 KiB per device

A root cause that other rules' findings are symptoms of gets one ``symptoms:``
line per kind of symptom (``15 activation all-gathers, 1.84 MiB per step``);
``verbose`` lists each symptom under its kind. The fix is given for the framework the dump came from, or for both when
that is unknown. ``verbose`` adds the dump location, the HLO line and the
evidence table. The summary names only the rules that found something,
says how many rules ran, and gives one "not judged" line per rule that
could not run, with the reason. Everything taken from the dump is made
plain (:mod:`hlo_doctor.report.safe`) before it is printed.
"""

from __future__ import annotations

import linecache
from collections import Counter
from typing import TYPE_CHECKING

from hlo_doctor.findings import Finding, Severity, Suggestion
from hlo_doctor.report.paths import relative_path
from hlo_doctor.report.safe import plain
from hlo_doctor.report.source import SourcePolicy, source_lines, sources_summary
from hlo_doctor.report.symptoms import symptom_kinds, symptoms_of
from hlo_doctor.units import format_bytes

if TYPE_CHECKING:
    from hlo_doctor.findings import Report

__all__ = ["bytes_line", "fixes_for", "render_statistics", "render_text"]

_COLORS = {Severity.ERROR: "1;31", Severity.WARNING: "33", Severity.INFO: "36"}
_HLO_WIDTH = 240
_FRAMEWORK_LABELS = (("jax", "JAX"), ("torch_xla", "torch_xla"))


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text


def render_text(
    report: Report,
    *,
    color: bool = False,
    width: int = 100,
    quiet: bool = False,
    sources: SourcePolicy | None = None,
) -> str:
    """The report as text (ANSI colours only when ``color``); ``quiet`` leaves out the summary.

    ``width`` is accepted for callers of the earlier, wrapped format; lines are not wrapped.
    """
    style = _Style(color)
    sources = sources or SourcePolicy.default(dump=report.dump)
    frameworks = {module.key: module.framework for module in report.modules}
    blocks = [_finding(finding, frameworks.get(finding.module), report.verbose, sources, style)
              for finding in report.findings]
    if not quiet:
        blocks.append(_summary(report, style))
    return "\n".join(blocks)


def render_statistics(report: Report) -> str:
    """Counts per rule (``--statistics``), most frequent first."""
    counts = Counter((f.rule, f.severity.value) for f in report.findings)
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    width = max((len(str(count)) for _, count in rows), default=1)
    rule_width = max((len(rule) for (rule, _), _ in rows), default=0)
    lines = [f"{count:>{width}}  {rule:<{rule_width}}  {severity}" for (rule, severity), count in rows]
    lines.append(_found_line(report))
    return "\n".join(lines) + "\n"


# -- one finding -------------------------------------------------------------


def _finding(finding: Finding, framework: str | None, verbose: bool, sources: SourcePolicy, style: _Style) -> str:
    source = finding.source
    frame = source_lines(source.file, source.line, sources) if source is not None else None
    lines = [_header(finding, frame, style)]
    if frame and source is not None:
        lines += _code_frame(frame, source.line, style)
    lines += _symptoms(finding, verbose, style)
    if verbose:
        lines += _verbose_details(finding, style)
    if finding.suggestion is not None:
        lines += _fix(finding, framework, style)
    moved = bytes_line(finding)
    if moved:
        lines.append(f"  {style('bytes:', '1')} {moved}")
    return "\n".join(lines) + "\n"


def _header(finding: Finding, frame: list[tuple[int, str]] | None, style: _Style) -> str:
    if finding.source is not None:
        column = _column(frame, finding.source.line)
        where = f"{plain(relative_path(finding.source.file))}:{finding.source.line}:{column}"
    elif finding.file is not None:
        where = f"{plain(relative_path(finding.file))}:{finding.line or 1}:1"
    else:
        where = plain(finding.module)
    severity = style(finding.severity.value, _COLORS[finding.severity])
    return f"{style(where, '1')}: {severity} {style(finding.rule, '1;35')} {plain(finding.message)}"


def _column(frame: list[tuple[int, str]] | None, line: int) -> int:
    """1-based column of the line's first character that is not a space (1 when the line is not shown)."""
    for number, text in frame or ():
        if number == line and text.strip():
            return len(text) - len(text.lstrip()) + 1
    return 1


def _code_frame(frame: list[tuple[int, str]], line: int, style: _Style) -> list[str]:
    gutter = len(str(frame[-1][0]))
    bar = style(" " * gutter + " |", "34")
    out = [bar]
    for number, text in frame:
        out.append(style(f"{number:>{gutter}} |", "34") + (f" {text}" if text else ""))
        if number == line and text.strip():
            indent = len(text) - len(text.lstrip())
            out.append(bar + " " + " " * indent + style("^" * len(text.strip()), _COLORS[Severity.ERROR]))
    out.append(bar)
    return out


def _symptoms(finding: Finding, verbose: bool, style: _Style) -> list[str]:
    """One line per kind of symptom (count, bytes per step); ``verbose`` lists each symptom under its kind."""
    label = "symptoms:"
    lines = []
    by_kind: dict[str, list] = {}
    if verbose:
        for symptom in symptoms_of(finding):
            kind = symptom.get("kind") or f"{symptom['rule']} finding"
            by_kind.setdefault(str(kind), []).append(symptom)
    for number, kind in enumerate(symptom_kinds(finding)):
        lead = f"  {style(label, '1')} " if number == 0 else " " * (len(label) + 3)
        lines.append(lead + plain(kind.text()))
        for symptom in by_kind.get(kind.kind, ()):
            wire = symptom.get("wire_bytes_per_step")
            moved = f", {format_bytes(wire)} per step" if isinstance(wire, int) and not isinstance(wire, bool) else ""
            lines.append(f"      {plain(symptom.get('instruction') or '?')} ({plain(symptom['rule'])}{moved}): "
                         f"{plain(symptom.get('message') or '')}")
    return lines


def _fix(finding: Finding, framework: str | None, style: _Style) -> list[str]:
    suggestion = finding.suggestion
    assert suggestion is not None
    chosen = fixes_for(suggestion, framework)
    title = f"  {style('fix:', '1;32')} {plain(suggestion.summary)}"
    if len(chosen) == 1:
        title += f" ({chosen[0][0]})"
    lines = [title]
    for label, code in chosen:
        if len(chosen) > 1:
            lines.append(style(f"    # {label}", "2"))
        lines += [f"    {plain(line)}" for line in code.splitlines()]
    return lines


def fixes_for(suggestion: Suggestion, framework: str | None) -> list[tuple[str, str]]:
    """(label, code) of the suggestion's fix in ``framework`` (``jax``/``torch_xla``), or of every
    framework it has when that is unknown or has no code."""
    codes = [(label, getattr(suggestion, key)) for key, label in _FRAMEWORK_LABELS if getattr(suggestion, key)]
    chosen = [(label, code) for label, code in codes if framework is None or label.lower() == framework.lower()]
    return chosen or codes


def bytes_line(finding: Finding) -> str:
    """The finding's byte counts on one line (``in 200 KiB, out 800 KiB, wire 600 KiB per device``;
    ``activation gather wire 1.98 MiB per step``), or ''.

    When some counts are per device, only those are given.
    """
    counts = {key: value for key, value in finding.evidence.items()
              if "bytes" in key and isinstance(value, (int, float)) and not isinstance(value, bool)}
    per_device = {key: value for key, value in counts.items() if key.endswith("_per_device")}
    parts = []
    for key, value in (per_device or counts).items():
        per_step = " per step" if key.endswith("_per_step") else ""
        label = key.removesuffix("_per_device").removesuffix("_per_step").replace("bytes", "").replace("_", " ")
        label = " ".join(label.split())
        parts.append((f"{plain(label)} {format_bytes(value)}" if label else format_bytes(value)) + per_step)
    return ", ".join(parts) + (" per device" if per_device and parts else "")


def _verbose_details(finding: Finding, style: _Style) -> list[str]:
    lines = []
    if finding.file is not None:
        name = f" %{plain(finding.instruction)}" if finding.instruction else ""
        lines.append(f"  {style('dump:', '2')} {plain(relative_path(finding.file))}:{finding.line}{name} "
                     f"({plain(finding.module)})")
        hlo = linecache.getline(finding.file, finding.line).strip() if finding.line else ""
        if hlo:
            hlo = plain(hlo)
            if len(hlo) > _HLO_WIDTH:
                hlo = hlo[: _HLO_WIDTH - 3] + "..."
            lines.append(f"    {style(hlo, '36')}")
    if finding.related:
        lines.append(f"  {style('related:', '2')} {', '.join(plain(name) for name in finding.related)}")
    evidence = {key: value for key, value in finding.evidence.items() if key != "symptoms"}  # listed above
    if evidence:
        width = max(len(key) for key in evidence)
        lines.append(f"  {style('evidence:', '2')}")
        lines += [f"    {plain(key):<{width}}  {_value(value)}" for key, value in evidence.items()]
    return lines


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return plain(value)


# -- summary -----------------------------------------------------------------


def _summary(report: Report, style: _Style) -> str:
    lines = []
    if report.verbose:
        for module in report.modules:
            collectives = ", ".join(f"{kind} x{count} {format_bytes(nbytes)}"
                                    for kind, (count, nbytes) in module.collectives.items()) or "no collectives"
            lines.append(f"module {plain(module.key)} ({module.partitioner}, "
                         f"{module.num_partitions or '?'} partitions): {collectives}")
    for error in report.errors:
        lines.append(style(f"error: {plain(relative_path(error.path))}: {plain(error.message)}", "31"))
    lines += [style(plain(line), "2") for line in sources_summary(report.sources)]
    lines.append(style(_found_line(report), "1"))
    count = len(report.rules)
    lines.append(f"{count} rule{'s' if count != 1 else ''} ran")
    for rule, reason, modules in _not_judged(report):
        where = f" in {modules} modules" if modules > 1 else ""
        lines.append(style(f"not judged: {rule}{where}: {plain(reason)}", "33"))
    if report.baselined:
        count = len(report.baselined)
        lines.append(f"{count} finding{'s' if count != 1 else ''} accepted by the baseline (not shown)")
    return "\n".join(lines) + "\n"


def _found_line(report: Report) -> str:
    modules = f"{len(report.modules)} module{'s' if len(report.modules) != 1 else ''}"
    if not report.findings:
        return f"no findings in {modules}"
    severities = Counter(f.severity for f in report.findings)
    kinds = ", ".join(f"{severities[s]} {s.value}{'s' if severities[s] != 1 else ''}" for s in Severity if severities[s])
    rules = Counter(f.rule for f in report.findings)
    per_rule = ", ".join(f"{rule} {count}" for rule, count in sorted(rules.items()))
    total = len(report.findings)
    return f"found {total} finding{'s' if total != 1 else ''} ({kinds}) in {modules}: {per_rule}"


def _not_judged(report: Report) -> list[tuple[str, str, int]]:
    """(rule, reason, how many modules) per rule and reason, in rule order."""
    counts = Counter((skip.rule, skip.reason) for skip in report.skipped)
    return [(rule, reason, count) for (rule, reason), count in sorted(counts.items())]
