"""``hlo-doctor show`` and ``hlo-doctor explain``.

``show DUMP [--module M] [--op NAME] [--format text|json]``: a table per
module of the ops after propagation: shape, sharding before and after
propagation, per-device shape and the user's source line; with ``--op``, a
picture of how that array's dims split over the devices.

OP may be a name after propagation or one of the after-partitioning names
findings print; both commands say which snapshot they looked in.

``explain DUMP OP [--module M] [--format text|json]``: the provenance of
OP's sharding, axis by axis, back to the user's annotations, and the
collectives the partitioner inserted for it. Bad input: one line on stderr,
exit 2.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

import click

from hlo_doctor.config import load_config
from hlo_doctor.dump import load_dump
from hlo_doctor.errors import InputError, one_line
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.linking import link_modules
from hlo_doctor.graph.provenance import MeshSpec, explain, find_annotations, mesh_from_run_record
from hlo_doctor.graph.sharding import device_tile_indices, shard_shape, tiles_per_dim
from hlo_doctor.graph.shardy_origins import find_origins_file, read_origins
from hlo_doctor.graph.source import user_frame_of
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.program.locate import SourceFinder, SourceSettings, parse_path_maps
from hlo_doctor.report.safe import plain, plain_block
from hlo_doctor.semantics.parameters import torch_parameter_names

__all__ = ["Lookup", "ModuleContext", "explain_command", "load_context", "lookup", "provenance_json", "show_command"]


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
    parameter_paths: dict = field(default_factory=dict)  # torch_xla: entry parameter name -> its module path


def load_context(dump_module, run_record) -> ModuleContext:

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
        find_annotations(graph, before, before_link), mesh, shardy, _parameter_paths(module, run_record),
    )


def _parameter_paths(module, run_record) -> dict:  # noqa: ANN001
    """torch_xla: each entry parameter's module path, where the runner recorded the model's parameters
    (every one is ``xla__device_data`` in the dump; see ``torch_parameter_names``)."""
    if not isinstance(run_record, dict) or not run_record.get("module_trees") or module.entry is None:
        return {}
    params = list(module.entry.parameters())
    labels = torch_parameter_names(params, run_record)
    return {p.name: labels[p.parameter_number] for p in params
            if p.parameter_number in labels and labels[p.parameter_number] != f"{p.name} {p.shape}"}


def _load(dump: str, module_name: str | None):
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


_PATH_MAP = click.option(
    "--path-map", "path_map", multiple=True, metavar="RECORDED=LOCAL",
    help="The program files the dump recorded below RECORDED are at LOCAL here (repeatable; with "
         "[tool.hlo-doctor] path-map): source lines are shown as the files found here.")


def _finder(dump: str, pairs: tuple[str, ...]) -> SourceFinder:
    """How the program files the dump names are found here (as ``analyze`` finds them)."""
    try:
        path_map = tuple(load_config().path_map.value) + parse_path_maps(pairs)
    except ValueError as error:
        raise InputError(str(error)) from None
    return SourceFinder(SourceSettings(path_map), dump)


def _where(finder: SourceFinder, file: str, line: int) -> str:
    """``file:line`` as found here (relative to the current directory when below it), else as recorded."""
    local = finder.local(file)
    if local is None:
        return f"{file}:{line}"
    relative = os.path.relpath(local)
    return f"{local if relative.startswith('..') else relative}:{line}"


def _fail(error: Exception) -> None:
    click.echo(f"error: {plain(one_line(str(error)))}", err=True)
    sys.exit(2)


@dataclass(frozen=True)
class Lookup:
    """Where an OP name given on the command line was found.

    ``key`` is the after-propagation instruction to explain or draw (None when
    the name has no counterpart there); ``partitioned`` the instruction of the
    after-partitioning snapshot when the name is one of its names (the names
    findings print); ``note`` says which snapshot was looked in.
    """

    name: str
    snapshot: str
    key: tuple[str, str] | None
    partitioned: tuple[str, str] | None
    note: str

    def to_json(self) -> dict:
        return {"name": self.name, "snapshot": self.snapshot, "note": self.note,
                "after_propagation": self.key[1] if self.key else None,
                "after_partitioning": self.partitioned[1] if self.partitioned else None}


def lookup(context: ModuleContext, op: str) -> Lookup | None:
    """Find ``op`` after propagation, else among the after-partitioning snapshot's names."""
    after = context.module.after_propagation().label
    keys = context.graph.find(op)
    if keys:
        return Lookup(op, after, keys[0], None, f"%{op}: looking in the after-propagation snapshot ({after})")
    parameter = next((name for name, path in context.parameter_paths.items() if path == op), None)
    keys = context.graph.find(parameter) if parameter is not None else []
    if keys:
        return Lookup(op, after, keys[0], None, f"{op} is the entry parameter %{parameter}: looking in the "
                                                f"after-propagation snapshot ({after})")
    partitioned = context.module.partitioned()
    if partitioned is None or context.partition_link is None:
        return None
    found = next(((c.name, i.name) for c, i in partitioned.module().instructions() if i.name == op), None)
    if found is None:
        return None
    label = partitioned.label
    origins = context.partition_link.origin_of(found)
    if found in context.partition_link.backward:
        note = (f"%{op} is a name of the after-partitioning snapshot ({label}); "
                f"after propagation ({after}) it is %{origins[0][1]}")
    elif origins:
        names = ", ".join(f"%{key[1]}" for key in origins)
        note = (f"%{op} was inserted by the partitioner ({label}) for {names}; "
                f"looking at %{origins[0][1]} after propagation ({after})")
    else:
        note = f"%{op} was inserted by the partitioner ({label}) and has no counterpart after propagation"
    return Lookup(op, label, origins[0] if origins else None, found, note)


