"""Where a module's mesh comes from: :func:`recover_mesh` and :func:`infer_mesh` (see :mod:`hlo_doctor.graph.mesh`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

from hlo_doctor.hlo.ir import Sharding, ShardingKind

if TYPE_CHECKING:
    from hlo_doctor.dump import DumpModule
    from hlo_doctor.hlo.ir import HloModule

from hlo_doctor.graph.mesh_model import Mesh, _strides

__all__ = ["infer_mesh", "recover_mesh"]


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
