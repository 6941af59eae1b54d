"""``hlo-doctor ls DUMP``: what a dump folder holds.

Lists each module (id, name, partitioner, partitions, mesh, device
assignment) and its snapshots (role, pass, size, instruction count), then
the files that failed to read or parse.

Exit status: 0 when at least one snapshot parses (failures are listed in the
output); 2 with one line on stderr when the input is unusable: a missing or
unreadable path, no HLO modules, or no snapshot that parses.
"""

from __future__ import annotations

import json
import sys

import click

from hlo_doctor.dump.folder import Dump, Snapshot, load_dump
from hlo_doctor.errors import InputError, one_line
from hlo_doctor.hlo.errors import ParseError


@click.command("ls")
@click.argument("dump", metavar="DUMP")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@click.option(
    "--parse/--no-parse",
    default=True,
    show_default=True,
    help="Parse every snapshot to count instructions and find bad files.",
)
def ls_command(dump: str, output_format: str, parse: bool) -> None:
    """List the modules and pass snapshots in DUMP (a dump folder or one HLO file)."""

    try:
        loaded = load_dump(dump)
        if parse:
            loaded.parse_all()
            if not any(s.parsed for m in loaded.modules for s in m.snapshots):
                first = loaded.errors[0]
                message = first.message if first.message.startswith(first.path) else f"{first.path}: {first.message}"
                more = len(loaded.errors) - 1
                raise InputError(message + (f" (and {more} more errors)" if more else ""))
        inventory = _inventory(loaded)
    except (InputError, ParseError) as error:
        click.echo(f"error: {one_line(str(error))}", err=True)
        sys.exit(2)

    if output_format == "json":
        click.echo(json.dumps(inventory, indent=2, sort_keys=False))
    else:
        _render_text(inventory)


def _inventory(loaded: object) -> dict[str, object]:
    assert isinstance(loaded, Dump)
    modules = []
    for module in loaded.modules:
        options = module.compile_options
        modules.append(
            {
                "id": module.id,
                "name": module.name,
                "key": module.key,
                "partitioner": module.partitioner.value,
                "num_partitions": module.num_partitions,
                "num_replicas": module.num_replicas,
                "device_assignment": list(module.device_assignment) if module.device_assignment else None,
                "meshes": [str(mesh) for mesh in module.meshes],
                "backend": module.backend,
                "process_count": options.process_count if options is not None else None,
                "shardy_dumps": [str(p) for p in module.shardy_dumps],
                "snapshots": [
                    {
                        "role": s.role.value,
                        "ordinal": s.ordinal,
                        "pipeline": s.pipeline,
                        "after_pass": s.after_pass,
                        "before_pass": s.before_pass,
                        "backend": s.backend,
                        "size": s.size,
                        "path": str(s.path),
                        "instructions": _count(s),
                        "error": s.error,
                    }
                    for s in module.snapshots
                ],
            }
        )
    return {
        "path": str(loaded.path),
        "modules": modules,
        "run_record": loaded.run_record,
        "errors": [{"path": e.path, "message": e.message} for e in loaded.errors],
    }


def _count(snapshot: object) -> int | None:
    assert isinstance(snapshot, Snapshot)
    if not snapshot.parsed:
        return None
    return sum(len(c.instructions) for c in snapshot.module().computations)


def _render_text(inventory: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    from hlo_doctor.report.safe import rich_text


    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    modules = inventory["modules"]
    assert isinstance(modules, list)
    console.print(f"{rich_text(inventory['path'])}: {len(modules)} module(s)")

    summary = Table(title="Modules", title_justify="left")
    for column in ("id", "name", "partitioner", "partitions", "replicas", "mesh", "device assignment", "snapshots"):
        summary.add_column(column)
    for module in modules:
        assignment = module["device_assignment"]
        summary.add_row(
            "" if module["id"] is None else str(module["id"]),
            rich_text(module["name"]),
            rich_text(module["partitioner"]),
            _text(module["num_partitions"]),
            _text(module["num_replicas"]),
            rich_text(" ".join(module["meshes"])),
            _short_list(assignment),
            str(len(module["snapshots"])),
        )
    console.print(summary)

    for module in modules:
        table = Table(title=f"{rich_text(module['key'])} snapshots", title_justify="left")
        for column in ("#", "role", "pipeline", "pass", "size", "instructions"):
            table.add_column(column, justify="right" if column in ("#", "size", "instructions") else "left")
        for snapshot in module["snapshots"]:
            if snapshot["after_pass"]:
                label = f"after {snapshot['after_pass']}"
                if snapshot["before_pass"]:
                    label += f" / before {snapshot['before_pass']}"
            elif snapshot["role"] == "after_optimizations" and snapshot["backend"]:
                label = f"{snapshot['backend']}_after_optimizations"
            else:
                label = snapshot["path"].rsplit("/", 1)[-1] if snapshot["role"] == "other" else snapshot["role"]
            table.add_row(
                _text(snapshot["ordinal"]),
                snapshot["role"],
                rich_text(snapshot["pipeline"] or ""),
                rich_text(label),
                _size(snapshot["size"]),
                "error" if snapshot["error"] else _text(snapshot["instructions"]),
            )
        console.print(table)

    errors = inventory["errors"]
    assert isinstance(errors, list)
    if errors:
        table = Table(title=f"Errors ({len(errors)})", title_justify="left")
        table.add_column("file")
        table.add_column("message")
        for error in errors:
            table.add_row(rich_text(error["path"]), rich_text(error["message"]))
        console.print(table)


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _short_list(values: object, limit: int = 16) -> str:
    if not isinstance(values, list):
        return ""
    text = ",".join(map(str, values[:limit]))
    return f"[{text}{',...' if len(values) > limit else ''}]"


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)
