"""The device mesh a program was partitioned over, and which mesh axes each sharding and group uses.

**Id space.** A :class:`Mesh` lists its devices in *logical* ids: the ids
HLO tile assignments and replica groups use (partition ids for the one-replica
programs JAX and torch_xla emit). They are not device ids. JAX compiles with
the device assignment set to the mesh's devices, flattened, so a JAX mesh is
always ``0..n-1`` in logical ids whatever its physical order: the mesh
``np.array(jax.devices()).reshape(2, 4).T`` is logical ``[[0,1],[2,3],...]``
and runs on physical ``[0,4,1,5,2,6,3,7]``.
:mod:`hlo_doctor.graph.devices` maps logical ids to devices and hosts.

:func:`recover_mesh` takes the mesh, in order, from:

1. ``module.mlir``'s ``sdy.mesh`` (Shardy; its ``device_ids``, when written,
   are the ids Shardy puts in tile assignments: logical). A dump without
   module.mlir but with ``xla.sdy.meshes`` in the HLO header gives source
   ``"hlo_header"``;
2. the runner's sidecar (``hlo_doctor_run.json`` ``meshes``, in *physical*
   ids for JAX, mapped back through the device assignment; torch_xla's mesh
   ids go into its shardings unchanged, so they are taken as logical);
3. a ``replica_groups=mesh[...]`` collective (its axis names are whatever
   the partitioner wrote, often ``axis_0``...);
4. otherwise it is inferred from the tile assignments and replica groups:
   the finest factorization of the devices that every one of them respects,
   with axes named ``axis_0``, ``axis_1``... (major first) and source
   ``"inferred"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

from hlo_doctor.errors import ShardingError
from hlo_doctor.hlo.ir import Sharding, ShardingKind, transpose_devices

if TYPE_CHECKING:
    from hlo_doctor.dump import DumpModule
    from hlo_doctor.hlo.ir import HloModule

__all__ = ["Mesh", "dim_axes", "infer_mesh", "recover_mesh"]

SOURCES = ("module.mlir", "hlo_header", "sidecar", "replica_groups", "inferred")


@dataclass(frozen=True)
class Mesh:
    """Named axes (major to minor) over logical ids.

    ``device_ids`` is the mesh's device array flattened row-major, in logical
    ids (see the module docstring). ``source`` says where it came from:
    ``"module.mlir"``, ``"hlo_header"``, ``"sidecar"``, ``"replica_groups"``
    or ``"inferred"`` (axis names made up, sizes deduced). ``name`` is the
    Shardy mesh name when there is one.
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    device_ids: tuple[int, ...]
    source: str
    name: str | None = None
    _coords: dict[int, tuple[int, ...]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.axis_names) != len(self.axis_sizes):
            raise ShardingError("one size per axis name")
        if math.prod(self.axis_sizes) != len(self.device_ids):
            raise ShardingError(
                f"mesh {dict(zip(self.axis_names, self.axis_sizes, strict=False))} needs "
                f"{math.prod(self.axis_sizes)} devices, got {len(self.device_ids)}"
            )
        strides = _strides(self.axis_sizes)
        coords = {
            device: tuple(i // s % n for s, n in zip(strides, self.axis_sizes, strict=False))
            for i, device in enumerate(self.device_ids)
        }
        if len(coords) != len(self.device_ids):
            raise ShardingError(f"mesh device ids repeat: {self.device_ids}")
        object.__setattr__(self, "_coords", coords)

    @property
    def is_inferred(self) -> bool:
        """True when the axes were deduced from tile assignments, not read."""
        return self.source == "inferred"

    @property
    def num_devices(self) -> int:
        return len(self.device_ids)

    @property
    def shape(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.axis_sizes, strict=False))

    def axis_size(self, axis: str) -> int:
        """The size of an axis, or of a sub-axis written ``name:(pre)size``."""
        name, _, size = _split_sub_axis(axis)
        if name not in self.axis_names:
            raise KeyError(f"no mesh axis {name!r} in {self}")
        return size if size is not None else self.axis_sizes[self.axis_names.index(name)]

    def coords(self, device: int) -> tuple[int, ...] | None:
        """The coordinate of a logical id along each axis, or None if not in the mesh."""
        return self._coords.get(device)

    def axes_for(self, shards: int) -> tuple[str, ...] | None:
        """Mesh axes whose sizes multiply to ``shards``: one axis if possible, else a run of adjacent axes."""
        for name, size in zip(self.axis_names, self.axis_sizes, strict=False):
            if size == shards:
                return (name,)
        for start in range(len(self.axis_sizes)):
            for stop in range(start + 2, len(self.axis_sizes) + 1):
                if math.prod(self.axis_sizes[start:stop]) == shards:
                    return self.axis_names[start:stop]
        return None

    def fsdp_axes(self) -> tuple[str, ...] | None:
        """The axes to shard weights over: an axis named fsdp/data/dp/batch, else the largest axis."""
        for wanted in ("fsdp", "data", "dp", "batch"):
            for name in self.axis_names:
                if name.lower() == wanted:
                    return (name,)
        if not self.axis_names:
            return None
        largest = max(range(len(self.axis_sizes)), key=lambda i: self.axis_sizes[i])
        return (self.axis_names[largest],)

    def groups_over(self, axes: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """Device groups whose members differ only along ``axes``.

        Within a group the devices run over ``axes`` in the order given
        (the first axis major), as an all-gather over those axes
        concatenates them; groups come in mesh order of the other axes.
        ``groups_over(())`` is every device alone.
        """
        index = []
        for axis in axes:
            if axis not in self.axis_names:
                raise KeyError(f"no mesh axis {axis!r} in {self}")
            index.append(self.axis_names.index(axis))
        other = [i for i in range(len(self.axis_names)) if i not in index]
        ids = transpose_devices(self.device_ids, self.axis_sizes, tuple(other + index))
        size = math.prod(self.axis_sizes[i] for i in index)
        return tuple(ids[g : g + size] for g in range(0, len(ids), size))

    def axes_for_groups(self, groups: Iterable[Sequence[int]]) -> tuple[str, ...] | None:
        """The mesh axes (major first) a set of device groups runs over.

        Every group must step through the same axes in the same mixed-radix
        order. A sub-axis prints as ``name:(pre_size)size`` as in Shardy.
        Groups of one device run over no axis: ``()``. None when the groups
        match no axis combination (or hold ids outside the mesh).
        """
        groups = [tuple(g) for g in groups]
        if not groups:
            return None
        if all(len(g) <= 1 for g in groups):
            return ()
        pattern = self._walk(groups[0])
        if pattern is None:
            return None
        axes, offsets = pattern
        for group in groups[1:]:
            if len(group) != len(groups[0]) or self._offsets(group) != offsets:
                return None
        return axes

    def axes_between(self, a: int, b: int) -> tuple[str, ...] | None:
        """Axes along which logical ids ``a`` and ``b`` differ (None if either is not in the mesh)."""
        ca, cb = self.coords(a), self.coords(b)
        if ca is None or cb is None:
            return None
        return tuple(n for n, x, y in zip(self.axis_names, ca, cb, strict=False) if x != y)

    def __str__(self) -> str:
        axes = ",".join(f"'{n}'={s}" for n, s in zip(self.axis_names, self.axis_sizes, strict=False))
        return f"mesh[{axes}]"

    def describe(self) -> str:
        """One line for a report: the mesh and where it came from."""
        if self.is_inferred:
            return f"{self} (inferred from tile assignments; axis names are made up)"
        return f"{self} (from {self.source})"

    # -- axis walking -----------------------------------------------------
    def _offsets(self, seq: Sequence[int]) -> tuple[tuple[int, ...], ...] | None:
        base = self.coords(seq[0])
        if base is None:
            return None
        out = []
        for device in seq:
            c = self.coords(device)
            if c is None:
                return None
            out.append(tuple(x - y for x, y in zip(c, base, strict=False)))
        return tuple(out)

    def _walk(self, seq: Sequence[int]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]] | None:
        """The (sub-)axes a sequence of ids steps through in mixed-radix order, major first.

        Returns the axis names and the per-position coordinate offsets, or
        None when the sequence is not such a walk.
        """
        offsets = self._offsets(seq)
        if offsets is None:
            return None
        k = len(seq)
        factors: list[tuple[int, int, int]] = []  # (axis, step, size), minor first
        block = 1
        while block < k:
            moved = [a for a, d in enumerate(offsets[block]) if d != 0]
            if len(moved) != 1:
                return None
            axis = moved[0]
            step = offsets[block][axis]
            if step < 0:
                return None
            run = 1
            while run * block < k and offsets[run * block] == tuple(
                run * step if a == axis else 0 for a in range(len(self.axis_sizes))
            ):
                run += 1
            if run == 1 or k % (run * block):
                return None
            factors.append((axis, step, run))
            block *= run
        # Every position must be the mixed-radix sum of its digits.
        for position in range(k):
            expect = [0] * len(self.axis_sizes)
            rest = position
            for axis, step, size in factors:
                expect[axis] += (rest % size) * step
                rest //= size
            if tuple(expect) != offsets[position]:
                return None
        names = []
        for axis, step, size in reversed(factors):
            full = self.axis_sizes[axis]
            if size == full and step == 1:
                names.append(self.axis_names[axis])
            elif full % (size * step) == 0:
                names.append(f"{self.axis_names[axis]}:({full // (size * step)}){size}")
            else:
                return None
        return tuple(names), offsets


