"""``hlo-doctor fix``: the findings' suggestions as a patch of the user's program, optionally verified.

Exit codes: 0 when every finding got an edit (with ``--verify``: and every targeted finding is
gone after recompiling, with no new warning), 1 when a finding has no safe edit (listed with the
reason) or the verification failed, 2 on bad input (one line on stderr).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import hlo_doctor.fix as fixlib
from hlo_doctor.cli.common import (
    RULE_OPTIONS,
    effective_config,
    emit,
    fail,
    ids,
    input_errors_exit_2,
    load_rules,
    run_analysis,
    some_analysis_options,
    source_settings,
)
from hlo_doctor.cli.run import _split_command
from hlo_doctor.errors import InputError
from hlo_doctor.files import real_path, write_atomically
from hlo_doctor.fix.output import (
    dumps,
    plan_text,
    plan_to_dict,
    refusals_text,
    verification_text,
    verification_to_dict,
)
from hlo_doctor.fix.verify import verify_fix
from hlo_doctor.program.locate import SourceFinder, project_roots
from hlo_doctor.runner.detect import FrameworkError
from hlo_doctor.runner.extras import MissingExtra, extras_for, require_extras
from hlo_doctor.runner.run import RunError
from hlo_doctor.runner.targets import TargetError, parse_target


def _plan(findings, program, select, path_map=None, readable=None):  # noqa: ANN001, ANN202
    try:
        if path_map:
            return fixlib.plan_fixes(findings, program=program, select=select, path_map=path_map,
                                     readable=readable)
        return fixlib.plan_fixes(findings, program=program, select=select, readable=readable)
    except NotImplementedError:
        raise InputError("hlo-doctor fix: this build has no edit library (hlo_doctor.fix.plan_fixes)") from None


def _path_map(finder: SourceFinder, findings, program: str | None) -> dict[str, str]:  # noqa: ANN001
    """Each recorded file the findings name -> the file here the analysis read for it (found
    through ``--path-map``, the recorded path's tail, or the gallery; see
    :mod:`hlo_doctor.program.locate`), so the patch edits the lines the rules read."""
    mapping: dict[str, str] = {}
    recorded_files = {program} | {f.source.file for f in findings if f.source is not None} | {
        e.file for f in findings if f.suggestion is not None for e in f.suggestion.edits if e.file}
    for path in sorted(p for p in recorded_files if p):
        local = finder.local(path)
        if local is not None and str(local) != path:
            mapping[path] = str(local)
    return mapping


def _known_rules(select: list[str], registry) -> list[str]:  # noqa: ANN001
    unknown = [rule_id for rule_id in select if rule_id not in registry.ids()]
    if unknown:
        raise InputError(f"unknown rule id '{unknown[0]}' (known: {', '.join(sorted(registry.ids()))})")
    return select


@click.command("fix", context_settings={"ignore_unknown_options": True})
@click.option("--write", is_flag=True,
              help="Apply the patch to the files (with --verify: only when the verification passed).")
@click.option("--select", multiple=True, metavar="ID", help="Fix only the findings of these rules.")
@click.option("--path-map", multiple=True, metavar="RECORDED=LOCAL",
              help="Read (and --write) the file or folder the dump recorded as RECORDED at LOCAL instead "
                   "(a dump made on another machine or checkout).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
@click.option("--verify", is_flag=True,
              help="Run `-- python SCRIPT [ARGS]` through the runner, patch a copy, recompile it and "
                   "diagnose it again.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), metavar="PATCHED.py",
              help="--verify: keep the patched copy here (default: a scratch copy, removed afterwards; "
                   "it runs with the original's folder on PYTHONPATH).")
@click.option("--devices", type=click.IntRange(min=1), help="--verify: simulate this many CPU devices.")
@click.option("--target", "target", metavar="TARGET",
              help="--verify, JAX only: compile for a GPU cluster or TPU slice without the hardware "
                   "(as for `hlo-doctor run --target`).")
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path),
              help="--verify: keep the dumps before and after in DIR/before and DIR/after (DIR/after-2... for "
                   "later rounds).")
@click.option("--rounds", type=click.IntRange(min=1),
              help="--verify: patch and recompile at most this many times (default 3): a new warning the "
                   "recompiled copy shows, when its edit can be made, is patched in the copy and the copy "
                   "recompiled again.")
@some_analysis_options(*RULE_OPTIONS)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[DUMP | -- python SCRIPT [ARGS]...]")
@input_errors_exit_2
def fix_command(write, select, output_format, verify, command, **options):
    """Turn each finding's suggestion into an edit of the program, or verify it by recompiling.

    \b
      hlo-doctor fix ./dump                     # print the patch (a unified diff)
      hlo-doctor fix ./dump --write             # apply it
      hlo-doctor fix --verify --devices 4 -- python train.py --steps 1
      hlo-doctor fix --verify -o train_fixed.py --devices 4 -- python train.py

    The diff goes to stdout and the findings with no safe edit, with the reason, to stderr.
    --verify reports per targeted finding gone / still there, new findings, and the
    collective bytes per device per step by role, on the critical path and prefetchable,
    before -> after. Exits 0 when every finding got an edit (and, with --verify, every
    targeted finding is gone and no new warning appeared); 1 otherwise; 2 on bad input.
    """
    registry = load_rules(options["strict_plugins"])
    config = effective_config(options["config_file"], registry, ignore=ids(options["ignore"]),
                              devices_per_host=options["devices_per_host"], hardware=options["hardware"])
    chosen = tuple(_known_rules(ids(select), registry))
    analysis = {"config": config, "verbose": options["verbose"], "registry": registry, "jobs": options["jobs"]}
    if not verify:
        unknown = next((part for part in command if part.startswith("-")), None)
        if unknown is not None:
            raise InputError(f"no such option: {unknown}")
        if len(command) != 1:
            raise InputError("give one DUMP (or --verify -- python SCRIPT [ARGS])")
        for name, key in (("-o", "output"), ("--devices", "devices"), ("--target", "target"),
                          ("--dump-dir", "dump_dir"), ("--rounds", "rounds")):
            if options[key] is not None:
                raise InputError(f"{name} needs --verify")
        _fix_dump(command[0], analysis, chosen, write, output_format, options["path_map"])
        return
    if options["path_map"]:
        raise InputError("--path-map is for a DUMP made elsewhere; --verify runs the script here")
    if not command:
        raise InputError("--verify runs a script: hlo-doctor fix --verify [OPTIONS] -- python SCRIPT [ARGS]")
    if command[0].startswith("-"):
        raise InputError(f"no such option: {command[0]}")
    _fix_verify(command, analysis, chosen, write, output_format, options)


def _refuse_outside_project(changed: list[str]) -> None:
    """``--write`` edits only files below the project root (real paths): nothing is written otherwise."""
    roots = project_roots()
    outside = [path for path in changed if not any(real_path(path).is_relative_to(root) for root in roots)]
    if outside:
        raise InputError(f"{outside[0]}: outside the project root ({roots[-1]}); --write edits only the "
                         "project's files (nothing was written)")


def _fix_dump(dump, analysis, select, write, output_format, path_pairs) -> None:  # noqa: ANN001
    # ``fix`` reads what the reports may quote and the rules read: the project root, the dump's
    # folder, the targets of the user's path maps and this package's gallery programs (real paths).
    settings = source_settings(analysis["config"], path_pairs)
    report = run_analysis(dump, analysis["config"], analysis["verbose"], analysis["registry"], analysis["jobs"],
                          sources=settings)
    finder = SourceFinder(settings, dump)
    path_map = _path_map(finder, report.findings, report.program)
    plan = _plan(report.findings, report.program, select, path_map, finder.allows)
    changed = plan.changed  # it also holds files it read and left as they were
    written: tuple[str, ...] = ()
    if write:
        _refuse_outside_project(changed)
        for path in changed:
            write_atomically(Path(path), plan.patched[path])
        written = tuple(changed)
    if output_format == "json":
        emit(dumps(plan_to_dict(plan, dump=dump, written=written)), None)
    else:
        emit(plan_text(plan), None)
        click.echo(refusals_text(plan), err=True, nl=False)
        edits, files = len(plan.applied), len(changed)
        summary = (f"{edits} edit{'s' if edits != 1 else ''} in {files} file{'s' if files != 1 else ''}"
                   + (" (written)" if written else "" if not edits else " (not written: add --write)"))
        if plan.refused:
            summary += f"; {len(plan.refused)} finding{'s' if len(plan.refused) != 1 else ''} without a safe edit"
        if not edits and not plan.refused:
            summary = "nothing to fix"
        click.echo(summary, err=True)
    if plan.refused:
        sys.exit(1)


def _fix_verify(command, analysis, select, write, output_format, options) -> None:  # noqa: ANN001
    config = analysis["config"]
    output, devices, target = options["output"], options["devices"], options["target"]
    try:
        python, script, args = _split_command(command)
    except click.UsageError as error:
        raise InputError(error.message) from None
    compile_target = None  # a GPU Target or a TpuTarget
    if target is not None:
        if devices is not None:
            raise InputError("--target sets the device count itself; drop --devices")
        try:
            compile_target = parse_target(target)
        except TargetError as error:
            raise InputError(f"--target: {error}") from None
    if output is not None and Path(output).resolve() == Path(script).resolve():
        raise InputError("-o names the script itself: the original changes only with --write")
    analysis = {
        "select": config.select.value, "ignore": config.ignore.value, "hardware": config.hardware.value,
        "rule_options": {rule_id: config.options_for(rule_id) for rule_id in config.rule_options},
        "ignore_ops": config.ignore_ops.value, "verbose": analysis["verbose"], "registry": analysis["registry"],
        "jobs": analysis["jobs"],
    }
    try:
        if not Path(script).is_file():
            raise InputError(f"{script}: no such script")
        if compile_target is not None:
            require_extras(extras_for("jax", target_platform=compile_target.platform), python)
        result = verify_fix(
            script, args, work_dir=options["dump_dir"], output=output, write=write, select=select, python=python,
            devices=devices, devices_per_host=config.devices_per_host.value, target=compile_target,
            framework="jax" if compile_target is not None else None, analysis=analysis, rounds=options["rounds"] or 3,
        )
    except NotImplementedError:
        raise InputError("hlo-doctor fix: this build has no edit library (hlo_doctor.fix.plan_fixes)") from None
    except RunError as error:
        tail = error.format_tail().strip().splitlines()
        fail(InputError(f"{error}{': ' + tail[-1] if tail else ''}"))
    except (MissingExtra, FrameworkError, FileNotFoundError, ValueError) as error:
        fail(error)
    code = 0 if result.ok else 1
    if output_format == "json":
        emit(dumps(verification_to_dict(result, exit_code=code)), None)
    else:
        emit(verification_text(result), None)
    if code:
        sys.exit(code)
