"""``hlo-doctor fix --verify``: patch a copy of the script, recompile it, and diagnose it again.

The loop (:func:`verify_fix`):

1. run the script through the runner (:func:`hlo_doctor.runner.run_script`) into a dump;
2. diagnose it (:func:`hlo_doctor.analysis.analyze_dump`);
3. plan the edits (:func:`hlo_doctor.fix.plan_fixes`) and write the patched copy: to ``output``
   when given, else into a scratch folder that is removed afterwards. Files the plan patches
   besides the script (a sibling module that builds the mesh) are written into that scratch
   folder under their path relative to the script's folder, which goes first on the child's
   ``PYTHONPATH``; the original's folder comes next, so the copy imports what the original
   imports. The original files change only with ``write=True``, and then only when the
   verification passed;
4. recompile the copy through the runner with the same arguments;
5. diagnose it again and compare.

**Matching findings before and after** is :func:`hlo_doctor.gate.matching.match_findings`, with
each patched file's :class:`~hlo_doctor.gate.matching.LineMap` (its text before and after). An
``xla-flag`` fix whose flag is not in the program's source but in the ``XLA_FLAGS`` it was run
with is an environment change: the copy is recompiled without the flag (the report says the
change is the user's to make; ``--write`` cannot make it). The verification passes when every
finding that got an edit is gone, no new finding of severity warning or error appeared, and every
finding that got no safe edit is gone too: a symptom that went with its cause (the patch of
another finding removed it) counts as fixed, and the report says so.

Bytes are collective bytes per device per step, summed over the modules, by role and split
into the critical path and prefetchable (:mod:`hlo_doctor.semantics.critical_path`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hlo_doctor.fix as _fix
from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump
from hlo_doctor.files import write_atomically
from hlo_doctor.findings import Finding, Report, Severity
from hlo_doctor.fingerprint import module_family
from hlo_doctor.fix.flags import SET_OUTSIDE
from hlo_doctor.gate.matching import FindingOutcome, LineMap, match_findings
from hlo_doctor.program.locate import SourceSettings
from hlo_doctor.program.records import recorded_program
from hlo_doctor.rules._batch import parameter_name
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.runner.run import RunError, run_script

__all__ = [
    "EnvironmentChange",
    "FindingOutcome",
    "LineMap",
    "OverlappableGather",
    "Traffic",
    "Verification",
    "dump_traffic",
    "match_findings",
    "verify_fix",
]

_WARNING = Severity.WARNING.rank


@dataclass(frozen=True, slots=True)
class OverlappableGather:
    """A gather whose operand derives from no data input: the scheduler can prefetch it."""

    module: str
    instruction: str
    kind: str
    role: str
    bytes_per_step: int
    parameters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Traffic:
    """Collective bytes per device per step of one dump, summed over its modules."""

    total: int = 0
    critical: int = 0
    prefetchable: int = 0
    by_role: Mapping[str, int] = field(default_factory=dict)
    overlappable: tuple[OverlappableGather, ...] = ()


@dataclass(frozen=True, slots=True)
class EnvironmentChange:
    """A flag to take out of the ``XLA_FLAGS`` the program was run with (it is not in its source)."""

    finding: Finding
    flag: str


@dataclass
class Verification:
    """What :func:`verify_fix` found (see the module docstring)."""

    program: Path
    plan: Any  # hlo_doctor.fix.FixPlan
    before: Report
    before_traffic: Traffic
    after: Report | None = None
    after_traffic: Traffic | None = None
    targeted: tuple[FindingOutcome, ...] = ()
    new: tuple[Finding, ...] = ()
    patched_copy: Path | None = None
    """where the patched script was kept (``output``); None: a scratch copy, removed"""
    copy: Path | None = None
    """the patched copy that was compiled (``patched_copy``, or the scratch copy: gone by now)"""
    written: tuple[str, ...] = ()
    """original files patched in place (``write=True`` and the verification passed)"""
    problems: tuple[str, ...] = ()
    """why the loop could not be closed (nothing to patch, a file the copy cannot carry)"""
    environment: tuple[EnvironmentChange, ...] = ()
    """flags the fix takes out of ``XLA_FLAGS`` set outside the program: the copy recompiled
    without them (``--write`` cannot make that change: it is the user's)"""
    unedited: tuple[FindingOutcome, ...] = ()
    """the findings that got no safe edit, gone or still there after the others' edits (gone: a
    symptom that went with its cause)"""

    @property
    def went_with_cause(self) -> tuple[FindingOutcome, ...]:
        """The findings without a safe edit that the other edits removed."""
        return tuple(o for o in self.unedited if o.status == "gone")

    @property
    def new_warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.new if f.severity.rank <= _WARNING)

    @property
    def ok(self) -> bool:
        """The loop closed, every targeted finding gone, no new warning, and every finding
        without a safe edit gone with the others' edits.

        A program with no finding to fix (none found, or none selected) is ok: nothing to do.
        """
        if self.problems:
            return False
        if not self.plan.applied and not self.environment:
            return not self.plan.refused
        refused_gone = len(self.went_with_cause) == len(self.plan.refused) == len(self.unedited)
        return (self.after is not None and refused_gone and all(o.status == "gone" for o in self.targeted)
                and not self.new_warnings)