def _strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(sizes)
    for i in range(len(sizes) - 2, -1, -1):
        strides[i] = strides[i + 1] * sizes[i + 1]
    return tuple(strides)


def _split_sub_axis(axis: str) -> tuple[str, int | None, int | None]:
    if axis.endswith(")") or ":(" not in axis:
        return axis, None, None
    name, _, rest = axis.rpartition(":(")
    pre, _, size = rest.partition(")")
    if pre.isdigit() and size.isdigit():
        return name, int(pre), int(size)
    return axis, None, None


# --------------------------------------------------------------------------
# Tensor dims -> mesh axes


def dim_axes(sharding: Sharding, shape_rank: int, mesh: Mesh) -> tuple[tuple[str, ...], ...] | None:
    """The mesh axes (major first) each tensor dim is sharded over.

    ``()`` for a dim that is not split. A named (Shardy v3) sharding over a
    mesh with the same axis names is read as written. Otherwise the tile
    assignment is walked: along each tensor dim, the devices must step
    through mesh axes (or sub-axes, ``name:(pre)size``) in mixed-radix order,
    and every tile must be the sum of its per-dim steps. Trailing subgroup
    dims (``last_tile_dim_replicate``, ``last_tile_dims``) are replicated or
    manual axes and are not reported. None when the tile assignment is not
    built from the mesh's axes (for an inferred mesh, the axes are made-up
    names: see :attr:`Mesh.is_inferred`).
    """
    if sharding.kind is not ShardingKind.TILED or sharding.tile_assignment is None:
        return ((),) * shape_rank if sharding.kind is not ShardingKind.TUPLE else None
    named = sharding.named
    if (
        named is not None
        and len(named.dim_axes) == shape_rank
        and tuple(a.name for a in named.axes) == mesh.axis_names
        and not any(r.is_sub_axis for refs in named.dim_refs for r in refs)
    ):
        return tuple(tuple(d) for d in named.dim_axes)
    assignment = sharding.tile_assignment
    dims = assignment.dims
    data = sharding.data_tile_dims
    if len(data) != shape_rank:
        return None
    ids = assignment.device_ids()
    strides = _strides(dims)
    base = mesh.coords(ids[0])
    if base is None:
        return None
    out: list[tuple[str, ...]] = []
    steps: list[tuple[tuple[int, ...], ...]] = []
    for d, size in enumerate(dims):
        seq = [ids[j * strides[d]] for j in range(size)]
        if size == 1:
            steps.append(((0,) * len(mesh.axis_sizes),))
            if d < shape_rank:
                out.append(())
            continue
        walk = mesh._walk(seq)
        if walk is None:
            return None
        names, offsets = walk
        steps.append(offsets)
        if d < shape_rank:
            out.append(names)
    # Every tile is the sum of its per-dim steps.
    for flat, device in enumerate(ids):
        coords = mesh.coords(device)
        if coords is None:
            return None
        expect = list(base)
        for d, stride in enumerate(strides):
            step = steps[d][flat // stride % dims[d]]
            for a, v in enumerate(step):
                expect[a] += v
        if tuple(expect) != coords:
            return None
    return tuple(out)


# --------------------------------------------------------------------------
# Recovery


def recover_mesh(
    dump_module: DumpModule | None,
    hlo_module: HloModule | Callable[[], HloModule | None] | None = None,
    run_record: Mapping[str, object] | None = None,
) -> Mesh | None:
    """The mesh of one dumped module, from the first source that has it (see the module docstring).

    ``hlo_module`` (or a function giving it, called only when the HLO is
    needed) is parsed from the dump when needed and not given (the
    after-propagation snapshot, else the partitioned one, else any).
    """
    num_partitions = dump_module.num_partitions if dump_module is not None else None
    if dump_module is not None:
        mesh = _from_sdy(dump_module, num_partitions)
        if mesh is not None:
            return mesh
    if run_record is not None:
        mesh = _from_sidecar(dump_module, run_record, num_partitions)
        if mesh is not None:
            return mesh
    if callable(hlo_module):
        hlo_module = hlo_module()
    if hlo_module is None and dump_module is not None:
        hlo_module = _some_module(dump_module)
    if hlo_module is None:
        return None
    if num_partitions is None:
        text = hlo_module.attribute("num_partitions")
        num_partitions = int(text) if text is not None and text.isdigit() else None
    mesh = _from_replica_groups(hlo_module, num_partitions)
    if mesh is not None:
        return mesh
    return infer_mesh(hlo_module, num_partitions)


def _some_module(dump_module: DumpModule) -> HloModule | None:
    for snapshot in (
        dump_module.after_propagation(),
        dump_module.partitioned(),
        dump_module.after_optimizations(),
        dump_module.before_optimizations(),
        *dump_module.snapshots,
    ):
        if snapshot is not None:
            module = snapshot.try_module()
            if module is not None:
                return module
    return None


def _from_sdy(dump_module: DumpModule, num_partitions: int | None) -> Mesh | None:
    meshes = [m for m in dump_module.meshes if m.axes]
    if not meshes:
        return None
    source = dump_module.meshes_source or "hlo_header"
    fitting = [m for m in meshes if num_partitions is None or m.num_devices == num_partitions] or meshes
    chosen = next((m for m in fitting if m.name == "mesh"), None) or max(fitting, key=lambda m: m.num_devices)
    ids = chosen.device_ids or tuple(range(chosen.num_devices))
    if len(ids) != chosen.num_devices:
        return None
    return Mesh(chosen.axis_names, chosen.shape, tuple(ids), source, chosen.name)


def _from_sidecar(
    dump_module: DumpModule | None, record: Mapping[str, object], num_partitions: int | None
) -> Mesh | None:
    meshes = record.get("meshes")
    if not isinstance(meshes, list):
        return None
    assignment = dump_module.device_assignment if dump_module is not None else None
    logical_ids = record.get("framework") == "torch_xla" or assignment is None
    candidates: list[tuple[int, Mesh]] = []
    for entry in meshes:
        if not isinstance(entry, dict):
            continue
        names, shape, devices = entry.get("axis_names"), entry.get("shape"), entry.get("device_ids")
        if not (isinstance(names, list) and isinstance(shape, list) and isinstance(devices, list)):
            continue
        if len(names) != len(shape) or math.prod(shape) != len(devices):
            continue
        if num_partitions is not None and len(devices) != num_partitions:
            continue
        if logical_ids:
            ids = tuple(devices)
            rank = 1
        else:
            assert assignment is not None
            position = {d: i for i, d in enumerate(assignment)}
            if any(d not in position for d in devices):
                continue
            ids = tuple(position[d] for d in devices)
            rank = 0 if tuple(devices) == tuple(assignment) else 1  # JAX: the assignment is the mesh
        candidates.append((rank, Mesh(tuple(map(str, names)), tuple(shape), ids, "sidecar")))
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[0])[1]


