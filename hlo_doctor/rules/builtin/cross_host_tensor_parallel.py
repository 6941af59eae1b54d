"""cross-host-tensor-parallel: tensor-parallel collectives on activations whose device groups span hosts."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from hlo_doctor.findings import SourceEdit
from hlo_doctor.graph.collectives import Collective
from hlo_doctor.program.levers import mesh_construction_line, mesh_construction_rewritten
from hlo_doctor.program.records import record_entries, user_line
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics import ACTIVATION_ROLES
from hlo_doctor.units import format_bytes


@dataclass(frozen=True, slots=True)
class CrossHostTensorParallelOptions:
    min_bytes: int = 0
    """Ignore collectives that move fewer bytes per device (in or out, whichever is larger)."""


class CrossHostTensorParallel(Rule):
    """Tensor-parallel collectives on activations run between devices on different hosts.

    **What it finds**

    Collectives of the partitioned module whose *physical* device groups
    (the replica groups mapped through the device assignment) cross the
    slow boundary (hosts on GPU and CPU, slices on TPU, where ICI joins the
    hosts of a slice), and that are **tensor-parallel traffic on
    activations**, as the analysis layer judges it from the dataflow
    (:mod:`hlo_doctor.semantics.roles`):

    * the role is ``activation-reduce`` (partial sums of a value that still
      carries the batch dim) or ``activation-gather``; weight gathers,
      gradient reductions, expert dispatch, pipeline sends, scalar and index
      traffic and self-pairs are never reported: FSDP, data parallelism,
      expert and pipeline parallelism cross hosts by design;
    * the collective's mesh axes are not data-parallel: axes that split the
      batch of a data input, or over which gradients are reduced (an
      activation gathered over such an axis is a lost batch sharding,
      reported by ``activation-all-gather``). Axis names are never read.

    Hosts come from ``--devices-per-host N``, the runner's record, or the
    dump's topology (the process index of each device); without any of them
    the rule is skipped. One finding per set of mesh axes, at the largest
    such collective.

    **Why it hurts**

    Tensor parallelism puts a collective on the critical path of every
    layer, forward and backward. Inside a host it runs over NVLink/ICI
    (hundreds of GB/s); across hosts over the data-center network, often
    ten times slower, and nothing can overlap it. The usual cause is the
    mesh: the TP axis is the *major* axis (``reshape(2, 4)`` with axes
    ``('tp', 'dp')``), or the device array is transposed, so a TP group
    takes one device from each host.

    **Example**

    ```
    // 8 devices, 4 per host; mesh ('tp'=2, 'dp'=4)
    %dot.1 = f32[16,512] dot(%max.7, %param.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    ROOT %all-reduce = f32[16,512] all-reduce(%dot.1), channel_id=1,
        replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=%add
    ```

    **Fix**

    Build the mesh so that the TP axis is the minor (last) axis and fits in
    one host, with the devices in host order; keep data parallelism / FSDP
    across hosts. The fix is the program's own mesh construction (the line the
    runner recorded), its axes and shape permuted or its transpose dropped;
    for a Keras program, its ``DeviceMesh``.

    ```python
    # JAX: the program's Mesh(devices.reshape(2, n // 2), ('tp', 'dp')), 'tp' last
    mesh = Mesh(devices.reshape(n // 2, 2), ('dp', 'tp'))
    # or explicitly: per-host (ICI) shape and across-host (DCN) shape
    mesh = Mesh(mesh_utils.create_hybrid_device_mesh((2, 2), (2, 1)), ('dp', 'tp'))
    # torch_xla
    mesh = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1), axis_names=('dp', 'tp'))
    ```

    **Options**

    * ``min_bytes`` (int, default 0): ignore collectives that move fewer
      bytes per device.
    """

    id = "cross-host-tensor-parallel"
    cause_rank = 60
    severity = Severity.WARNING
    reads = frozenset({"per_device"})
    summary = "Tensor-parallel collectives on activations cross hosts (the TP axis should stay inside a host)."
    Options = CrossHostTensorParallelOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        if ctx.per_device is None:
            raise RuleSkipped("no partitioned or after-optimizations snapshot")
        semantics = ctx.semantics
        roles = [r for r in semantics.roles if r.role in ACTIVATION_ROLES and r.facts.talking_groups]
        if not roles:
            return
        device_map = ctx.device_map
        if device_map.host_of is None and device_map.slice_of is None:
            raise RuleSkipped(
                "the host of each device is unknown: pass --devices-per-host N "
                "(or record it with `hlo-doctor run --devices-per-host N`)"
            )
        data_parallel = semantics.data_parallel_axes
        # mesh axes -> the TP collectives over them that cross the slow boundary
        found: dict[tuple[str, ...] | None, list[Collective]] = {}
        for role in roles:
            facts = role.facts
            if not facts.crosses_slow_boundary:
                continue
            if facts.bytes_per_device < self.options.min_bytes:
                continue
            if semantics.is_data_parallel(role):
                continue  # over data-parallel axes: a lost batch sharding, not tensor parallelism
            if _only_data_parallel_axes_cross(ctx, facts.op.mesh_axes, data_parallel):
                continue  # its other axes stay inside a host: the batch axes cross, and a mesh change would not help
            found.setdefault(facts.op.mesh_axes, []).append(facts.op)
        for axes, ops in found.items():
            yield self._finding(ctx, axes, ops, set(data_parallel))

    def _finding(self, ctx: RuleContext, axes, ops: list[Collective], batch: set[str]) -> Finding:
        executions = ctx.executions
        ops = sorted(ops, key=lambda c: -c.wire_bytes_per_device * executions.get(c.computation, 1))
        top = ops[0]
        device_map = ctx.device_map
        per_host = device_map.devices_per_host or ctx.devices_per_host
        physical = top.physical_groups or top.logical_groups
        crossing = [g for g, lg in zip(physical, top.logical_groups) if device_map.spans_hosts(lg)]
        hosts = sorted({h for lg in top.logical_groups for h in (device_map.hosts(lg) or ())})
        total_wire = sum(c.wire_bytes_per_device * executions.get(c.computation, 1) for c in ops)
        axis_text = "mesh axis " + "/".join(f"'{a}'" for a in axes) if axes else "a device group of no mesh axis"
        groups_text = ", ".join("{" + ",".join(map(str, g)) + "}" for g in physical[:4])
        if len(physical) > 4:
            groups_text += ", ..."
        per_host_text = f"{per_host} devices per host" if per_host else "hosts from the topology"
        message = (
            f"{top.kind} {top.instruction} over {axis_text} carries an activation between devices "
            f"{groups_text} on different hosts ({per_host_text}): tensor-parallel traffic "
            f"({format_bytes(top.wire_bytes_per_device)} sent per device) goes over the inter-host network"
        )
        if len(ops) > 1:
            message += f", as do {len(ops) - 1} more collective{'s' if len(ops) > 2 else ''} over the same axes"
        mesh = ctx.mesh
        tp_axes = tuple(axes) if axes else ()
        summary, jax_code, torch_code = _mesh_fix(mesh, tp_axes, per_host, ctx.num_partitions)
        edits, no_edit = _mesh_edit(ctx, tp_axes)
        rewritten = mesh_construction_rewritten(edits[0].file, edits[0].line, edits[0].details) if edits else None
        if rewritten is not None:  # the program's own construction, as it should read
            code = f"{rewritten}  # line {edits[0].line}: {'/'.join(repr(a) for a in tp_axes)} over one host's devices"
            if ctx.framework == "torch_xla":
                torch_code = f"{code}\n# or: {torch_code}"
            else:
                jax_code = "\n".join([code, *jax_code.splitlines()[1:]])  # and the hybrid-mesh alternative
        order = device_map.logical_to_physical
        if mesh is not None and tp_axes and mesh.axis_names[-len(tp_axes):] == tp_axes and not device_map.is_identity:
            # the axes are right; the device array is not in host order (e.g. a transposed reshape)
            summary = (
                f"{'/'.join(repr(a) for a in tp_axes)} is already the last mesh axis, but the mesh's devices are not in "
                f"host order (device assignment {list(order[:8])}{'...' if len(order) > 8 else ''}): build the mesh "
                "from the devices in order (no transpose), so each TP group is consecutive devices of one host."
            )
        return self.finding(
            ctx,
            message,
            instruction=ctx.instruction(top.computation, top.instruction),
            name=top.instruction,
            related=tuple(c.instruction for c in ops[1:]),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code, edits=edits, no_edit=no_edit),
            evidence={
                "kind": top.kind,
                "mesh_axes": list(axes) if axes else None,
                "data_parallel_axes": sorted(batch),
                "physical_groups": [list(g) for g in physical],
                "crossing_groups": len(crossing),
                "hosts": hosts,
                "devices_per_host": per_host,
                "host_source": device_map.host_source,
                "device_assignment": list(device_map.logical_to_physical),
                "bytes_per_device": max(top.bytes_in_per_device, top.bytes_out_per_device),
                "wire_bytes_per_device": top.wire_bytes_per_device,
                "collectives": len(ops),
                "inter_host_bytes_per_step": total_wire,
            },
        )


def _only_data_parallel_axes_cross(ctx: RuleContext, axes: tuple[str, ...] | None,
                                   data_parallel: frozenset[str]) -> bool:
    """Whether a collective over ``axes`` (some data-parallel, some not) crosses the slow boundary only
    through its data-parallel axes: every group over its other axes alone stays inside a host (slice).

    Such traffic (an activation all-reduced over the FSDP and tensor axes together, with the tensor
    axis minor) is batch data movement, reported by the batch rules; laying the tensor axis inside a
    host, this rule's fix, is already done.
    """
    mesh = ctx.mesh
    if not axes or mesh is None or any(":(" in a or a not in mesh.axis_names for a in axes):
        return False
    other = [a for a in axes if a not in data_parallel]
    if not other or len(other) == len(axes):
        return False
    device_map = ctx.device_map
    return all(device_map.crosses_slow_boundary(group) is False for group in mesh.groups_over(other))


def _mesh_fix(mesh, tp_axes: Sequence[str], per_host: int | None, num_devices: int) -> tuple[str, str, str]:
    """A mesh with the TP axes last, and its per-host (ICI) and across-host (DCN) shapes."""
    if mesh is None or not tp_axes or any(a not in mesh.axis_names for a in tp_axes):
        names = ("dp", "tp")
        tp = 2
        sizes = (max(1, num_devices // tp), tp)
        tp_axes = ("tp",)
    else:
        others = [a for a in mesh.axis_names if a not in tp_axes]
        names = tuple(others) + tuple(a for a in mesh.axis_names if a in tp_axes)
        sizes = tuple(mesh.axis_size(a) for a in names)
    tp_size = math.prod(s for n, s in zip(names, sizes) if n in tp_axes)
    per_host = per_host or tp_size
    hosts = max(1, num_devices // per_host) if num_devices >= per_host else 1
    dcn: list[int] = []
    left = hosts
    for name, size in zip(names, sizes):
        if name in tp_axes:
            dcn.append(1)
        else:
            g = math.gcd(left, size)
            dcn.append(g)
            left //= g
    ici = tuple(s // d for s, d in zip(sizes, dcn))
    tp_text = "/".join(f"'{a}'" for a in tp_axes)
    fits = tp_size <= per_host and per_host % tp_size == 0 and left == 1
    names_text = "(" + ", ".join(repr(n) for n in names) + ("," if len(names) == 1 else "") + ")"
    shape_text = _tuple(sizes)
    if fits:
        summary = (f"Make {tp_text} the last mesh axis, over consecutive devices of one host ({per_host} per host): "
                   f"mesh shape {shape_text} with axes {names_text}, data parallelism across hosts.")
    else:
        summary = (f"{tp_text} has {tp_size} devices but a host has {per_host}: shrink tensor parallelism to fit "
                   f"in a host (use the rest as data parallelism / FSDP) and make it the last mesh axis.")
    jax_code = (
        f"mesh = Mesh(mesh_utils.create_device_mesh({shape_text}), {names_text})  # {tp_text} last: its groups stay "
        "inside a host (from jax.experimental import mesh_utils)\n"
        f"# or: mesh = Mesh(mesh_utils.create_hybrid_device_mesh({_tuple(ici)}, {_tuple(tuple(dcn))}), {names_text})"
    )
    torch_code = (
        f"mesh = xs.HybridMesh(ici_mesh_shape={_tuple(ici)}, dcn_mesh_shape={_tuple(tuple(dcn))}, "
        f"axis_names={names_text})"
    )
    return summary, jax_code, torch_code


def _mesh_edit(ctx: RuleContext, tp_axes: Sequence[str]) -> tuple[tuple[SourceEdit, ...], str | None]:
    """The edit of the program's mesh construction (the runner recorded where it is): the TP axes
    last, or, when they already are, the devices in host order."""
    mesh = ctx.mesh
    framework = ctx.framework
    if mesh is None or mesh.is_inferred or not tp_axes or framework not in ("jax", "torch_xla"):
        return (), "the mesh's axis names or the framework are not known"
    # Keras builds its jax Mesh lazily from the program's DeviceMesh: the DeviceMesh is the lever
    keras = [e for e in record_entries(ctx.dump.run_record, "keras", "meshes")
             if tuple(e.get("axis_names") or ()) == mesh.axis_names]
    made = keras or [e for e in record_entries(ctx.dump.run_record, "meshes")
                     if tuple(e.get("axis_names") or ()) == mesh.axis_names]
    where = user_line(made[0]) if len(made) == 1 else None
    if where is None and not ctx.dump.run_record:  # a dump made without the runner: the source alone
        found = [(program, line) for program in ctx.program_files
                 for line in [mesh_construction_line(program, mesh.axis_names)] if line is not None]
        where = found[0] if len(found) == 1 else None
    if where is None:
        return (), ("the runner's record does not say which line of the program builds this mesh" if ctx.dump.run_record
                    else "no one mesh construction of the program names these axes")
    file, line = where
    names = mesh.axis_names
    if names[-len(tp_axes):] == tuple(tp_axes):
        details: dict[str, object] = {"device_order": "host-major", "shape": mesh.axis_sizes}
    else:
        order = [a for a in names if a not in tp_axes] + [a for a in names if a in tp_axes]
        details = {"axis_names": tuple(order), "shape": tuple(mesh.axis_size(a) for a in order),
                   "permutation": tuple(names.index(a) for a in order)}
    return (SourceEdit("mesh", framework, file=file, line=line, details=details),), None


def _tuple(values: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


