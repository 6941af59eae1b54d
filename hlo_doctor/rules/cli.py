"""``hlo-doctor analyze`` and ``hlo-doctor rules``: thin click commands over the library."""

from __future__ import annotations

import sys

import click

from hlo_doctor.cli_common import analysis_options, effective_config, emit, ids, input_errors_exit_2, run_analysis


@click.command("analyze")
@click.argument("dump", metavar="DUMP")
@analysis_options
@input_errors_exit_2
def analyze_command(dump, output_format, output, devices_per_host, hardware, select, ignore, config_file, verbose):
    """Analyze an XLA dump folder (or one HLO file) and report sharding problems.

    Exits 0 when the analysis ran, whatever it found; 2 when the input cannot be
    used. For a CI gate that fails on findings, use `hlo-doctor check`.

    \b
      hlo-doctor analyze ./dump
      hlo-doctor analyze ./dump --format json --select uneven-sharding-padding
      hlo-doctor analyze ./dump --hardware h100 --devices-per-host 8
    """
    from hlo_doctor.report import render

    config = effective_config(
        config_file, select=ids(select), ignore=ids(ignore), devices_per_host=devices_per_host, hardware=hardware
    )
    report = run_analysis(dump, config, verbose)
    emit(render(report, output_format, color=None if output is None else False), output)


@click.command("rules")
@click.argument("rule_id", required=False, metavar="[ID]")
def rules_command(rule_id):
    """List the rules (origin, severity, summary), or print the docs of one rule."""
    from hlo_doctor.rules import discover
    from hlo_doctor.rules.docs import rule_markdown

    registry = discover()
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
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