def _from_replica_groups(module: HloModule, num_partitions: int | None) -> Mesh | None:
    best: Mesh | None = None
    for _, instruction in module.instructions():
        text = instruction.attribute("replica_groups")
        if text is None or not text.lstrip().startswith("mesh"):
            continue
        groups = instruction.replica_groups
        named = groups.mesh if groups is not None else None
        if named is None or named.maximal_device is not None or not named.axes:
            continue
        if num_partitions is not None and named.num_devices != num_partitions:
            continue
        mesh = Mesh(
            tuple(a.name for a in named.axes), tuple(a.size for a in named.axes),
            named.devices(), "replica_groups",
        )
        if best is None or _nontrivial(mesh) > _nontrivial(best):
            best = mesh
    return best


def _nontrivial(mesh: Mesh) -> int:
    return sum(1 for s in mesh.axis_sizes if s > 1)


def infer_mesh(module: HloModule, num_partitions: int | None = None) -> Mesh | None:
    """A mesh deduced from the module's tile assignments and replica groups.

    Each tile assignment (and each set of replica groups) that is an iota
    reshaped and transposed splits the device ids into mixed-radix digits;
    the mesh has one axis per digit boundary that every one of them agrees
    on, named ``axis_0``... major first, with devices in iota order.
    None when the module has no partitions to infer from.
    """
    arrays: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    seen: set[str] = set()
    for _, instruction in module.instructions():
        text = instruction.attribute("sharding")
        if text is not None and text not in seen:
            seen.add(text)
            sharding = instruction.sharding
            if sharding is not None:
                for leaf in _leaves(sharding):
                    if leaf.kind is ShardingKind.TILED and leaf.tile_assignment is not None:
                        ta = leaf.tile_assignment
                        arrays.append((ta.dims, ta.device_ids()))
        text = instruction.attribute("replica_groups")
        if text is not None and text not in seen:
            seen.add(text)
            rg = instruction.replica_groups
            groups = rg.groups() if rg is not None else ()
            if groups and len({len(g) for g in groups}) == 1:
                arrays.append(((len(groups), len(groups[0])), tuple(d for g in groups for d in g)))
    n = num_partitions
    if n is None:
        lengths = {len(ids) for _, ids in arrays}
        n = max(lengths) if lengths else None
    if n is None or n < 1:
        return None
    cuts = {1, n}
    for dims, ids in arrays:
        if len(ids) != n or sorted(ids) != list(range(n)):
            continue
        boundaries = _iota_boundaries(dims, ids)
        if boundaries is not None:
            cuts.update(boundaries)
    chain = [1]
    for cut in sorted(cuts):
        if cut > chain[-1] and cut % chain[-1] == 0 and n % cut == 0:
            chain.append(cut)
    sizes = tuple(b // a for a, b in pairwise(chain))[::-1] or (1,)  # major first
    names = tuple(f"axis_{i}" for i in range(len(sizes)))
    return Mesh(names, sizes, tuple(range(n)), "inferred")


def _leaves(sharding: Sharding) -> Iterable[Sharding]:
    if sharding.is_tuple:
        for element in sharding.tuple_elements:
            yield from _leaves(element)
    else:
        yield sharding


def _iota_boundaries(dims: tuple[int, ...], ids: tuple[int, ...]) -> set[int] | None:
    """The digit boundaries (strides and stride*size) of an iota-transpose device array.

    None when ``ids`` is not ``iota(n)`` reshaped and transposed.
    """
    if not ids or ids[0] != 0:
        return None
    strides = _strides(dims)
    factors: list[tuple[int, int]] = []  # (stride, size)
    per_dim: list[list[int]] = []
    for d, size in enumerate(dims):
        seq = [ids[j * strides[d]] for j in range(size)]
        per_dim.append(seq)
        digits = _digits(seq)
        if digits is None:
            return None
        factors.extend(digits)
    for flat, device in enumerate(ids):
        if device != sum(per_dim[d][flat // strides[d] % dims[d]] for d in range(len(dims))):
            return None
    expected = 1
    for step, run in sorted(factors):
        if step != expected:
            return None
        expected *= run
    if expected != len(ids):
        return None
    return {step for step, _ in factors} | {step * run for step, run in factors}


def _digits(seq: Sequence[int]) -> list[tuple[int, int]] | None:
    """``seq`` (starting at 0) as mixed-radix digits (stride, size), minor first; None if it is not."""
    size = len(seq)
    digits: list[tuple[int, int]] = []
    block = 1
    while block < size:
        step = seq[block]
        run = 1
        while run * block < size and seq[run * block] == run * step:
            run += 1
        if run == 1 or size % (run * block) or step <= 0:
            return None
        digits.append((step, run))
        block *= run
    for j in range(size):
        rest, value = j, 0
        for step, run in digits:
            value += (rest % run) * step
            rest //= run
        if value != seq[j]:
            return None
    return digits
