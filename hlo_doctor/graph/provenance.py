"""Where an instruction's sharding came from: the user, or propagation.

:func:`find_annotations` finds what the user gave: entry parameter shardings
(``input``), a user-fixed entry result sharding (``output``), ``Sharding``
custom-calls (torch_xla ``mark_sharding``, JAX ``with_sharding_constraint``
under GSPMD; after propagation they are ``copy`` ops) and, in Shardy dumps,
the ``copy`` ops that shardy-xla makes of ``sdy.sharding_constraint`` /
``sdy.reshard`` (metadata op_name ``.../sharding_constraint``)
(``constraint``).

:func:`explain` answers per *axis* of the value's sharding (a mesh axis name
when the mesh is known, else ``dim<i>``; without a mesh, an axis is the way
the devices split along that dim, so dims of two values that split devices
the same way hold the same axis). Each axis gets its own origin, so one
value can take different axes from different annotations.

* When Shardy's ``sdy.sharding_origins`` were dumped and map to the value,
  they are the answer (:mod:`hlo_doctor.graph.shardy_origins`); the path is
  then searched towards that origin.
* Otherwise origins are inferred: a breadth-first search from the value
  through neighbours (operands and users, across computations) that hold the
  same axis, to the nearest annotation holding it. Into a ``dot`` the axis
  must map to the same output dim; operands that bring the axis to different
  output dims conflict and are not followed in the first search (Shardy
  leaves such conflicts to be settled from elsewhere, typically a
  constraint downstream). If that finds nothing, a second search follows
  them. At equal distance a constraint beats an output beats an input.

Limits: the inference is a heuristic; it does not replay GSPMD's or
Shardy's propagation order or priorities. A dim split over several mesh
axes is matched only as that whole combination when the mesh is unknown.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import permutations

from hlo_doctor.graph.dataflow import DataflowGraph, NodeKey
from hlo_doctor.graph.dots import dot_dims
from hlo_doctor.graph.sharding import device_tile_indices
from hlo_doctor.graph.source import user_frame_of
from hlo_doctor.hlo.ir import Instruction, Sharding, ShardingKind, StackFrame

__all__ = [
    "Annotation",
    "AxisOrigin",
    "MeshSpec",
    "Provenance",
    "Step",
    "find_annotations",
    "axes_of",
    "explain",
]

_KIND_RANK = {"self": 0, "constraint": 1, "output": 2, "input": 3}


@dataclass(frozen=True, slots=True)
class MeshSpec:
    """A logical mesh: axis names, sizes and the device at each mesh position."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Annotation:
    kind: str  # "input" | "output" | "constraint"
    index: int | None
    key: NodeKey


@dataclass(frozen=True, slots=True)
class AxisOrigin:
    axis: str
    kind: str  # "input" | "output" | "constraint" | "self"
    index: int | None
    instruction: str
    source: StackFrame | None
    from_shardy: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    key: NodeKey
    opcode: str
    sharding: str | None
    source: StackFrame | None
    via: str  # "start", or how it was reached from the step before: "operand" | "user"


@dataclass
class Provenance:
    module: str
    instruction: str
    sharding: str | None
    user_given: Annotation | None
    origins: dict[str, AxisOrigin] = field(default_factory=dict)
    paths: dict[str, list[Step]] = field(default_factory=dict)
    collectives: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------
# Axes of a sharding


def _signature(sharding: Sharding, rank: int, num_devices: int) -> dict[int, tuple[int, ...]]:
    if sharding.kind is not ShardingKind.TILED or sharding.tile_assignment is None:
        return {}
    try:
        tiles = device_tile_indices(sharding, num_devices, rank)
    except ValueError:
        return {}
    out = {}
    devices = sorted(tiles)
    for dim in range(rank):
        signature = tuple(tiles[d][dim] for d in devices)
        if any(signature):
            out[dim] = signature
    return out


