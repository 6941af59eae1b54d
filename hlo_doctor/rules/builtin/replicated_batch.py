"""replicated-batch: the batch is not split over a mesh axis, so every device along it computes the same data."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.graph.dataflow import DataflowGraph
from hlo_doctor.graph.dots import dot_dims
from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.hlo.attr_sharding import parse_sharding
from hlo_doctor.hlo.ir import HloModule, Instruction, Sharding, ShardingKind, attribute_of_each
from hlo_doctor.program.suggest import constraint_code, jax_spec, python_identifier, torch_spec
from hlo_doctor.rules._batch import (
    activation_matmuls,
    batch_input,
    matmul_traffic_axes,
    paired_tensor_axes,
    parameter_name,
    with_torch_source,
)
from hlo_doctor.rules._batch_lever import at_batch_lever
from hlo_doctor.rules._lost_rows import asked_or_judged, partitioner_regroup, rows_repeated
from hlo_doctor.rules._regroup import regrouped_batch
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics import ACTIVATION_ROLES
from hlo_doctor.semantics.batch_dims import gathered_weight_dim
from hlo_doctor.semantics.opclasses import MATMULS
from hlo_doctor.semantics.parameters import EntryParameters
from hlo_doctor.units import format_bytes

_DOTS = MATMULS


@dataclass(frozen=True, slots=True)
class ReplicatedBatchOptions:
    min_redundant_fraction: float = 0.05
    """Fire when at least this share of the activation matmuls' FLOPs is repeated along an axis."""
    min_regrouped_fraction: float = 0.25
    """Fire for an axis the batch input is split over when at least this share of the activation
    matmuls' FLOPs repeats along it (the batch regrouped off it mid-graph)."""


@dataclass(frozen=True, slots=True)
class _Axis:
    name: str
    size: int
    flops: float  # activation matmul FLOPs repeated along the axis
    dots: tuple[tuple[str, Instruction], ...]  # (computation, matmul) repeated along it, largest first


