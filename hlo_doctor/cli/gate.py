"""``hlo-doctor check``, ``hlo-doctor diff`` and ``hlo-doctor config``: the CI gate.

Exit codes follow ruff and mypy: 0 when nothing at or above ``--fail-on``
remains, 1 when something does, 2 on usage or input errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import click

from hlo_doctor.analysis import input_errors
from hlo_doctor.cli.common import (
    analysis_options,
    effective_config,
    emit,
    ids,
    input_errors_exit_2,
    load_rules,
)
from hlo_doctor.cli.memory import (
    MAX_MEMORY_DIFF_HELP,
    MAX_MEMORY_HELP,
    memory_limit_failures,
    module_peaks,
)
from hlo_doctor.cli.output import OutputOptions, analyze_or_exit, failures_as_json, write_report
from hlo_doctor.config import SEVERITIES
from hlo_doctor.findings import Severity
from hlo_doctor.gate.baseline import apply_baseline, read_baseline, write_baseline
from hlo_doctor.gate.diff import diff_dumps
from hlo_doctor.report.diff import (
    render_diff_json,
    render_diff_markdown,
    render_diff_text,
)
from hlo_doctor.report.safe import plain
from hlo_doctor.rules import discover
from hlo_doctor.units import format_bytes


@click.command("check")
@click.argument("dump", metavar="DUMP")
@analysis_options
@click.option("--fail-on", type=click.Choice(SEVERITIES), default=None,
              help="Fail (exit 1) on findings of this severity or worse.  [default: warning]")
@click.option("--baseline", "baseline_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Ignore the findings recorded in this baseline file.")
@click.option("--write-baseline", "write_baseline_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Record the current findings in this file (and exit 0).")
@click.option("--max-memory", "max_memory", metavar="LIMIT", help=MAX_MEMORY_HELP + ".")
@input_errors_exit_2
def check_command(dump, devices_per_host, hardware, select, ignore, config_file, verbose, jobs, strict_plugins,
                  fail_on, baseline_file, write_baseline_file, *, max_memory=None, **output):
    """Gate CI on a compiled graph: exit 1 when findings at or above --fail-on remain.

    \b
      hlo-doctor check ./dump                                 # fail on warnings and errors
      hlo-doctor check ./dump --write-baseline hlo-baseline.json
      hlo-doctor check ./dump --baseline hlo-baseline.json --format sarif -o hlo.sarif
      hlo-doctor check ./dump --max-memory target            # also fail when a step does not fit
    """

    out = OutputOptions.pop_from(output)
    registry = load_rules(strict_plugins)
    with failures_as_json(dump, out):
        config = effective_config(
            config_file, registry, select=ids(select), ignore=ids(ignore), devices_per_host=devices_per_host,
            hardware=hardware, fail_on=fail_on,
        )
        baseline = None
        if baseline_file is not None and write_baseline_file is None:
            baseline = read_baseline(baseline_file, dump)
        report = analyze_or_exit(dump, config, verbose, registry, jobs, out)
    if write_baseline_file is not None:
        count = write_baseline(report.findings, write_baseline_file)
        click.echo(f"wrote {count} finding{'s' if count != 1 else ''} to the baseline {write_baseline_file}", err=True)
        return
    fixed = ()
    if baseline is not None:
        result = apply_baseline(report.findings, baseline)
        report = dataclasses.replace(report, findings=result.new, baselined=result.baselined)
        fixed = result.fixed
    write_report(report, out, config)
    unread = input_errors(report)
    if unread:
        # A module that could not be read was not checked: the gate fails whatever the format
        # (the text report lists the errors itself; the others get them here, one line each).
        if out.output_format != "text" or out.output is not None:
            for error in unread:
                where = "" if error.message.startswith(f"{error.path}:") else f"{error.path}: "
                click.echo(f"error: {plain(where + error.message)}", err=True)
        count = len(unread)
        click.echo(f"error: {count} error{'s' if count != 1 else ''} in the dump: the modules involved were "
                   "not fully checked", err=True)
        raise SystemExit(2)
    threshold = Severity(config.fail_on.value).rank
    failing = [f for f in report.findings if f.severity.rank <= threshold]
    memory_failures = memory_limit_failures(max_memory, module_peaks(dump, config.hardware.value)) \
        if max_memory is not None else []
    for line in memory_failures:
        click.echo(plain(f"memory: {line}"), err=True)
    if baseline is not None and not out.quiet:
        baselined = len(report.baselined or ())
        click.echo(f"baseline {baseline_file}: {baselined} known finding{'s' if baselined != 1 else ''} ignored, "
                   f"{len(report.findings)} new, {len(fixed)} fixed", err=True)
        for entry in fixed:
            where = f" at {entry.source}" if entry.source else ""
            click.echo(plain(f"fixed: {entry.rule} in {entry.module}{where}: {entry.message}"), err=True)
    if failing and not out.exit_zero:
        if not out.quiet:
            click.echo(f"{len(failing)} finding{'s' if len(failing) != 1 else ''} at or above "
                       f"'{config.fail_on.value}'", err=True)
        raise SystemExit(1)
    if memory_failures and not out.exit_zero:
        raise SystemExit(1)


@click.command("config")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Configuration file (default: found from the current directory up).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@input_errors_exit_2
def config_command(config_file, output_format):
    """Print the effective configuration and where each value came from."""
    config = effective_config(config_file)
    rows = [
        ("select", list(config.select.value) or "all rules", config.select.origin),
        ("ignore", list(config.ignore.value), config.ignore.origin),
        ("devices-per-host", config.devices_per_host.value, config.devices_per_host.origin),
        ("hardware", config.hardware.value, config.hardware.origin),
        ("ignore-ops", list(config.ignore_ops.value), config.ignore_ops.origin),
        ("fail-on", config.fail_on.value, config.fail_on.origin),
        ("path-map", dict(config.path_map.value), config.path_map.origin),
    ]

    registry = discover()
    for rule_id in registry.ids():
        configured = config.rule_options.get(rule_id, {})
        for option in registry.rules[rule_id].rule.option_fields():
            setting = configured.get(option.name)
            value, origin = (setting.value, setting.origin) if setting else (option.default, "default")
            rows.append((f"rules.{rule_id}.{option.name.replace('_', '-')}", value, origin))
    if output_format == "json":
        document = {
            "file": str(config.path) if config.path else None,
            "settings": [{"key": key, "value": value, "origin": origin} for key, value, origin in rows],
        }
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(f"configuration file: {config.path or 'none found'}")
    width = max(len(key) for key, _, _ in rows)
    for key, value, origin in rows:
        click.echo(f"{key.ljust(width)}  {json.dumps(value)}  ({origin})")


@click.command("diff")
@click.argument("before", metavar="BEFORE")
@click.argument("after", metavar="AFTER")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "markdown"]), default="text",
              show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write to this file.")
@click.option("--max-comm-increase", type=click.FloatRange(min=0), metavar="PCT",
              help="Fail (exit 1) when collective bytes per device grow by more than PCT percent.")
@click.option("--critical-path", is_flag=True,
              help="--max-comm-increase limits the bytes on the critical path (collectives whose operand "
                   "derives from the step's data) instead of all bytes: prefetchable weight gathers may grow.")
@click.option("--max-memory", "max_memory", metavar="LIMIT", help=MAX_MEMORY_DIFF_HELP)
@click.option("--devices-per-host", type=click.IntRange(min=1), help="Devices per host (for cross-host bytes).")
@click.option("--select", multiple=True, metavar="ID", help="Run only these rules.")
@click.option("--ignore", multiple=True, metavar="ID", help="Do not run these rules.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Configuration file.")
@input_errors_exit_2
def diff_command(before, after, output_format, output, max_comm_increase, critical_path, max_memory, devices_per_host,
                 select, ignore, config_file):
    """Compare two dumps of the same program: collectives, bytes by role, findings, parameter shardings.

    Exits 1 when new findings appear or collective bytes grow by more than
    --max-comm-increase percent (with --critical-path: the bytes on the critical
    path, so a fix that trades activation gathers for prefetchable weight
    gathers passes); 0 otherwise; 2 on input errors.

    \b
      hlo-doctor diff main-dump pr-dump --max-comm-increase 10
      hlo-doctor diff main-dump pr-dump --max-comm-increase 10 --critical-path
      hlo-doctor diff main-dump pr-dump --max-memory 5%       # the peak per device may grow 5%
    """
    if critical_path and max_comm_increase is None:
        raise click.UsageError("--critical-path chooses the bytes --max-comm-increase limits: add --max-comm-increase")

    config = effective_config(config_file, select=ids(select), ignore=ids(ignore), devices_per_host=devices_per_host)
    before_dump, after_dump = before, after
    diff = diff_dumps(
        before,
        after,
        select=config.select.value,
        ignore=config.ignore.value,
        devices_per_host=config.devices_per_host.value,
        hardware=config.hardware.value,
        rule_options={rule_id: config.options_for(rule_id) for rule_id in config.rule_options},
        ignore_ops=config.ignore_ops.value,
    )
    renderers = {"json": render_diff_json, "markdown": render_diff_markdown, "text": render_diff_text}
    emit(renderers[output_format](diff), output)
    reasons = []
    if diff.added:
        reasons.append(f"{len(diff.added)} new finding{'s' if len(diff.added) != 1 else ''}")
    if max_comm_increase is not None:
        grew, what, before, after = (
            (diff.critical_increase_pct, "collective bytes on the critical path", diff.critical_before,
             diff.critical_after) if critical_path
            else (diff.comm_increase_pct, "collective bytes", diff.bytes_before, diff.bytes_after))
        if grew > max_comm_increase:
            by = f"{grew:.1f}%" if math.isfinite(grew) else f"from {format_bytes(before)} to {format_bytes(after)}"
            reasons.append(f"{what} grew {by} (limit {max_comm_increase:g}%)")
    if max_memory is not None:
        hardware = config.hardware.value
        reasons.extend(memory_limit_failures(max_memory, module_peaks(after_dump, hardware),
                                             module_peaks(before_dump, hardware)))
    if reasons:
        click.echo("; ".join(reasons), err=True)
        raise SystemExit(1)