def _mesh_axes_for(signature: tuple[int, ...], mesh: MeshSpec) -> tuple[str, ...] | None:
    position = {d: i for i, d in enumerate(mesh.devices)}
    devices = sorted(position)
    if len(devices) != len(signature):
        return None
    coords: list[tuple[int, ...]] = []
    for d in devices:
        p, c = position[d], []
        for size in reversed(mesh.shape):
            c.append(p % size)
            p //= size
        coords.append(tuple(reversed(c)))
    axes = [i for i, s in enumerate(mesh.shape) if s > 1]
    for count in range(1, min(3, len(axes)) + 1):
        for combo in permutations(axes, count):
            values = []
            for coord in coords:
                v = 0
                for a in combo:
                    v = v * mesh.shape[a] + coord[a]
                values.append(v)
            if tuple(values) == signature:
                return tuple(mesh.names[a] for a in combo)
    return None


def axes_of(
    sharding: Sharding | None, rank: int, num_devices: int, mesh: MeshSpec | None = None
) -> dict[str, int]:
    """Axis identity -> tensor dim. Identities are mesh axis names, else signatures."""
    if sharding is None or sharding.is_tuple:
        return {}
    out: dict = {}
    for dim, signature in _signature(sharding, rank, num_devices).items():
        names = _mesh_axes_for(signature, mesh) if mesh is not None else None
        if names:
            for name in names:
                out[name] = dim
        else:
            out[signature] = dim
    return out


# --------------------------------------------------------------------------
# Annotations


def _is_constraint(instruction: Instruction) -> bool:
    if instruction.opcode == "custom-call":
        target = (instruction.attribute("custom_call_target") or "").strip('"')
        return target in ("Sharding", "ShardingConstraint")
    if instruction.opcode == "copy":
        metadata = instruction.metadata
        op_name = metadata.op_name if metadata else None
        return op_name is not None and (
            op_name.endswith("sharding_constraint") or "xla__custom_sharding" in op_name
        )
    return False


def find_annotations(graph: DataflowGraph, before: DataflowGraph | None = None, link=None) -> dict[NodeKey, Annotation]:
    """The user's sharding annotations in ``graph`` (an after-propagation snapshot).

    ``before`` (the before-propagation graph, GSPMD) and ``link`` (a
    :class:`~hlo_doctor.graph.linking.SnapshotLink` before -> after) tell
    which ops were ``Sharding`` custom-calls before they became copies, and
    whether the entry result had a sharding before propagation.
    """
    module = graph.module
    entry = module.entry
    out: dict[NodeKey, Annotation] = {}
    if entry is None:
        return out
    for param in entry.parameters():
        if param.sharding is not None:
            key = (entry.name, param.name)
            out[key] = Annotation("input", param.parameter_number, key)
    for computation in module.computations:
        for instruction in computation.instructions:
            if _is_constraint(instruction):
                key = (computation.name, instruction.name)
                out[key] = Annotation("constraint", None, key)
    if before is not None and link is not None:
        for computation in before.module.computations:
            for instruction in computation.instructions:
                if _is_constraint(instruction):
                    after = link.matched((computation.name, instruction.name))
                    if after is not None:
                        out[after] = Annotation("constraint", None, after)
    root = entry.root
    output_fixed = "true" not in (module.attribute("allow_spmd_sharding_propagation_to_output") or "")
    if before is not None and before.module.entry is not None:
        before_root = before.module.entry.root
        output_fixed = before_root is not None and before_root.sharding is not None
    if root is not None and root.sharding is not None and output_fixed:
        roots = root.operands if root.opcode == "tuple" else (root.name,)
        for index, name in enumerate(roots):
            key = (entry.name, name)
            out.setdefault(key, Annotation("output", index, key))
    return out


# --------------------------------------------------------------------------
# Explain


def _num_devices(graph: DataflowGraph) -> int:
    text = graph.module.attribute("num_partitions")
    return int(text) if text and text.isdigit() else 1


