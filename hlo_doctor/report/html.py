"""The HTML report: one self-contained file (inline CSS, JS and SVG; no network).

Per finding: the message, the source snippet, the fix with a copy button,
and three pictures (:mod:`hlo_doctor.report.svg`): the dataflow
neighbourhood of the op, the device mesh with the collective's replica
groups, and bytes per step by collective role. Per module: the
communication inventory. A Content-Security-Policy forbids every fetch.

The pictures need the dump itself: it is loaded again from ``report.dump``
(one module at a time); when it is gone, the report says so and keeps the
rest. Everything taken from the dump is escaped (:func:`html_text`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hlo_doctor.dump import load_dump
from hlo_doctor.dump.folder import Role
from hlo_doctor.errors import one_line
from hlo_doctor.findings import Finding, Severity
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.sharding import shard_shape
from hlo_doctor.report.paths import relative_path
from hlo_doctor.report.safe import html_text
from hlo_doctor.report.source import SourcePolicy, source_lines
from hlo_doctor.report.svg import Bar, Edge, MeshCell, Node, bars_svg, dataflow_svg, grid_shape, mesh_svg
from hlo_doctor.report.text import bytes_line, fixes_for
from hlo_doctor.rules import AnalysisOptions, RuleContext
from hlo_doctor.semantics.inventory import module_rows
from hlo_doctor.units import format_bytes

if TYPE_CHECKING:
    from hlo_doctor.findings import Report
    from hlo_doctor.rules.context import RuleContext

__all__ = ["INVENTORY_KEYS", "module_inventory", "render_html"]

INVENTORY_KEYS = ("instruction", "kind", "role", "phase", "parameters", "axes", "group_size", "crosses_hosts",
                  "bytes_per_device", "executions", "source", "reason")
COLLECTIVE_OPCODES = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                                "collective-broadcast", "ragged-all-to-all"})
_NEIGHBOURS = 12


def module_inventory(ctx: RuleContext | None) -> list[dict[str, Any]] | None:
    """The module's communication inventory (``hlo-doctor collectives``): one dict per collective.

    Keys :data:`INVENTORY_KEYS`, roles and phases from the analysis layer
    (:mod:`hlo_doctor.semantics`). None when the module has no per-device snapshot.
    """
    if ctx is None or ctx.per_device is None:
        return None

    def source_of(instruction):  # noqa: ANN001, ANN202
        frame, _ = ctx.user_source(instruction)
        return f"{relative_path(frame.file)}:{frame.line}" if frame is not None else None

    return [row.as_json() for row in module_rows(ctx.semantics, source_of)]


def render_html(report: Report, *, sources: SourcePolicy | None = None) -> str:
    """The whole report as one HTML document."""
    sources = sources or SourcePolicy.default(dump=report.dump)
    frameworks = {module.key: module.framework for module in report.modules}
    contexts, note = _contexts(report)
    inventories = {key: _inventory_or_none(ctx) for key, ctx in contexts.items()}
    body = [_header(report, note)]
    for number, finding in enumerate(report.findings, 1):
        body.append(_finding(number, finding, contexts.get(finding.module), inventories.get(finding.module),
                             frameworks.get(finding.module), sources))
    for module in report.modules:
        body.append(_module(module.key, inventories.get(module.key)))
    title = f"hlo-doctor: {relative_path(report.dump)}"
    return _PAGE.format(title=html_text(title), style=_STYLE, script=_SCRIPT, body="\n".join(body))


# -- the dump, loaded again for the pictures --------------------------------


def _contexts(report: Report) -> tuple[dict[str, RuleContext], str | None]:

    try:
        dump = load_dump(report.dump)
    except Exception as error:  # noqa: BLE001 - the report is still worth writing without pictures
        return {}, f"pictures left out: the dump cannot be read again ({one_line(str(error), 200)})"
    options = AnalysisOptions(devices_per_host=report.devices_per_host)
    wanted = {module.key for module in report.modules}
    return {module.key: RuleContext(dump, module, options) for module in dump.modules if module.key in wanted}, None


def _inventory_or_none(ctx: RuleContext) -> list[dict[str, Any]] | None:
    """:func:`module_inventory`, or None when the module's snapshots cannot be read (the analysis said why)."""
    try:
        return module_inventory(ctx)
    except Exception:  # noqa: BLE001 - a module that failed to parse is already in the report's errors
        return None


def _picture(make, *args) -> str:
    """One picture, or a line saying why it is missing (a picture must never end the report)."""
    try:
        return make(*args) or ""
    except Exception as error:  # noqa: BLE001
        return f'<p class="note">picture left out: {html_text(type(error).__name__)}: {html_text(one_line(str(error), 200))}</p>'


