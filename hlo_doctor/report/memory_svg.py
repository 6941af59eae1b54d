"""The memory picture: one module's peak per device stacked by class, against the target's memory.

:func:`memory_svg` draws a horizontal bar as long as the peak, cut into one
segment per class (largest first) with its bytes, and a vertical line at the
target's memory when it is known (red when the peak is over it);
:func:`memory_page` wraps the pictures of a dump's modules in one
self-contained HTML page (``hlo-doctor memory --format html``), and
:func:`memory_section` gives one module's picture with its headroom and
largest items, which the analysis report (:mod:`hlo_doctor.report.html`) shows
per module. Static SVG, no script; every text passes through
:func:`~hlo_doctor.report.safe.html_text`.
"""

from __future__ import annotations

from collections.abc import Sequence

from hlo_doctor.memory import SOURCE_LABELS, ModuleMemory
from hlo_doctor.report.paths import relative_path
from hlo_doctor.report.safe import html_text
from hlo_doctor.units import format_bytes

__all__ = ["CLASS_COLORS", "headroom_line", "memory_page", "memory_section", "memory_svg"]

CLASS_COLORS = {
    "weights": "#2563eb", "optimizer_state": "#7c3aed", "gradients": "#db2777", "activations": "#16a34a",
    "gathered_weights": "#d97706", "collective_buffers": "#0891b2", "inputs": "#65a30d", "outputs": "#4b5563",
    "temporaries": "#9ca3af",
}
_WIDTH, _BAR_TOP, _BAR_HEIGHT, _LEFT = 760, 34, 34, 10


def memory_svg(memory: ModuleMemory) -> str:
    """The peak of ``memory`` stacked by class, against its target's memory (when known)."""
    target = memory.target.hbm_bytes if memory.target is not None else 0
    scale_to = max(memory.peak_bytes, target, 1)
    usable = _WIDTH - 2 * _LEFT
    height = _BAR_TOP + _BAR_HEIGHT + 30 + 18 * ((len(memory.classes) + 2) // 3)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="picture memory" width="{_WIDTH}" height="{height}" '
             f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="12" role="img">',
             f'<title>{html_text(memory.name)}: peak {html_text(format_bytes(memory.peak_bytes))} per device</title>',
             f'<text x="{_LEFT}" y="18">peak {html_text(format_bytes(memory.peak_bytes))} per device '
             f'({html_text(SOURCE_LABELS.get(memory.peak_source, memory.peak_source))})</text>']
    x = float(_LEFT)
    ordered = sorted(memory.classes.items(), key=lambda kv: -kv[1])
    for cls, size in ordered:
        width = usable * size / scale_to
        color = CLASS_COLORS.get(cls, "#6b7280")
        parts.append(f'<rect x="{x:.1f}" y="{_BAR_TOP}" width="{max(width, 0.5):.1f}" height="{_BAR_HEIGHT}" '
                     f'fill="{color}"><title>{html_text(cls)}: {html_text(format_bytes(size))}</title></rect>')
        if width > 60:
            parts.append(f'<text x="{x + 4:.1f}" y="{_BAR_TOP + 21}" fill="#fff">{html_text(format_bytes(size))}</text>')
        x += width
    if target:
        line_x = _LEFT + usable * target / scale_to
        over = memory.peak_bytes > target
        color = "#dc2626" if over else "#111827"
        label = (f"{memory.target.hardware if memory.target else ''} {format_bytes(target)}: "
                 + (f"over by {format_bytes(memory.peak_bytes - target)}" if over
                    else f"headroom {format_bytes(target - memory.peak_bytes)}"))
        anchor = "end" if line_x > _WIDTH / 2 else "start"
        parts.append(f'<line x1="{line_x:.1f}" x2="{line_x:.1f}" y1="{_BAR_TOP - 8}" y2="{_BAR_TOP + _BAR_HEIGHT + 8}" '
                     f'stroke="{color}" stroke-width="2" stroke-dasharray="4 2"/>')
        parts.append(f'<text x="{line_x + (-4 if anchor == "end" else 4):.1f}" y="{_BAR_TOP + _BAR_HEIGHT + 20}" '
                     f'text-anchor="{anchor}" fill="{color}">{html_text(label)}</text>')
    legend_top = _BAR_TOP + _BAR_HEIGHT + 40
    for index, (cls, size) in enumerate(ordered):
        lx, ly = _LEFT + 250 * (index % 3), legend_top + 18 * (index // 3)
        share = size / memory.peak_bytes if memory.peak_bytes else 0.0
        parts.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{CLASS_COLORS.get(cls, "#6b7280")}"/>')
        parts.append(f'<text x="{lx + 16}" y="{ly}">{html_text(cls)} {html_text(format_bytes(size))} ({share:.0%})</text>')
    parts.append("</svg>")
    return "".join(parts)


def headroom_line(memory: ModuleMemory) -> str:
    """``peak 4.03 MiB per device (XLA's buffer assignment); tpu-v5e 16 GiB per device: headroom ...``"""
    peak = (f"peak {format_bytes(memory.peak_bytes)} per device "
            f"({SOURCE_LABELS.get(memory.peak_source, memory.peak_source)})")
    target = memory.target
    if target is None:
        return peak + "; the target's memory is unknown (--hardware NAME)"
    headroom = target.headroom(memory.peak_bytes)
    used = f" ({memory.peak_bytes / target.hbm_bytes:.0%} used)" if target.hbm_bytes else ""
    verdict = (f"headroom {format_bytes(headroom)}" if headroom >= 0
               else f"over by {format_bytes(-headroom)}: does not fit")
    return f"{peak}; {target.hardware} {format_bytes(target.hbm_bytes)} per device: {verdict}{used}"


def _source(source: str | None) -> str:
    """``path:line``, with the path relative to here when it is below."""
    if not source:
        return "-"
    file, _, line = source.rpartition(":")
    return f"{relative_path(file)}:{line}" if file and line.isdigit() else source


def _items_table(memory: ModuleMemory, count: int) -> str:
    rows = "".join(
        f"<tr><td>{html_text(i.cls)}</td><td style='text-align:right'>{html_text(format_bytes(i.bytes))}</td>"
        f"<td>{html_text(i.name)}</td><td>{html_text(_source(i.source))}</td></tr>" for i in memory.items[:count])
    return ("<table class='memory-items'><tr><th>class</th><th>bytes</th><th>item</th><th>source</th></tr>"
            + rows + "</table>")


def memory_section(memory: ModuleMemory, items: int = 12) -> str:
    """One module's memory: its headroom line, the picture, and its largest ``items`` items."""
    over = memory.target is not None and memory.peak_bytes > memory.target.hbm_bytes
    return (f'<p class="{"error" if over else "memory"}">{html_text(headroom_line(memory))}</p>'
            + memory_svg(memory) + _items_table(memory, items))


def memory_page(memories: Sequence[ModuleMemory], title: str) -> str:
    """One self-contained HTML page with each module's memory picture and its largest items."""
    body = [f"<h1>{html_text(title)}</h1>"]
    for memory in memories:
        body.append(f"<h2>{html_text(memory.name)}</h2>")
        body.append(memory_section(memory, 20))
    if not memories:
        body.append("<p>no module with a per-device snapshot</p>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + html_text(title) + "</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;font-size:13px}</style>"
            "</head><body>" + "".join(body) + "</body></html>\n")
