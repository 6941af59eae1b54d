"""What the HTML report draws of a module, made by the analysis while the module is loaded.

* :func:`module_inventory`: the communication inventory (``hlo-doctor collectives``' rows);
* :func:`finding_pictures` (:func:`with_pictures` for a module's findings): a finding's
  dataflow neighbourhood and device mesh (:class:`~hlo_doctor.pictures.FindingPictures`).

:mod:`hlo_doctor.report.html` only renders these, so ``--format html`` reads the dump once.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hlo_doctor.dump.folder import Role
from hlo_doctor.errors import one_line
from hlo_doctor.findings import Finding
from hlo_doctor.graph.collectives import Collective
from hlo_doctor.graph.dataflow import DataflowGraph, build_graph
from hlo_doctor.graph.sharding import shard_shape
from hlo_doctor.pictures import (
    INVENTORY_KEYS,
    Dataflow,
    Edge,
    FindingPictures,
    MeshCell,
    MeshPicture,
    Node,
    grid_shape,
)
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics.inventory import module_rows

__all__ = ["INVENTORY_KEYS", "finding_pictures", "module_inventory", "with_pictures"]

COLLECTIVE_OPCODES = frozenset({"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                                "collective-broadcast", "ragged-all-to-all"})
_NEIGHBOURS = 12


def module_inventory(ctx: RuleContext | None) -> tuple[dict[str, Any], ...] | None:
    """The module's communication inventory (``hlo-doctor collectives``): one dict per collective.

    Keys :data:`INVENTORY_KEYS`, roles and phases from the analysis layer
    (:mod:`hlo_doctor.semantics`); ``source`` is the user's ``file:line`` as the dump
    recorded it (the report maps it to a local path). None when the module has no
    per-device snapshot.
    """
    if ctx is None or ctx.per_device is None:
        return None

    # The user's line depends on the op's source location alone, which the ops of a layer share.
    lines: dict[object, str | None] = {}

    def source_of(instruction):  # noqa: ANN001, ANN202
        location = instruction.source
        if location not in lines:
            frame, _ = ctx.user_source(instruction)
            lines[location] = f"{frame.file}:{frame.line}" if frame is not None else None
        return lines[location]

    return tuple(row.as_json() for row in module_rows(ctx.semantics, source_of))


def with_pictures(ctx: RuleContext, findings: Iterable[Finding]) -> list[Finding]:
    """The findings, each with its :func:`finding_pictures`."""
    collectives: dict[str, Collective] | None = None
    drawn = []
    for finding in findings:
        if collectives is None:
            collectives = {op.instruction: op for op in _collectives(ctx)}
        drawn.append(dataclasses.replace(finding, pictures=finding_pictures(ctx, finding, collectives)))
    return drawn


def finding_pictures(ctx: RuleContext, finding: Finding,
                     collectives: Mapping[str, Collective] | None = None) -> FindingPictures:
    """The dataflow around the finding's op and the mesh with its collective's groups (``collectives``:
    the module's by name, when the caller has them); a picture that cannot be made is left out with a
    note (a picture must never end the analysis)."""
    if collectives is None:
        collectives = {op.instruction: op for op in _collectives(ctx)}
    dataflow = mesh = None
    notes = []
    try:
        dataflow = _dataflow(finding, ctx)
    except Exception as error:  # noqa: BLE001
        notes.append(_left_out(error))
    try:
        mesh = _mesh(finding, ctx, collectives)
    except Exception as error:  # noqa: BLE001
        notes.append(_left_out(error))
    return FindingPictures(dataflow, mesh, tuple(notes))


def _left_out(error: Exception) -> str:
    return f"picture left out: {type(error).__name__}: {one_line(str(error), 200)}"


def _collectives(ctx: RuleContext) -> tuple[Collective, ...]:
    try:
        return ctx.collectives
    except Exception:  # noqa: BLE001 - the mesh picture then shows no groups; the analysis reports the failure
        return ()


# -- the dataflow neighbourhood ---------------------------------------------------


def _graphs_for(finding: Finding, ctx: RuleContext) -> Iterator[tuple[DataflowGraph, bool]]:
    """Dataflow graphs to look for the finding's op in, with whether their shapes are per device:
    the per-device one (whose names findings use, and which shows the collectives), then the
    snapshot the finding points at when this process has parsed it. A picture never parses a
    snapshot: with the rules split over two processes the other one may have parsed it, and
    the picture must be the same whatever ``jobs`` is for every op the per-device module has."""
    if ctx.graph is not None:
        yield ctx.graph, True
    for snapshot in ctx.module.snapshots:
        if finding.file is None or str(snapshot.path) != finding.file or not snapshot.parsed:
            continue
        module = snapshot.try_module()
        if module is None or module is ctx.per_device:
            continue
        graph = ctx.sharded_graph if module is ctx.sharded else build_graph(module)
        if graph is not None:
            yield graph, snapshot.role in (Role.AFTER_PARTITIONING, Role.AFTER_OPTIMIZATIONS)


def _is_collective(opcode: str) -> bool:
    return opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVE_OPCODES


def _device_shape(instruction, per_device: bool) -> str:  # noqa: ANN001
    shape = instruction.shape
    if shape.is_tuple:
        return f"tuple of {len(shape.tuple_shapes)}"
    dims = shape.dims
    sharding = instruction.sharding
    if not per_device and sharding is not None and not sharding.is_tuple:
        with contextlib.suppress(ValueError):
            dims = shard_shape(sharding, dims)
    return f"{shape.element_type}[{','.join(map(str, dims))}]"


def _neighbourhood(graph: DataflowGraph, focus: tuple[str, str]) -> Iterator[tuple[str, str]]:
    """Keys near ``focus``: itself, producers two steps up, consumers one step down (at most _NEIGHBOURS)."""
    seen = {focus}
    yield focus
    frontier = [focus]
    for _ in range(2):
        step = []
        for key in frontier:
            for producer, _kind in sorted(graph.producers(key)):
                if producer not in seen and len(seen) < _NEIGHBOURS:
                    seen.add(producer)
                    step.append(producer)
                    yield producer
        frontier = step
    for consumer, _kind in sorted(graph.consumers(focus)):
        if consumer not in seen and len(seen) < _NEIGHBOURS:
            seen.add(consumer)
            yield consumer


def _dataflow(finding: Finding, ctx: RuleContext) -> Dataflow | None:
    if not finding.instruction:
        return None
    for graph, per_device in _graphs_for(finding, ctx):  # noqa: B007 - the pair the loop breaks at is used below
        keys = graph.find(finding.instruction)
        if keys:
            break
    else:
        return None
    chosen = list(_neighbourhood(graph, keys[0]))
    members = set(chosen)
    nodes = []
    for key in chosen:
        instruction = graph.instruction(key)
        nodes.append(Node(f"{key[0]}/{key[1]}", instruction.name,
                          f"{instruction.opcode} {_device_shape(instruction, per_device)}",
                          collective=_is_collective(instruction.opcode), focus=key == keys[0]))
    edges = []
    for key in chosen:
        for producer, _kind in sorted(graph.producers(key)):
            if producer in members:
                source = graph.instruction(producer)
                sharding = source.sharding.text if source.sharding is not None else ""
                edges.append(Edge(f"{producer[0]}/{producer[1]}", f"{key[0]}/{key[1]}",
                                  _device_shape(source, per_device), sharding))
    title = f"dataflow around %{finding.instruction} (per-device shapes and shardings on the edges)"
    return Dataflow(tuple(nodes), tuple(edges), title)


# -- the device mesh --------------------------------------------------------------


def _collective_of(finding: Finding, collectives: Mapping[str, Collective]) -> Collective | None:
    names = [finding.instruction, *finding.related] if finding.instruction else list(finding.related)
    return next((collectives[name] for name in names if name in collectives), None)


def _mesh(finding: Finding, ctx: RuleContext, collectives: Mapping[str, Collective]) -> MeshPicture:
    mesh = ctx.mesh
    device_map = ctx.device_map
    if mesh is not None:
        logical_ids = list(mesh.device_ids)
        shape = grid_shape(mesh.axis_sizes)
        axes = " x ".join(f"{name}={size}" for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=False))
    else:
        logical_ids = list(range(ctx.num_partitions or 1))
        shape = (1, len(logical_ids))
        axes = f"{len(logical_ids)} partitions, no mesh known"
    by_slice = device_map.platform == "tpu" and device_map.slice_of is not None
    cells = []
    for logical in logical_ids:
        try:
            physical = device_map.physical_id(logical)
        except (IndexError, ValueError):
            physical = logical
        place = (device_map.slice_of or {}).get(physical) if by_slice else device_map.host(physical)
        cells.append(MeshCell(logical, f"d{physical}", place))
    op = _collective_of(finding, collectives)
    groups = tuple(tuple(group) for group in op.logical_groups) if op is not None else ()
    unit = "slices" if by_slice else "hosts"
    known = any(cell.host is not None for cell in cells)
    legend = f"colour: {unit}" + ("" if known else " unknown (pass --devices-per-host)")
    if op is not None:
        legend += f"; {len(groups)} replica group{'s' if len(groups) != 1 else ''} of %{op.instruction} " \
                  f"({op.kind}, {op.group_size} devices each)"
    else:
        legend += "; no collective in this finding"
    return MeshPicture(tuple(cells), shape, groups, f"mesh {axes}", legend)
