"""The HTML report: one self-contained file (inline CSS, JS and SVG; no network).

Per finding: the message, the source snippet, its symptoms as a table (one row
per kind, each symptom in a fold-out), the fix with a copy button, and three
pictures (:mod:`hlo_doctor.report.svg`): the dataflow neighbourhood of the op,
the device mesh with the collective's replica groups, and bytes per step by
collective role. Per module: the memory per device at its peak, stacked by
class against the target's memory with the headroom (:mod:`hlo_doctor.report.memory_svg`),
and the communication inventory. A
Content-Security-Policy forbids every fetch.

Everything drawn comes with the :class:`~hlo_doctor.findings.Report`: the
analysis made each finding's pictures (:class:`~hlo_doctor.pictures.FindingPictures`)
and each module's inventory and memory while the module was loaded, so the page never reads
the dump. Everything taken from the dump is escaped (:func:`html_text`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hlo_doctor.errors import one_line
from hlo_doctor.findings import Finding, Severity
from hlo_doctor.memory import ModuleMemory
from hlo_doctor.pictures import INVENTORY_KEYS, FindingPictures
from hlo_doctor.report.memory_svg import memory_section
from hlo_doctor.report.paths import relative_path
from hlo_doctor.report.safe import html_text
from hlo_doctor.report.source import SourcePolicy, source_lines, sources_summary
from hlo_doctor.report.svg import Bar, bars_svg, dataflow_svg, mesh_svg
from hlo_doctor.report.symptoms import symptom_kinds, symptoms_of
from hlo_doctor.report.text import bytes_line, fixes_for
from hlo_doctor.units import format_bytes

if TYPE_CHECKING:
    from hlo_doctor.findings import Report

__all__ = ["INVENTORY_KEYS", "render_html"]

Inventory = Sequence[Mapping[str, Any]]


def render_html(report: Report, *, sources: SourcePolicy | None = None) -> str:
    """The whole report as one HTML document."""
    sources = sources or SourcePolicy.default(dump=report.dump)
    frameworks = {module.key: module.framework for module in report.modules}
    inventories = {module.key: module.inventory for module in report.modules}
    body = [_header(report)]
    for number, finding in enumerate(report.findings, 1):
        body.append(_finding(number, finding, inventories.get(finding.module), frameworks.get(finding.module),
                             sources))
    for module in report.modules:
        if module.memory is not None:
            body.append(_memory(module.key, module.memory))
        body.append(_module(module.key, module.inventory, report.drawings))
    title = f"hlo-doctor: {relative_path(report.dump)}"
    return _PAGE.format(title=html_text(title), style=_STYLE, script=_SCRIPT, body="\n".join(body))


def _picture(make, *args) -> str:  # noqa: ANN001
    """One picture, or a line saying why it is missing (a picture must never end the report)."""
    try:
        return make(*args) or ""
    except Exception as error:  # noqa: BLE001
        return f'<p class="note">picture left out: {html_text(type(error).__name__)}: {html_text(one_line(str(error), 200))}</p>'


# -- sections -----------------------------------------------------------------


def _header(report: Report) -> str:
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
    lines += [f"<p class=\"sources\">{html_text(line)}</p>" for line in sources_summary(report.sources)]
    if not report.drawings:
        lines.append("<p class=\"note\">pictures and inventories left out: the analysis did not make them "
                     "(analyze_dump(..., drawings=True) does)</p>")
    return "<header>" + "\n".join(lines) + "</header>"


def _finding(number: int, finding: Finding, inventory: Inventory | None, framework: str | None,
             sources: SourcePolicy) -> str:
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
    symptoms = _symptoms(finding)
    if symptoms:
        parts.append(symptoms)
    if finding.suggestion is not None:
        parts.append(_fix(anchor, finding, framework))
    moved = bytes_line(finding)
    if moved:
        parts.append(f'<p class="bytes">bytes: {html_text(moved)}</p>')
    if finding.pictures is not None:
        parts.append(_pictures(finding, finding.pictures, inventory))
    parts.append("</section>")
    return "\n".join(parts)


def _symptoms(finding: Finding) -> str:
    """The symptoms it causes: one row per kind (count, bytes per step, rules), each symptom in a fold-out."""
    kinds = symptom_kinds(finding)
    if not kinds:
        return ""
    rows = "".join(
        f"<tr><td>{html_text(kind.kind)}</td><td>{kind.count}</td>"
        f"<td>{html_text(format_bytes(kind.wire_bytes_per_step)) if kind.wire_bytes_per_step is not None else ''}</td>"
        f"<td>{html_text(', '.join(kind.rules))}</td></tr>" for kind in kinds)
    each = "".join(
        f"<tr><td><code>{html_text(symptom.get('instruction') or '')}</code></td>"
        f"<td>{html_text(symptom.get('kind') or '')}</td><td>{html_text(symptom['rule'])}</td>"
        f"<td>{_bytes_cell(symptom.get('wire_bytes_per_step'))}</td>"
        f"<td>{html_text(symptom.get('message') or '')}</td></tr>" for symptom in symptoms_of(finding))
    total = sum(kind.count for kind in kinds)
    return (f'<div class="symptoms"><p><strong>symptoms:</strong> {total} finding{"s" if total != 1 else ""} '
            "of other rules that this cause explains</p>"
            '<table class="symptoms"><thead><tr><th>kind</th><th>count</th><th>wire bytes per device per step</th>'
            f"<th>rules</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<details><summary>each symptom ({total})</summary>"
            '<table class="symptoms"><thead><tr><th>op</th><th>kind</th><th>rule</th><th>wire bytes per step</th>'
            f"<th>message</th></tr></thead><tbody>{each}</tbody></table></details></div>")


def _bytes_cell(value: Any) -> str:
    return html_text(format_bytes(value)) if isinstance(value, int) and not isinstance(value, bool) else ""


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


def _module(key: str, inventory: Inventory | None, drawn: bool) -> str:
    parts = [f'<section class="module"><h2>module <code>{html_text(key)}</code>: communication inventory</h2>']
    if not drawn:
        parts.append('<p class="note">not made by the analysis</p>')
    elif inventory is None:
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


def _memory(key: str, memory: Mapping[str, Any]) -> str:
    """The module's memory per device at its peak, stacked by class against the target's memory."""
    return ('<section class="module memory">'
            f'<h2>module <code>{html_text(key)}</code>: memory per device</h2>'
            + _picture(lambda: memory_section(ModuleMemory.from_document(memory))) + "</section>")


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key == "bytes_per_device" and isinstance(value, int):
        return format_bytes(value)
    if key == "source" and isinstance(value, str):
        file, _, line = value.rpartition(":")
        return f"{relative_path(file)}:{line}" if file and line.isdigit() else value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


# -- pictures -------------------------------------------------------------------


def _pictures(finding: Finding, pictures: FindingPictures, inventory: Inventory | None) -> str:
    parts = ['<div class="pictures">']
    if pictures.dataflow is not None:
        flow = pictures.dataflow
        parts.append(_picture(dataflow_svg, flow.nodes, flow.edges, flow.title))
    if pictures.mesh is not None:
        mesh = pictures.mesh
        parts.append(_picture(mesh_svg, mesh.cells, mesh.shape, mesh.groups, mesh.title, mesh.legend))
    parts.append(_picture(_bars_picture, finding, inventory))
    parts += [f'<p class="note">{html_text(note)}</p>' for note in pictures.notes]
    parts.append("</div>")
    return "\n".join(parts)


def _bars_picture(finding: Finding, inventory: Inventory | None) -> str | None:
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
table.inventory,table.symptoms,table.memory-items{border-collapse:collapse;font-size:12px;width:100%}
table.inventory th,table.inventory td,table.symptoms th,table.symptoms td,table.memory-items th,table.memory-items td{border-bottom:1px solid #e5e7eb;padding:3px 6px;text-align:left;
vertical-align:top}div.symptoms{margin:6px 0}div.symptoms p{margin:4px 0}details summary{cursor:pointer;font-size:12px}
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
