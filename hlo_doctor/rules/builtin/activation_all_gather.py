"""activation-all-gather: an all-gather of activations where FSDP expects only weight all-gathers."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.graph.collectives import Collective, Form
from hlo_doctor.graph.dataflow import NodeKey
from hlo_doctor.graph.sharding import tiles_per_dim
from hlo_doctor.hlo.ir import Instruction, ShardingKind
from hlo_doctor.program.library_levers import at_flax_rules
from hlo_doctor.program.suggest import constraint_code, constraint_edit, with_user_variable
from hlo_doctor.rules._batch import (
    BatchAnalysis,
    axes_text,
    batch_axes,
    parameter_name,
    with_torch_source,
)
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics.opclasses import MATMULS
from hlo_doctor.units import format_bytes

_DOTS = MATMULS


@dataclass(frozen=True, slots=True)
class ActivationAllGatherOptions:
    min_bytes: int = 0
    """Only all-gathers whose result is at least this many bytes per device are flagged."""


class ActivationAllGather(Rule):
    """An all-gather of an activation (data derived from the batch input) that feeds a layer's matmul.

    **What it finds**

    In the partitioned (per-device) program, an all-gather in any form
    (``all-gather``, ``all-gather-start``/``-done``, an async-wrapped
    all-gather) whose operand is an *activation*, a value derived from the
    batch-sharded program input that still carries its batch dimension, and
    whose result feeds a dot or convolution whose other operand is a weight
    (derived from parameters only, not from the batch input). Two shapes of
    the pattern are reported:

    * **batch**: the all-gather gathers the activation along its batch
      dimension: every device receives the whole batch;
    * **feature**: the activation's batch is already whole on every device
      and the all-gather re-gathers it along a feature dimension.

    The batch input is the entry parameter whose sharding splits dim 0 and
    whose dim 0 reaches a dot as a free dim of the lhs; its batch dim is
    followed through dots, elementwise ops, broadcasts, reshapes and
    transposes (in a torch_xla training step the ``buffer_donor`` weights are
    never batch inputs). Weight all-gathers (FSDP's normal traffic) and
    tensor-parallel collectives are never reported.

    The severity is *warning*: the program computes the right result, but
    each device does the work of the whole batch for that layer and moves
    activations, which grow with the batch, instead of weights, which do not.

    **Why it hurts**

    Data parallelism is lost for the layer: every device runs the matmul on
    the whole batch (the per-device FLOPs of that layer grow by the number of
    devices in the group) and the all-gather's bytes scale with the batch
    size. Gathering the (sharded) weight instead, as FSDP intends, keeps each
    device on its own batch shard. The usual cause is that sharding
    propagation let the weight's sharding decide the layout of a layer's
    output (pytorch/xla#6778).

    **Example**

    ```
    %param = f32[40,1280] parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
    %all-gather = f32[160,1280] all-gather(%param), dimensions={0}
    %dot = f32[160,240] dot(%all-gather, %transpose.4), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    %all-gather.1 = f32[160,960] all-gather(%add.19), dimensions={1}
    ```

    **Fix**

    Constrain the layer's output (the hidden activation) to stay
    batch-sharded, with the axes the input batch is sharded over; the
    partitioner then all-gathers the weight instead. The constraint is
    written at the line that makes the value it constrains: the consuming
    matmul's line for a gather of the batch, the gathered activation's line
    for a feature re-gather. In the backward pass of a JAX step the
    consuming matmul carries the line of the forward op it differentiates,
    and that line assigns the forward value: the fix constrains that value
    (its rank and batch dim from the line's forward matmul), whose gradient
    JAX constrains the same way.

    ```python
    # JAX
    h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(('fsdp', 'replica'), None)))
    # torch_xla
    xs.mark_sharding(h, mesh, (('fsdp', 'replica'), None))
    ```

    **Options**

    * ``min_bytes`` (int, default 0): only flag all-gathers whose result is
      at least this many bytes per device.
    """

    id = "activation-all-gather"
    cause_rank = 30
    severity = Severity.WARNING
    reads = frozenset({"per_device"})
    summary = "An all-gather gathers an activation (batch-derived data) instead of a weight."
    Options = ActivationAllGatherOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.per_device
        graph = ctx.graph
        if module is None or graph is None:
            raise RuleSkipped("no per-device snapshot (after partitioning or after optimizations)")
        if ctx.num_partitions <= 1:
            return
        gathers = [c for c in ctx.collectives if c.kind == "all-gather" and c.dimension is not None]
        if not gathers:
            return
        analysis = ctx.semantics.batch  # the batch dims of every data input, from the analysis layer
        if analysis is None or not analysis.batch_inputs:
            return
        semantics = ctx.semantics
        self._forward_lines: dict[tuple[str, int], list[int]] | None = None  # made on the first backward gather
        for collective in gathers:
            if collective.bytes_out_per_device < self.options.min_bytes:
                continue
            role = semantics.role_of(collective.computation, collective.instruction)
            if role is not None and role.role != "activation-gather":
                continue  # a weight gather, a reshard, index or scalar traffic: not this pattern
            finding = self._check_gather(ctx, analysis, collective)
            if finding is not None:
                yield finding

    def _lever(self, ctx: RuleContext, analysis: BatchAnalysis, collective: Collective, dot: Instruction,
               kind: str, param: int) -> tuple[Instruction, int] | None:
        """For a gather of the batch in the backward pass of a JAX step: the forward value of the
        consuming matmul's line (whose line the finding takes) and its batch dim, or None.

        JAX writes a backward matmul with the line of the forward op it differentiates; that line
        assigns the forward value, not the matmul's output. The forward value is the matmul of that
        line in the forward pass (the ancestors of the loss) whose result carries the batch input's dim.
        """
        if kind != "batch" or ctx.framework != "jax":
            return None
        role = ctx.semantics.role_of(collective.computation, collective.instruction)
        line = ctx.user_source(dot)[0]
        graph = ctx.semantics.view.graph
        if role is None or role.phase != "backward" or line is None or graph is None:
            return None
        if self._forward_lines is None:  # the forward pass's matmuls by their user line, once per module
            self._forward_lines = {}
            for node in sorted(ctx.semantics.forward_nodes):
                instruction = graph.instruction_at[node]
                if instruction.opcode in _DOTS and not instruction.shape.is_tuple:
                    source = ctx.user_source(instruction)[0]
                    if source is not None:
                        self._forward_lines.setdefault((source.file, source.line), []).append(node)
        found: dict[tuple[int, int], Instruction] = {}
        for node in self._forward_lines.get((line.file, line.line), ()):
            instruction = graph.instruction_at[node]
            dims = [d for d, p in analysis.batch_dims(graph.keys[node]).items() if p == param]
            if len(dims) == 1:
                found.setdefault((instruction.shape.rank, dims[0]), instruction)
        if len(found) != 1:
            return None  # no forward matmul on the line, or several layouts: the value is not known
        ((_, batch_dim), value), = found.items()
        return value, batch_dim

    def _check_gather(self, ctx: RuleContext, analysis: BatchAnalysis, collective: Collective) -> Finding | None:
        graph = analysis.graph
        start = graph.instruction((collective.computation, collective.instruction))
        if not start.operands:
            return None
        operand_key = (collective.computation, start.operands[0])
        if operand_key not in graph:
            return None
        batch = analysis.batch_dims(operand_key)
        if not batch:
            return None  # not an activation: a weight, or data not derived from the batch input
        gathered = collective.dimension
        if gathered in batch:
            kind, batch_dim = "batch", gathered
        else:
            batch_dim = next((d for d, p in batch.items() if analysis.batch_replicated(operand_key, d, p)), None)
            if batch_dim is None:
                return None  # the batch stays sharded: e.g. a tensor-parallel gather, batch parallelism kept
            kind = "feature"
        param = batch[batch_dim]
        result_key = (collective.computation, collective.done) if collective.done else (
            collective.computation, collective.instruction)
        found = _consuming_dot(analysis, result_key)
        if found is None:
            return None
        dot_key, weight_key = found
        dot = graph.instruction(dot_key)
        weight_params = sorted(graph.entry_parameters(weight_key) - analysis.batch_inputs)
        if not weight_params:
            return None
        return self._finding(ctx, analysis, collective, start, operand_key, kind, batch_dim, param,
                             dot_key, dot, weight_key, weight_params)

    def _finding(self, ctx, analysis: BatchAnalysis, collective: Collective, start: Instruction,
                 operand_key: NodeKey, kind: str, batch_dim: int, param: int, dot_key: NodeKey,
                 dot: Instruction, weight_key: NodeKey, weight_params: list[int]) -> Finding:
        graph = analysis.graph
        operand = graph.instruction(operand_key)
        operand_name = parameter_name(ctx, operand, with_shape=False) if operand.opcode == "parameter" else operand.name
        result = graph.instruction((collective.computation, collective.done)) if collective.done else start
        out_shape = result.shape if not result.shape.is_tuple else result.shape.tuple_shapes[-1]
        batch_input = analysis.inputs[param]
        input_name = parameter_name(ctx, batch_input)
        weights = _weight_summary(ctx, analysis, weight_params)
        axes = batch_axes(ctx, analysis, param)
        group_axes = "/".join(collective.mesh_axes) if collective.mesh_axes else f"{collective.group_size} devices"
        if kind == "batch":
            what = (f"gathers the activation {operand_name} ({operand.shape}, derived from the batch input "
                    f"{input_name}) along its batch dimension {batch_dim}")
            # constrain the layer's output: the consuming dot's result, where the batch dim went
            target_dims = analysis.batch_dims(dot_key)
            target_key = dot_key
            target_batch = next((d for d, p in target_dims.items() if p == param), 0)
            if graph.instruction(dot_key).shape.rank != operand.shape.rank:
                # an optimized dot (split-K, batch dims added): write the spec in the input's layout
                target_key, target_batch = operand_key, batch_dim
        else:
            what = (f"re-gathers the hidden activation {operand_name} ({operand.shape}) on feature dimension "
                    f"{collective.dimension}; its batch dimension {batch_dim} (from the batch input {input_name}) "
                    "is already whole on every device")
            target_key, target_batch = operand_key, batch_dim
        target = graph.instruction(target_key)
        rank = target.shape.rank if not target.shape.is_tuple else 2
        spec: list = [None] * rank
        spec[min(target_batch, rank - 1)] = axes or (f"<axes of {input_name}'s batch>",)
        jax_code, torch_code = constraint_code(spec, "h")
        executions = ctx.semantics.executions.get(collective.computation)
        per_step = f", {executions.count} times a step" if executions is not None and executions.count > 1 else ""
        layers = _stacked_layers(ctx, graph.instruction(weight_key), weight_params)
        weight_wire = _weight_gather_bytes(weights["bytes"] // layers, collective.group_size)
        if weights["sharded"]:
            alternative = (
                f"gathering the weight {weights['names']} instead would send {format_bytes(weight_wire)} per device "
                f"(against {format_bytes(collective.wire_bytes_per_device)} for this gather), but a weight gather does "
                "not wait for the previous layer, so XLA can prefetch it behind compute, while this gather waits for "
                f"{operand_name} and sits on the critical path"
            )
        else:
            alternative = (f"the weight {weights['names']} is not sharded, so a batch-sharded {dot.name} "
                           "would need no communication at all")
        work = _repeated_work(ctx, analysis, dot, weight_key, weight_params, collective.group_size)
        message = (
            f"all-gather {collective.instruction} {what}: each device receives {out_shape} "
            f"({format_bytes(collective.bytes_out_per_device)}, {format_bytes(collective.wire_bytes_per_device)} over "
            f"the wire{per_step}) over {group_axes}, and {dot.name} {work}; {alternative}"
        )
        lever = self._lever(ctx, analysis, collective, dot, kind, param)
        if lever is not None:
            # the value the consuming matmul's line makes: in the backward pass, the forward value of
            # that line, whose gradient the matmul computes (a constraint holds for the gradient too)
            forward_value, forward_dim = lever
            source_from = forward_value
            spec = [None] * forward_value.shape.rank
            spec[forward_dim] = axes or (f"<axes of {input_name}'s batch>",)
            jax_code, torch_code = constraint_code(spec, "h")
            what_h = (f"h, the value this line makes in the forward pass ({forward_value.name}, "
                      f"{forward_value.shape}),")
        elif kind == "batch":
            what_h = f"h, the output of {dot.name} (the layer that reads the gathered {operand_name})"
        else:
            what_h = f"h ({operand_name}, the hidden activation {dot.name} reads)"
        summary = (
            f"Keep the activation batch-sharded over {axes_text(axes)}: constrain {what_h} to the batch "
            "input's sharding, so the partitioner all-gathers the weight instead."
        )
        if lever is not None:
            summary += (f" {dot.name}, which reads the gathered {operand_name}, is this line's backward matmul, "
                        "and JAX constrains the gradient of a constrained value the same way.")
        else:
            # the value the constraint is written for is the consuming matmul's output (or the gathered
            # operand): its line, when the dump names one, assigns that value
            anchor = dot if kind == "batch" else graph.instruction(operand_key)
            source_from = anchor if ctx.user_source(anchor)[0] is not None else (
                start if ctx.user_source(start)[0] is not None else dot)
        finding = self.finding(
            ctx,
            message,
            instruction=start,
            related=tuple(n for n in (collective.done, operand.name, dot.name, graph.instruction(weight_key).name,
                                      _producing_dot(graph, operand_key)) if n),
            source_from=source_from,
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code,
                                  edits=constraint_edit(spec, ctx.framework, "h")),
            evidence={
                "gather": kind,
                "form": collective.form.value,
                "dimension": collective.dimension,
                "batch_dim": batch_dim,
                "operand": operand.name,
                "operand_shape": str(operand.shape),
                "result_shape": str(out_shape),
                "bytes_in_per_device": collective.bytes_in_per_device,
                "bytes_out_per_device": collective.bytes_out_per_device,
                "wire_bytes_per_device": collective.wire_bytes_per_device,
                "group_size": collective.group_size,
                "mesh_axes": list(collective.mesh_axes or ()),
                "executions_per_step": executions.count if executions is not None else 1,
                "batch_input": input_name,
                "global_batch": analysis.global_batch[param],
                "batch_axes": list(axes or ()),
                "consuming_dot": dot.name,
                "weight": graph.instruction(weight_key).name,
                "weight_parameters": weights["names"],
                "weight_bytes": weights["bytes"],
                "weight_sharded": weights["sharded"],
                "weight_gather_wire_bytes_per_device": weight_wire,
                "repeats_work": work.startswith("repeats"),
                "async": collective.form is not Form.SYNC,
            },
        )
        finding = with_user_variable(with_torch_source(ctx, finding, analysis.module, dot), "h")
        return at_flax_rules(finding, ctx.dump.run_record, spec, ctx.framework, ctx.program_files)


def _consuming_dot(analysis: BatchAnalysis, start: NodeKey, limit: int = 64) -> tuple[NodeKey, NodeKey] | None:
    """The first dot/convolution the gathered value flows into, and its other (weight) operand."""
    graph = analysis.graph
    seen = {start}
    queue: deque[NodeKey] = deque([start])
    while queue and len(seen) < limit:
        key = queue.popleft()
        for target, _ in graph.consumers(key):
            if target in seen:
                continue
            seen.add(target)
            instruction = graph.instruction(target)
            if instruction.opcode in _DOTS and len(instruction.operands) >= 2:
                sides = [(target[0], o) for o in instruction.operands[:2]]
                mine = [s for s in sides if s in seen]
                others = [s for s in sides if s not in seen]
                if mine and others and not analysis.derives_from_batch(others[0]):
                    return target, others[0]
                continue  # activation x activation (attention) or a gradient: not this pattern
            queue.append(target)
    return None


def _weight_summary(ctx: RuleContext, analysis: BatchAnalysis, params: list[int]) -> dict:
    """Names, global bytes and whether any is sharded, of the weight parameters.

    Global shapes come from ``ctx.global_parameter_shapes`` (a header, not a parse), names and
    shardings from the per-device parameters, which keep both.
    """
    by_number = {}
    if analysis.module.entry is not None:
        for p in analysis.module.entry.parameters():
            by_number.setdefault(p.parameter_number, p)
    shapes = ctx.global_parameter_shapes
    names, total, sharded = [], 0, False
    for number in params:
        param = by_number.get(number)
        shape = shapes[number] if shapes is not None and number < len(shapes) else None
        if param is None or shape is None or shape.is_tuple or shape.rank == 0:
            continue
        names.append(parameter_name(ctx, param))
        total += shape.byte_size
        sharding = param.sharding
        if sharding is not None and sharding.kind is ShardingKind.TILED:
            try:
                sharded = sharded or any(t > 1 for t in tiles_per_dim(sharding, shape.rank))
            except ValueError:
                pass
    return {"names": ", ".join(names) or "?", "bytes": total, "sharded": sharded}


def _weight_gather_bytes(weight_bytes: int, group_size: int) -> int:
    """Ring wire bytes per device of all-gathering a weight of ``weight_bytes`` over ``group_size`` devices."""
    return (group_size - 1) * weight_bytes // max(group_size, 1)


def _repeated_work(ctx: RuleContext, analysis: BatchAnalysis, dot: Instruction, weight_key: NodeKey,
                   weight_params: list[int], group_size: int) -> str:
    """What the consuming matmul does with the whole batch, true to its per-device shapes.

    Every device repeats the work only when it also holds the whole weight; with a shard of
    the weight (column- or row-parallel) the FLOPs are split, not repeated.
    """
    shapes = ctx.global_parameter_shapes
    weight = analysis.graph.instruction(weight_key)
    full = sum(shapes[p].num_elements for p in weight_params
               if shapes is not None and p < len(shapes) and not shapes[p].is_tuple)
    full //= _stacked_layers(ctx, weight, weight_params)
    held = weight.shape.num_elements if not weight.shape.is_tuple else 0
    if full and held >= full:
        return (f"repeats the same work on every device of the group ({group_size}x the FLOPs of a batch-sharded "
                "layer): it multiplies the whole batch by the whole weight")
    fraction = f"{held / full:.0%} of" if full else "a shard of"
    return (f"multiplies the whole batch by {fraction} the weight on each device: the FLOPs are split, not "
            "repeated, but its output is sharded on a feature dim")


def _stacked_layers(ctx: RuleContext, weight: Instruction, params: list[int]) -> int:
    """Layers stacked in a scanned weight: its dim 0 when the matmul reads one layer (a rank less)."""
    shapes = ctx.global_parameter_shapes
    if shapes is None or len(params) != 1 or params[0] >= len(shapes) or weight.shape.is_tuple:
        return 1
    shape = shapes[params[0]]
    return shape.dims[0] if not shape.is_tuple and shape.rank == weight.shape.rank + 1 and shape.dims[0] else 1


def _producing_dot(graph, key: NodeKey, limit: int = 8) -> str | None:  # noqa: ANN001
    """The nearest matmul upstream of ``key`` (through elementwise ops), the layer that made the value."""
    seen = {key}
    queue: deque[NodeKey] = deque([key])
    while queue and len(seen) < limit * 4:
        current = queue.popleft()
        for source, _ in graph.producers(current):
            if source in seen:
                continue
            seen.add(source)
            instruction = graph.instruction(source)
            if instruction.opcode in _DOTS:
                return instruction.name
            if instruction.opcode not in ("parameter", "constant"):
                queue.append(source)
    return None