# -- sections -----------------------------------------------------------------


def _header(report: Report, note: str | None) -> str:
    severities = Counter(f.severity for f in report.findings)
    counts = ", ".join(f"{severities[s]} {s.value}{'s' if severities[s] != 1 else ''}" for s in Severity
                       if severities[s])
    total = len(report.findings)
    found = f"{total} finding{'s' if total != 1 else ''} ({counts})" if total else "no findings"
    rules = Counter(f.rule for f in report.findings)
    first: dict[str, int] = {}
    for number, finding in enumerate(report.findings, 1):
        first.setdefault(finding.rule, number)
    lines = [f"<h1>hlo-doctor {html_text(report.tool_version)}</h1>",
             f"<p class=\"dump\">{html_text(relative_path(report.dump))}: {found} in {len(report.modules)} "
             f"module{'s' if len(report.modules) != 1 else ''}; {len(report.rules)} rules ran</p>"]
    if rules:
        lines.append("<ul class=\"rules\">" + "".join(
            f"<li><a href=\"#finding-{first[rule]}\"><code>{html_text(rule)}</code></a> {count}</li>"
            for rule, count in sorted(rules.items())) + "</ul>")
    if report.baselined:
        lines.append(f"<p>{len(report.baselined)} findings accepted by the baseline are not shown.</p>")
    for (rule, reason), count in sorted(Counter((s.rule, s.reason) for s in report.skipped).items()):
        where = f" in {count} modules" if count > 1 else ""
        lines.append(f"<p class=\"skipped\">not judged: <code>{html_text(rule)}</code>{where}: {html_text(reason)}</p>")
    for error in report.errors:
        lines.append(f"<p class=\"error\">error: {html_text(relative_path(error.path))}: {html_text(error.message)}</p>")
    if note:
        lines.append(f"<p class=\"note\">{html_text(note)}</p>")
    return "<header>" + "\n".join(lines) + "</header>"


def _finding(number: int, finding: Finding, ctx: RuleContext | None, inventory: list[dict] | None,
             framework: str | None, sources: SourcePolicy) -> str:
    anchor = f"finding-{number}"
    where = _location(finding)
    parts = [f'<section class="finding {finding.severity.value}" id="{anchor}" data-rule="{html_text(finding.rule)}">',
             f'<h2><span class="severity">{finding.severity.value}</span> '
             f'<code>{html_text(finding.rule)}</code> <a class="anchor" href="#{anchor}">#{number}</a></h2>',
             f'<p class="where">{html_text(where)} <span class="dim">module {html_text(finding.module)}'
             + (f", %{html_text(finding.instruction)}" if finding.instruction else "") + "</span></p>",
             f'<p class="message">{html_text(finding.message)}</p>']
    if finding.source is not None:
        lines = source_lines(finding.source.file, finding.source.line, sources)
        if lines:
            parts.append('<pre class="source">' + "".join(
                f'<span class="line{" hit" if n == finding.source.line else ""}"><span class="number">{n}</span> '
                f'{html_text(text)}</span>' for n, text in lines) + "</pre>")
    if finding.suggestion is not None:
        parts.append(_fix(anchor, finding, framework))
    moved = bytes_line(finding)
    if moved:
        parts.append(f'<p class="bytes">bytes: {html_text(moved)}</p>')
    if ctx is not None:
        parts.append('<div class="pictures">')
        parts.append(_picture(_dataflow_picture, finding, ctx))
        parts.append(_picture(_mesh_picture, finding, ctx))
        parts.append(_picture(_bars_picture, finding, inventory))
        parts.append("</div>")
    parts.append("</section>")
    return "\n".join(parts)


def _location(finding: Finding) -> str:
    if finding.source is not None:
        function = f" in {finding.source.function}" if finding.source.function else ""
        return f"{relative_path(finding.source.file)}:{finding.source.line}{function}"
    if finding.file is not None:
        return f"{relative_path(finding.file)}:{finding.line}"
    return finding.module


def _fix(anchor: str, finding: Finding, framework: str | None) -> str:
    suggestion = finding.suggestion
    assert suggestion is not None
    parts = [f'<div class="fix"><p><strong>fix:</strong> {html_text(suggestion.summary)}</p>']
    for index, (label, code) in enumerate(fixes_for(suggestion, framework)):
        target = f"{anchor}-fix-{index}"
        parts.append(f'<div class="code"><div class="code-head">{html_text(label)} '
                     f'<button type="button" class="copy" data-target="{target}">copy</button></div>'
                     f'<pre><code id="{target}">{html_text(code)}</code></pre></div>')
    parts.append("</div>")
    return "".join(parts)