def _explain_lookups(dump: str, op: str, module_name: str | None):
    loaded, modules = _load(dump, module_name)
    results = []
    for dump_module in modules:
        context = load_context(dump_module, loaded.run_record)
        found = lookup(context, op)
        if found is None:
            continue
        result = None
        if found.key is not None:
            result = explain(context.graph, found.key[1], computation=found.key[0], marks=context.marks,
                             mesh=context.mesh, shardy=context.shardy, partition_link=context.partition_link)
        results.append((found, result))
    if not results:
        raise InputError(f"no instruction {op!r} after propagation or after partitioning in {dump}")
    return results


@click.command("explain")
@click.argument("dump", metavar="DUMP")
@click.argument("op", metavar="OP")
@click.option("--module", "module_name", default=None, help="Module name (default: every module with OP).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_PATH_MAP
def explain_command(dump: str, op: str, module_name: str | None, output_format: str,
                    path_map: tuple[str, ...] = ()) -> None:
    """Explain where OP's sharding came from, axis by axis.

    OP is a name after propagation, or one of the after-partitioning names
    findings print (then the op it came from is explained).
    """

    try:
        finder = _finder(dump, path_map)
        results = _explain_lookups(dump, op, module_name)
    except (InputError, ParseError, OSError) as error:
        _fail(error)
    if output_format == "json":
        payload = [dict(provenance_json(r) if r is not None else {"module": None, "instruction": None},
                        lookup=found.to_json()) for found, r in results]
        click.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
        return
    for found, result in results:
        click.echo(plain(found.note))
        if result is None:
            continue
        click.echo(plain(f"{result.module}: %{result.instruction}  sharding={result.sharding}"))
        if result.user_given is not None:
            click.echo(f"  given by the user ({result.user_given.kind})")
        if not result.origins:
            click.echo("  no sharded axis")
        for axis, origin in result.origins.items():
            where = f" {_where(finder, origin.source.file, origin.source.line)}" if origin.source else ""
            index = f" {origin.index}" if origin.index is not None else ""
            click.echo(plain(f"  axis {axis}: {origin.kind}{index} at %{origin.instruction}{where}"
                             + ("  (Shardy)" if origin.from_shardy else "")))
            for step in result.paths.get(axis, []):
                src = f"  {_where(finder, step.source.file, step.source.line)}" if step.source else ""
                click.echo(plain(f"    <- %{step.key[1]} ({step.opcode}, {step.sharding}) via {step.via}{src}"))
        if result.collectives:
            click.echo(plain("  inserted by the partitioner: " + ", ".join(f"%{c}" for c in result.collectives)))


def _rows(context: ModuleContext) -> list[dict]:
    """show's table: every op after propagation with its shardings, per-device shape and source line."""
    graph = context.graph
    before_names = {v: k for k, v in context.before_link.forward.items()} if context.before_link is not None else {}
    rows = []
    for computation in graph.module.computations:
        for instruction in computation.instructions:
            key = (computation.name, instruction.name)
            before = ""
            if key in before_names and context.before is not None:
                s = context.before.instruction(before_names[key]).sharding
                before = s.text if s else ""
            frame = user_frame_of(instruction)
            rows.append({
                "op": instruction.name, "computation": computation.name, "entry": computation.is_entry,
                "parameter": context.parameter_paths.get(instruction.name) if computation.is_entry else None,
                "shape": str(instruction.shape), "before": before,
                "after": instruction.sharding.text if instruction.sharding else "",
                "per_device": _per_device(instruction),
                "source": f"{frame.file}:{frame.line}" if frame else None,
            })
    return rows


def _per_device(instruction) -> str:
    sharding = instruction.sharding
    if sharding is None or instruction.shape.is_tuple or sharding.is_tuple:
        return ""
    try:
        return str(list(shard_shape(sharding, instruction.shape.dims)))
    except ValueError:
        return "?"


@click.command("show")
@click.argument("dump", metavar="DUMP")
@click.option("--module", "module_name", default=None, help="Only this module.")
@click.option("--op", default=None,
              help="Draw how this op's array splits over the devices (a name after propagation, or an "
                   "after-partitioning name as findings print them).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_PATH_MAP
def show_command(dump: str, module_name: str | None, op: str | None, output_format: str,
                 path_map: tuple[str, ...] = ()) -> None:
    """Show each op's shape, shardings, per-device shape and source line."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text


    console = Console(highlight=False)
    documents = []
    try:
        finder = _finder(dump, path_map)
        loaded, modules = _load(dump, module_name)
        for dump_module in modules:
            context = load_context(dump_module, loaded.run_record)
            graph = context.graph
            if op is not None:
                found = lookup(context, op)
                if found is None:
                    if module_name is not None or len(modules) == 1:
                        raise InputError(f"no instruction {op!r} in module {dump_module.name} "
                                         "(after propagation or after partitioning)")
                    continue
                document = {"module": dump_module.name, "lookup": found.to_json()}
                if found.partitioned is not None:
                    twin = dump_module.partitioned().module().computation(found.partitioned[0]).get(found.partitioned[1])
                    document["after_partitioning"] = {"instruction": twin.name, "shape_per_device": str(twin.shape)}
                if found.key is not None:
                    instruction = graph.instruction(found.key)
                    document.update(instruction=instruction.name, shape=str(instruction.shape),
                                    sharding=instruction.sharding.text if instruction.sharding else None,
                                    per_device=_per_device(instruction), split=split_cells(instruction))
                documents.append(document)
                if output_format == "text":
                    console.print(Text(plain(found.note), style="dim"))
                    if "after_partitioning" in document:
                        part = document["after_partitioning"]
                        console.print(Text(plain(f"{dump_module.name} %{part['instruction']} "
                                                 f"{part['shape_per_device']} per device (after partitioning)")))
                    if found.key is not None:
                        console.print(Text.assemble((plain(dump_module.name), "bold"),
                                                    plain(f" %{document['instruction']} {document['shape']}")))
                        console.print(Text(plain_block(render_split(instruction))))
                continue
            rows = _rows(context)
            documents.append({"module": dump_module.name, "snapshot": dump_module.after_propagation().label,
                              "ops": rows})
            if output_format == "json":
                continue
            table = Table(title=Text(plain(f"{dump_module.name} ({dump_module.after_propagation().label})")))
            for column in ("op", "shape", "before", "after", "per device", "source"):
                table.add_column(column, overflow="fold")
            for row in rows:
                name = row["op"] if row["entry"] else f"{row['computation']}/{row['op']}"
                if row["parameter"]:
                    name += f" ({row['parameter']})"
                source = _shown_source(finder, row["source"])
                table.add_row(*(Text(plain(cell)) for cell in (name, row["shape"], row["before"], row["after"],
                                                              row["per_device"], source)))
            console.print(table)
        if op is not None and not documents:
            raise InputError(f"no instruction {op!r} in {dump} (after propagation or after partitioning)")
    except (InputError, ParseError, OSError) as error:
        _fail(error)
    if output_format == "json":
        click.echo(json.dumps(documents[0] if op is not None and len(documents) == 1 else documents, indent=2))


def _shown_source(finder: SourceFinder, source: str | None) -> str:
    """show's source column: the file's name and line, or where it was found here when a path map
    or the recorded path's tail found it (not at the recorded path)."""
    if not source:
        return ""
    file, _, line = source.rpartition(":")
    found = finder.find(file)
    if found.how in ("path-map", "suffix") and line.isdigit():
        return _where(finder, file, int(line))
    return source.rsplit("/", 1)[-1]


def split_cells(instruction) -> list[dict]:
    """Which devices hold which slice of each dim: ``[{"slice": ["0:40", "0:1280"], "devices": [0]}, ...]``."""
    sharding = instruction.sharding
    shape = instruction.shape
    if sharding is None or shape.is_tuple or sharding.is_tuple:
        return []
    dims = shape.dims
    tiles = tiles_per_dim(sharding, len(dims))
    num = sharding.tile_assignment.num_devices if sharding.tile_assignment else 1
    cells: dict[tuple[int, ...], list[int]] = {}
    for device, index in sorted(device_tile_indices(sharding, num, len(dims)).items()):
        cells.setdefault(index, []).append(device)
    out = []
    for index in sorted(cells):
        ranges = []
        for size, t, i in zip(dims, tiles, index, strict=False):
            step = -(-size // t)
            ranges.append(f"{i * step}:{min(size, (i + 1) * step)}")
        out.append({"slice": ranges, "devices": cells[index]})
    return out


def render_split(instruction) -> str:
    """Text picture of which devices hold which slice of each dim, any rank."""
    sharding = instruction.sharding
    shape = instruction.shape
    if sharding is None or shape.is_tuple or sharding.is_tuple:
        return "(no array sharding)"
    dims = shape.dims
    tiles = tiles_per_dim(sharding, len(dims))
    lines = [f"dims {list(dims)} split {list(tiles)} ways ({sharding.text})"]
    for cell in split_cells(instruction):
        lines.append(f"  [{', '.join(cell['slice'])}]  -> devices {','.join(map(str, cell['devices']))}")
    if len(lines) == 1:
        lines.append("  replicated on every device")
    return "\n".join(lines)