class _Axes:
    def __init__(self, graph: DataflowGraph, mesh: MeshSpec | None) -> None:
        self.graph = graph
        self.mesh = mesh
        self.devices = _num_devices(graph)
        self.cache: dict[NodeKey, dict] = {}

    def __call__(self, key: NodeKey) -> dict:
        axes = self.cache.get(key)
        if axes is None:
            instruction = self.graph.instruction(key)
            shape = instruction.shape
            sharding = instruction.sharding
            if shape.is_tuple and len(shape.tuple_shapes) == 1 and sharding is not None and \
                    len(sharding.tuple_elements) == 1:
                # a one-element tuple (the export's result wrapper): its element's axes
                axes = axes_of(sharding.tuple_elements[0], shape.tuple_shapes[0].rank, self.devices, self.mesh)
            else:
                axes = {} if shape.is_tuple else axes_of(sharding, shape.rank, self.devices, self.mesh)
            self.cache[key] = axes
        return axes


def _dot_map(graph: DataflowGraph, key: NodeKey, operand_key: NodeKey, axis, axes: _Axes) -> tuple[bool, bool]:
    """(consistent, conflict) for moving ``axis`` from an operand into a dot."""
    dot = graph.instruction(key)
    computation = graph.module.computation(key[0])
    operands = [computation.get(o) for o in dot.operands[:2]] if computation else []
    shapes = [o.shape for o in operands if o is not None]
    if len(shapes) < 2 or any(s.is_tuple for s in shapes):
        return True, False
    roles = dot_dims(dot, shapes[0].rank, shapes[1].rank)
    here = axes(key).get(axis)
    targets = set()
    consistent = False
    for side, name in enumerate(dot.operands[:2]):
        dim = axes((key[0], name)).get(axis)
        if dim is None:
            continue
        out = roles.output_dim(side, dim)
        targets.add(out)
        if (key[0], name) == operand_key and out == here:
            consistent = True
    return consistent, len(targets) > 1


def _search(graph, start, axis, axes, marks, strict: bool):
    pred, succ = graph.pred, graph.succ
    parent: dict[NodeKey, tuple[NodeKey | None, str]] = {start: (None, "start")}
    queue = deque([start])
    found: list[tuple[int, int, NodeKey]] = []
    depth = {start: 0}
    best_depth = None
    while queue:
        node = queue.popleft()
        if best_depth is not None and depth[node] > best_depth:
            break
        if node != start and node in marks:
            found.append((_KIND_RANK[marks[node].kind], depth[node], node))
            best_depth = depth[node]
            continue
        opcode = graph.instruction(node).opcode
        for source in pred[node]:
            if source in parent or axis not in axes(source):
                continue
            if opcode in ("dot", "convolution") and opcode == "dot":
                consistent, conflict = _dot_map(graph, node, source, axis, axes)
                if not consistent or (strict and conflict):
                    continue
            parent[source] = (node, "operand")
            depth[source] = depth[node] + 1
            queue.append(source)
        for target in succ[node]:
            if target in parent or axis not in axes(target):
                continue
            parent[target] = (node, "user")
            depth[target] = depth[node] + 1
            queue.append(target)
    if not found:
        return None, parent
    return min(found)[2], parent


def _path(graph, parent, end, user_given_start) -> list[Step]:
    """Steps from the value (first) to its origin (last); ``via`` says how each was reached."""
    chain = []
    node = end
    while node is not None and node not in chain:  # a parent cycle must not hang
        chain.append(node)
        node = parent[node][0]
    chain.reverse()
    steps = []
    for key in chain:
        instruction = graph.instruction(key)
        sharding = instruction.sharding
        steps.append(
            Step(key, instruction.opcode, sharding.text if sharding else None,
                 user_frame_of(instruction), parent[key][1])
        )
    return steps


def _axis_name(axis, dim: int) -> str:
    return axis if isinstance(axis, str) else f"dim{dim}"


def _shardy_names_other_origin(shardy_value, label: str, mark: Annotation) -> bool:
    if shardy_value is None or label not in shardy_value.origins:
        return False
    origin = shardy_value.origins[label]
    if origin.kind == "constraint":
        return True
    if origin.kind == "self":
        return False
    return (origin.kind, origin.index) != (mark.kind, mark.index)


