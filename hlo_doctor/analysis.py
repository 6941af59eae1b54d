"""The analysis entry point: :func:`analyze_dump` (dump folder -> :class:`Report`).

Loads the dump, discovers the rules, runs the selected ones over every
module with one shared :class:`~hlo_doctor.rules.RuleContext` per module,
and collects findings, skipped rules and errors. One module that fails to
parse or crashes an analysis is reported in ``errors``; the others go on.
"""

from __future__ import annotations

import fnmatch
import gc
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hlo_doctor._gc import paused_gc
from hlo_doctor.dump import Dump, DumpModule, load_dump
from hlo_doctor.dump.snapshot import DumpError
from hlo_doctor.errors import InputError, one_line
from hlo_doctor.findings import ModuleSummary, Report, ReportError, RuleInfo
from hlo_doctor.graph.source import is_library_file, split_module_path
from hlo_doctor.program.locate import SourceFinder, SourceSettings, finding_sources
from hlo_doctor.program.records import recorded_program
from hlo_doctor.rules import (
    AnalysisOptions,
    Finding,
    RuleContext,
    Skip,
    discover,
    module_workers,
    select_rules,
)
from hlo_doctor.rules._memory import memory_of
from hlo_doctor.rules.base import Rule
from hlo_doctor.rules.drawings import module_inventory, with_pictures
from hlo_doctor.rules.engine import BAD_INPUT, BAD_INPUT_ERRORS, bad_input_of, located
from hlo_doctor.rules.parallel import default_jobs, run_module_rules
from hlo_doctor.rules.registry import Registry
from hlo_doctor.semantics.hardware import HardwareProfile, load_profile

__all__ = ["ModuleSummary", "Report", "ReportError", "analyze_dump", "input_errors"]  # the records live in hlo_doctor.findings

Progress = Callable[[int, int, str], None]
PLUGIN_NOT_LOADED = "rule plugin not loaded"
BAD_INPUT_SKIP = "the module's HLO is malformed where this rule reads it (see its error)"


def _ignored_op(op_name: str | None, patterns: tuple[str, ...]) -> bool:
    if not op_name:
        return False
    names = dict.fromkeys((op_name, split_module_path(op_name)[1]))
    return any(fnmatch.fnmatchcase(name, p) for name in names for p in patterns)


def analyze_dump(path: str | os.PathLike[str] | Dump, **options: Any) -> Report:
    """Analyze the dump at ``path`` (or an already loaded :class:`Dump`) with the registered rules.

    Options: ``select``/``ignore`` choose rules by id; ``rule_options`` sets
    option fields per rule id; ``ignore_ops`` drops findings whose op_name
    matches one of these globs (torch_xla: with or without the runner's module path,
    ``model.layers.0.mlp/aten__mm`` or ``aten__mm``); ``hardware`` is a bundled profile name, a
    JSON file or a :class:`HardwareProfile`; ``devices_per_host``,
    ``verbose``, ``registry`` and ``progress`` as in :func:`_analyze`;
    ``jobs`` is how many processes may work at once: a dump of several modules
    has them analysed in up to ``jobs`` worker processes
    (:mod:`hlo_doctor.rules.module_workers`), and a dump of one big module
    shares its rules between two (:mod:`hlo_doctor.rules.parallel`); 1 keeps
    everything in this process. The default is the usable cores, at most 4.
    The report is the same whatever ``jobs`` is. ``sources``
    (:class:`~hlo_doctor.program.locate.SourceSettings`: path maps, ``--show-source-anywhere``,
    the programs this invocation ran) says how the program files the dump names are found and
    which folders the rules may read them from; the report lists each file and how it was found
    (``Report.sources``). ``drawings`` (default True) has the
    analysis make what the HTML report draws (each finding's pictures, each module's
    communication inventory) while the dump is loaded; False leaves them out, for a
    report that no HTML will be made of (about a tenth less work on a big module).
    Raises :class:`InputError` for an unusable dump, an unknown rule id or
    hardware, or bad rule options.

    The parsed IR of a big dump is millions of long-lived objects without
    reference cycles: the cyclic garbage collector, triggered by the
    analyses' many small allocations, would rescan all of them again and
    again, so it is paused for the run (and works as usual afterwards).
    """
    with paused_gc():
        return _analyze(path, **options)


