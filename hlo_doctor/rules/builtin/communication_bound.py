"""communication-bound: collective time dominates matmul time in a step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.rules.hardware import profile_for_dump, profile_names
from hlo_doctor.units import format_bytes


@dataclass(frozen=True, slots=True)
class CommunicationBoundOptions:
    threshold: float = 0.5
    """Fire when the estimated fraction of the step spent communicating is at least this."""
    min_collective_bytes: int = 0
    """Ignore modules whose collectives move fewer bytes per device per step than this."""
    min_compute_seconds: float = 1e-4
    """Do not judge steps whose matmuls take less than this (estimated): latency decides those."""


class CommunicationBound(Rule):
    """The step spends more time in collectives than in matmuls.

    **What it finds**

    Per device and per step, with the analysis layer's cost model
    (:mod:`hlo_doctor.semantics.cost`): the time of every matmul (``dot``,
    ``convolution``, GEMM calls, loop bodies times their trip count) at the
    profile's dense peak for its element type, against the time of every
    collective (ring wire bytes over the intra-host link, or over the
    inter-host link, inter-slice on TPU, when its groups cross that
    boundary). Only communication that nothing overlaps counts: in a
    scheduled GPU/TPU module an async collective hides behind the matmuls
    scheduled between its start and its done; elsewhere weight gathers
    (prefetchable) and gradient reductions hide behind compute up to the
    step's compute time, while activation traffic, reshards and scalar
    reductions sit on the critical path. The rule fires when the exposed
    communication is at least ``threshold`` of the step. It needs a hardware
    profile (``--hardware h100|a100|b200|tpu-v4|tpu-v5e`` or a JSON file; a
    GPU dump's backend picks one itself); without one it says nothing. Steps
    whose matmuls take less than ``min_compute_seconds`` are not judged:
    latency, which a bandwidth model leaves out, decides those. The
    estimate is a lower bound on communication time, within about 2x
    (datasheet bandwidths, no latency).

    **Why it hurts**

    Even perfectly overlapped, a step cannot be faster than its
    communication; above one half, adding devices makes it slower.
    Typical causes: weights gathered for too little work per device (small
    per-device batch under FSDP), tensor parallelism across hosts,
    activations resharded back and forth.

    **Example**

    ```
    %all-gather = f32[512,2048] all-gather(%param.1), dimensions={0}   // 4 MiB per layer
    %dot = f32[16,2048] dot(%param, %all-gather)                        // 33 MFLOP
    ```

    **Fix**

    Do more work per byte: a larger per-device batch (or gradient
    accumulation), fewer FSDP shards (e.g. FSDP inside a host, data
    parallelism across hosts), tensor parallelism only inside a host.

    ```python
    # JAX: FSDP inside a host, replicas across hosts (32 hosts of 4 chips);
    # the axis names are yours to choose: the rule never makes them up
    mesh = jax.make_mesh((32, 4), (<replica axis>, <fsdp axis>))
    # torch_xla
    mesh = xs.Mesh(device_ids, (32, 4), (<replica axis>, <fsdp axis>))
    ```

    **Options**

    * ``threshold`` (float, default 0.5): the fraction of the step spent
      communicating at which the rule fires.
    * ``min_collective_bytes`` (int, default 0): ignore modules whose
      collectives send fewer bytes per device per step.
    * ``min_compute_seconds`` (float, default 0.0001): do not judge steps
      whose matmuls take less than this (estimated).
    """

    id = "communication-bound"
    cause_rank = 90
    severity = Severity.WARNING
    reads = frozenset({"per_device"})
    summary = "Collectives take more of the step than the matmuls (needs a hardware profile)."
    Options = CommunicationBoundOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        hardware = ctx.options.hardware or profile_for_dump(ctx.module)
        if hardware is None:
            raise RuleSkipped(f"no hardware profile: pass --hardware ({', '.join(profile_names())} or a JSON file)")
        if ctx.per_device is None:
            raise RuleSkipped("no partitioned or after-optimizations snapshot")
        semantics = ctx.semantics
        roles = [r for r in semantics.roles if r.facts.talking_groups]
        if not roles:
            return
        cost = semantics.cost(hardware)
        step = cost.step()
        total_bytes = sum(r.facts.wire_bytes_per_step for r in roles)
        if total_bytes < self.options.min_collective_bytes:
            return
        if step.compute_seconds < self.options.min_compute_seconds:
            raise RuleSkipped(
                f"the step's matmuls take an estimated {_us(step.compute_seconds)} on {hardware.name}, "
                f"under min-compute-seconds ({_us(self.options.min_compute_seconds)}): launch and latency "
                "costs, which the bandwidth model leaves out, decide a step this short"
            )
        fraction = step.bound_fraction
        if step.link_seconds <= 0 or fraction < self.options.threshold:
            return
        timed = sorted(((cost.collective_seconds(r.facts) * r.facts.executions.count, r) for r in roles),
                       key=lambda c: -c[0])
        top_time, top = timed[0]
        # Bytes over the slow links (between TPU slices; between hosts elsewhere), where the dump and
        # the options tell every collective's side of them.
        crossing = [r.facts.crosses_slow_boundary for r in roles]
        slow = (None if None in crossing else
                sum(r.facts.wire_bytes_per_step for r in roles if r.facts.crosses_slow_boundary))
        intensity = step.flops / total_bytes if total_bytes else 0.0
        by_role = ", ".join(f"{role} {_us(seconds)}" for role, seconds in
                            sorted(step.by_role.items(), key=lambda kv: -kv[1]) if seconds > 0)
        hidden = step.communication_seconds - step.exposed_communication_seconds
        message = (
            f"on {hardware.name}, the step's collectives need an estimated {_us(step.link_seconds)} on their "
            f"busiest link against {_us(step.compute_seconds)} for {step.flops / 1e9:.3g} GFLOP of matmuls, "
            f"so even perfectly overlapped the step waits on communication ({fraction:.0%} of compute plus "
            f"communication): {format_bytes(total_bytes)} per device in {len(roles)} collectives ({by_role}), "
            f"{intensity:.0f} FLOP per byte sent where the hardware needs about {cost.machine_balance:.0f}; "
            f"{_us(step.exposed_communication_seconds)} of it sits on the critical path (activation traffic, "
            f"reshards, what prefetching cannot hide), {_us(hidden)} can overlap compute; the largest is the "
            f"{top.role} {top.facts.kind} {top.facts.instruction} ({_us(top_time)})"
        )
        shape = _hosts_by_devices(ctx.num_partitions, ctx.devices_per_host or hardware.devices_per_host)
        yield self.finding(
            ctx,
            message,
            instruction=_instruction(semantics, top),
            name=top.facts.instruction,
            related=tuple(r.facts.instruction for _, r in timed[1:6]),
            suggestion=Suggestion(
                summary=("Do more work per byte sent: a larger per-device batch, fewer FSDP shards (FSDP inside a "
                         "host, replicas across hosts), tensor parallelism only inside a host. The mesh below is "
                         f"that layout for this step, {shape} (hosts, devices per host); its axis names are "
                         "yours to choose."),
                jax=f"mesh = jax.make_mesh({shape}, (<replica axis>, <fsdp axis>))",
                torch_xla=f"mesh = xs.Mesh(device_ids, {shape}, (<replica axis>, <fsdp axis>))",
                no_edit=("the fix is a choice of parallelism (per-device batch, mesh shape), which trades memory for "
                         "traffic: hlo-doctor gives the numbers, the choice is yours"),
            ),
            evidence={
                "hardware": hardware.name,
                "communication_fraction": round(fraction, 4),
                "busiest_link_seconds": step.link_seconds,
                "communication_seconds": step.communication_seconds,
                "exposed_communication_seconds": step.exposed_communication_seconds,
                "compute_seconds": step.compute_seconds,
                "dot_flops": step.flops,
                "collective_bytes_sent": total_bytes,
                **({"slow_link_bytes_sent": slow} if slow is not None else {}),
                "collectives": len(roles),
                "seconds_by_role": {k: v for k, v in step.by_role.items()},
                "flops_per_byte": round(intensity, 2),
                "slow_boundary": ctx.device_map.slow_boundary,
            },
        )


def _instruction(semantics, role):  # noqa: ANN001, ANN202
    module = semantics.view.per_device
    computation = module.computation(role.facts.computation) if module is not None else None
    return computation.get(role.facts.instruction) if computation is not None else None


def _us(seconds: float) -> str:
    """A duration in the unit that reads best (us below a millisecond, ms below a second, else s)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def _hosts_by_devices(devices: int, per_host: int | None) -> str:
    """The mesh shape of replicas across hosts and FSDP inside one, ``(hosts, devices per host)``;
    placeholders where the devices per host are unknown or do not divide the devices."""
    if per_host and devices % per_host == 0 and devices > per_host:
        return f"({devices // per_host}, {per_host})"
    return "(<hosts>, <devices per host>)"
