"""Text and JSON of ``hlo-doctor fix``: a plan (the diff, the edits, the refusals) and a verification.

The JSON documents carry ``"kind": "fix"`` or ``"kind": "fix-verify"`` and ``schema_version`` 1.
Bytes are collective bytes per device per step (:mod:`hlo_doctor.semantics.critical_path`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hlo_doctor._version import __version__
from hlo_doctor.findings import Finding
from hlo_doctor.fix.verify import Traffic, Verification
from hlo_doctor.report.json import finding_to_dict
from hlo_doctor.report.safe import plain, plain_block
from hlo_doctor.units import format_bytes

__all__ = ["plan_text", "plan_to_dict", "verification_text", "verification_to_dict"]

SCHEMA_VERSION = 1


def _shown(path: object) -> str:
    """``path`` relative to the current folder when it is below it (as the diff names files), else as it is."""
    try:
        return str(Path(str(path)).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def _where(finding: Finding, *, relative: bool = False, copy: tuple[str, str] | None = None) -> str:
    """``file:line`` of the finding (relative to the current folder with ``relative``), or its
    module; ``copy``: (the scratch copy's path, what to call it), as the copy is gone afterwards."""
    if finding.source is not None:
        if copy is not None and finding.source.file == copy[0]:
            return f"{copy[1]}:{finding.source.line}"
        file = _shown(finding.source.file) if relative else finding.source.file
        return f"{file}:{finding.source.line}"
    return finding.module


def _here(finding: Finding, copy: tuple[str, str] | None = None) -> str:
    return _where(finding, relative=True, copy=copy)


def _scratch_copy(result: Verification, *, relative: bool) -> tuple[str, str] | None:
    """The scratch copy the findings after the patch name (removed by now), and its name in the report."""
    if result.copy is None or result.patched_copy is not None:
        return None
    program = _shown(str(result.program)) if relative else str(result.program)
    return str(result.copy), f"{program} (patched copy)"


def _edit_dict(planned: Any) -> dict[str, Any]:
    edit, source = planned.edit, planned.finding.source
    # an edit with no file/line of its own is at the finding's own line (SourceEdit's docs)
    file = edit.file or (source.file if source is not None and edit.kind != "xla-flag" else None)
    line = edit.line or (source.line if source is not None and edit.kind != "xla-flag" and not edit.file else None)
    return {"rule": planned.finding.rule, "fingerprint": planned.finding.fingerprint,
            "where": _where(planned.finding), "description": planned.description,
            "kind": edit.kind, "file": file, "line": line}


def _refusal_dict(refusal: Any) -> dict[str, Any]:
    return {"rule": refusal.finding.rule, "fingerprint": refusal.finding.fingerprint,
            "where": _where(refusal.finding), "message": refusal.finding.message, "reason": refusal.reason}


def _diff(plan: Any) -> str:
    return plan.diff() if plan.changed else ""


def plan_to_dict(plan: Any, *, dump: str, written: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "fix",
        "tool": {"name": "hlo-doctor", "version": __version__},
        "dump": dump,
        "diff": _diff(plan),
        "files": plan.changed,
        "written": list(written),
        "edits": [_edit_dict(e) for e in plan.applied],
        "refused": [_refusal_dict(r) for r in plan.refused],
    }


def refusals_text(plan: Any) -> str:
    """One line per refused finding: where, rule, why no safe edit."""
    return "".join(plain(f"no safe edit: {_here(r.finding)}: {r.finding.rule}: {r.reason}") + "\n"
                   for r in plan.refused)


def plan_text(plan: Any) -> str:
    """The unified diff (empty when nothing is patched): the part of ``fix``'s output that goes to stdout."""
    return _diff(plan)


def _traffic_dict(traffic: Traffic | None) -> dict[str, Any] | None:
    if traffic is None:
        return None
    return {"total": traffic.total, "critical_path": traffic.critical, "prefetchable": traffic.prefetchable,
            "by_role": dict(traffic.by_role),
            "overlappable_gathers": [
                {"module": g.module, "instruction": g.instruction, "kind": g.kind, "role": g.role,
                 "bytes": g.bytes_per_step, "parameters": list(g.parameters)} for g in traffic.overlappable]}


def verification_to_dict(result: Verification, *, exit_code: int) -> dict[str, Any]:
    copy = _scratch_copy(result, relative=False)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "fix-verify",
        "tool": {"name": "hlo-doctor", "version": __version__},
        "program": str(result.program),
        "patched_copy": str(result.patched_copy) if result.patched_copy is not None else None,
        "written": list(result.written),
        "diff": _diff(result.plan),
        "edits": [_edit_dict(e) for e in result.plan.applied],
        "refused": [_refusal_dict(r) for r in result.plan.refused],
        "refused_outcomes": [
            {"rule": o.finding.rule, "fingerprint": o.finding.fingerprint, "where": _where(o.finding),
             "status": o.status, "matched_by": o.matched_by} for o in result.unedited],
        "environment": [{"rule": c.finding.rule, "fingerprint": c.finding.fingerprint, "where": _where(c.finding),
                         "remove_from_xla_flags": c.flag} for c in result.environment],
        "targeted": [
            {"rule": o.finding.rule, "fingerprint": o.finding.fingerprint, "where": _where(o.finding, copy=copy),
             "message": o.finding.message, "status": o.status, "matched_by": o.matched_by,
             "after": None if o.after is None else {"where": _where(o.after, copy=copy), "message": o.after.message}}
            for o in result.targeted],
        "new_findings": [finding_to_dict(f) for f in result.new],
        "bytes_per_device": {"before": _traffic_dict(result.before_traffic),
                             "after": _traffic_dict(result.after_traffic)},
        "problems": list(result.problems),
        "ok": result.ok,
        "exit_code": exit_code,
    }


