"""The :class:`Mesh`: axis names and sizes over logical device ids (see :mod:`hlo_doctor.graph.mesh`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hlo_doctor.errors import ShardingError
from hlo_doctor.hlo.ir import transpose_devices

if TYPE_CHECKING:
    pass

__all__ = ["SOURCES", "Mesh"]

SOURCES = ("module.mlir", "hlo_header", "sidecar", "replica_groups", "program", "inferred")


@dataclass(frozen=True)
class Mesh:
    """Named axes (major to minor) over logical ids.

    ``device_ids`` is the mesh's device array flattened row-major, in logical
    ids (see the module docstring). ``source`` says where it came from:
    ``"module.mlir"``, ``"hlo_header"``, ``"sidecar"``, ``"replica_groups"``,
    ``"program"`` (inferred sizes, names read from the program's mesh construction)
    or ``"inferred"`` (axis names made up, sizes deduced). ``name`` is the
    Shardy mesh name when there is one.
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    device_ids: tuple[int, ...]
    source: str
    name: str | None = None
    _coords: dict[int, tuple[int, ...]] = field(init=False, compare=False, repr=False)
    # What :func:`hlo_doctor.graph.mesh.dim_axes` read from each sharding over this mesh.
    read_shardings: dict[tuple, tuple[tuple[str, ...], ...] | None] = field(
        init=False, default_factory=dict, compare=False, repr=False)

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