def _module(key: str, inventory: list[dict] | None) -> str:
    parts = [f'<section class="module"><h2>module <code>{html_text(key)}</code>: communication inventory</h2>']
    if inventory is None:
        parts.append('<p class="note">no per-device snapshot: collectives unknown</p>')
    elif not inventory:
        parts.append("<p>no collectives</p>")
    else:
        head = "".join(f"<th>{html_text(k.replace('_', ' '))}</th>" for k in INVENTORY_KEYS)
        rows = "".join("<tr>" + "".join(f"<td>{html_text(_cell(key, row.get(key)))}</td>" for key in INVENTORY_KEYS)
                       + "</tr>" for row in inventory)
        parts.append(f'<table class="inventory"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>')
    parts.append("</section>")
    return "\n".join(parts)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key == "bytes_per_device" and isinstance(value, int):
        return format_bytes(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


# -- pictures -------------------------------------------------------------------


def _graphs_for(finding: Finding, ctx: RuleContext) -> Iterator[tuple[Any, bool]]:
    """Dataflow graphs to look for the finding's op in, with whether their shapes are per device:
    the snapshot the finding points at, then the per-device one (whose names findings use)."""

    for snapshot in ctx.module.snapshots:
        if finding.file is not None and str(snapshot.path) == finding.file and snapshot.module() is not ctx.per_device:
            yield build_graph(snapshot.module()), snapshot.role in (Role.AFTER_PARTITIONING, Role.AFTER_OPTIMIZATIONS)
    if ctx.graph is not None:
        yield ctx.graph, True


def _is_collective(opcode: str) -> bool:
    return opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVE_OPCODES


def _device_shape(instruction, per_device: bool) -> str:
    shape = instruction.shape
    if shape.is_tuple:
        return f"tuple of {len(shape.tuple_shapes)}"
    dims = shape.dims
    sharding = instruction.sharding
    if not per_device and sharding is not None and not sharding.is_tuple:
        with contextlib.suppress(ValueError):
            dims = shard_shape(sharding, dims)
    return f"{shape.element_type}[{','.join(map(str, dims))}]"


def _neighbourhood(graph, focus) -> Iterator[tuple]:
    """Keys near ``focus``: itself, producers two steps up, consumers one step down (at most _NEIGHBOURS)."""
    seen = {focus}
    yield focus
    frontier = [focus]
    for _ in range(2):
        step = []
        for key in frontier:
            for producer, _kind in sorted(graph.producers(key)):
                if producer not in seen and len(seen) < _NEIGHBOURS:
                    seen.add(producer)
                    step.append(producer)
                    yield producer
        frontier = step
    for consumer, _kind in sorted(graph.consumers(focus)):
        if consumer not in seen and len(seen) < _NEIGHBOURS:
            seen.add(consumer)
            yield consumer


def _dataflow_picture(finding: Finding, ctx: RuleContext) -> str | None:
    if not finding.instruction:
        return None
    for graph, per_device in _graphs_for(finding, ctx):  # noqa: B007 - the pair the loop breaks at is used below
        keys = graph.find(finding.instruction)
        if keys:
            break
    else:
        return None
    chosen = list(_neighbourhood(graph, keys[0]))
    members = set(chosen)
    nodes = []
    for key in chosen:
        instruction = graph.instruction(key)
        nodes.append(Node(f"{key[0]}/{key[1]}", instruction.name, f"{instruction.opcode} {_device_shape(instruction, per_device)}",
                          collective=_is_collective(instruction.opcode), focus=key == keys[0]))
    edges = []
    for key in chosen:
        for producer, _kind in sorted(graph.producers(key)):
            if producer in members:
                source = graph.instruction(producer)
                sharding = source.sharding.text if source.sharding is not None else ""
                edges.append(Edge(f"{producer[0]}/{producer[1]}", f"{key[0]}/{key[1]}",
                                  _device_shape(source, per_device), sharding))
    title = f"dataflow around %{finding.instruction} (per-device shapes and shardings on the edges)"
    return dataflow_svg(nodes, edges, title)


def _collective_of(finding: Finding, ctx: RuleContext):
    names = [finding.instruction, *finding.related] if finding.instruction else list(finding.related)
    by_name = {op.instruction: op for op in ctx.collectives}
    return next((by_name[name] for name in names if name in by_name), None)


def _mesh_picture(finding: Finding, ctx: RuleContext) -> str | None:
    mesh = ctx.mesh
    device_map = ctx.device_map
    if mesh is not None:
        logical_ids = list(mesh.device_ids)
        shape = grid_shape(mesh.axis_sizes)
        axes = " x ".join(f"{name}={size}" for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=False))
    else:
        logical_ids = list(range(ctx.num_partitions or 1))
        shape = (1, len(logical_ids))
        axes = f"{len(logical_ids)} partitions, no mesh known"
    by_slice = device_map.platform == "tpu" and device_map.slice_of is not None
    cells = []
    for logical in logical_ids:
        try:
            physical = device_map.physical_id(logical)
        except (IndexError, ValueError):
            physical = logical
        place = (device_map.slice_of or {}).get(physical) if by_slice else device_map.host(physical)
        cells.append(MeshCell(logical, f"d{physical}", place))
    op = _collective_of(finding, ctx)
    groups = list(op.logical_groups) if op is not None else []
    unit = "slices" if by_slice else "hosts"
    known = any(cell.host is not None for cell in cells)
    legend = f"colour: {unit}" + ("" if known else " unknown (pass --devices-per-host)")
    if op is not None:
        legend += f"; {len(groups)} replica group{'s' if len(groups) != 1 else ''} of %{op.instruction} " \
                  f"({op.kind}, {op.group_size} devices each)"
    else:
        legend += "; no collective in this finding"
    return mesh_svg(cells, shape, groups, f"mesh {axes}", legend)