def verify_fix(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    work_dir: str | Path | None = None,
    output: str | Path | None = None,
    write: bool = False,
    select: Sequence[str] = (),
    python: str | None = None,
    devices: int | None = None,
    devices_per_host: int | None = None,
    target: Any = None,
    framework: str | None = None,
    echo_stderr: bool = False,
    analysis: Mapping[str, Any] | None = None,
    rounds: int = 3,
) -> Verification:
    """Run ``script``, plan its fixes, recompile the patched copy and diagnose both (module docstring).

    ``work_dir`` keeps the dumps (``before/``, ``after/``, ``after-2/``...); by default they go to a
    scratch folder that is removed. ``rounds``: how many times at most the copy is patched and
    recompiled: a fix can uncover the next problem (the batch, once split, shows an op the
    compiler gave its weight's sharding), and a new warning whose edit can be made is patched in
    the copy and the copy recompiled again (see :func:`_next_round`). ``analysis``: keyword arguments of :func:`analyze_dump` (rules,
    options, hardware); ``devices_per_host`` is passed to it too. Raises what the runner
    raises (:class:`~hlo_doctor.runner.run.RunError` when the original script fails); a patched copy
    that fails is a problem of the result (``problems``), not an exception.
    """
    script = Path(script)
    options = dict(analysis or {})
    if devices_per_host is not None:
        options.setdefault("devices_per_host", devices_per_host)
    scratch = Path(tempfile.mkdtemp(prefix="hlo-doctor-fix-"))
    try:
        dumps = Path(work_dir) if work_dir is not None else scratch
        run = {"python": python, "devices": devices, "devices_per_host": devices_per_host, "target": target,
               "framework": framework, "echo_stderr": echo_stderr}
        before_dump = run_script(script, args, dump_dir=dumps / "before", **run).dump_dir
        before_report, before_traffic = _diagnose(before_dump, options)
        program = before_report.program or str(script.resolve())
        plan = _fix.plan_fixes(before_report.findings, program=program, select=tuple(select))
        result = Verification(script, plan, before_report, before_traffic)
        result.environment = _environment_changes(plan, os.environ.get("XLA_FLAGS", ""))
        if not plan.applied and not result.environment:
            return result
        copy, problems = _write_copy(script, program, plan, scratch / "overlay", output)
        result.problems = problems
        result.patched_copy = Path(output) if output is not None else None
        result.copy = copy
        if problems:
            return result
        try:
            after_dump = run_script(copy, args, dump_dir=dumps / "after",
                                    env=_import_env(scratch / "overlay", script.resolve().parent,
                                                    without_flags=[c.flag for c in result.environment]),
                                    **run).dump_dir
        except RunError as error:
            tail = "; ".join(line for line in error.stderr_tail[-3:] if line.strip())
            result.problems = (f"the patched copy failed: exit code {error.returncode}: {tail}",)
            return result
        result.after, result.after_traffic = _diagnose(after_dump, options)
        maps = _line_maps(plan, program, copy)
        targets = _unique([*(e.finding for e in plan.applied), *(c.finding for c in result.environment)])
        outcomes, new = match_findings(before_report.findings, result.after.findings, maps)
        result.targeted = tuple(o for o in outcomes if any(o.finding is t for t in targets))
        result.new = new
        result.unedited = _unedited(result, maps)
        for round_number in range(2, rounds + 1):
            if not _next_round(result, script, program, copy, args, dumps / f"after-{round_number}", run,
                               options, scratch / "overlay", round_number):
                break
        if write and result.ok:
            changed = plan.changed
            for path in changed:
                write_atomically(Path(path), plan.patched[path])
            result.written = tuple(changed)
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _next_round(result: Verification, script: Path, program: str, copy: Path, args: Sequence[str], dump_dir: Path,
                run: Mapping[str, Any], options: Mapping[str, Any], overlay: Path, round_number: int) -> bool:
    """Patch the copy for the new warnings of the last recompile that have edits, recompile and
    diagnose again; False (and ``result`` unchanged) when there is nothing to do or it cannot be
    done. The plan becomes the original's text to the copy's latest, its edits those of every
    round; the new warnings patched become targeted findings of their own."""
    follow = [f for f in result.new if f.severity.rank <= _WARNING and f.suggestion is not None
              and f.suggestion.edits]
    if not follow or len(follow) != len(result.new_warnings):
        return False  # a new warning without an edit stays a failure, whatever else is patched
    copy_text = copy.read_text(encoding="utf-8")
    plan = _fix.plan_fixes(follow, program=str(copy))
    changed = plan.changed
    if plan.refused or not changed or any(not _same_file(Path(p).resolve(), copy.resolve()) for p in changed):
        return False
    patched_text = plan.patched[changed[0]]
    write_atomically(copy, patched_text)
    try:
        after_dump = run_script(copy, args, dump_dir=dump_dir, env=_import_env(
            overlay, script.resolve().parent, without_flags=[c.flag for c in result.environment]), **run).dump_dir
    except RunError as error:
        tail = "; ".join(line for line in error.stderr_tail[-3:] if line.strip())
        result.problems = (f"the copy patched again (round {round_number}) failed: exit code {error.returncode}: "
                           f"{tail}",)
        return True
    after, traffic = _diagnose(after_dump, options)
    original_key = next(p for p in result.plan.patched if _same_file(Path(p).resolve(), Path(program).resolve()))
    result.plan.patched[original_key] = patched_text
    result.plan.applied.extend(_fix.PlannedEdit(e.finding, e.edit, f"after recompiling (round {round_number}): "
                                                                    f"{e.description}") for e in plan.applied)
    targets = [o.finding for o in result.targeted]
    outcomes, unmatched = match_findings(targets, after.findings, _line_maps(result.plan, program, copy))
    copy_map = {copy.name: (copy.name, LineMap(copy_text, patched_text))}
    follow_outcomes, new = match_findings(follow, unmatched, copy_map)
    result.targeted = outcomes + follow_outcomes
    result.new = new
    result.after, result.after_traffic = after, traffic
    result.unedited = _unedited(result, _line_maps(result.plan, program, copy))
    return True