def _analyze(
    path: str | os.PathLike[str] | Dump,
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    devices_per_host: int | None = None,
    hardware: str | HardwareProfile | None = None,
    rule_options: Mapping[str, Mapping[str, Any]] | None = None,
    verbose: bool = False,
    registry: Registry | None = None,
    progress: Progress | None = None,
    ignore_ops: Iterable[str] = (),
    jobs: int | None = None,
    drawings: bool = True,
    sources: SourceSettings | None = None,
) -> Report:
    """:func:`analyze_dump`'s work, with the garbage collector paused."""
    registry = registry or discover()
    try:
        chosen = select_rules(registry, select, ignore)
    except KeyError as error:
        known = ", ".join(registry.ids())
        raise InputError(f"unknown rule id '{error.args[0]}' (known: {known})") from None
    profile = load_profile(hardware) if isinstance(hardware, str) else hardware
    rules = []
    for rule_id in chosen:
        spec = registry.rules[rule_id]
        try:
            rules.append(spec.rule(**dict((rule_options or {}).get(rule_id, {}))))
        except TypeError as error:
            raise InputError(f"bad options for rule {rule_id}: {one_line(str(error))}") from None
    dump = path if isinstance(path, Dump) else load_dump(path)
    jobs = default_jobs() if jobs is None else jobs
    settings = sources or SourceSettings()
    options = AnalysisOptions(devices_per_host=devices_per_host, hardware=profile, verbose=verbose, sources=settings)
    # Every read of the program (the rules', in this process and in forked workers) goes through
    # this one finder, confined to the folders ``settings`` and the dump allow.
    finder = SourceFinder(settings, dump.path)

    findings: list[Finding] = []
    skipped: list[Skip] = []
    errors: list[ReportError] = [
        ReportError(e.entry_point, f"{PLUGIN_NOT_LOADED} ({e.origin}): {e.message}") for e in registry.errors
    ]
    # A dump loaded here is ours: each module's parsed snapshots are dropped once it is done,
    # so the memory a dump needs is that of its biggest module, not the sum.
    release = not isinstance(path, Dump)
    with finding_sources(finder):
        outcomes = _module_outcomes(dump, rules, options, jobs, release, progress, drawings)
    summaries: list[ModuleSummary] = []
    program = _program(dump)
    named = [program] if program else []
    for outcome in outcomes:
        named += outcome.program_files
        findings.extend(outcome.findings)
        skipped.extend(outcome.skipped)
        errors.extend(outcome.errors)
        summaries.append(outcome.summary)
    errors.extend(ReportError(e.path, e.message) for e in dump.load_errors)
    snapshots = [s for module in dump.modules for s in module.snapshots]
    if snapshots and not any(s.parsed_once for s in snapshots):
        failed = [s for s in snapshots if s.error is not None]
        if failed:
            # Nothing could be read at all: an input error, not an analysis.
            raise InputError(failed[0].error or f"{failed[0].path}: cannot be parsed")
    patterns = tuple(ignore_ops)
    if patterns:
        findings = [f for f in findings if not _ignored_op(f.op_name, patterns)]
    return Report(
        dump=str(dump.path),
        modules=tuple(summaries),
        findings=tuple(findings),
        errors=tuple(errors),
        skipped=tuple(skipped),
        rules=tuple(chosen),
        rule_info=tuple(RuleInfo(rule.id, rule.summary, rule.severity, type(rule).__doc__ or "") for rule in rules),
        hardware=profile.name if profile is not None else None,
        verbose=verbose,
        devices_per_host=devices_per_host,
        program=program,
        drawings=drawings,
        sources=tuple(finder.find(path) for path in dict.fromkeys(named)),
    )