def _bars_picture(finding: Finding, inventory: list[dict] | None) -> str | None:
    if inventory is None:
        return None
    names = {finding.instruction, *finding.related} - {None}
    totals: dict[str, list[int]] = {}
    for row in inventory:
        role = str(row.get("role") or "unknown")
        step = int(row.get("bytes_per_device") or 0) * int(row.get("executions") or 1)
        total = totals.setdefault(role, [0, 0])
        total[0] += step
        if row.get("instruction") in names:
            total[1] += step
    bars = [Bar(role, total, marked) for role, (total, marked) in sorted(totals.items(), key=lambda i: -i[1][0])]
    return bars_svg(bars, "bytes per device per step by collective role", "this finding's collectives")


# -- the page -------------------------------------------------------------------

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
<script>{script}</script>
</body>
</html>
"""

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#111827;background:#fff;margin:0 auto;
max-width:1200px;padding:16px 24px}
h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:4px 0 6px}code,pre{font:12.5px/1.4 ui-monospace,
SFMono-Regular,Menlo,monospace}.dim{color:#6b7280;font-weight:normal}ul.rules{padding-left:18px}
section{border:1px solid #e5e7eb;border-radius:8px;padding:12px 16px;margin:14px 0}
section.finding.warning{border-left:5px solid #d97706}section.finding.error{border-left:5px solid #dc2626}
section.finding.info{border-left:5px solid #0891b2}.severity{text-transform:uppercase;font-size:12px;
letter-spacing:.05em;color:#92400e}.error .severity{color:#b91c1c}a.anchor{color:#9ca3af;text-decoration:none}
pre{background:#f9fafb;border:1px solid #e5e7eb;border-radius:6px;padding:8px 10px;overflow-x:auto;margin:6px 0}
pre.source .line{display:block}pre.source .hit{background:#fef3c7}.number{color:#9ca3af;display:inline-block;
min-width:3em}.code-head{font-size:12px;color:#374151;display:flex;gap:8px;align-items:center}
button.copy{font-size:12px;padding:1px 8px;border:1px solid #9ca3af;border-radius:4px;background:#fff;cursor:pointer}
.pictures{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start;margin-top:8px}
svg.picture{border:1px solid #e5e7eb;border-radius:6px;background:#fff;max-width:100%;height:auto}
svg text{font-family:system-ui,sans-serif}.caption{font-size:12px;font-weight:600;fill:#374151}
.node-label{font-size:11.5px;font-weight:600}.node-detail,.edge-label,.edge-sharding,.legend,.bar-value{font-size:10.5px;
fill:#4b5563}.edge-sharding{fill:#7c3aed}.device-label{font-size:11px}.bar-label{font-size:11px}
table.inventory{border-collapse:collapse;font-size:12px;width:100%}table.inventory th,table.inventory td{
border-bottom:1px solid #e5e7eb;padding:3px 6px;text-align:left;vertical-align:top}
.note,.skipped{color:#6b7280}.error{color:#b91c1c}
"""

_SCRIPT = """
(function () {
  function fallback(text) {
    var area = document.createElement('textarea');
    area.value = text;
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand('copy'); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }
  function show(button, ok) {
    button.textContent = ok ? 'copied' : 'press Ctrl+C';
    setTimeout(function () { button.textContent = 'copy'; }, 1500);
  }
  document.addEventListener('click', function (event) {
    var button = event.target.closest ? event.target.closest('button.copy') : null;
    if (!button) { return; }
    var code = document.getElementById(button.getAttribute('data-target'));
    var text = code ? code.textContent : '';
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { show(button, true); },
                                               function () { show(button, fallback(text)); });
    } else {
      show(button, fallback(text));
    }
  });
})();
"""