def _change(before: int, after: int | None) -> str:
    if after is None:
        return format_bytes(before)
    if before == after:
        pct = "0%"
    elif before == 0:
        pct = "new"
    else:
        pct = f"{100.0 * (after - before) / before:+.0f}%"
    return f"{format_bytes(before)} -> {format_bytes(after)} ({pct})"


def verification_text(result: Verification) -> str:
    """The report of ``fix --verify`` (the diff first)."""
    copy = _scratch_copy(result, relative=True)
    lines: list[str] = []
    diff = _diff(result.plan)
    if diff:
        lines.append(diff.rstrip("\n"))
        lines.append("")
    lines.append(f"hlo-doctor fix --verify: {_shown(result.program)}")
    for planned in result.plan.applied:
        lines.append(f"  edit: {_here(planned.finding, copy)}: {planned.finding.rule}: {planned.description}")
    for change in result.environment:
        lines.append(f"  environment: {_here(change.finding)}: {change.finding.rule}: remove {change.flag} from "
                     "XLA_FLAGS (set outside the program: the copy was recompiled without it; the change is yours)")
    gone_anyway = {id(o.finding) for o in result.went_with_cause}
    for refusal in result.plan.refused:
        lines.append(f"  no safe edit: {_here(refusal.finding)}: {refusal.finding.rule}: {refusal.reason}")
        if id(refusal.finding) in gone_anyway:
            lines.append(f"    gone with its cause: {refusal.finding.rule} at {_here(refusal.finding)} went with "
                         "the other edits (a symptom of what they fixed)")
    for problem in result.problems:
        lines.append(f"  not verified: {problem}")
    if result.after is not None:
        for outcome in result.targeted:
            how = f" (matched by {outcome.matched_by} at {_here(outcome.after, copy)})" if outcome.after else ""
            lines.append(f"  {outcome.status}: {outcome.finding.rule} at {_here(outcome.finding, copy)}{how}")
        for finding in result.new:
            lines.append(f"  new: {finding.severity.value} {finding.rule} at {_here(finding, copy)}: {finding.message}")
        if not result.new:
            lines.append("  no new findings")
    before, after = result.before_traffic, result.after_traffic
    lines.append("  collective bytes per device per step" + (" (before -> after):" if after is not None else ":"))
    roles = list(before.by_role) + [r for r in (after.by_role if after else {}) if r not in before.by_role]
    for role in roles:
        lines.append(f"    {role:<22}{_change(before.by_role.get(role, 0), after.by_role.get(role, 0) if after else None)}")
    lines.append(f"    {'total':<22}{_change(before.total, after.total if after else None)}")
    lines.append(f"    {'on the critical path':<22}{_change(before.critical, after.critical if after else None)}")
    lines.append(f"    {'prefetchable':<22}{_change(before.prefetchable, after.prefetchable if after else None)}")
    gathers = (after or before).overlappable
    if gathers:
        lines.append("  gathers that can overlap (operand derived from weights only, prefetchable):")
        for gather in gathers:
            of = f" of {', '.join(gather.parameters)}" if gather.parameters else ""
            lines.append(f"    {gather.module} {gather.instruction}: {gather.kind}{of}, "
                         f"{format_bytes(gather.bytes_per_step)}")
    elif after is not None:
        lines.append("  no gather can overlap: every gather waits on the step's compute")
    verdict = "verified: every targeted finding is gone and no new warning appeared" if result.ok else "not verified"
    if result.ok and result.went_with_cause:
        verdict = ("verified: every targeted finding is gone, those without a safe edit went with their cause, "
                   "and no new warning appeared")
    if not result.plan.applied and not result.plan.refused and not result.environment:
        verdict = "nothing to fix"
    lines.append(verdict)
    return plain_block("\n".join(lines)) + "\n"


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"