class ReplicatedBatch(Rule):
    """The batch is not split over a mesh axis, so all the devices along it compute the same data.

    **What it finds**

    In the program after sharding propagation (global shapes, a sharding on
    every op), when the program shards something at all: a mesh axis of size
    > 1 that neither splits the batch dim of the data inputs nor the matmuls
    that compute on them. A matmul (dot or
    convolution) of activations repeats its work along an axis when its
    result is not split over that axis and no contracting dim of its
    operands is either: every device along the axis then multiplies the same
    rows by the same columns. The rule fires when such repeated matmuls are at
    least ``min_redundant_fraction`` of the activation matmuls' FLOPs.
    Which parameters are data (the batch, tokens, labels) and which are
    weights is decided by the analysis layer from the dataflow
    (:mod:`hlo_doctor.semantics.parameters`); axis names are never read.

    An axis that splits some of the activation matmuls is a tensor-parallel
    axis: when the batch is split over another axis, work repeated along a TP
    axis means those layers' weights are not split over it (that is
    ``replicated-large-parameter``), so the axis must repeat every activation
    matmul. What shows an axis splitting matmuls is traffic of their products
    over it (a feature-split output gathered, a partial sum reduced); a
    vocab-split embedding whose lookup is reduced over an axis splits the
    table, not the matmuls after it. When the batch is split over no axis at all (every weight marked,
    the inputs not: pytorch/xla#6778's first strategy), the share counts, and
    so do the activation all-gathers (the analysis layer's
    ``activation-gather`` roles) that put feature-split layer outputs back
    together over the weights' axes: each device then runs the whole batch
    against its slice of every weight and waits on a gather every layer.

    The batch can also leave an axis mid-graph: split over ('data', 'fsdp')
    at the input, then put on 'fsdp' alone by a sharding constraint (a
    ``with_sharding_constraint``, a ``mark_sharding``, FSDPv2's default
    ``shard_output``). When at least ``min_regrouped_fraction`` of the
    activation matmuls' FLOPs repeat along an axis the input is split over,
    the finding is at that constraint (the first one the batch reaches that
    leaves the axis out), its fix the constraint's spec with the batch dim on
    all the input's axes, and the activation traffic and reshards over the
    axis are folded into it as symptoms (the rows can move by an all-gather,
    or by a collective-permute or all-to-all that hands each device other
    rows). Propagation may split the ops after
    such a constraint again (a constraint that replicates the batch, the
    labels' split coming back from the loss), while the partitioner still
    gathers the rows for some matmul (a weight gradient over the whole
    batch): then the repeated work is read in the partitioned module, as the
    matmuls whose operands hold more rows of the batch per device than the
    batch input's shard; the program's constraint is the evidence of the
    regroup there, so ``min_redundant_fraction`` is the bar.

    No constraint of the program may regroup the batch, yet the partitioner
    gathers its rows on its own: propagation chose a layout that leaves the
    batch whole (a scan's carry split on its features because the weights
    inside are, a weight gradient over every row). When the matmuls whose
    operands hold more rows than the input's shard are at least
    ``min_regrouped_fraction`` of the activation matmuls' FLOPs per device,
    the finding is at the collective where the rows grow (an all-gather, or a
    collective-permute or all-to-all that hands each device other rows: the
    one that reaches the most of that work), its fix a constraint that keeps
    the batch dim split there; the activation traffic on the repeated rows
    is folded into it as symptoms.

    When the batch is split over no axis, the batch input must divide over
    the axes it would be split over (6 rows on 8 devices cannot): otherwise
    the work repeats by design (tensor parallelism of a small batch), and
    this rule's fix could not apply.

    A program that shards nothing at all on several devices (the batch input
    placed whole on the mesh, every weight replicated: a data-parallel step
    whose input was never sharded) repeats every matmul on every device and
    is reported too. It is silent on a single device, for manual
    (``shard_map``) computations, and for
    tensor parallelism: a TP axis splits the matmuls (heads, features,
    contracting dims), so no work repeats along it. An axis over which the
    forward pass runs column- and row-parallel pairs (a matmul's feature-split
    output summed by the next matmul, no collective between: Megatron's
    layout) is tensor parallel by design even when the batch is split over no
    axis: a small batch served whole by every device of it, whose sharded
    norms are gathered, is that design, not the weights-only marking of
    pytorch/xla#6778.

    **Why it hurts**

    "With FSDP, each device should process distinct data, so the global
    batch dimension must be sharded across all devices, both for inputs and
    activations" (pytorch/xla#6778). Along a replicating axis of size *n*
    the same tokens are computed *n* times: the step does 1/*n* of the useful
    work it could, while it still pays for the weight gathers and gradient
    reductions over that axis.

    **Example**

    ```
    // mesh ('data'=2, 'fsdp'=4); x: P('fsdp', None): 'data' splits nothing the matmuls compute
    %x = f32[64,512] parameter(0), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
    %dot = f32[64,2048] dot(%x, %w1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
    ```

    **Fix**

    Shard the batch over the combined axes: the data input (``in_shardings``,
    ``device_put``, ``mark_sharding``), and for FSDPv2 the wrapper's
    ``shard_output``. In JAX the traced function's argument is constrained as
    the function starts, and the program's own constraints that put the batch
    dim on fewer axes (the runner records them) are named: they split it again
    otherwise. In torch_xla the model's inputs are marked before the model is
    called (an input the program already marked is cleared first: torch_xla
    refuses a second mark), and every FSDPv2 wrapper gets a ``shard_output``.

    ```python
    # JAX
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(('data', 'fsdp'), None)))
    # torch_xla
    xs.mark_sharding(input_ids, mesh, (('replica', 'fsdp'), None))
    # FSDPv2: shard the outputs over both axes, not 'fsdp' alone
    def shard_output(output, mesh):
        real = output.logits if hasattr(output, 'logits') else output
        real = real[0] if isinstance(real, tuple) else real
        xs.mark_sharding(real, mesh, (('replica', 'fsdp'),) + (None,) * (real.dim() - 1))
    ```

    **Options**

    * ``min_redundant_fraction`` (float, default 0.05): the share of the
      activation matmuls' FLOPs that must repeat along an axis.
    * ``min_regrouped_fraction`` (float, default 0.25): the share that must
      repeat along an axis the batch input is split over (a mid-graph regroup).
    """

    id = "replicated-batch"
    cause_rank = 5
    severity = Severity.WARNING
    reads = frozenset({"sharded", "per_device"})
    summary = "The batch is not split over a mesh axis: every device along it computes the same data."
    Options = ReplicatedBatchOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        per_device = ctx.per_device
        if per_device is None or per_device.entry is None:
            raise RuleSkipped("no partitioned snapshot")
        mesh = ctx.mesh
        params = ctx.semantics.parameters
        if ctx.num_partitions <= 1 or mesh is None or params is None or not params.data:
            return
        # Entry parameters keep their (global) shardings after partitioning: the batch axes and
        # whether anything is sharded are read there, without parsing the propagated snapshot.
        used = _axes_in_use(per_device, mesh)
        # Nothing sharded at all (a replicated program on a mesh of devices, the batch input left
        # whole): every device computes every row, the redundancy at its largest.
        batch_axes = set(ctx.semantics.batch_split_axes)
        candidates = {a for a in mesh.axis_names if mesh.axis_size(a) > 1} - batch_axes
        if not used and (not candidates or not _main_step(ctx, per_device, params, mesh, candidates)):
            return
        if not batch_axes and used:
            found = self._gathered_instead(ctx, per_device, params, mesh, used)
            if found is not None:
                yield found
                return
        # An axis that carries tensor-parallel traffic (a matmul's product gathered or summed over
        # it) splits some activation matmul: it is not an axis along which every matmul repeats
        # (see the docstring). A vocab-split embedding's lookup reduced over an axis is not such
        # traffic: every matmul may still repeat along that axis.
        traffic = {a.split(":(")[0] for r in ctx.semantics.roles if r.role in ACTIVATION_ROLES
                   for a in r.facts.op.mesh_axes or ()}
        if batch_axes:
            candidates -= matmul_traffic_axes(ctx)
        # A regroup moves rows over the axis it takes the batch off (its symptom, not tensor
        # parallelism): an activation gather or reduction, or a reshard (a collective-permute or
        # all-to-all that hands each device other rows). Without such traffic over a batch axis
        # there is none to look for, and the propagated module (parsed in this process when the
        # rules are split) is not read.
        moved = traffic | {a.split(":(")[0] for r in ctx.semantics.roles if r.role == "reshard"
                           for a in r.facts.op.mesh_axes or ()}
        regroup_axes = batch_axes & moved
        if not candidates and not regroup_axes:
            return
        module = ctx.sharded
        if module is None or module.entry is None:
            raise RuleSkipped("no snapshot with propagated shardings (after propagation or before optimizations)")
        graph = ctx.sharded_graph
        assert graph is not None
        activation_flops, axes = _repeated_work(module, graph, params, mesh, candidates | regroup_axes)
        if activation_flops <= 0:
            return
        # An axis that splits some activation matmul is a tensor-parallel axis: work repeated along it
        # means those layers' weights are not split over it (replicated-large-parameter), not a lost
        # batch, unless the batch is split over no axis at all (weights marked, inputs not: the seed).
        replicating = [a for a in axes if a.name in candidates
                       and a.flops >= self.options.min_redundant_fraction * activation_flops
                       and (a.flops >= activation_flops * (1 - 1e-9) or not batch_axes)]
        if not batch_axes:
            # the batch split over no axis: only an axis it divides over could take it (4 rows on a
            # 16-device tensor-parallel axis repeat by design)
            rows = _batch_rows(per_device, params)
            replicating = [a for a in replicating if rows is not None and rows >= a.size and rows % a.size == 0]
            if replicating:
                # nor along an axis of column- and row-parallel pairs: tensor parallelism of the whole
                # batch by design (a matmul it leaves whole is a replicated weight's, not the batch's)
                paired = paired_tensor_axes(ctx, params)
                replicating = [a for a in replicating if a.name not in paired]
        if replicating:
            yield self._finding(ctx, module, params, mesh, batch_axes, replicating, activation_flops,
                                whole_program=not used)
            return
        # An axis the input is split over, along which much of the work repeats: regrouped mid-graph.
        regrouped = [a for a in axes if a.name in regroup_axes
                     and a.flops >= self.options.min_regrouped_fraction * activation_flops]
        if regrouped:
            batch = ctx.propagated_batch  # computed once, for this rule and any other that reads it
            assert batch is not None  # the module, its graph and the parameters are there
            found = regrouped_batch(self, ctx, module, graph, params, mesh, batch_axes,
                                    max(regrouped, key=lambda a: a.flops), activation_flops, batch)
            if found is not None:
                yield found
                return
        if not regroup_axes:
            return
        # Read where the work happens, in the partitioned module: the matmuls whose operands hold more
        # rows of the batch than the input's shard.
        repeated = rows_repeated(ctx, params)
        if not repeated.dots or repeated.repeated_flops < self.options.min_redundant_fraction * repeated.device_flops:
            return
        batch = ctx.propagated_batch
        assert batch is not None
        if not regrouped:
            # Propagation may split again what a constraint regrouped: the partitioned module's
            # matmuls then still gather the rows (a weight gradient over the whole batch).
            # The program's own constraint (regrouped_batch finds it, or reports nothing) is the
            # evidence of the regroup here: the repeated share need only pass the general bar.
            for axis in sorted(regroup_axes, key=lambda a: (-mesh.axis_size(a), a)):
                found = regrouped_batch(self, ctx, module, graph, params, mesh, batch_axes,
                                        _Axis(axis, mesh.axis_size(axis), repeated.repeated_flops, repeated.dots),
                                        repeated.device_flops, batch)
                if found is not None:
                    yield found
                    return
        # No constraint of the program's regroups the batch, yet the partitioner gathers its rows for
        # much of the work: where they grow is the finding (a propagated layout, not the program's). A
        # constraint of the program's that leaves the batch off an axis asks for those rows itself, and a
        # matmul that loses the batch is non-batch-dim-sharding's finding.
        if repeated.repeated_flops >= self.options.min_regrouped_fraction * repeated.device_flops \
                and not asked_or_judged(module, batch, mesh, batch_axes):
            found = partitioner_regroup(self, ctx, params, mesh, batch_axes, repeated)
            if found is not None:
                yield found

    def _gathered_instead(self, ctx: RuleContext, module: HloModule, params: EntryParameters, mesh: Mesh,
                          used: set[str]) -> Finding | None:
        """The batch split over no axis while the weights are: the layers' outputs are feature-sharded
        and gathered back every layer (the first strategy of pytorch/xla#6778)."""
        gathers = [r for r in ctx.semantics.roles if r.role == "activation-gather" and r.facts.op.mesh_axes]
        graph = ctx.semantics.view.graph
        if not gathers or graph is None:
            return None
        # some gather must put a layer's output back together on its feature dim (a dim of a weight): rows
        # or a sequence gathered are not the feature split this finding is about (they are its symptoms)
        on_features = gathered_weight_dim(module, graph, params.weights,
                                          [(r.facts.computation, r.facts.instruction) for r in gathers])
        if not any(on_features.values()):
            return None
        entry = module.entry
        weight_axes: set[str] = set()
        for param in entry.parameters() if entry is not None else ():
            if param.parameter_number in params.weights:
                weight_axes |= _axes_of(param.sharding, param, mesh)
        # an axis of column- and row-parallel pairs is tensor parallelism by design: the whole batch on
        # every device of it is that design's, and its gathers (sharded norms, the head) are not the
        # weights-only marking this finding is about
        paired = paired_tensor_axes(ctx, params)
        axes = tuple(a for a in mesh.axis_names if a in used and a in weight_axes and a not in paired and any(
            a in {x.split(":(")[0] for x in r.facts.op.mesh_axes or ()} for r in gathers))
        if not axes:
            return None
        batch_param = batch_input(module, params)
        if batch_param is None:
            return None
        rows = batch_param.shape.dims[0]
        factor = math.prod(mesh.axis_size(a) for a in axes)
        if rows < factor or rows % factor:
            # The batch cannot be split over those axes (6 rows on 8 devices): the layers' weights are
            # split by design (tensor parallelism), and the fix this finding gives could not be applied.
            return None
        wire = sum(r.facts.wire_bytes_per_step for r in gathers)
        input_name = parameter_name(ctx, batch_param, with_shape=False)  # the message prints its shape
        axes_text = "/".join(repr(a) for a in axes)
        largest = max(gathers, key=lambda r: r.facts.wire_bytes_per_step)
        message = (
            f"the batch is split over no mesh axis: every device computes all {rows} rows of the batch input "
            f"{input_name} ({batch_param.shape}) while the weights are sharded over {axes_text} ({factor} devices), "
            f"so the layers' outputs are split on feature dims and {len(gathers)} all-gathers put the activations "
            f"back together ({format_bytes(wire)} over the wire per device per step, each waiting on the layer "
            f"before it); the largest is {largest.facts.instruction}"
        )
        spec: list = [None] * batch_param.shape.rank
        spec[0] = axes
        variable = python_identifier(input_name, "batch")
        jax_code, torch_code = constraint_code(spec, variable)
        summary = (
            f"Shard the batch over {axes_text} as well (FSDP: each device its own {max(1, rows // factor)} rows): "
            "the partitioner then gathers the weights instead, which it can prefetch behind compute, and the "
            f"activation gathers go away; the weight gathers cost about the weights' size per step, and the weight "
            f"gradients are reduced over {axes_text}."
        )
        anchor = ctx.instruction(largest.facts.computation, largest.facts.instruction)
        finding = self.finding(
            ctx, message, instruction=anchor, name=largest.facts.instruction,
            related=tuple(r.facts.instruction for r in gathers if r is not largest),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code),
            evidence={
                "replicated_axes": list(axes),
                "redundancy_factor": factor,
                "batch_axes": [],
                "batch_input": input_name,
                "global_batch": rows,
                "rows_per_device": rows,
                "healthy_rows_per_device": max(1, rows // factor),
                "activation_gathers": len(gathers),
                "activation_gather_wire_bytes_per_step": wire,
            },
        )
        return at_batch_lever(ctx, finding, spec, variable, (), rows)

    def _finding(self, ctx: RuleContext, module: HloModule, params: EntryParameters, mesh: Mesh,
                 batch_axes: set[str], replicating: list[_Axis], activation_flops: float,
                 whole_program: bool = False) -> Finding:
        entry = module.entry
        assert entry is not None
        data = [p for p in entry.parameters() if p.parameter_number in params.data and not p.shape.is_tuple
                and p.shape.rank >= 1]
        data.sort(key=lambda p: -p.shape.byte_size)
        batch_input = data[0]
        rows = batch_input.shape.dims[0]
        split = math.prod(mesh.axis_size(a) for a in batch_axes) if batch_axes else 1
        factor = math.prod(a.size for a in replicating)
        names = [a.name for a in replicating]
        combined = tuple(a for a in mesh.axis_names if a in batch_axes or a in names)
        top_computation, top = max(replicating, key=lambda a: a.flops).dots[0]
        partitioned = ctx.partitioned_names([(top_computation, top.name)])
        share = sum(a.flops for a in replicating) / activation_flops / len(replicating)
        input_name = parameter_name(ctx, batch_input, with_shape=False)  # the message prints its shape
        axes_text = "/".join(repr(a) for a in names)
        message = (
            f"the batch is not split over mesh axis {axes_text} ({factor} devices) "
            + ("and nothing else is either (the whole program is replicated): " if whole_program
               else "while the program is sharded: ") +
            f"{share:.0%} of the matmul FLOPs on activations repeat along it, so the {factor} devices "
            f"along {axes_text} compute the same data; the batch input {input_name} ({batch_input.shape}) is "
            + (f"split {split} ways (over {'/'.join(repr(a) for a in sorted(batch_axes))})" if batch_axes
               else "whole on every device")
            + f", so each device's matmuls take {rows // split} of its {rows} rows where {max(1, rows // (split * factor))} "
            f"would do (e.g. {top.name} {top.shape})"
        )
        spec: list = [None] * batch_input.shape.rank
        spec[0] = combined
        variable = python_identifier(input_name, "batch")
        jax_code, torch_code = constraint_code(spec, variable)
        jax_code += (f"\n# or at the jit boundary: in_shardings=NamedSharding(mesh, {jax_spec(spec)}) for "
                     f"{variable}")
        if ctx.framework == "torch_xla":
            output_spec = [combined, None, None]
            torch_code += (
                "\n# FSDPv2: shard its outputs over the same axes\n"
                "def shard_output(output, mesh):\n"
                f"    xs.mark_sharding(output.logits, mesh, {torch_spec(output_spec)})\n"
                "model = FSDPv2(model, mesh=mesh, shard_output=shard_output)"
            )
        summary = (
            f"Shard the batch over {'/'.join(repr(a) for a in combined)} (the data input and, for FSDPv2, the "
            f"outputs): each device then computes 1/{factor} of today's rows and holds 1/{factor} of the "
            f"activations; in a training step the weight gradients are then also reduced over {axes_text} "
            "(one all-reduce of the gradients per step, which overlaps the backward pass)."
        )
        if mesh.is_inferred:
            summary += (f" The dump names no mesh axes: {', '.join(mesh.axis_names)} are positional names read "
                        "from the tile assignments; write your mesh's own.")
        finding = self.finding(
            ctx, message, instruction=top, name=partitioned.get((top_computation, top.name)), source_from=top,
            related=tuple(d.name for a in replicating for _, d in a.dots[1:6]),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code),
            evidence={
                "replicated_axes": names,
                "redundancy_factor": factor,
                "batch_axes": sorted(batch_axes),
                "batch_input": input_name,
                "global_batch": rows,
                "rows_per_device": rows // split,
                "healthy_rows_per_device": max(1, rows // (split * factor)),
                "repeated_flops_fraction": round(share, 4),
                "repeated_matmuls": sum(len(a.dots) for a in replicating),
                "activation_bytes_per_device": batch_input.shape.byte_size // split,
                "activation_bytes_per_device_if_split": batch_input.shape.byte_size // (split * factor),
                "bytes_saved_per_device": format_bytes(batch_input.shape.byte_size // split
                                                       - batch_input.shape.byte_size // (split * factor)),
            },
        )
        ordered = tuple(a for a in mesh.axis_names if a in batch_axes)
        return at_batch_lever(ctx, with_torch_source(ctx, finding, module, top), spec, variable, ordered, rows)


def _batch_rows(module: HloModule, params: EntryParameters) -> int | None:
    """Dim 0 of the batch input (its rows on each device)."""
    largest = batch_input(module, params)
    return largest.shape.dims[0] if largest is not None else None


def _main_step(ctx: RuleContext, module: HloModule, params: EntryParameters, mesh: Mesh,
               axes: set[str]) -> bool:
    """Whether a program that shards nothing is worth reporting: its batch input splits evenly over
    ``axes`` (a ``[1, S]`` position table or a batch of 1 could not be split), and it is the dump's
    largest module (frameworks compile small replicated helpers beside the step: torch_xla compiles
    every graph for all the devices of its SPMD mesh)."""
    rows = _batch_rows(module, params)
    if rows is None:
        return False
    ways = math.prod(mesh.axis_size(a) for a in axes)
    if rows < ways or rows % ways:
        return False
    return all(_text_bytes(other) <= _text_bytes(ctx.module) for other in ctx.dump.modules)


def _text_bytes(module) -> int:  # noqa: ANN001 - a DumpModule
    return sum(s.size for s in module.snapshots)


def _axes_in_use(module: HloModule, mesh: Mesh) -> set[str]:
    """Mesh axes (size > 1) that split some entry parameter or matmul."""
    found: set[str] = set()
    entry = module.entry
    candidates = list(entry.parameters()) if entry is not None else []
    candidates += [i for c in module.computations for i in c.instructions if i.opcode in _DOTS]
    # The matmuls of a deep model share a few (sharding, rank) pairs: each is read once. A sharding
    # is known by its object (one per text); the entry keeps it, so the id is never another's.
    judged: dict[tuple[int, int], tuple[Sharding, set[str]]] = {}
    for instruction, text in zip(candidates, attribute_of_each(candidates, "sharding"), strict=True):
        if text is None or instruction.shape.is_tuple:
            continue
        sharding = parse_sharding(text)  # instruction.sharding, its text read with the others'
        key = (id(sharding), instruction.shape.rank)
        entry_for = judged.get(key)
        if entry_for is None:
            entry_for = judged[key] = (sharding, _axes_of(sharding, instruction, mesh))
        found |= entry_for[1]
    return {a for a in found if mesh.axis_size(a) > 1}


def _axes_of(sharding: Sharding | None, instruction: Instruction, mesh: Mesh) -> set[str]:
    if sharding is None or sharding.kind is not ShardingKind.TILED or instruction.shape.is_tuple:
        return set()
    try:
        per_dim = dim_axes(sharding, instruction.shape.rank, mesh)
    except (ValueError, KeyError):
        return set()
    return {a.split(":(")[0] for dims in per_dim or () for a in dims}


def _repeated_work(module: HloModule, graph: DataflowGraph, params: EntryParameters, mesh: Mesh,
                   candidates: set[str]) -> tuple[float, list[_Axis]]:
    """The activation matmuls' FLOPs, and per candidate axis the FLOPs that repeat along it.

    A matmul with no sharding is replicated: Shardy writes no sharding on a replicated op (every
    op of a program that shards nothing, the weight-gradient dots of replicated weights)."""
    total = 0.0
    repeated: dict[str, list[tuple[float, str, Instruction]]] = {a: [] for a in candidates}
    for computation, dot, flops in activation_matmuls(module, graph, params):
        if dot.sharding is not None and dot.sharding.kind is ShardingKind.MANUAL:
            continue
        total += flops
        if not candidates:
            continue
        # no sharding on the result: replicated (Shardy writes none on a replicated op, such as the
        # weight-gradient dot of a replicated weight); its contracting dims may still be split
        result_axes = set() if dot.sharding is None else _axes_of(dot.sharding, dot, mesh)
        split = result_axes | _contracting_axes(dot, computation, mesh)
        for axis in candidates - split:
            repeated[axis].append((flops, computation.name, dot))
    axes = []
    for axis, dots in repeated.items():
        if dots:
            dots.sort(key=lambda d: (-d[0], d[2].name))
            axes.append(_Axis(axis, mesh.axis_size(axis), sum(f for f, _, _ in dots),
                              tuple((c, d) for _, c, d in dots)))
    return total, axes


def _contracting_axes(dot: Instruction, computation, mesh: Mesh) -> set[str]:  # noqa: ANN001
    """Axes that split a contracting dim of either operand (the work is split, the result summed)."""
    found: set[str] = set()
    operands = [computation.get(name) for name in dot.operands[:2]]
    if any(o is None or o.shape.is_tuple for o in operands):
        return found
    try:
        roles = dot_dims(dot, operands[0].shape.rank, operands[1].shape.rank)
    except (ValueError, KeyError, IndexError):
        return found
    for side, operand in enumerate(operands):
        sharding = operand.sharding
        if sharding is None or sharding.kind is not ShardingKind.TILED:
            continue
        try:
            per_dim = dim_axes(sharding, operand.shape.rank, mesh)
        except (ValueError, KeyError):
            continue
        for dim, axes in enumerate(per_dim or ()):
            if dim < len(roles.roles[side]) and roles.role(side, dim).role == "contracting":
                found |= {a.split(":(")[0] for a in axes}
    return found