@dataclass(frozen=True, slots=True)
class _ModuleOutcome:
    """What one module's analysis adds to the report, and what it learnt about the dump's files
    (so a worker process can hand it back)."""

    findings: list[Finding]
    skipped: list[Skip]
    errors: list[ReportError]
    summary: ModuleSummary
    parsed: tuple[bool, ...]  # per snapshot: parsed once
    failures: tuple[str | None, ...]  # per snapshot: its one-line parse error
    metadata_errors: tuple[DumpError, ...]
    program_files: tuple[str, ...] = ()  # the user's files the module names (frame tables, findings)


def _module_outcomes(
    dump: Dump, rules: list[Rule], options: AnalysisOptions, jobs: int, release: bool, progress: Progress | None,
    drawings: bool,
) -> list[_ModuleOutcome]:
    """Each module's outcome, in module order: in worker processes when there are several modules
    and jobs (see :mod:`hlo_doctor.rules.module_workers`), else here, one module after another."""
    modules = dump.modules
    total = len(modules)
    sizes = [sum(s.size or 0 for s in module.snapshots) for module in modules]
    if module_workers.worth_forking(sizes, jobs):
        done = 0

        def started(index: int) -> None:
            nonlocal done
            if progress is not None:
                progress(done, total, modules[index].key)
            done += 1

        outcomes = module_workers.map_modules(
            lambda i, share: _analyze_module(dump, modules[i], rules, options, max(share, 1),
                                             release=share > 0 or release, drawings=drawings),
            sizes, jobs,
            started=started,
        )
        for module, outcome in zip(modules, outcomes, strict=True):
            _adopt(module, outcome)
    else:
        outcomes = []
        for number, module in enumerate(modules):
            if progress is not None:
                progress(number, total, module.key)
            outcomes.append(_analyze_module(dump, module, rules, options, jobs, release=release, drawings=drawings))
    if progress is not None:
        progress(total, total, "")
    return outcomes


def _analyze_module(
    dump: Dump, module: DumpModule, rules: list[Rule], options: AnalysisOptions, jobs: int, *, release: bool,
    drawings: bool = True,
) -> _ModuleOutcome:
    ctx = RuleContext(dump, module, options)
    module_findings, module_skips = run_module_rules(ctx, rules, jobs=jobs)
    # Malformed input that stopped rules is the module's error, once (with its file:line:col).
    errors: list[ReportError] = [ReportError(_error_path(message, module), message, module.key)
                                 for message in bad_input_of(module_skips)]
    module_skips = [Skip(s.rule, s.module, BAD_INPUT_SKIP) if s.reason.startswith(BAD_INPUT) else s
                    for s in module_skips]
    # What the reports draw (the HTML pictures and inventory), made while the module is loaded:
    # a report renders from the Report alone and never reads the dump again.
    if drawings:
        module_findings = with_pictures(ctx, module_findings)
    try:
        collectives = _collective_summary(ctx)
    except BAD_INPUT_ERRORS as error:
        collectives = {}
        message = one_line(str(located(error, module)), 400)
        if message not in {e.message for e in errors}:
            errors.append(ReportError(_error_path(message, module), message, module.key))
    except Exception as error:  # noqa: BLE001 - the summary must not end the run
        collectives = {}
        errors.append(ReportError(str(dump.path), f"collective summary failed: {type(error).__name__}: "
                                                  f"{one_line(str(error), 200)}", module.key))
    inventory = None
    try:
        inventory = module_inventory(ctx) if drawings else None
    except Exception as error:  # noqa: BLE001 - the inventory must not end the run
        errors.append(ReportError(str(dump.path), f"communication inventory failed: {type(error).__name__}: "
                                                  f"{one_line(str(error), 200)}", module.key))
    program_files = _program_files(module, module_findings)
    memory = None
    try:
        memory = _memory_summary(ctx) if drawings else None
    except Exception as error:  # noqa: BLE001 - the memory picture must not end the run
        errors.append(ReportError(str(dump.path), f"memory summary failed: {type(error).__name__}: "
                                                  f"{one_line(str(error), 200)}", module.key))
    module_errors = module.errors
    errors.extend(ReportError(e.path, e.message, module.key) for e in module_errors)
    summary = ModuleSummary(
        id=module.id,
        name=module.name,
        key=module.key,
        partitioner=module.partitioner.value,
        num_partitions=module.num_partitions,
        snapshots=tuple(s.label for s in module.snapshots),
        errors=tuple(e.message for e in module_errors),
        collectives=collectives,
        framework=ctx.framework,
        inventory=inventory,
        memory=memory,
    )
    if release:
        ctx.__dict__.clear()  # the shared analyses, which hold cycles back to the context
        module.release()
        # The garbage collector is paused for the run: the few cycles the analyses left (a graph
        # and its module) go now, in a collection of only what was made since the last one.
        gc.collect(0)
    return _ModuleOutcome(
        module_findings, module_skips, errors, summary,
        tuple(s.parsed_once for s in module.snapshots), tuple(s.error for s in module.snapshots),
        module.errors_found, program_files,
    )