def _unedited(result: Verification, maps: Mapping[str, tuple[str, LineMap]]) -> tuple[FindingOutcome, ...]:
    """Each finding the plan refused (no safe edit), gone or still there in the last recompile,
    matched as the targeted ones are."""
    refused = _unique(r.finding for r in result.plan.refused)
    if result.after is None or not refused:
        return ()
    outcomes, _ = match_findings(refused, result.after.findings, maps)
    return tuple(outcomes)


def _environment_changes(plan: Any, xla_flags: str) -> tuple[EnvironmentChange, ...]:
    """The ``xla-flag`` edits refused because the flag is not in the program's source but in the
    ``XLA_FLAGS`` it runs with: taken out of the plan's refusals, to be verified by recompiling
    without the flag (the entry as written there, ``--name=value``)."""
    written = {entry.split("=", 1)[0]: entry for entry in xla_flags.split()}
    changes: list[EnvironmentChange] = []
    kept = []
    for refusal in plan.refused:
        suggestion = refusal.finding.suggestion
        names = [str(e.details.get("flag") or "").split("=", 1)[0]
                 for e in (suggestion.edits if suggestion else ()) if e.kind == "xla-flag"]
        if names and all(n in written for n in names) and SET_OUTSIDE in refusal.reason:
            changes.extend(EnvironmentChange(refusal.finding, written[n]) for n in names)
        else:
            kept.append(refusal)
    plan.refused[:] = kept
    return tuple(dict.fromkeys(changes))


