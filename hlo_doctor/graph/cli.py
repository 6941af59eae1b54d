"""``hlo-doctor show`` and ``hlo-doctor explain``.

``show DUMP [--module M] [--op NAME]``: a table per module of the ops after
propagation: shape, sharding before and after propagation, per-device shape
and the user's source line; with ``--op``, a picture of how that array's
dims split over the devices.

``explain DUMP OP [--module M] [--format text|json]``: the provenance of
OP's sharding, axis by axis, back to the user's annotations, and the
collectives the partitioner inserted for it. Bad input: one line on stderr,
exit 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import click

from hlo_doctor.errors import InputError, one_line

__all__ = ["ModuleContext", "explain_command", "load_context", "provenance_json", "show_command"]


@dataclass
class ModuleContext:
    """Everything explain/show need for one module."""

    module: object  # DumpModule
    graph: object  # DataflowGraph (after propagation)
    before: object | None  # DataflowGraph before propagation (GSPMD)
    before_link: object | None
    partition_link: object | None
    marks: dict
    mesh: object | None
    shardy: object | None


def load_context(dump_module, run_record) -> ModuleContext:
    from hlo_doctor.graph.dataflow import build_graph
    from hlo_doctor.graph.linking import link_modules
    from hlo_doctor.graph.provenance import MeshSpec, annotations, mesh_from_run_record
    from hlo_doctor.graph.shardy_origins import find_origins_file, read_origins

    after = dump_module.after_propagation()
    if after is None:
        raise InputError(f"module {dump_module.name} has no after-propagation snapshot")
    module = after.module()
    graph = build_graph(module)
    before = before_link = None
    if dump_module.before_propagation() is not None:
        before = build_graph(dump_module.before_propagation().module())
        before_link = link_modules(before.module, module)
    partition_link = None
    if dump_module.partitioned() is not None:
        partition_link = link_modules(module, dump_module.partitioned().module())
    mesh = mesh_from_run_record(run_record)
    if mesh is None:
        meshes = getattr(dump_module, "meshes", ()) or ()
        if len(meshes) == 1:
            sizes = meshes[0].shape
            count = 1
            for s in sizes:
                count *= s
            mesh = MeshSpec(meshes[0].axis_names, sizes, tuple(range(count)))
    shardy = None
    path = find_origins_file(getattr(dump_module, "shardy_dumps", ()))
    if path is not None:
        shardy = read_origins(path, module)
    return ModuleContext(
        dump_module, graph, before, before_link, partition_link,
        annotations(graph, before, before_link), mesh, shardy,
    )


def _load(dump: str, module_name: str | None):
    from hlo_doctor.dump import load_dump

    loaded = load_dump(dump)
    modules = list(loaded.modules)
    if module_name is not None:
        modules = [m for m in modules if module_name in (m.name, getattr(m, "key", None), str(getattr(m, "id", "")))]
        if not modules:
            raise InputError(f"no module {module_name!r} in {dump}")
    modules = [m for m in modules if m.after_propagation() is not None]
    if not modules:
        raise InputError(f"{dump}: no module with an after-propagation snapshot")
    return loaded, modules


def _frame_json(frame):
    if frame is None:
        return None
    return {"file": frame.file, "line": frame.line, "function": frame.function}


def provenance_json(result) -> dict:
    """The public JSON form of a :class:`~hlo_doctor.graph.provenance.Provenance`."""
    return {
        "module": result.module,
        "instruction": result.instruction,
        "sharding": result.sharding,
        "origins": {
            axis: {
                "kind": o.kind,
                "index": o.index,
                "instruction": o.instruction,
                "source": _frame_json(o.source),
            }
            for axis, o in result.origins.items()
        },
        "path": [
            {
                "axis": axis,
                "steps": [
                    {
                        "instruction": s.key[1],
                        "computation": s.key[0],
                        "opcode": s.opcode,
                        "sharding": s.sharding,
                        "via": s.via,
                        "source": _frame_json(s.source),
                    }
                    for s in steps
                ],
            }
            for axis, steps in result.paths.items()
        ],
        "collectives": result.collectives,
    }


def _fail(error: Exception) -> None:
    from hlo_doctor.report.safe import plain

    click.echo(f"error: {plain(one_line(str(error)))}", err=True)
    sys.exit(2)


@click.command("explain")
@click.argument("dump", metavar="DUMP")
@click.argument("op", metavar="OP")
@click.option("--module", "module_name", default=None, help="Module name (default: every module with OP).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def explain_command(dump: str, op: str, module_name: str | None, output_format: str) -> None:
    """Explain where OP's sharding came from, axis by axis."""
    from hlo_doctor.graph.provenance import explain
    from hlo_doctor.hlo.errors import ParseError

    results = []
    try:
        loaded, modules = _load(dump, module_name)
        for dump_module in modules:
            context = load_context(dump_module, loaded.run_record)
            if not context.graph.find(op):
                continue
            results.append(
                explain(
                    context.graph, op, marks=context.marks, mesh=context.mesh,
                    shardy=context.shardy, partition_link=context.partition_link,
                )
            )
        if not results:
            raise InputError(f"no instruction {op!r} after propagation in {dump}")
    except (InputError, ParseError, OSError) as error:
        _fail(error)
    if output_format == "json":
        payload = [provenance_json(r) for r in results]
        click.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
        return
    for result in results:
        click.echo(f"{result.module}: %{result.instruction}  sharding={result.sharding}")
        if result.user_given is not None:
            click.echo(f"  given by the user ({result.user_given.kind})")
        if not result.origins:
            click.echo("  no sharded axis")
        for axis, origin in result.origins.items():
            where = f" {origin.source.file}:{origin.source.line}" if origin.source else ""
            index = f" {origin.index}" if origin.index is not None else ""
            click.echo(f"  axis {axis}: {origin.kind}{index} at %{origin.instruction}{where}"
                       + ("  (Shardy)" if origin.from_shardy else ""))
            for step in result.paths.get(axis, []):
                src = f"  {step.source.file}:{step.source.line}" if step.source else ""
                click.echo(f"    <- %{step.key[1]} ({step.opcode}, {step.sharding}) via {step.via}{src}")
        if result.collectives:
            click.echo("  inserted by the partitioner: " + ", ".join(f"%{c}" for c in result.collectives))


