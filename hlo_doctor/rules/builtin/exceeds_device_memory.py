"""exceeds-device-memory: the step's peak memory per device is over the target's memory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.memory import FROM_BUFFER_ASSIGNMENT, FROM_USAGE_REPORT, ModuleMemory
from hlo_doctor.program.suggest import parameter_code
from hlo_doctor.rules._memory import (
    ParameterLayout,
    memory_of,
    parameter_instruction,
    parameter_layouts,
    target_for,
)
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.units import format_bytes

_SOURCES = {FROM_BUFFER_ASSIGNMENT: "XLA's buffer assignment", FROM_USAGE_REPORT: "XLA's memory-usage report"}
_STATE = ("weights", "optimizer_state")


@dataclass(frozen=True, slots=True)
class ExceedsDeviceMemoryOptions:
    largest_items: int = 3
    """How many of the largest items the message names."""


@dataclass(frozen=True, slots=True)
class _Change:
    """Sharding the weights and optimizer state over the mesh axes they are replicated on."""

    axes: tuple[str, ...]
    sharded_over: tuple[str, ...]
    freed: int
    parameters: tuple[ParameterLayout, ...]


class ExceedsDeviceMemory(Rule):
    """The peak memory per device is over the target's memory: the step does not fit.

    **What it finds**

    A module whose peak memory per device is larger than the memory of one
    device of the target: the hardware the dump was compiled for (a TPU's
    chip, a GPU's architecture), or the one named with ``--hardware``. The
    peak is XLA's own where the dump has it (the buffer assignment's total
    of the default memory space, which a deviceless TPU compile writes even
    when it then fails with ``RESOURCE_EXHAUSTED``), else the estimate of
    ``hlo-doctor memory``. The message names the largest items and what
    they are (weights, optimizer state, gradients, activations kept for the
    backward, gathered weights, ...), and the sharding change that frees
    the most: the weights and optimizer state that are replicated over some
    mesh axes, sharded over those axes too.

    **Why it hurts**

    The job fails at compile time or runs out of memory at its first step,
    after the time spent to schedule it on the hardware. An ahead-of-time
    compile says only that it does not fit, not what fills the memory.

    **Example**

    ```
    %param.5 = f32[12288,49152]{1,0} parameter(5), sharding={devices=[4,1,4]<=[16] last_tile_dim_replicate}
    // XLA's buffer assignment: 17.9 GiB in the default memory space; a v5e chip has 16 GiB
    ```

    **Fix**

    Shard the weights and the optimizer state over every mesh axis they
    are replicated on (here: 'data' as well as 'fsdp'), so each device keeps
    ``1/n`` of them:

    ```python
    # JAX
    w = jax.device_put(w, NamedSharding(mesh, P(('data', 'fsdp'), None)))
    # torch_xla
    xs.mark_sharding(w, mesh, (('data', 'fsdp'), None))
    ```

    When nothing is replicated any more, free the activations instead
    (``jax.checkpoint`` on the layers, a smaller per-device batch), or use a
    target with more memory.

    **Options**

    * ``largest_items`` (int, default 3): how many of the largest items the
      message names.
    """

    id = "exceeds-device-memory"
    cause_rank = 40
    severity = Severity.ERROR
    reads = frozenset({"per_device", "sharded"})
    summary = "The peak memory per device is over the target's memory."
    Options = ExceedsDeviceMemoryOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        if ctx.per_device is None:
            raise RuleSkipped("no per-device (partitioned or optimized) snapshot")
        if target_for(ctx) is None:  # judged before anything is measured: nothing to hold the peak against
            raise RuleSkipped("the target's memory is unknown (--hardware NAME)")
        memory = memory_of(ctx)
        if memory is None or memory.target is None:
            raise RuleSkipped("no per-device module to measure")
        if memory.peak_bytes <= memory.target.hbm_bytes:
            return
        yield self._finding(ctx, memory)

    def _finding(self, ctx: RuleContext, memory: ModuleMemory) -> Finding:
        target = memory.target
        assert target is not None
        over = memory.peak_bytes - target.hbm_bytes
        largest = [i for i in memory.items if i.bytes > 0][: self.options.largest_items]
        named = ", ".join(f"{item.name} ({item.cls}, {format_bytes(item.bytes)})" for item in largest)
        classes = ", ".join(f"{cls} {format_bytes(size)}"
                            for cls, size in sorted(memory.classes.items(), key=lambda kv: -kv[1])[:4])
        source = _SOURCES.get(memory.peak_source, "estimated from live ranges")
        message = (f"the step needs {format_bytes(memory.peak_bytes)} per device ({source}) but a {target.hardware} "
                   f"device has {format_bytes(target.hbm_bytes)}: {format_bytes(over)} over. "
                   f"By class: {classes}; largest items: {named}")
        change = _sharding_change(ctx, memory)
        anchor_number = next((i.parameter for i in memory.items if i.parameter is not None), None)
        evidence = {
            "peak_bytes": memory.peak_bytes,
            "peak_source": memory.peak_source,
            "hbm_bytes": target.hbm_bytes,
            "over_bytes": over,
            **{f"class_{cls}_bytes": size for cls, size in memory.classes.items()},
        }
        if change is not None:
            biggest = max(change.parameters, key=lambda p: p.global_bytes)
            anchor_number = biggest.number
            order = ctx.mesh.axis_names if ctx.mesh is not None else ()
            axes = tuple(sorted((*change.sharded_over, *change.axes),
                                key=lambda a: order.index(a) if a in order else len(order)))
            spec: list = [None] * len(biggest.dims)
            dim = next((d for d, t in enumerate(biggest.tiles) if t > 1), 0)
            spec[dim] = axes
            jax_code, torch_code = parameter_code(spec, "<each weight and optimizer-state array>")
            fits = memory.peak_bytes - change.freed <= target.hbm_bytes
            message += (f". Sharding the {len(change.parameters)} weights and optimizer-state arrays replicated over "
                        f"{', '.join(repr(a) for a in change.axes)} over that axis too frees "
                        f"{format_bytes(change.freed)} per device"
                        + (" and the step fits" if fits else ", not enough on its own"))
            summary = (f"Shard the weights and the optimizer state over {'/'.join(axes)} (now "
                       f"{'/'.join(change.sharded_over) or 'nothing'}), so each device keeps a "
                       f"1/{_product(ctx, axes)} share.")
            suggestion = Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code)
            evidence["bytes_freed_by_sharding"] = change.freed
        else:
            suggestion = Suggestion(
                summary="Nothing large is replicated: free activations (jax.checkpoint on the layers, a smaller "
                        "per-device batch) or pick a target with more memory.",
                no_edit="which layer to rematerialize or how far to cut the batch is the user's choice")
        anchor = parameter_instruction(ctx, anchor_number)
        return self.finding(ctx, message, instruction=anchor, suggestion=suggestion, evidence=evidence)


def _product(ctx: RuleContext, axes: tuple[str, ...]) -> int:
    mesh = ctx.mesh
    total = 1
    for axis in axes:
        try:
            total *= mesh.axis_size(axis) if mesh is not None else 1
        except (KeyError, ValueError):
            pass
    return total


def _sharding_change(ctx: RuleContext, memory: ModuleMemory) -> _Change | None:
    """The mesh axes over which the most weight and optimizer-state bytes are replicated, and what
    sharding them there too frees per device."""
    layouts = parameter_layouts(ctx)
    by_axes: dict[tuple[tuple[str, ...], tuple[str, ...]], list[ParameterLayout]] = {}
    held = {i.parameter for i in memory.items if i.cls in _STATE and i.parameter is not None}
    for number in held:
        lay = layouts.get(number)
        if lay is None or not lay.replicated_over or lay.sharded_over is None:
            continue
        by_axes.setdefault((lay.replicated_over, lay.sharded_over), []).append(lay)
    best: _Change | None = None
    for (axes, sharded), group in by_axes.items():
        factor = _product(ctx, axes)
        if factor <= 1:
            continue
        freed = sum(lay.bytes_per_device - lay.bytes_per_device // factor for lay in group)
        if best is None or freed > best.freed:
            best = _Change(axes, sharded, freed, tuple(group))
    return best if best is not None and best.freed > 0 else None
