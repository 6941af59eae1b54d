"""replicated-optimizer-state: optimizer state kept whole on devices that share its weight's work."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.program.suggest import parameter_code
from hlo_doctor.rules._memory import ParameterLayout, parameter_classes, parameter_instruction, parameter_layouts
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.units import format_bytes


@dataclass(frozen=True, slots=True)
class ReplicatedOptimizerStateOptions:
    min_bytes: int = 1024 * 1024
    """Only when the bytes sharding the state would free per device are at least this many."""


class ReplicatedOptimizerState(Rule):
    """Optimizer state (an optimizer's moments) is split fewer ways than the weights it updates.

    **What it finds**

    A training step whose optimizer state is kept more whole than its
    weights: each state array (a parameter the step updates that reaches no
    matmul, reduction or collective: it only updates itself and its weight,
    like Adam's moments; decided from the dataflow by the analysis layer) is
    compared with the weights of the same global shape. When the weights are
    split ``k`` ways and the state fewer, every device keeps more of the
    state than of the weight it updates; the finding gives the bytes per
    device sharding the state like its weights would free. Also found: a
    data-parallel step whose weights and state are all replicated while its
    batch is split, as information (plain data parallelism is a choice, not a
    mistake; sharding the state costs an all-gather of the updated weights
    every step): the state could be sharded over the data axis (ZeRO-1),
    since each device updates its weights from the same reduced gradients.

    **Why it hurts**

    Adam keeps two moments per weight, in f32: twice the weights' memory.
    Kept whole on every device while the weights are sharded, the state
    costs ``n/2`` times the sharded weights on ``n`` devices, the largest
    class of the peak, without any communication to show for it.

    **Example**

    ```
    %param.3 = f32[1024,256]{1,0} parameter(3), sharding={devices=[4,1]<=[4]}   // embed: split 4 ways
    %param.17 = f32[1024,256]{1,0} parameter(17), sharding={replicated}        // mu['embed']: whole
    ```

    **Fix**

    Give each moment its weight's sharding where the state is made (with
    optax: jit the optimizer's ``init`` with the weights' shardings as
    ``out_shardings``, or ``jax.device_put`` the state like the weights):

    ```python
    # JAX
    mu = jax.tree.map(lambda m, p: jax.device_put(m, p.sharding), mu, params)
    # torch_xla
    xs.mark_sharding(moment, mesh, ('fsdp', None))
    ```

    **Options**

    * ``min_bytes`` (int, default 1048576): only when sharding the state
      frees at least this many bytes per device.
    """

    id = "replicated-optimizer-state"
    cause_rank = 30
    severity = Severity.WARNING
    reads = frozenset({"per_device", "sharded"})
    summary = "Optimizer state is split fewer ways than the weights it updates (or not at all)."
    Options = ReplicatedOptimizerStateOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        if ctx.per_device is None or ctx.global_parameter_shapes is None:
            raise RuleSkipped("no partitioned snapshot with the global parameter shapes")
        if ctx.num_partitions <= 1:
            return
        classes = parameter_classes(ctx)
        state = [n for n, c in classes.items() if c == "optimizer_state"]
        if not state:
            return
        layouts = parameter_layouts(ctx)
        weights = [layouts[n] for n, c in classes.items() if c == "weights" and n in layouts]
        shards_by_dims: dict[tuple[int, ...], int] = {}
        for weight in weights:
            # the fewest ways any weight of a shape is split: a state array is judged against the
            # weight it may update, and when one weight of its shape is left whole (its own, say),
            # the state kept whole with it is that weight's matter (replicated-large-parameter)
            shards_by_dims[weight.dims] = min(shards_by_dims.get(weight.dims, weight.shards), weight.shards)
        behind: list[tuple[ParameterLayout, int]] = []
        for number in state:
            lay = layouts.get(number)
            if lay is None:
                continue
            wanted = shards_by_dims.get(lay.dims)
            if wanted is not None and wanted > lay.shards:
                behind.append((lay, wanted))
        kind = "sharded-weights"
        if not behind:
            behind = self._zero1(ctx, classes, layouts, state, weights)
            kind = "data-parallel"
        freed = sum(lay.bytes_per_device - lay.global_bytes // wanted for lay, wanted in behind)
        if not behind or freed < self.options.min_bytes:
            return
        yield self._finding(ctx, behind, freed, kind)

    @staticmethod
    def _zero1(ctx: RuleContext, classes, layouts, state, weights) -> list[tuple[ParameterLayout, int]]:  # noqa: ANN001
        """A data-parallel step: every weight and state array replicated, the data split."""
        data = [layouts[n] for n, c in classes.items() if c == "inputs" and n in layouts and layouts[n].dims]
        if not weights or any(w.shards > 1 for w in weights) or not any(d.shards > 1 for d in data):
            return []
        ways = max(d.shards for d in data)
        found = []
        for number in state:
            lay = layouts.get(number)
            if lay is not None and lay.shards == 1 and any(size % ways == 0 for size in lay.dims):
                found.append((lay, ways))
        return found

    def _finding(self, ctx: RuleContext, behind: list[tuple[ParameterLayout, int]], freed: int, kind: str) -> Finding:
        names = ctx.argument_names
        behind.sort(key=lambda item: (-item[0].bytes_per_device, item[0].number))
        largest, wanted = behind[0]
        held = sum(lay.bytes_per_device for lay, _ in behind)
        listed = ", ".join(names.get(lay.number, f"parameter {lay.number}") for lay, _ in behind[:3])
        more = f" and {len(behind) - 3} more" if len(behind) > 3 else ""
        if kind == "sharded-weights":
            message = (f"{len(behind)} optimizer-state arrays ({listed}{more}) are split at most {largest.shards} "
                       f"way(s) while the weights of their shapes are split {wanted} ways: each device keeps "
                       f"{format_bytes(held)} of optimizer state; sharded like the weights it would keep "
                       f"{format_bytes(held - freed)} ({format_bytes(freed)} freed per device)")
        else:
            message = (f"data-parallel step: its {len(behind)} optimizer-state arrays ({listed}{more}) are replicated "
                       f"on all {ctx.num_partitions} devices ({format_bytes(held)} on each device) while the batch is split "
                       f"{wanted} ways; sharding the state over the data axis (ZeRO-1) frees {format_bytes(freed)} "
                       "per device")
        spec: list = [None] * len(largest.dims)
        weight_axes = self._weight_axes(ctx, largest, wanted)
        dim = next((d for d, size in enumerate(largest.dims) if size % wanted == 0), 0)
        spec[dim] = weight_axes
        jax_code, torch_code = parameter_code(spec, names.get(largest.number, "<optimizer-state array>").split("[")[0]
                                              if kind == "data-parallel" else "<each optimizer-state array>")
        if kind == "sharded-weights":
            jax_code = ("# give every moment its weight's sharding (where the state is made)\n"
                        "<optimizer state> = jax.tree.map(lambda m, p: jax.device_put(m, p.sharding), "
                        "<optimizer state>, <weights>)")
        summary = ("Shard the optimizer state like the weights it updates."
                   if kind == "sharded-weights" else "Shard the optimizer state over the data axis (ZeRO-1).")
        # every other array of the state has the same cause and the same fix: folded into this finding
        # (so a replicated-large-parameter finding on one of them is its symptom, not a second finding)
        others = [(lay, parameter_instruction(ctx, lay.number)) for lay, _ in behind[1:]]
        same_fix = [{"instruction": instruction.name, "source_line": None,
                     "message": f"optimizer-state array {names.get(lay.number, instruction.name)} "
                                f"({format_bytes(lay.bytes_per_device)} per device)"}
                    for lay, instruction in others if instruction is not None]
        return self.finding(
            ctx, message, instruction=parameter_instruction(ctx, largest.number),
            # plain data parallelism is a layout of its own, not a mistake: sharding its state is a
            # saving to weigh (ZeRO-1 adds a gather of the updated weights), told as information
            severity=Severity.INFO if kind == "data-parallel" else None,
            related=tuple(entry["instruction"] for entry in same_fix),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code),
            evidence={"optimizer_state_bytes_per_device": held, "bytes_freed_per_device": freed,
                      "arrays": len(behind), "weight_shards": wanted, "state_shards": largest.shards,
                      "same_fix": same_fix},
        )

    @staticmethod
    def _weight_axes(ctx: RuleContext, state: ParameterLayout, wanted: int) -> tuple[str, ...]:
        mesh = ctx.mesh
        axes = mesh.axes_for(wanted) if mesh is not None else None
        return tuple(axes) if axes else (f"<axis of size {wanted}>",)
