"""``hlo-doctor collectives``: the communication inventory of each module of a dump."""

from __future__ import annotations

import json
from io import StringIO

import click

from hlo_doctor.cli.common import input_errors_exit_2
from hlo_doctor.dump import load_dump
from hlo_doctor.errors import InputError
from hlo_doctor.report.safe import rich_text
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.semantics.inventory import inventory_document, module_rows, totals_by_role
from hlo_doctor.units import format_bytes


@click.command("collectives")
@click.argument("dump", metavar="DUMP")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--devices-per-host", type=click.IntRange(min=1),
              help="Devices per host, to judge which collectives cross hosts.")
@click.option("--module", "module_name", default=None, help="Only this module.")
@input_errors_exit_2
def collectives_command(dump: str, output_format: str, devices_per_host: int | None, module_name: str | None) -> None:
    """What each module's step sends, and why: every collective with its role.

    Roles are decided from the dataflow (where the operand comes from), never
    from names: weight-gather, gradient-reduce, activation-reduce,
    activation-gather, reshard, expert-dispatch, pipeline-send, scalar-reduce,
    index-gather, other. Bytes are per device per execution; executions per
    step come from the loops' trip counts (blank when unknown).

    \b
      hlo-doctor collectives ./dump
      hlo-doctor collectives ./dump --devices-per-host 8 --format json
    """

    loaded = load_dump(dump)
    modules = [m for m in loaded.modules if module_name in (None, m.name, m.key)]
    if module_name is not None and not modules:
        raise InputError(f"no module {module_name!r} in {dump} (modules: {', '.join(m.name for m in loaded.modules)})")
    options = AnalysisOptions(devices_per_host=devices_per_host)
    inventories = []
    for dump_module in modules:
        ctx = RuleContext(loaded, dump_module, options)
        if ctx.per_device is None:
            continue

        def source_of(instruction, ctx=ctx):  # noqa: ANN001, ANN202
            found, _ = ctx.user_source(instruction)
            return f"{found.file}:{found.line}" if found is not None else None

        inventories.append((dump_module.name, module_rows(ctx.semantics, source_of)))
    if output_format == "json":
        click.echo(json.dumps(inventory_document(inventories), indent=2))
        return
    click.echo(render_inventory(inventories), nl=False)


def render_inventory(inventories) -> str:  # noqa: ANN001
    """The text form: per module, a table sorted by bytes per step, then totals by role."""
    from rich.console import Console
    from rich.table import Table


    buffer = StringIO()
    console = Console(file=buffer, width=160, color_system=None, highlight=False)
    for name, rows in inventories:
        table = Table(title=f"{rich_text(name)}: {len(rows)} collectives", title_justify="left")
        for column in ("instruction", "kind", "role", "phase", "axes", "group", "hosts", "bytes/device", "x/step",
                       "parameters", "reason"):
            table.add_column(column, overflow="fold", justify="right" if column in ("group", "bytes/device",
                                                                                   "x/step") else "left")
        for row in rows:
            table.add_row(
                rich_text(row.instruction), row.kind, row.role, row.phase,
                rich_text(",".join(row.axes)) if row.axes else ("-" if row.axes is not None else "?"),
                str(row.group_size),
                {True: "across", False: "inside", None: "?"}[row.crosses_hosts],
                format_bytes(row.bytes_per_device),
                "?" if row.executions is None else str(row.executions),
                rich_text(", ".join(row.parameters[:3]) + (" ..." if len(row.parameters) > 3 else "")),
                rich_text(row.reason),
            )
        console.print(table)
        totals = totals_by_role(rows)
        if totals:
            console.print("  by role: " + "; ".join(
                f"{role} {count}x {format_bytes(size)}" for role, (count, size) in totals.items()) + " per step")
        console.print()
    if not inventories:
        console.print("no module with a per-device (partitioned) snapshot")
    return buffer.getvalue()