def explain(
    graph: DataflowGraph,
    name: str,
    *,
    marks: dict[NodeKey, Annotation] | None = None,
    mesh: MeshSpec | None = None,
    shardy=None,
    partition_link=None,
    computation: str | None = None,
) -> Provenance:
    """The provenance of instruction ``name`` (see the module docstring).

    ``shardy`` is a :class:`~hlo_doctor.graph.shardy_origins.ShardyOrigins`
    for the same snapshot; ``partition_link`` a
    :class:`~hlo_doctor.graph.linking.SnapshotLink` from this snapshot to the
    partitioned one (for the collectives inserted for the op).
    """
    keys = graph.find(name, computation)
    if not keys:
        raise KeyError(name)
    key = keys[0]
    if marks is None:
        marks = find_annotations(graph)
    axes = _Axes(graph, mesh)
    instruction = graph.instruction(key)
    sharding = instruction.sharding
    result = Provenance(
        graph.module.name, instruction.name, sharding.text if sharding else None, marks.get(key)
    )
    shardy_value = shardy.by_key().get(key) if shardy is not None else None
    by_index = {(a.kind, a.index): a.key for a in marks.values() if a.kind != "constraint"}
    for axis, dim in sorted(axes(key).items(), key=lambda item: (item[1], str(item[0]))):
        label = _axis_name(axis, dim)
        # Shardy's own record wins where it names another origin: even an
        # argument's sharding may come from a constraint (jax.jit lets
        # propagation reach parameters).
        if key in marks and not _shardy_names_other_origin(shardy_value, label, marks[key]):
            mark = marks[key]
            result.origins[label] = AxisOrigin(
                label, "output" if mark.kind == "output" else "self", mark.index, instruction.name, user_frame_of(instruction)
            )
            result.paths[label] = _path(graph, {key: (None, "start")}, key, True)
            continue
        target: NodeKey | None = None
        kind: str | None = None
        index: int | None = None
        from_shardy = False
        if shardy_value is not None and label in shardy_value.origins:
            origin = shardy_value.origins[label]
            from_shardy = True
            if origin.kind == "constraint":
                target = shardy.constraint_keys.get(origin.constraint or "")
                kind = "constraint"
            elif origin.kind in ("input", "output"):
                target = by_index.get((origin.kind, origin.index))
                kind, index = origin.kind, origin.index
            else:
                target, kind = key, "self"
        parent: dict[NodeKey, tuple[NodeKey | None, str]]
        if target == key:
            # The value is its own origin (the constraint op itself, say).
            end, parent = key, {key: (None, "start")}
        elif target is not None:
            mark = marks.get(target) or Annotation(kind or "self", index, target)
            end, parent = _search(graph, key, axis, axes, {target: mark}, False)
            if end is None:
                parent = {key: (None, "start"), target: (key, "user")}
                end = target
        else:
            end, parent = _search(graph, key, axis, axes, marks, True)
            if end is None:
                end, parent = _search(graph, key, axis, axes, marks, False)
            if end is not None:
                kind, index = marks[end].kind, marks[end].index
        if end is None:
            continue
        origin_instruction = graph.instruction(end)
        result.origins[label] = AxisOrigin(
            label, kind or "constraint", index, origin_instruction.name,
            user_frame_of(origin_instruction), from_shardy,
        )
        result.paths[label] = _path(graph, parent, end, False)
    if partition_link is not None:
        result.collectives = [
            b[1]
            for b in partition_link.realized_by(key)
            if partition_link.is_inserted(b)
            and partition_link.b.computation(b[0]).get(b[1]).opcode
            in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                "all-gather-start", "all-reduce-start", "collective-permute-start", "async-start")
        ]
    return result


def mesh_from_run_record(record: dict | None) -> MeshSpec | None:
    """The (single) mesh the runner recorded, if there is exactly one."""
    meshes = (record or {}).get("meshes") or []
    if len(meshes) != 1:
        return None
    mesh = meshes[0]
    try:
        shape = tuple(mesh["shape"])
        # HLO tile assignments hold logical ids: JAX compiles with the mesh's
        # devices in order, so logical id i is the mesh's i-th position.
        return MeshSpec(tuple(mesh["axis_names"]), shape, tuple(range(_prod(shape))))
    except (KeyError, TypeError):
        return None


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