@click.command("show")
@click.argument("dump", metavar="DUMP")
@click.option("--module", "module_name", default=None, help="Only this module.")
@click.option("--op", default=None, help="Draw how this op's array splits over the devices.")
def show_command(dump: str, module_name: str | None, op: str | None) -> None:
    """Show each op's shape, shardings, per-device shape and source line."""
    from rich.console import Console
    from rich.table import Table

    from hlo_doctor.graph.sharding import shard_shape
    from hlo_doctor.graph.source import user_frame_of
    from hlo_doctor.hlo.errors import ParseError

    console = Console()
    try:
        loaded, modules = _load(dump, module_name)
        for dump_module in modules:
            context = load_context(dump_module, loaded.run_record)
            graph = context.graph
            if op is not None:
                keys = graph.find(op)
                if not keys:
                    raise InputError(f"no instruction {op!r} in module {dump_module.name}")
                instruction = graph.instruction(keys[0])
                console.print(f"[bold]{dump_module.name}[/bold] %{instruction.name} {instruction.shape}")
                console.print(render_split(instruction))
                continue
            table = Table(title=dump_module.name)
            for column in ("op", "shape", "before", "after", "per device", "source"):
                table.add_column(column, overflow="fold")
            before_names = {}
            if context.before_link is not None:
                before_names = {v: k for k, v in context.before_link.forward.items()}
            for computation in graph.module.computations:
                for instruction in computation.instructions:
                    key = (computation.name, instruction.name)
                    before = ""
                    if key in before_names and context.before is not None:
                        s = context.before.instruction(before_names[key]).sharding
                        before = s.text if s else ""
                    sharding = instruction.sharding
                    per_device = ""
                    if sharding is not None and not instruction.shape.is_tuple and not sharding.is_tuple:
                        try:
                            per_device = str(list(shard_shape(sharding, instruction.shape.dims)))
                        except ValueError:
                            per_device = "?"
                    frame = user_frame_of(instruction)
                    table.add_row(
                        f"{computation.name}/{instruction.name}" if not computation.is_entry else instruction.name,
                        str(instruction.shape), before, sharding.text if sharding else "",
                        per_device, f"{frame.file.rsplit('/', 1)[-1]}:{frame.line}" if frame else "",
                    )
            console.print(table)
    except (InputError, ParseError, OSError) as error:
        _fail(error)


def render_split(instruction) -> str:
    """Text picture of which devices hold which slice of each dim, any rank."""
    from hlo_doctor.graph.sharding import device_tile_indices, tiles_per_dim

    sharding = instruction.sharding
    shape = instruction.shape
    if sharding is None or shape.is_tuple or sharding.is_tuple:
        return "(no array sharding)"
    dims = shape.dims
    tiles = tiles_per_dim(sharding, len(dims))
    num = sharding.tile_assignment.num_devices if sharding.tile_assignment else 1
    indices = device_tile_indices(sharding, num, len(dims))
    cells: dict[tuple[int, ...], list[int]] = {}
    for device, index in sorted(indices.items()):
        cells.setdefault(index, []).append(device)
    lines = [f"dims {list(dims)} split {list(tiles)} ways ({sharding.text})"]
    for index in sorted(cells):
        ranges = []
        for d, (size, t, i) in enumerate(zip(dims, tiles, index)):
            step = -(-size // t)
            ranges.append(f"{i * step}:{min(size, (i + 1) * step)}")
        devices = ",".join(map(str, cells[index]))
        lines.append(f"  [{', '.join(ranges)}]  -> devices {devices}")
    if len(lines) == 1:
        lines.append("  replicated on every device")
    return "\n".join(lines)
