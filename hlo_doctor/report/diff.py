"""Rendering of ``hlo-doctor diff``: text, JSON and Markdown.

Names from the dumps are made plain in text and escaped in Markdown
(:mod:`hlo_doctor.report.safe`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from hlo_doctor.gate.diff import DumpDiff
from hlo_doctor.report.json import finding_to_dict
from hlo_doctor.report.safe import md_code, md_text, plain_block
from hlo_doctor.units import format_bytes


def _pct(before: int, after: int) -> str:
    if before == after:
        return "0%"
    if before == 0:
        return "new"
    return f"{100.0 * (after - before) / before:+.0f}%"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def diff_to_dict(diff: DumpDiff) -> dict[str, Any]:
    return {
        "before": diff.before,
        "after": diff.after,
        "bytes_per_device": {"before": diff.bytes_before, "after": diff.bytes_after,
                             "increase_pct": _finite(diff.comm_increase_pct)},
        "critical_path_bytes_per_device": {"before": diff.critical_before, "after": diff.critical_after,
                                           "increase_pct": _finite(diff.critical_increase_pct)},
        "bytes_per_device_by_role": {role: {"before": b, "after": a} for role, (b, a) in diff.roles.items()},
        "modules": [
            {
                "name": m.name,
                "before": m.before,
                "after": m.after,
                "collectives": {
                    kind: {
                        "before": {"count": b.count, "bytes": b.bytes_per_device, "cross_host_bytes": b.cross_host_bytes},
                        "after": {"count": a.count, "bytes": a.bytes_per_device, "cross_host_bytes": a.cross_host_bytes},
                    }
                    for kind, (b, a) in m.collectives.items()
                },
                "critical_path_bytes": {"before": m.critical_before, "after": m.critical_after},
                "bytes_by_role": {role: {"before": b, "after": a} for role, (b, a) in m.roles.items()},
                "findings_added": [finding_to_dict(f) for f in m.added],
                "findings_removed": [finding_to_dict(f) for f in m.removed],
                "collectives_removed": [_detail(d) for d in m.collectives_removed],
                "collectives_added": [_detail(d) for d in m.collectives_added],
                "parameters_changed": [
                    {"number": p.number, "name": p.name, "shape": p.shape, "before": p.before, "after": p.after}
                    for p in m.parameters
                ],
            }
            for m in diff.modules
        ],
        "errors": list(diff.errors),
    }


def _detail(d) -> dict[str, Any]:
    return {"kind": d.kind, "instruction": d.instruction, "role": d.role, "parameters": list(d.parameters),
            "operand_shape": d.operand_shape, "result_shape": d.result_shape, "dimension": d.dimension,
            "bytes_per_device": d.bytes_per_device, "can_overlap": d.can_overlap}


def render_diff_json(diff: DumpDiff) -> str:
    return json.dumps(diff_to_dict(diff), indent=2) + "\n"


def render_diff_text(diff: DumpDiff) -> str:
    lines = [f"hlo-doctor diff: {diff.before} -> {diff.after}"]
    for m in diff.modules:
        lines.append("")
        lines.append(f"module {m.name} ({m.before or 'absent'} -> {m.after or 'absent'})")
        if m.collectives:
            lines.append(f"  {'collective':<22}{'count':>13}  {'bytes/device':>27}  {'cross-host bytes':>27}")
            for kind, (b, a) in m.collectives.items():
                lines.append(
                    f"  {kind:<22}{b.count:>5} -> {a.count:<5}  "
                    f"{format_bytes(b.bytes_per_device):>11} -> {format_bytes(a.bytes_per_device):<11} {_pct(b.bytes_per_device, a.bytes_per_device):>4}  "
                    f"{format_bytes(b.cross_host_bytes):>11} -> {format_bytes(a.cross_host_bytes):<11}"
                )
        else:
            lines.append("  no collectives")
        if m.roles:
            lines.append(f"  {'role':<22}{'bytes/device':>27}")
            for role, (b, a) in m.roles.items():
                lines.append(f"  {role:<22}{format_bytes(b):>11} -> {format_bytes(a):<11} {_pct(b, a):>4}")
            lines.append(f"  {'on the critical path':<22}{format_bytes(m.critical_before):>11} -> "
                         f"{format_bytes(m.critical_after):<11} {_pct(m.critical_before, m.critical_after):>4}")
        for detail in m.collectives_removed:
            lines.append(f"  - {detail.describe()}")
        for detail in m.collectives_added:
            lines.append(f"  + {detail.describe()}")
        for finding in m.added:
            lines.append(f"  + {finding.rule} {finding.instruction or ''}: {finding.message}")
        for finding in m.removed:
            lines.append(f"  - {finding.rule} {finding.instruction or ''}: {finding.message}")
        for p in m.parameters:
            lines.append(f"  parameter {p.number} ({p.name} {p.shape}) sharding: {p.before} -> {p.after}")
    lines.append("")
    lines.append(
        f"collective bytes per device: {format_bytes(diff.bytes_before)} -> {format_bytes(diff.bytes_after)} "
        f"({_pct(diff.bytes_before, diff.bytes_after)}), on the critical path {format_bytes(diff.critical_before)} "
        f"-> {format_bytes(diff.critical_after)} ({_pct(diff.critical_before, diff.critical_after)}); "
        f"findings: +{len(diff.added)} -{len(diff.removed)}"
    )
    for error in diff.errors:
        lines.append(f"error: {error}")
    return plain_block("\n".join(lines)) + "\n"


def render_diff_markdown(diff: DumpDiff) -> str:
    lines = [
        f"### hlo-doctor diff: collective bytes per device {format_bytes(diff.bytes_before)} -> {format_bytes(diff.bytes_after)} "
        f"({_pct(diff.bytes_before, diff.bytes_after)}), on the critical path {format_bytes(diff.critical_before)} "
        f"-> {format_bytes(diff.critical_after)} ({_pct(diff.critical_before, diff.critical_after)}), "
        f"findings +{len(diff.added)} -{len(diff.removed)}",
        "",
    ]
    for m in diff.modules:
        lines += [f"**{md_text(m.name)}**", "", "| collective | count | bytes/device | cross-host bytes |", "| --- | --- | --- | --- |"]
        for kind, (b, a) in m.collectives.items():
            lines.append(
                f"| {md_code(kind, in_table=True)} | {b.count} → {a.count} | {format_bytes(b.bytes_per_device)} → {format_bytes(a.bytes_per_device)} "
                f"({_pct(b.bytes_per_device, a.bytes_per_device)}) | {format_bytes(b.cross_host_bytes)} → {format_bytes(a.cross_host_bytes)} |"
            )
        for role, (b, a) in m.roles.items():
            lines.append(f"| {md_text(role)} (role) | | {format_bytes(b)} → {format_bytes(a)} ({_pct(b, a)}) | |")
        if m.roles:
            lines.append(f"| on the critical path | | {format_bytes(m.critical_before)} → "
                         f"{format_bytes(m.critical_after)} ({_pct(m.critical_before, m.critical_after)}) | |")
        lines.append("")
        for detail in m.collectives_removed:
            lines.append(f"- removed {md_text(detail.describe())}")
        for detail in m.collectives_added:
            lines.append(f"- added {md_text(detail.describe())}")
        for finding in m.added:
            lines.append(f"- :new: {md_code(finding.rule)} {md_code(finding.instruction or '')}: "
                         f"{md_text(finding.message)}")
        for finding in m.removed:
            lines.append(f"- :heavy_check_mark: fixed {md_code(finding.rule)} {md_code(finding.instruction or '')}: "
                         f"{md_text(finding.message)}")
        for p in m.parameters:
            lines.append(f"- parameter {p.number} {md_code(p.name)} {md_code(p.shape)}: {md_code(p.before)} → "
                         f"{md_code(p.after)}")
        lines.append("")
    return "\n".join(lines)
