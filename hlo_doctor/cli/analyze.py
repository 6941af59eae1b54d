"""``hlo-doctor analyze`` and ``hlo-doctor rules``: thin click commands over the library."""

from __future__ import annotations

import sys

import click

from hlo_doctor.cli.common import (
    analysis_options,
    effective_config,
    ids,
    input_errors_exit_2,
    load_rules,
    strict_plugins_option,
)
from hlo_doctor.cli.output import OutputOptions, analyze_or_exit, failures_as_json, write_report
from hlo_doctor.rules.docs import rule_markdown


@click.command("analyze")
@click.argument("dump", metavar="DUMP")
@analysis_options
@input_errors_exit_2
def analyze_command(dump, devices_per_host, hardware, select, ignore, config_file, verbose, jobs, strict_plugins,
                    **output):
    """Analyze an XLA dump folder (or one HLO file) and report sharding problems.

    Exits 0 when the analysis ran, whatever it found; 2 when the input cannot be
    used (or, with --strict-plugins, when a rule plugin could not be loaded;
    without it the plugin is skipped and listed in the report's errors). For a
    CI gate that fails on findings, use `hlo-doctor check`.

    \b
      hlo-doctor analyze ./dump
      hlo-doctor analyze ./dump --format json --select uneven-sharding-padding
      hlo-doctor analyze ./dump --hardware h100 --devices-per-host 8
      hlo-doctor analyze ./dump --format html -o report.html
    """
    out = OutputOptions.pop_from(output)
    registry = load_rules(strict_plugins)
    with failures_as_json(dump, out):
        config = effective_config(
            config_file, registry, select=ids(select), ignore=ids(ignore), devices_per_host=devices_per_host,
            hardware=hardware,
        )
        report = analyze_or_exit(dump, config, verbose, registry, jobs, out)
    write_report(report, out, config)


@click.command("rules")
@click.argument("rule_id", required=False, metavar="[ID]")
@strict_plugins_option
def rules_command(rule_id, strict_plugins):
    """List the rules (origin, severity, summary), or print the docs of one rule.

    The origin is `builtin` or the plugin distribution that registered the rule
    (`plugin NAME==VERSION`). Plugins that could not be loaded are reported on
    stderr; with --strict-plugins they make the command exit 2.
    """
    registry = load_rules(strict_plugins)
    for error in registry.errors:
        click.echo(f"warning: rule plugin {error.entry_point} ({error.origin}) not loaded: {error.message}", err=True)
    if rule_id is not None:
        spec = registry.get(rule_id)
        if spec is None:
            click.echo(f"error: unknown rule '{rule_id}' (known: {', '.join(registry.ids())})", err=True)
            sys.exit(2)
        click.echo(rule_markdown(spec.rule, spec.origin), nl=False)
        return
    rows = [(spec.id, spec.origin, spec.rule.severity.value, spec.rule.summary)
            for spec in (registry.rules[i] for i in registry.ids())]
    widths = [max((len(r[c]) for r in rows), default=0) for c in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=False)) + "  " + row[3])
