"""``hlo-doctor analyze`` and ``hlo-doctor rules``: thin click commands over the library."""

from __future__ import annotations

import sys

import click

from hlo_doctor.errors import InputError


def _ids(values: tuple[str, ...]) -> list[str]:
    """``--select a --select b,c`` -> [a, b, c]."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@click.command("analyze")
@click.argument("dump", metavar="DUMP")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Output format.")
@click.option("--devices-per-host", type=click.IntRange(min=1),
              help="Devices per host, to judge which collectives cross hosts.")
@click.option("--hardware", metavar="NAME",
              help="Hardware profile for cost estimates: h100, a100, tpu-v4, tpu-v5e, or a JSON file.")
@click.option("--select", multiple=True, metavar="ID", help="Run only these rules (repeat or comma-separate).")
@click.option("--ignore", multiple=True, metavar="ID", help="Do not run these rules.")
@click.option("-v", "--verbose", is_flag=True, help="Also say which rules could not judge a module, and why.")
def analyze_command(dump, output_format, devices_per_host, hardware, select, ignore, verbose):
    """Analyze an XLA dump folder (or one HLO file) and report sharding problems.

    Exits 0 when the analysis ran, whatever it found; 2 when the input cannot be used.

    \b
      hlo-doctor analyze ./dump
      hlo-doctor analyze ./dump --format json --select uneven-sharding-padding
      hlo-doctor analyze ./dump --hardware h100 --devices-per-host 8
    """
    from hlo_doctor.analysis import analyze_dump

    try:
        with _progress() as progress:
            report = analyze_dump(
                dump, select=_ids(select), ignore=_ids(ignore), devices_per_host=devices_per_host,
                hardware=hardware, verbose=verbose, progress=progress,
            )
    except InputError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    if output_format == "json":
        from hlo_doctor.report.json import render_json

        click.echo(render_json(report), nl=False)
    else:
        from rich.console import Console

        from hlo_doctor.report.text import print_text

        print_text(report, Console(highlight=False))


class _progress:
    """A rich progress bar on stderr when it is a terminal; otherwise nothing."""

    def __enter__(self):
        if not sys.stderr.isatty():
            self._bar = None
            return None
        from rich.console import Console
        from rich.progress import Progress

        self._bar = Progress(console=Console(stderr=True), transient=True)
        self._bar.start()
        self._task = self._bar.add_task("analyzing", total=None)

        def update(done: int, total: int, module: str) -> None:
            self._bar.update(self._task, completed=done, total=total, description=f"analyzing {module}")

        return update

    def __exit__(self, *exc_info):
        if self._bar is not None:
            self._bar.stop()
        return False


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
