"""The frozen IR that HLO text parses into.

Every node is a frozen, slotted dataclass. Positions are 1-based ``line:col``
into the text the module was parsed from, so findings and errors can point at
the exact spot in a dump file.

Attribute values the parser does not interpret are kept as raw text
(:attr:`Instruction.attributes`), so a new XLA attribute never breaks a parse.
The interpreted ones (sharding, metadata, replica groups, dimensions, channel
id, called computations) are exposed as typed properties, parsed on first use
and cached per distinct text.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from hlo_doctor.errors import ShardingError

# Bits per element of each XLA primitive type (xla_data.proto PrimitiveType).
ELEMENT_BITS: Mapping[str, int] = {
    "pred": 8,
    "s1": 1, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u1": 1, "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f4e2m1fn": 4, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8,
    "f8e4m3fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128,
    "token": 0, "opaque": 0, "tuple": 0,
}


class Position(NamedTuple):
    """A 1-based line and column in the parsed text (a tuple: one per instruction)."""

    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout ``{minor_to_major:tiles...}``; only minor_to_major is interpreted."""

    minor_to_major: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Shape:
    """An array, token or tuple shape.

    ``dims`` are the (upper-bound) sizes; ``dynamic`` marks ``<=N`` bounded and
    ``?`` unbounded dimensions. A tuple has ``element_type == "tuple"`` and its
    elements in ``tuple_shapes``.
    """

    element_type: str
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    tuple_shapes: tuple[Shape, ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.element_type == "tuple"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def num_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def byte_size(self) -> int:
        """Bytes of the whole value (tuples: the sum of their leaves)."""
        if self.is_tuple:
            return sum(s.byte_size for s in self.tuple_shapes)
        return (self.num_elements * ELEMENT_BITS.get(self.element_type, 0) + 7) // 8

    def leaves(self) -> Iterator[Shape]:
        """The array shapes of a tuple, depth first; an array yields itself."""
        if self.is_tuple:
            for element in self.tuple_shapes:
                yield from element.leaves()
        else:
            yield self

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        if self.element_type in ("token", "opaque"):
            return f"{self.element_type}[]"
        dims = ",".join(
            (f"<={d}" if dyn else str(d)) if d >= 0 else "?"
            for d, dyn in zip(self.dims, self.dynamic or (False,) * len(self.dims))
        )
        return f"{self.element_type}[{dims}]"


# --------------------------------------------------------------------------
# Shardings


class ShardingKind(str, Enum):
    REPLICATED = "replicated"
    MANUAL = "manual"
    UNKNOWN = "unknown"
    MAXIMAL = "maximal"
    TILED = "tiled"
    TUPLE = "tuple"
    UNREDUCED = "unreduced"  # ``{unreduced}``: every device holds a partial value


class SubgroupType(str, Enum):
    """Kinds of the trailing tile dims listed in ``last_tile_dims={...}``."""

    REPLICATED = "replicated"
    MANUAL = "manual"
    MAXIMAL = "maximal"
    UNREDUCED = "unreduced"


@dataclass(frozen=True, slots=True)
class IotaDevices:
    """``<=[reshape_dims]T(perm)``: iota(prod(reshape)) reshaped, transposed, flattened."""

    reshape_dims: tuple[int, ...]
    transpose_perm: tuple[int, ...] | None = None

    def device_ids(self) -> tuple[int, ...]:
        """The device ids in row-major order, exactly as XLA's IotaTileAssignment."""
        dims = self.reshape_dims
        perm = self.transpose_perm or tuple(range(len(dims)))
        count = math.prod(dims)
        strides = [1] * len(dims)
        for axis in range(len(dims) - 2, -1, -1):
            strides[axis] = strides[axis + 1] * dims[axis + 1]
        out_dims = [dims[p] for p in perm]
        out_strides = [strides[p] for p in perm]
        ids = [0]
        for size, stride in zip(out_dims, out_strides):
            ids = [base + i * stride for base in ids for i in range(size)]
        assert len(ids) == count
        return tuple(ids)

    def __str__(self) -> str:
        text = "<=[" + ",".join(map(str, self.reshape_dims)) + "]"
        if self.transpose_perm is not None:
            text += "T(" + ",".join(map(str, self.transpose_perm)) + ")"
        return text


@dataclass(frozen=True, slots=True)
class TileAssignment:
    """The tile grid shape and the device in each tile (explicit list or iota)."""

    dims: tuple[int, ...]
    explicit: tuple[int, ...] | None = None
    iota: IotaDevices | None = None

    def device_ids(self) -> tuple[int, ...]:
        """Device per tile, row-major over ``dims``."""
        if self.explicit is not None:
            return self.explicit
        if self.iota is not None:
            return self.iota.device_ids()
        return tuple(range(math.prod(self.dims)))

    @property
    def num_devices(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True, slots=True)
class MeshAxis:
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis ``'x'``, or its sub-axis ``'x':(pre_size)size``.

    A sub-axis is the slice of axis ``x`` (viewed as major-to-minor factors)
    that comes after ``pre_size`` and has ``size`` elements; ``size`` is None
    for the whole axis.
    """

    name: str
    pre_size: int = 1
    size: int | None = None

    @property
    def is_sub_axis(self) -> bool:
        return self.size is not None

    def __str__(self) -> str:
        if self.size is None:
            return f"'{self.name}'"
        return f"'{self.name}':({self.pre_size}){self.size}"


@dataclass(frozen=True, slots=True)
class NamedMesh:
    """The v3 ``{mesh['a'=2,'b'=4], [{'a'}, {}], replicated={'b'}}`` form.

    ``dim_axes``/``replicated_axes``/``unreduced_axes``/``manual_axes`` name
    the axes (a sub-axis appears under its axis's name); the ``*_refs``
    fields keep the exact references, sub-axes included. ``open_dims`` marks
    dimensions written with a trailing ``?``. The mesh's devices are
    ``device_ids`` (explicit), ``device_iota`` (``device_ids=([4,2]T(1,0))``)
    or, when both are None, iota over the axes. ``maximal_device`` is set for
    ``maximal_mesh[device_id=N]``. ``unreduced_reduction`` is the reduction
    written in ``unreduced=max{...}`` (newer XLA), else None.
    """

    axes: tuple[MeshAxis, ...]
    dim_axes: tuple[tuple[str, ...], ...]
    replicated_axes: tuple[str, ...] = ()
    unreduced_axes: tuple[str, ...] = ()
    device_ids: tuple[int, ...] | None = None
    manual_axes: tuple[str, ...] = ()
    dim_refs: tuple[tuple[AxisRef, ...], ...] = ()
    replicated_refs: tuple[AxisRef, ...] = ()
    unreduced_refs: tuple[AxisRef, ...] = ()
    manual_refs: tuple[AxisRef, ...] = ()
    open_dims: tuple[bool, ...] = ()
    device_iota: IotaDevices | None = None
    maximal_device: int | None = None
    unreduced_reduction: str | None = None

    @property
    def num_devices(self) -> int:
        if self.maximal_device is not None:
            return 1
        return math.prod(a.size for a in self.axes)

    def devices(self) -> tuple[int, ...]:
        """The mesh's device ids, row-major over the axes."""
        if self.maximal_device is not None:
            return (self.maximal_device,)
        if self.device_ids is not None:
            return self.device_ids
        if self.device_iota is not None:
            return self.device_iota.device_ids()
        return tuple(range(self.num_devices))


def split_mesh_axes(
    axes: tuple[MeshAxis, ...], refs: tuple[AxisRef, ...]
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Split mesh axes into the factors that ``refs`` need.

    Returns the factor sizes (row-major over the mesh: axes in order, each
    axis major to minor) and, per ref, the indices of the factors it covers.
    Raises ValueError for an unknown axis, a sub-axis that does not divide
    its axis, or refs that overlap.
    """
    index = {axis.name: i for i, axis in enumerate(axes)}
    bounds: list[set[int]] = [{1, axis.size} for axis in axes]
    spans: list[tuple[int, int, int]] = []
    for ref in refs:
        if ref.name not in index:
            raise ShardingError(f"unknown mesh axis '{ref.name}'")
        i = index[ref.name]
        full = axes[i].size
        if ref.size is None:
            lo, hi = 1, full
        else:
            lo, hi = ref.pre_size, ref.pre_size * ref.size
            if ref.pre_size < 1 or ref.size < 1 or full % hi or hi % lo:
                raise ShardingError(f"sub-axis {ref} does not divide axis '{ref.name}'={full}")
        bounds[i].update((lo, hi))
        spans.append((i, lo, hi))
    sizes: list[int] = []
    starts: list[dict[int, int]] = []  # per axis: lower bound -> factor index
    for i in range(len(axes)):
        cuts = sorted(bounds[i])
        for a, b in zip(cuts, cuts[1:]):
            if b % a:
                raise ShardingError(f"sub-axes of '{axes[i].name}' do not nest")
        starts.append({a: len(sizes) + k for k, a in enumerate(cuts[:-1])})
        sizes.extend(b // a for a, b in zip(cuts, cuts[1:]))
    covered: list[tuple[int, ...]] = []
    used: set[int] = set()
    for ref, (i, lo, hi) in zip(refs, spans):
        cuts = sorted(c for c in bounds[i] if lo <= c < hi)
        factors = tuple(starts[i][c] for c in cuts)
        if used.intersection(factors):
            raise ShardingError(f"mesh axis {ref} is used more than once")
        used.update(factors)
        covered.append(factors)
    return tuple(sizes), tuple(covered)


def transpose_devices(
    devices: tuple[int, ...], dims: tuple[int, ...], perm: tuple[int, ...]
) -> tuple[int, ...]:
    """``devices`` reshaped to ``dims``, transposed by ``perm``, flattened."""
    if perm == tuple(range(len(dims))):
        return devices
    order = IotaDevices(dims, perm).device_ids()
    return tuple(devices[i] for i in order)


@dataclass(frozen=True, slots=True)
class Sharding:
    """A parsed ``sharding={...}`` value. ``text`` is the source text."""

    kind: ShardingKind
    tile_assignment: TileAssignment | None = None
    last_tile_dim_replicate: bool = False
    last_tile_dims: tuple[SubgroupType, ...] = ()
    maximal_device: int | None = None
    tuple_elements: tuple[Sharding, ...] = ()
    shard_group: tuple[str, int] | None = None  # ("shard_as" | "shard_like", id)
    metadata: tuple[OpMetadata, ...] = ()
    named: NamedMesh | None = None
    text: str = field(default="", compare=False)

    @property
    def is_tuple(self) -> bool:
        return self.kind is ShardingKind.TUPLE

    @property
    def is_replicated(self) -> bool:
        if self.kind is ShardingKind.REPLICATED:
            return True
        if self.kind is ShardingKind.TILED and self.tile_assignment is not None:
            return self.tile_assignment.num_devices == 1 or all(
                d == 1 for d in self.data_tile_dims
            )
        return False

    @property
    def num_subgroup_dims(self) -> int:
        if self.last_tile_dim_replicate:
            return 1
        return len(self.last_tile_dims)

    @property
    def data_tile_dims(self) -> tuple[int, ...]:
        """Tiles per tensor dimension (the tile grid minus subgroup dims)."""
        if self.tile_assignment is None:
            return ()
        dims = self.tile_assignment.dims
        return dims[: len(dims) - self.num_subgroup_dims]

    def __str__(self) -> str:
        return self.text


# --------------------------------------------------------------------------
# Replica groups


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """``replica_groups=`` in any of its three spellings.

    * explicit: ``{{0,1},{2,3}}``
    * iota: ``[num_groups,group_size]<=[reshape]T(perm)``
    * mesh: ``mesh['a'=2,'b'=4] {'a'}`` (groups over the named axes)
    """

    explicit: tuple[tuple[int, ...], ...] | None = None
    iota_shape: tuple[int, int] | None = None
    iota: IotaDevices | None = None
    mesh_axes: tuple[MeshAxis, ...] = ()
    mesh_selected: tuple[str, ...] = ()
    text: str = field(default="", compare=False)
    mesh: NamedMesh | None = None  # the full mesh (device ids) of the mesh form
    mesh_refs: tuple[AxisRef, ...] = ()  # the exact selected axes, sub-axes included

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """Expand to explicit groups of logical ids (partition or replica ids)."""
        if self.explicit is not None:
            return self.explicit
        if self.iota_shape is not None and self.iota is not None:
            ids = self.iota.device_ids()
            count, size = self.iota_shape
            return tuple(tuple(ids[g * size : (g + 1) * size]) for g in range(count))
        if self.mesh is not None or self.mesh_axes:
            mesh = self.mesh or NamedMesh(self.mesh_axes, ())
            refs = self.mesh_refs or tuple(AxisRef(name) for name in self.mesh_selected)
            return _mesh_groups(mesh, refs)
        return ()


def _mesh_groups(mesh: NamedMesh, refs: tuple[AxisRef, ...]) -> tuple[tuple[int, ...], ...]:
    """XLA's MeshAxesReplicaGroupList: devices that differ only along ``refs``.

    The mesh's device array is split into the factors the refs need; the
    other factors stay in mesh order and the selected ones move to the end in
    the order written, so each run of ``group size`` devices is one group.
    """
    if mesh.maximal_device is not None:
        return ((mesh.maximal_device,),)
    sizes, covered = split_mesh_axes(mesh.axes, refs)
    chosen = [f for factors in covered for f in factors]
    other = [f for f in range(len(sizes)) if f not in chosen]
    ids = transpose_devices(mesh.devices(), sizes, tuple(other + chosen))
    group_size = math.prod(sizes[f] for f in chosen)
    return tuple(ids[g : g + group_size] for g in range(0, len(ids), group_size))


# --------------------------------------------------------------------------
# Metadata and source locations


@dataclass(frozen=True, slots=True)
class OpMetadata:
    """``metadata={op_type=... op_name=... source_file=... source_line=...}``."""

    op_type: str | None = None
    op_name: str | None = None
    source_file: str | None = None
    source_line: int | None = None
    source_end_line: int | None = None
    source_column: int | None = None
    stack_frame_id: int | None = None
    text: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class StackFrame:
    file: str
    function: str
    line: int
    column: int | None = None


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where an op came from in the user's program.

    ``frames`` is the whole chain, innermost first (as XLA's StackFrames table
    links child to parent). ``file``/``line``/``function`` are the innermost.
    """

    file: str
    line: int
    function: str | None = None
    column: int | None = None
    frames: tuple[StackFrame, ...] = ()


@dataclass(frozen=True, slots=True)
class StackFrameTables:
    """The ``FileNames``/``FunctionNames``/``FileLocations``/``StackFrames`` tables."""

    file_names: Mapping[int, str]
    function_names: Mapping[int, str]
    # id -> (file_name_id, function_name_id, line, column)
    file_locations: Mapping[int, tuple[int, int, int, int | None]]
    # id -> (file_location_id, parent_frame_id)
    stack_frames: Mapping[int, tuple[int, int]]

    def resolve(self, frame_id: int) -> tuple[StackFrame, ...]:
        """The frame chain from ``frame_id`` up to the root, innermost first."""
        chain: list[StackFrame] = []
        seen: set[int] = set()
        current = frame_id
        while current and current in self.stack_frames and current not in seen:
            seen.add(current)
            location_id, parent = self.stack_frames[current]
            location = self.file_locations.get(location_id)
            if location is not None:
                file_id, function_id, line, column = location
                chain.append(
                    StackFrame(
                        self.file_names.get(file_id, "?"),
                        self.function_names.get(function_id, "?"),
                        line,
                        column,
                    )
                )
            current = parent
        return tuple(chain)


# --------------------------------------------------------------------------
# Instructions, computations, modules


class ModuleText:
    """The text a module was parsed from, shared by all its instructions.

    Instructions keep only their character offset; line:col is computed on
    demand from a newline index built the first time one is asked for.
    """

    __slots__ = ("text", "path", "frame_tables", "_newlines")

    def __init__(self, text: str, path: str | None = None) -> None:
        self.text = text
        self.path = path
        self.frame_tables: StackFrameTables | None = None
        self._newlines: list[int] | None = None

    def position(self, offset: int) -> Position:
        if self._newlines is None:
            self._newlines = [m.start() for m in _NEWLINE.finditer(self.text)]
        line = bisect_right(self._newlines, offset - 1)
        line_start = self._newlines[line - 1] + 1 if line else 0
        return Position(line + 1, offset - line_start + 1)

    def line_text(self, line: int) -> str:
        """The text of 1-based ``line``, without its newline."""
        self.position(0)
        assert self._newlines is not None
        start = self._newlines[line - 2] + 1 if line > 1 else 0
        end = self._newlines[line - 1] if line - 1 < len(self._newlines) else len(self.text)
        return self.text[start:end]


_NEWLINE = re.compile("\n")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One HLO instruction.

    ``opcode`` is XLA's opcode string. Sugared async forms such as
    ``fusion-start`` are ``async-start``/``async-update``/``async-done``, as in
    XLA, with the printed spelling in ``printed_opcode``. ``attributes`` keeps
    every ``key=value`` as raw text in source order; the typed properties below
    interpret the ones that carry meaning for sharding analysis.
    """

    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    offset: int  # where the instruction starts in its module's text
    origin: ModuleText = field(compare=False, repr=False)
    is_root: bool = False
    # ", key=value, ..." exactly as written, split into pairs on first use
    # (or the pairs themselves); read it through ``attributes``.
    raw_attributes: str | tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    # Called computation names, or None to derive them from the attributes.
    called: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    printed_opcode: str | None = None
    literal: str | None = None  # the text inside parameter(...) / constant(...)

    @property
    def position(self) -> Position:
        """Line and column of the instruction in its module's text."""
        return self.origin.position(self.offset)

    @property
    def frame_tables(self) -> StackFrameTables | None:
        return self.origin.frame_tables

    @property
    def attributes(self) -> tuple[tuple[str, str], ...]:
        """Every ``key=value`` as raw text, in source order."""
        raw = self.raw_attributes
        if isinstance(raw, str):
            from hlo_doctor.hlo.parser import split_attributes

            raw = split_attributes(raw)
            object.__setattr__(self, "raw_attributes", raw)  # memoize
        return raw

    @property
    def called_computations(self) -> tuple[str, ...]:
        """Names of the computations this instruction calls, in attribute order."""
        if self.called is None:
            from hlo_doctor.hlo.parser import called_computation_names

            object.__setattr__(self, "called", called_computation_names(self.attributes))  # memoize
        return self.called  # type: ignore[return-value]

    def attribute(self, key: str) -> str | None:
        """The raw text of attribute ``key``, or None."""
        raw = self.raw_attributes
        if isinstance(raw, str) and key + "=" not in raw:
            return None
        for name, value in self.attributes:
            if name == key:
                return value
        return None

    @property
    def parameter_number(self) -> int | None:
        if self.opcode != "parameter" or self.literal is None:
            return None
        return int(self.literal)

    @property
    def sharding(self) -> Sharding | None:
        text = self.attribute("sharding")
        if text is None:
            return None
        from hlo_doctor.hlo.attributes import parse_sharding

        return parse_sharding(text)

    @property
    def metadata(self) -> OpMetadata | None:
        text = self.attribute("metadata")
        if text is None:
            return None
        from hlo_doctor.hlo.attributes import parse_metadata

        return parse_metadata(text)

    @property
    def replica_groups(self) -> ReplicaGroups | None:
        text = self.attribute("replica_groups")
        if text is None:
            return None
        from hlo_doctor.hlo.attributes import parse_replica_groups

        return parse_replica_groups(text)

    @property
    def source_pairs(self) -> tuple[tuple[int, int], ...] | None:
        text = self.attribute("source_target_pairs")
        if text is None:
            return None
        from hlo_doctor.hlo.attributes import parse_int_lists

        return tuple((a, b) for a, b in parse_int_lists(text))

    @property
    def dimensions(self) -> tuple[int, ...] | None:
        text = self.attribute("dimensions")
        if text is None:
            return None
        from hlo_doctor.hlo.attributes import parse_int_list

        return parse_int_list(text)

    @property
    def channel_id(self) -> int | None:
        text = self.attribute("channel_id")
        return int(text) if text is not None else None

    @property
    def backend_config(self) -> str | None:
        return self.attribute("backend_config")

    @property
    def source(self) -> SourceLocation | None:
        """Where the op came from: inline source_file/line or a stack frame chain."""
        metadata = self.metadata
        if metadata is None:
            return None
        if metadata.stack_frame_id and self.frame_tables is not None:
            frames = self.frame_tables.resolve(metadata.stack_frame_id)
            if frames:
                top = frames[0]
                return SourceLocation(top.file, top.line, top.function, top.column, frames)
        if metadata.source_file is not None and metadata.source_line is not None:
            frame = StackFrame(metadata.source_file, "", metadata.source_line, metadata.source_column)
            return SourceLocation(
                metadata.source_file, metadata.source_line, None, metadata.source_column, (frame,)
            )
        return None


@dataclass(frozen=True, slots=True)
class Computation:
    name: str
    instructions: tuple[Instruction, ...]
    position: Position
    is_entry: bool = False
    parameter_shapes: tuple[Shape, ...] = ()
    execution_thread: str | None = None
    by_name: Mapping[str, Instruction] = field(default_factory=dict, compare=False, repr=False)

    @property
    def root(self) -> Instruction | None:
        for instruction in self.instructions:
            if instruction.is_root:
                return instruction
        return self.instructions[-1] if self.instructions else None

    def parameters(self) -> list[Instruction]:
        """Parameters ordered by their parameter number."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number or 0)

    def get(self, name: str) -> Instruction | None:
        return self.by_name.get(name)

    def users(self) -> dict[str, list[Instruction]]:
        """Each value's users in this computation, in program order (made afresh on each call)."""
        users: dict[str, list[Instruction]] = {}
        for instruction in self.instructions:
            for operand in instruction.operands:
                users.setdefault(operand, []).append(instruction)
        return users


@dataclass(frozen=True, slots=True)
class HloModule:
    name: str
    computations: tuple[Computation, ...]
    entry_name: str | None
    attributes: tuple[tuple[str, str], ...] = ()
    frame_tables: StackFrameTables | None = field(default=None, compare=False, repr=False)
    path: str | None = None
    by_name: Mapping[str, Computation] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.by_name and self.computations:
            object.__setattr__(self, "by_name", {c.name: c for c in reversed(self.computations)})

    @property
    def entry(self) -> Computation | None:
        if self.entry_name is not None and self.entry_name in self.by_name:
            return self.by_name[self.entry_name]
        for computation in self.computations:
            if computation.is_entry:
                return computation
        return self.computations[-1] if self.computations else None

    def computation(self, name: str) -> Computation | None:
        return self.by_name.get(name)

    def attribute(self, key: str) -> str | None:
        for name, value in self.attributes:
            if name == key:
                return value
        return None

    def instructions(self) -> Iterator[tuple[Computation, Instruction]]:
        for computation in self.computations:
            for instruction in computation.instructions:
                yield computation, instruction
