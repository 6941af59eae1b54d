"""The HTML report's pictures, as inline SVG strings built from plain data.

* :func:`dataflow_svg`: the ops around a finding's op, layered by networkx
  (topological generations, one column each), with each edge labelled by the value's per-device shape and
  sharding; collectives are highlighted, the finding's op is outlined;
* :func:`mesh_svg`: the device mesh as a grid, each cell coloured by its host
  (or slice), with the collective's replica groups drawn through their devices;
* :func:`bars_svg`: bytes per step by collective role, the finding's share marked.

Every text passes through :func:`~hlo_doctor.report.safe.html_text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hlo_doctor.pictures import Edge, MeshCell, Node
from hlo_doctor.report.safe import html_text
from hlo_doctor.units import format_bytes

# Node, Edge and MeshCell are the analysis's records (hlo_doctor.pictures), drawn here.
__all__ = ["Bar", "Edge", "MeshCell", "Node", "bars_svg", "dataflow_svg", "mesh_svg"]

HOST_COLORS = ("#dbeafe", "#dcfce7", "#fef3c7", "#fce7f3", "#ede9fe", "#ccfbf1", "#fee2e2", "#e5e7eb")
GROUP_COLORS = ("#dc2626", "#2563eb", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    total: int
    marked: int = 0


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def dataflow_svg(nodes: Sequence[Node], edges: Sequence[Edge], title: str) -> str:
    """Nodes in dataflow layers, left to right (networkx's topological generations), edges with labels."""
    import networkx as nx

    graph = nx.DiGraph()  # built in sorted order: the layout follows insertion order
    for key in sorted(node.key for node in nodes):
        graph.add_node(key)
    for source, target in sorted((edge.source, edge.target) for edge in edges):
        graph.add_edge(source, target)
    layer: dict[str, int] = {}
    try:
        for depth, generation in enumerate(nx.topological_generations(graph)):
            for key in generation:
                layer[key] = depth
    except nx.NetworkXUnfeasible:  # a cycle: everything in one column
        layer = {key: 0 for key in graph}
    # Each networkx generation is a column, its nodes sorted by name (networkx's multipartite
    # layout would do the same but orders a layer's nodes by set iteration, so not reproducibly).
    columns = max(layer.values(), default=0) + 1
    members = {c: sorted(k for k, v in layer.items() if v == c) for c in range(columns)}
    rows = max((len(m) for m in members.values()), default=1)
    node_w, node_h, gap_x, gap_y, pad, top = 168, 40, 150, 34, 20, 34
    width = columns * node_w + (columns - 1) * gap_x + 2 * pad
    height = rows * node_h + (rows - 1) * gap_y + pad + top
    slots: dict[str, tuple[float, float]] = {}
    for column, keys in members.items():
        offset = (rows - len(keys)) * (node_h + gap_y) / 2
        for row, key in enumerate(keys):
            slots[key] = (pad + column * (node_w + gap_x), top + offset + row * (node_h + gap_y))

    def place(key: str) -> tuple[float, float]:
        return slots[key]

    out = [f'<svg class="picture dataflow" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html_text(title)}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>',
           f'<text x="{pad}" y="16" class="caption">{html_text(title)}</text>']
    for edge in edges:
        (x1, y1), (x2, y2) = place(edge.source), place(edge.target)
        sx, sy, tx, ty = x1 + node_w, y1 + node_h / 2, x2, y2 + node_h / 2
        title = f"{edge.source} -> {edge.target}: {edge.shape} per device, sharding {edge.sharding or 'none'}"
        out.append(f'<g class="edge"><title>{html_text(title)}</title>'
                   f'<line x1="{sx:.1f}" y1="{sy:.1f}" x2="{tx:.1f}" y2="{ty:.1f}" stroke="#6b7280" '
                   f'stroke-width="1.3" marker-end="url(#arrow)"/>'
                   f'<text x="{(sx + tx) / 2:.1f}" y="{(sy + ty) / 2 - 5:.1f}" text-anchor="middle" '
                   f'class="edge-label">{html_text(_clip(edge.shape, 26))}</text>'
                   f'<text x="{(sx + tx) / 2:.1f}" y="{(sy + ty) / 2 + 9:.1f}" text-anchor="middle" '
                   f'class="edge-sharding">{html_text(_clip(edge.sharding, 26))}</text></g>')
    for node in nodes:
        x, y = place(node.key)
        fill = "#fee2e2" if node.collective else "#f9fafb"
        stroke = "#111827" if node.focus else ("#dc2626" if node.collective else "#9ca3af")
        out.append(f'<g class="node{" collective" if node.collective else ""}{" focus" if node.focus else ""}">'
                   f'<title>{html_text(node.detail)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{node_w}" height="{node_h}" rx="6" fill="{fill}" '
                   f'stroke="{stroke}" stroke-width="{2.5 if node.focus else 1.2}"/>'
                   f'<text x="{x + node_w / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" class="node-label">'
                   f'{html_text(_clip(node.label, 24))}</text>'
                   f'<text x="{x + node_w / 2:.1f}" y="{y + 31:.1f}" text-anchor="middle" class="node-detail">'
                   f'{html_text(_clip(node.detail, 28))}</text></g>')
    out.append("</svg>")
    return "".join(out)


def mesh_svg(
    cells: Sequence[MeshCell],
    shape: tuple[int, int],
    groups: Sequence[Sequence[int]],
    title: str,
    legend: str,
) -> str:
    """A ``shape`` (rows, columns) grid of devices in mesh order; ``groups`` (logical ids) drawn as paths."""
    rows, columns = shape
    cell, gap, pad, top = 52, 10, 16, 30
    width = max(220, columns * cell + (columns - 1) * gap + 2 * pad, 6 * len(legend) + 2 * pad)
    height = rows * cell + (rows - 1) * gap + pad + top + 22
    centre: dict[int, tuple[float, float]] = {}
    out = [f'<svg class="picture mesh" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html_text(title)}">',
           f'<text x="{pad}" y="18" class="caption">{html_text(title)}</text>']
    for index, item in enumerate(cells):
        row, column = divmod(index, columns)
        x, y = pad + column * (cell + gap), top + row * (cell + gap)
        centre[item.logical] = (x + cell / 2, y + cell / 2)
        fill = HOST_COLORS[item.host % len(HOST_COLORS)] if item.host is not None else "#f3f4f6"
        host = f"host {item.host}" if item.host is not None else "host unknown"
        out.append(f'<g class="device"><title>{html_text(f"{item.label}, {host}")}</title>'
                   f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" rx="5" fill="{fill}" stroke="#9ca3af"/>'
                   f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" text-anchor="middle" class="device-label">'
                   f'{html_text(item.label)}</text></g>')
    for number, group in enumerate(groups[: len(GROUP_COLORS) * 2]):
        points = [centre[d] for d in group if d in centre]
        if not points:
            continue
        color = GROUP_COLORS[number % len(GROUP_COLORS)]
        offset = (number % 5 - 2) * 3
        path = " ".join(f"{x + offset:.1f},{y + offset:.1f}" for x, y in points)
        out.append(f'<g class="group"><title>{html_text("replica group " + str(list(group)))}</title>'
                   f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="3" stroke-opacity="0.8" '
                   f'stroke-linejoin="round"/>'
                   + "".join(f'<circle cx="{x + offset:.1f}" cy="{y + offset:.1f}" r="4.5" fill="{color}"/>'
                             for x, y in points) + "</g>")
    out.append(f'<text x="{pad}" y="{height - 8}" class="legend">{html_text(legend)}</text>')
    out.append("</svg>")
    return "".join(out)


def bars_svg(bars: Sequence[Bar], title: str, marked_label: str) -> str:
    """Horizontal bars of bytes per step; each bar's ``marked`` part (the finding's op) drawn darker."""
    label_w, bar_w, row_h, pad, top = 150, 300, 26, 16, 30
    width = label_w + bar_w + 110 + 2 * pad
    height = top + max(1, len(bars)) * row_h + 26
    largest = max((bar.total for bar in bars), default=0) or 1
    out = [f'<svg class="picture bars" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html_text(title)}">',
           f'<text x="{pad}" y="18" class="caption">{html_text(title)}</text>']
    if not bars:
        out.append(f'<text x="{pad}" y="{top + 16}" class="legend">no collectives</text>')
    for row, bar in enumerate(bars):
        y = top + row * row_h
        full = max(1.0, bar_w * bar.total / largest)
        part = bar_w * bar.marked / largest if bar.marked else 0.0
        out.append(f'<g class="bar"><title>{html_text(f"{bar.label}: {format_bytes(bar.total)} per step")}</title>'
                   f'<text x="{pad + label_w - 8}" y="{y + 15}" text-anchor="end" class="bar-label">'
                   f'{html_text(_clip(bar.label, 22))}</text>'
                   f'<rect x="{pad + label_w}" y="{y + 3}" width="{full:.1f}" height="{row_h - 8}" fill="#93c5fd"/>'
                   + (f'<rect x="{pad + label_w}" y="{y + 3}" width="{max(1.0, part):.1f}" height="{row_h - 8}" '
                      f'fill="#dc2626"/>' if bar.marked else "")
                   + f'<text x="{pad + label_w + full + 6:.1f}" y="{y + 15}" class="bar-value">'
                   f'{html_text(format_bytes(bar.total))}</text></g>')
    out.append(f'<rect x="{pad}" y="{height - 18}" width="10" height="10" fill="#dc2626"/>'
               f'<text x="{pad + 14}" y="{height - 9}" class="legend">{html_text(marked_label)}</text>')
    out.append("</svg>")
    return "".join(out)
