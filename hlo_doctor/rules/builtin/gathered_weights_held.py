"""gathered-weights-held: FSDP-gathered weights of many layers alive at once at the peak."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.hlo.ir import HloModule
from hlo_doctor.memory import MemoryItem
from hlo_doctor.memory.values import is_view
from hlo_doctor.rules._memory import memory_of
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.units import format_bytes


@dataclass(frozen=True, slots=True)
class GatheredWeightsHeldOptions:
    min_gathers: int = 4
    """Only when at least this many gathered weights are kept for the backward at the peak."""
    min_share: float = 0.25
    """Only when those hold at least this share of the peak."""


class GatheredWeightsHeld(Rule):
    """FSDP-gathered weights of many layers are alive at once at the peak, so FSDP's saving is lost.

    **What it finds**

    In a module compiled for a GPU or a TPU (a CPU compile schedules for the
    host, so its live ranges say nothing about the device's scheduler), at
    the step's peak (XLA's buffer assignment where the dump has it, else
    the estimate of ``hlo-doctor memory``), the values made by all-gathers
    of weights only (and their casts), decided from the dataflow: several
    of them alive at once, of which at least ``min_gathers`` are **saved for
    the backward** (used both before the peak, in the forward, and after it: the
    backward's matmuls need the weight), holding at least ``min_share`` of
    the peak. It reports the bytes held against the largest single gather
    (about one layer's weight), and what keeps them: saved for the backward,
    or **scheduled early** (a gathered weight that waits for its first use
    while several others are gathered). Gathers that are only scheduled
    early are not reported on their own: their lever, the scheduler's memory
    limit, is not verified on a fixture yet.

    **Why it hurts**

    FSDP keeps ``1/n`` of each weight per device and gathers a layer's
    weights just before the layer needs them, so only a layer or two are
    whole at any time. When autodiff saves every layer's gathered copy for
    the backward, all of them are whole at once: the memory a gathered model
    needs, on every device, at the peak.

    **Example**

    ```
    %all-gather-start.3 = (f32[256,16384], bf16[4096,16384]) all-gather-start(%convert.12), replica_groups=[1,16]<=[16], dimensions={0}
    // used by the forward's matmul and, after the loss, by the backward's: alive across the peak
    ```

    **Fix**

    Rematerialize the layers with a ``jax.checkpoint`` policy that does not
    save the gathered weights, so the backward gathers them again (the fixed
    twin of this rule's fixture: its peak drops and the weights are gathered
    twice). In a program with a remat setting, turn it on for the layers.
    Gathers that are only scheduled early need the scheduler's memory limit
    (an XLA flag), which this rule does not print until a fixture verifies it.

    ```python
    # JAX
    layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable)
    # torch_xla
    from torch_xla.distributed.fsdp import checkpoint_module
    layer = checkpoint_module(layer)
    ```

    **Options**

    * ``min_gathers`` (int, default 4): how many gathered weights must be
      kept for the backward at the peak.
    * ``min_share`` (float, default 0.25): the share of the peak those must hold.
    """

    id = "gathered-weights-held"
    cause_rank = 45
    severity = Severity.WARNING
    reads = frozenset({"per_device"})
    summary = "FSDP-gathered weights of many layers are alive at once at the peak."
    Options = GatheredWeightsHeldOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        if ctx.per_device is None:
            raise RuleSkipped("no per-device (partitioned or optimized) snapshot")
        if ctx.module.platform not in ("gpu", "tpu"):
            # a CPU compile schedules for the host (it hoists every gather to the top): its live
            # ranges say nothing about the GPU's or TPU's scheduler
            raise RuleSkipped("not compiled for a GPU or TPU (hlo-doctor run --target)")
        memory = memory_of(ctx)
        if memory is None or memory.peak_bytes <= 0:
            return
        gathered = [i for i in memory.items if i.cls == "gathered_weights" and i.instruction]
        held = sum(i.bytes for i in gathered)
        module = ctx.after_optimizations or ctx.per_device
        saved, early = _what_keeps(module, gathered)
        # reported when enough of them are kept for the backward: the lever for that (remat) is
        # verified on this rule's fixture; gathers that are only scheduled early are named in the
        # message, their lever (the scheduler's memory limit) is not verified yet
        kept = sum(i.bytes for i in saved)
        if len(saved) < self.options.min_gathers or kept < self.options.min_share * memory.peak_bytes:
            return
        yield self._finding(ctx, module, memory.peak_bytes, memory.peak_source, gathered, held, saved, early)

    def _finding(self, ctx, module, peak, source, gathered, held, saved, early) -> Finding:  # noqa: ANN001
        largest = max(gathered, key=lambda i: i.bytes)
        reason = []
        if saved:
            reason.append(f"{len(saved)} saved from the forward for the backward "
                          f"({format_bytes(sum(i.bytes for i in saved))})")
        if early:
            reason.append(f"{len(early)} gathered ahead of their first use "
                          f"({format_bytes(sum(i.bytes for i in early))})")
        message = (f"{len(gathered)} buffers of gathered weights ({format_bytes(held)}, {held / peak:.0%} of the "
                   f"{format_bytes(peak)} peak) are alive at once at the peak, "
                   f"{held / largest.bytes:.1f}x the largest single gather ({format_bytes(largest.bytes)}): "
                   + "; ".join(reason))
        if saved:
            suggestion = Suggestion(
                summary="Rematerialize the layers so the backward gathers their weights again: a jax.checkpoint "
                        "policy that does not save the gathered weights (or the program's remat setting).",
                jax="<layer function> = jax.checkpoint(<layer function>, "
                    "policy=jax.checkpoint_policies.nothing_saveable)",
                torch_xla="from torch_xla.distributed.fsdp import checkpoint_module\n"
                          "<layer> = checkpoint_module(<layer>)",
            )
        else:
            suggestion = Suggestion(
                summary="Limit how far ahead the scheduler starts the weight gathers (its memory limit).",
                no_edit="the scheduler's memory limit is an XLA flag of the launch, not a line of the program")
        entry = module.entry if module is not None else None
        anchor = entry.get(largest.instruction) if entry is not None else None
        first = saved[0] if saved else early[0]
        return self.finding(
            ctx, message, instruction=anchor,
            related=tuple(i.instruction for i in gathered[:8] if i.instruction and i is not largest),
            source_from=entry.get(first.instruction) if entry is not None else None,
            suggestion=suggestion,
            evidence={"gathered_bytes": held, "gathers": len(gathered), "largest_gather_bytes": largest.bytes,
                      "peak_bytes": peak, "peak_source": source,
                      "saved_for_backward": len(saved), "scheduled_early": len(early)},
        )


def _what_keeps(module: HloModule | None, gathered: list[MemoryItem]) -> tuple[list[MemoryItem], list[MemoryItem]]:
    """Which gathered values are used both before and after the peak (saved for the backward) and
    which are first used after it (gathered early), in the module's order."""
    entry = module.entry if module is not None else None
    if entry is None:
        return [], []
    position = {i.name: n for n, i in enumerate(entry.instructions)}
    users = entry.users()
    peak = max((position.get(i.instruction or "", -1) for i in gathered), default=-1)

    def uses(name: str) -> list[int]:
        found, stack, seen = [], [name], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            for user in users.get(current, ()):
                if is_view(user) or user.opcode == "convert":
                    stack.append(user.name)
                else:
                    found.append(position[user.name])
        return found

    # the peak is after every gathered value is defined: a value used both before and after that
    # point is kept from the forward for the backward; one that waits for its first use while
    # several other weights are gathered was gathered ahead of its turn
    spans = {}
    for item in gathered:
        at = uses(item.instruction or "")
        if at:
            spans[item.instruction] = (position.get(item.instruction or "", -1), min(at), max(at))
    saved, early = [], []
    for item in gathered:
        span = spans.get(item.instruction)
        if span is None:
            continue
        defined, first, last = span
        if first < peak < last:
            saved.append(item)
        elif sum(1 for d, _, _ in spans.values() if defined < d < first) >= 2:
            early.append(item)
    return saved, early
