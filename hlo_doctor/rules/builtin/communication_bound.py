"""communication-bound: collective time dominates matmul time in a step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.rules.hardware import HardwareProfile, bundled_profiles
from hlo_doctor.units import format_bytes

# after-optimizations backend prefix -> bundled profile
_BACKENDS = {"sm_9.0a_gpu": "h100", "sm_90a_gpu": "h100", "sm_9.0_gpu": "h100", "sm_8.0_gpu": "a100"}


@dataclass(frozen=True, slots=True)
class CommunicationBoundOptions:
    threshold: float = 0.5
    """Fire when the estimated fraction of the step spent communicating is at least this."""
    min_collective_bytes: int = 0
    """Ignore modules whose collectives move fewer bytes per device per step than this."""


class CommunicationBound(Rule):
    """The step spends more time in collectives than in matmuls.

    **What it finds**

    Per device and per step: the FLOPs of every ``dot`` and ``convolution``
    (while-loop bodies times their trip count) against the bytes every
    collective sends (ring estimates: all-reduce ``2(n-1)/n``, all-gather,
    reduce-scatter and all-to-all ``(n-1)/n`` of the data, permutes all of
    it). With a hardware profile (``--hardware h100|a100|tpu-v4|tpu-v5e`` or
    a JSON file; a GPU dump's backend picks one itself) it estimates compute
    time at peak bf16 FLOP/s and communication time at the intra- or
    inter-host bandwidth (a group crosses hosts per ``--devices-per-host``),
    and fires when communication is at least ``threshold`` of their sum.
    Without a profile (a CPU dump with no ``--hardware``) it says nothing.

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
    # JAX: FSDP inside a host, replicas across hosts
    mesh = jax.make_mesh((num_hosts, devices_per_host), ('replica', 'fsdp'))
    # torch_xla
    mesh = xs.Mesh(device_ids, (num_hosts, devices_per_host), ('replica', 'fsdp'))
    ```

    **Options**

    * ``threshold`` (float, default 0.5): the fraction of the step spent
      communicating at which the rule fires.
    * ``min_collective_bytes`` (int, default 0): ignore modules whose
      collectives send fewer bytes per device per step.
    """

    id = "communication-bound"
    severity = Severity.WARNING
    reads = frozenset({"per_device"})
    summary = "Collectives take more of the step than the matmuls (needs a hardware profile)."
    Options = CommunicationBoundOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        hardware = ctx.options.hardware or _profile_for_backend(ctx.backend)
        if hardware is None:
            raise RuleSkipped("no hardware profile: pass --hardware (h100, a100, tpu-v4, tpu-v5e or a JSON file)")
        if ctx.per_device is None:
            raise RuleSkipped("no partitioned or after-optimizations snapshot")
        collectives = ctx.collectives
        if not collectives:
            return
        devices_per_host = ctx.devices_per_host or hardware.devices_per_host
        costs = []
        total_bytes = 0.0
        inter_bytes = 0.0
        for op in collectives:
            crosses = op.crosses_hosts
            if crosses is None:
                groups = op.physical_groups or op.logical_groups
                crosses = any(len({d // devices_per_host for d in g}) > 1 for g in groups)
            bandwidth = hardware.inter_host_bandwidth if crosses else hardware.intra_host_bandwidth
            sent = op.wire_bytes_per_device * ctx.executions.get(op.computation, 1)
            total_bytes += sent
            inter_bytes += sent if crosses else 0.0
            costs.append((sent / bandwidth, op))
        if total_bytes < self.options.min_collective_bytes:
            return
        comm = sum(t for t, _ in costs)
        flops = ctx.dot_flops
        compute = flops / hardware.peak_bf16_flops
        if comm <= 0:
            return
        fraction = comm / (comm + compute)
        if fraction < self.options.threshold:
            return
        costs.sort(key=lambda c: -c[0])
        top_time, top = costs[0]
        intensity = flops / total_bytes if total_bytes else 0.0
        machine = hardware.peak_bf16_flops / hardware.intra_host_bandwidth
        message = (
            f"on {hardware.name}, collectives take an estimated {fraction:.0%} of the step: "
            f"{_us(comm)} to send {format_bytes(total_bytes)} per device in {len(collectives)} collectives vs "
            f"{_us(compute)} for {flops / 1e9:.3g} GFLOP of matmuls ({intensity:.0f} FLOP per byte sent; "
            f"the hardware needs about {machine:.0f}); the largest is {top.kind} {top.instruction} ({_us(top_time)})"
        )
        return_value = self.finding(
            ctx,
            message,
            instruction=ctx.instruction(top.computation, top.instruction),
            name=top.instruction,
            related=tuple(op.instruction for _, op in costs[1:6]),
            suggestion=Suggestion(
                summary=("Do more work per byte sent: a larger per-device batch, fewer FSDP shards (FSDP inside a "
                         "host, replicas across hosts), tensor parallelism only inside a host."),
                jax="mesh = jax.make_mesh((num_hosts, devices_per_host), ('replica', 'fsdp'))",
                torch_xla="mesh = xs.Mesh(device_ids, (num_hosts, devices_per_host), ('replica', 'fsdp'))",
            ),
            evidence={
                "hardware": hardware.name,
                "communication_fraction": round(fraction, 4),
                "communication_seconds": comm,
                "compute_seconds": compute,
                "dot_flops": flops,
                "collective_bytes_sent": total_bytes,
                "inter_host_bytes_sent": inter_bytes,
                "collectives": len(collectives),
                "flops_per_byte": round(intensity, 2),
                "devices_per_host": devices_per_host,
            },
        )
        yield return_value


def _profile_for_backend(backend: str | None) -> HardwareProfile | None:
    if not backend:
        return None
    name = _BACKENDS.get(backend)
    return bundled_profiles().get(name) if name else None


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