def _import_env(*paths: Path, without_flags: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment with ``paths`` first on ``PYTHONPATH`` (the runner puts its own before
    them) and ``without_flags`` taken out of ``XLA_FLAGS``."""
    env = dict(os.environ)
    if without_flags and "XLA_FLAGS" in env:
        env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if f not in set(without_flags))
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in paths] + ([old] if old else []))
    return env


def _diagnose(dump_dir: Path, options: Mapping[str, Any]) -> tuple[Report, Traffic]:
    dump = load_dump(dump_dir)
    # The runner wrote this dump's record in this invocation: the program it ran may be read.
    ran = recorded_program(dump.run_record)
    report = analyze_dump(dump, **{"sources": SourceSettings(programs=(ran,) if ran else ()), **options})
    return report, dump_traffic(dump, devices_per_host=options.get("devices_per_host"))


def dump_traffic(dump: Any, *, devices_per_host: int | None = None) -> Traffic:
    """The collective bytes of a loaded dump (or its path) by role and on the critical path."""
    if not hasattr(dump, "modules"):
        dump = load_dump(dump)
    total = critical = prefetchable = 0
    by_role: dict[str, int] = {}
    overlappable: list[OverlappableGather] = []
    for module in dump.modules:
        ctx = RuleContext(dump, module, AnalysisOptions(devices_per_host=devices_per_host))
        account = ctx.semantics.bytes
        total += account.total
        critical += account.critical
        prefetchable += account.prefetchable
        for role, nbytes in account.by_role.items():
            by_role[role] = by_role.get(role, 0) + nbytes
        hlo = ctx.per_device
        params = {p.parameter_number: p for p in hlo.entry.parameters()} if hlo is not None and hlo.entry else {}
        for gather in account.overlappable_gathers:
            names = tuple(parameter_name(ctx, params[n]) for n in gather.parameters if n in params)
            overlappable.append(OverlappableGather(module_family(module.name), gather.instruction, gather.kind,
                                                   gather.role, gather.bytes_per_step, names))
    return Traffic(total, critical, prefetchable, by_role, tuple(overlappable))


def _write_copy(script: Path, program: str, plan: Any, overlay: Path,
                output: str | Path | None) -> tuple[Path, tuple[str, ...]]:
    """Write the patched script (to ``output`` or into ``overlay``) and the other patched files into ``overlay``."""
    home = script.resolve().parent
    overlay.mkdir(parents=True, exist_ok=True)
    copy = Path(output) if output is not None else overlay / script.name
    problems = []
    wrote_script = False
    for path, text in plan.patched.items():
        if text == plan.originals.get(path):
            continue  # read, left as it was
        resolved = Path(path).resolve()
        if _same_file(resolved, script.resolve()) or _same_file(resolved, Path(program).resolve()):
            copy.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(copy, text)
            wrote_script = True
            continue
        try:
            relative = resolved.relative_to(home)
        except ValueError:
            problems.append(f"{path}: the patch edits a file outside the script's folder {home}, which the "
                            "patched copy cannot carry; apply it with --write and run again")
            continue
        target = overlay / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, text)
    if not wrote_script:
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(script, copy)
    return copy, tuple(problems)


def _same_file(a: Path, b: Path) -> bool:
    return a == b or (a.exists() and b.exists() and a.samefile(b))


def _line_maps(plan: Any, program: str, copy: Path) -> dict[str, tuple[str, LineMap]]:
    """File name before -> (file name after, its line map), for every file the plan patched."""
    maps = {}
    for path, text in plan.patched.items():
        before = plan.originals.get(path)
        if before is None:
            continue
        name = Path(path).name
        after_name = copy.name if Path(path).resolve() == Path(program).resolve() else name
        maps[name] = (after_name, LineMap(before, text))
    return maps


def _unique(findings) -> list[Finding]:  # noqa: ANN001
    out: list[Finding] = []
    for finding in findings:
        if not any(finding is seen for seen in out):
            out.append(finding)
    return out