def _program_files(module: DumpModule, findings: list[Finding]) -> tuple[str, ...]:
    """The user's program files ``module`` names: its parsed snapshots' ``FileNames`` tables, and the
    files its findings point at (a dump whose ops carry only ``source_file`` metadata); library files
    left out. Read before the module is released, in the process that analysed it."""
    files: list[str] = []
    for snapshot in module.snapshots:
        parsed = snapshot.try_module() if snapshot.parsed else None
        tables = parsed.frame_tables if parsed is not None else None
        if tables is not None:
            files += tables.file_names.values()
    for finding in findings:
        if finding.source is not None:
            files.append(finding.source.file)
        if finding.suggestion is not None:
            files += [edit.file for edit in finding.suggestion.edits if edit.file]
    return tuple(f for f in dict.fromkeys(files) if f and not f.startswith("<") and not is_library_file(f))
# The HTML report's table of a module's memory lists this many of its largest items.
MEMORY_ITEMS = 12


def _memory_summary(ctx: RuleContext) -> dict[str, Any] | None:
    """The module's memory per device at its peak (``hlo-doctor memory``'s, held against the run's
    ``--hardware`` or the hardware the dump was compiled for), for the HTML report to draw."""
    memory = memory_of(ctx)
    return memory.document(items=MEMORY_ITEMS) if memory is not None else None


def input_errors(report: Report) -> list[ReportError]:
    """The report's errors about the dump itself (a file that could not be read or parsed, a
    malformed attribute, a file skipped because it leads out of the dump), not about rule plugins:
    what ``check`` fails on (exit 2), since those modules were not (fully) analyzed."""
    return [error for error in report.errors if not error.message.startswith(PLUGIN_NOT_LOADED)]


def _error_path(message: str, module: DumpModule) -> str:
    """The file an error message starts with (``path:line:col: ...``), else the module's first snapshot."""
    for snapshot in module.snapshots:
        if message.startswith(f"{snapshot.path}:"):
            return str(snapshot.path)
    return str(module.snapshots[0].path) if module.snapshots else module.key


def _adopt(module: DumpModule, outcome: _ModuleOutcome) -> None:
    """Record here what a worker process learnt about ``module``'s files."""
    for snapshot, parsed, failure in zip(module.snapshots, outcome.parsed, outcome.failures, strict=True):
        if parsed:
            snapshot.adopt_parsed()
        if failure is not None:
            snapshot.adopt_failure(failure)
    for error in outcome.metadata_errors:
        module.add_error(error)


def _program(dump: Dump) -> str | None:
    """The script the runner ran, from the dump's run record."""
    return recorded_program(dump.run_record)


def _collective_summary(ctx: RuleContext) -> dict[str, tuple[int, int]]:
    summary: dict[str, tuple[int, int]] = {}
    for op in ctx.collectives:
        times = ctx.executions.get(op.computation, 1)
        count, nbytes = summary.get(op.kind, (0, 0))
        summary[op.kind] = (count + times, nbytes + max(op.bytes_in_per_device, op.bytes_out_per_device) * times)
    return dict(sorted(summary.items()))
