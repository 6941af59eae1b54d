"""non-batch-dim-sharding: a dot's activation output left batch-replicated and sharded on another dim."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from hlo_doctor.errors import ShardingError
from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.graph.mesh import dim_axes
from hlo_doctor.graph.source import module_path_of, user_frame
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.hlo.ir_metadata import SourceLocation, StackFrame
from hlo_doctor.program.levers import user_constraint_respec, with_lever
from hlo_doctor.program.library_levers import at_flax_rules
from hlo_doctor.program.module_hooks import forward_hook_lever
from hlo_doctor.program.records import sharding_call_of
from hlo_doctor.program.spec_sites import parse_spec_text
from hlo_doctor.program.suggest import (
    assigned_name,
    called_on,
    constraint_code,
    constraint_edit,
    jax_spec,
    mesh_expression,
    rename_value,
    torch_spec,
    with_user_variable,
)
from hlo_doctor.rules._batch import (
    BatchAnalysis,
    analyze_batch,
    axes_text,
    batch_axes,
    parameter_name,
    with_torch_source,
)
from hlo_doctor.rules._lost_at_boundary import boundary_finding
from hlo_doctor.rules._program_layouts import (
    batch_move,
    carry_losing_batch,
    dot_losing_batch,
    lookup_losing_batch,
    program_constraints,
    requested_batch_moves,
)
from hlo_doctor.rules._program_layouts import (
    tiles as dim_tiles,
)
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, SourceRef, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.rules.context import user_frame as context_user_frame
from hlo_doctor.semantics.batch_dims import weight_dims
from hlo_doctor.semantics.execution import execution_counts
from hlo_doctor.semantics.opclasses import MATMULS, NOT_ELEMENTWISE, RESHARD_COLLECTIVES
from hlo_doctor.semantics.parameters import updated_parameters

_DOTS = MATMULS


@dataclass(frozen=True, slots=True)
class NonBatchDimShardingOptions:
    min_bytes: int = 0
    """Only dot outputs of at least this many bytes (the whole value) are judged."""


class NonBatchDimSharding(Rule):
    """A dot's activation output has its batch dim replicated and another dim sharded, though its input was batch-sharded.

    **What it finds**

    After sharding propagation: a dot or convolution whose output is an
    activation (it carries the batch dimension of the batch-sharded program
    input) and whose sharding leaves that batch dimension unsplit while it
    splits a non-batch dimension (features, heads, sequence), *although the
    activation operand it reads is split along the batch*. Only the dot
    where the batch sharding is lost is reported, not every later dot that
    inherits the layout. The batch input and its batch dimension are found
    as in ``activation-all-gather``: the entry parameter with a sharded
    dim 0 that feeds a dot as the lhs with that dim free, followed through
    dots, elementwise ops, broadcasts, reshapes and transposes.

    The batch can also be lost on the operand side of a dot: the program's
    own constraint (``with_sharding_constraint``, ``mark_sharding``) takes
    an activation that arrives batch-sharded, leaves its batch dim unsplit
    and splits a feature dim (a dim that carries a weight's dim, not rows or
    a sequence) over an axis the batch input is split over, while
    propagation keeps the matmul before it batch-sharded. The partitioner
    then reshards at the constraint (an all-to-all) and the next matmul
    contracts the split features, summing partial products over those
    axes. That constraint is reported, with its spec rewritten: the batch
    dim on the input's axes, the features whole. Features split over an axis
    the batch is not split over are tensor parallelism, not this.

    The batch can also be lost at an embedding lookup: a ``gather`` from a
    table by batch-derived indices whose result splits the batch dim over
    fewer axes than the indices bring it in on, and another dim (the
    table's features) over the axes it dropped: propagation followed the
    table's sharding (an FSDP table split on ``d_model``). From there on
    each device holds more rows than its share, and the layers after it
    contract the split features as partial sums, with no weight gathered.
    The lookup is reported (after the matmuls, so a fix they share keeps a
    matmul's finding), its fix a constraint on its result with the
    indices' batch sharding. A loop's carry loses it the same way: a
    ``while`` (``lax.scan``) whose carry splits the batch dim over fewer axes
    than the carry's initial value, and the features over the dropped axes
    (propagation took the carry's layout from the body's weights); its fix
    is a constraint on the carry first in the scanned function, named by
    that function's parameter (``<carry>`` where the program's source is
    not at hand: the loop's line names only its output).

    A move of the batch's axes that the program asks for is not the
    partitioner's: when a constraint of the program leaves the batch dim
    whole and puts those axes on the rows or the sequence (``P(None,
    'data', None)`` on ``[B, S, D]``), or a link of a chain of constraints
    puts them on any dim, a dot that shows the same move (the same axes, on
    a sequence or a feature dim alike) carries the program's layout, which
    propagation spread to it (JAX constrains the gradient alike, so backward
    dots take it too). It is judged at the constraints (``reshard-churn``
    when they disagree), not at each dot.

    **Why it hurts**

    The partitioner must turn the batch-sharded input into a
    feature-sharded output: it all-gathers the input along the batch (or
    reshards it with an all-to-all), every device computes its slice of
    features for the whole batch, and the next layer, which contracts the
    sharded features, needs another all-gather or a reduction. FSDP and data
    parallelism expect activations to stay batch-sharded from layer to layer.

    **Example**

    ```
    %x.0 = f32[160,1280] parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="x"}
    %dot_general.0 = f32[160,960] dot(%x.0, %transpose.0), lhs_contracting_dims={1},
        rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}
    ```

    **Fix**

    Constrain the dot's output to the batch sharding of the input (with the
    mesh's real axis names), right after the line that assigns it, naming the
    variable that line assigns. Where the program itself decides the sharding,
    the fix goes there instead: a constraint of the program's own a few lines
    on that splits a feature dim gets its spec rewritten where the program
    writes the ``P(...)`` (followed back through names); in a Flax linen
    program, the batch's logical axis rule moves ahead of the rules that claim
    the same mesh axis (``nn.logical_axis_rules``). In a torch_xla program whose
    dot has only library frames (a Hugging Face layer), the module the runner
    names in the op_name (``model.layers.0.self_attn.o_proj/aten__mm``) gets a
    forward hook that marks its output over the batch axes, registered before
    the model call, on every layer at once when every layer has the finding.

    ```python
    # JAX
    h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(('fsdp', 'replica'), None)))
    # torch_xla
    xs.mark_sharding(h, mesh, (('fsdp', 'replica'), None))
    # Flax linen: the batch rule first
    rules = [('batch', 'data'), ('embed', 'data'), ('mlp', None)]
    # torch_xla, a library layer: a forward hook on the module
    def shard_batch(module, args, output):
        xs.mark_sharding(output, mesh, (('replica', 'fsdp'),) + (None,) * (output.dim() - 1))

    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(shard_batch)
    ```

    **Options**

    * ``min_bytes`` (int, default 0): only judge dot outputs of at least
      this many bytes.
    """

    id = "non-batch-dim-sharding"
    cause_rank = 20
    severity = Severity.WARNING
    reads = frozenset({"sharded"})
    summary = "A dot's activation output is batch-replicated and sharded on a non-batch dim."
    Options = NonBatchDimShardingOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.after_propagation
        if module is None or module.entry is None:
            raise RuleSkipped("no after-propagation snapshot (the propagated shardings are needed)")
        if ctx.num_partitions <= 1:
            return
        # the shared graph when ctx.sharded is this after-propagation module (it is whenever one exists)
        graph = ctx.sharded_graph if ctx.sharded is module else None
        graph = graph if graph is not None else build_graph(module)
        # A parameter the step updates is a weight, never the batch: a weight applied as ``w @ x.T``
        # (Equinox's per-example Linear under vmap) has its dim 0 free, as a batch input's is.
        updated = updated_parameters(module, graph, module.entry.parameters())
        analysis = analyze_batch(ctx, module, graph, per_device=False, exclude=frozenset(updated),
                                 weights=frozenset(updated))
        if not analysis.batch_inputs:
            return
        judged = []
        for computation in module.computations:
            for instruction in computation.instructions:
                if instruction.opcode not in _DOTS or instruction.shape.is_tuple:
                    continue
                if instruction.shape.byte_size < self.options.min_bytes:
                    continue
                found = dot_losing_batch(analysis, computation.name, instruction)
                if found is not None:
                    judged.append((computation.name, instruction, found))
        user_constraints = program_constraints(module, analysis)
        if user_constraints:
            weights = _weights(ctx, analysis, frozenset(updated))
            keys = [(c.name, i.name) for c, i in user_constraints] + [(c, i.name) for c, i, _ in judged]
            features = weight_dims(module, graph, weights, keys) if weights else {}
            if judged and weights and ctx.mesh is not None:
                # the batch's axes moved to another dim by the program's own constraint (onto a sequence,
                # or by a link of a chain of them), propagated to a matmul: the program's layout, judged at
                # its constraints (reshard-churn when they disagree), not a choice of the partitioner's
                moves = requested_batch_moves(analysis, user_constraints, features, ctx.mesh)
                judged = [(c, i, found) for c, i, found in judged
                          if batch_move(analysis, (c, i.name), found[0], features, ctx.mesh) not in moves]
            for where, constraint, found in self._judge_constraints(ctx, analysis, judged, weights,
                                                                    user_constraints, features):
                yield self._constraint_finding(ctx, analysis, where, constraint, found)
        yield from self._dot_findings(ctx, analysis, module, judged)
        if ctx.mesh is not None:  # after the matmuls': a fix they share keeps a matmul's finding
            yield from self._lookups(ctx, analysis, module)

    def _dot_findings(self, ctx: RuleContext, analysis: BatchAnalysis, module: HloModule,
                      judged: list) -> Iterator[Finding]:
        if not judged:
            return
        names = ctx.partitioned_names([(c, i.name) for c, i, _ in judged])
        # torch_xla: the modules (runner-recorded paths) whose dots are judged, for a fix on each layer at once
        paths = frozenset(p for _, i, _ in judged if (p := module_path_of(i)) is not None)
        executions = execution_counts(module)
        for computation, instruction, found in judged:
            times = executions[computation].count if computation in executions else 1
            yield self._finding(ctx, analysis, computation, instruction, names.get((computation, instruction.name)),
                                paths, times, found)

    def _judge_constraints(self, ctx: RuleContext, analysis: BatchAnalysis, judged: list, weights: frozenset[int],
                           candidates: list[tuple[Computation, Instruction]],
                           features: Mapping[tuple[str, str], set[int]]) -> list[tuple[str, Instruction, tuple]]:
        """The program's own sharding constraints (``with_sharding_constraint``, ``mark_sharding``) that
        take an activation arriving batch-sharded, leave its batch dim unsplit and split a feature dim
        (one that carries a weight's dim: not rows, not a sequence) over an axis the batch input is
        split over. The partitioner reshards there (an all-to-all), and the next matmul contracts the
        split features: the batch is lost on its operand side. A constraint on a judged dot's output
        is that dot's finding already. ``candidates``: the program's constraints on activations
        (:func:`~hlo_doctor.rules._program_layouts.program_constraints`); ``features``: their dims that carry a weight's dim."""
        mesh = ctx.mesh
        if mesh is None or not weights or not candidates:
            return []
        judged_outputs = {(c, i.name) for c, i, _ in judged}
        found = []
        for computation, constraint in candidates:
            key = (computation.name, constraint.name)
            operand_key = (computation.name, constraint.operands[0])
            if _reaches_back(computation, constraint, judged_outputs):
                continue
            tiles = dim_tiles(constraint.sharding, constraint.shape.rank)
            operand = analysis.graph.instruction(operand_key) if operand_key in analysis.graph else None
            in_tiles = dim_tiles(operand.sharding, operand.shape.rank) if operand is not None \
                and not operand.shape.is_tuple else None
            if tiles is None or in_tiles is None or constraint.sharding is None:
                continue
            try:
                per_dim = dim_axes(constraint.sharding, constraint.shape.rank, mesh) or ()
            except (ValueError, KeyError):
                continue
            for batch_dim, param in analysis.batch_dims(key).items():
                in_dims = [d for d, p in analysis.batch_dims(operand_key).items() if p == param and in_tiles[d] > 1]
                axes = set(batch_axes(ctx, analysis, param) or ())
                split = [d for d, t in enumerate(tiles) if t > 1 and d != batch_dim and d in features.get(key, ())
                         and d < len(per_dim) and {a.split(":(")[0] for a in per_dim[d]} & axes]
                if tiles[batch_dim] == 1 and in_dims and split:
                    found.append((computation.name, constraint, (batch_dim, param, split, operand, in_dims[0],
                                                                 in_tiles[in_dims[0]], per_dim)))
                    break
        return found

    def _constraint_finding(self, ctx: RuleContext, analysis: BatchAnalysis, computation: str,
                            constraint: Instruction, judged: tuple) -> Finding:
        batch_dim, param, split, operand, in_dim, in_shards, per_dim = judged
        axes = batch_axes(ctx, analysis, param)
        input_name = parameter_name(ctx, analysis.inputs[param])
        where = ", ".join(f"dim {d} ({constraint.shape.dims[d]}) on {axes_text(per_dim[d])}" for d in split)
        message = (
            f"the sharding constraint {constraint.name} ({constraint.shape}) puts the feature {where} and leaves "
            f"its batch dimension {batch_dim} unsplit, although the activation {operand.name} arrives "
            f"batch-sharded {in_shards} ways (dim {in_dim}, from the batch input {input_name}): the partitioner "
            "reshards it there, and a matmul that contracts the split features sums partial products over those "
            "axes (the batch lost on the operand side of the next layer)"
        )
        spec: list = [None] * constraint.shape.rank
        spec[batch_dim] = axes or (f"<axes of {input_name}'s batch>",)
        jax_code, torch_code = constraint_code(spec, "h")
        summary = (f"Write the constraint with the batch dim {batch_dim} on {axes_text(axes)} and the features "
                   "unsplit, as the activation arrives: the reshard and the partial sums after it go, and each "
                   "device keeps its own rows.")
        finding = self.finding(
            ctx, message, instruction=constraint, related=(operand.name,),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code,
                                  edits=constraint_edit(spec, ctx.framework, "h")),
            evidence={
                "constraint": constraint.name,
                "shape": str(constraint.shape),
                "sharding": constraint.sharding.text if constraint.sharding is not None else "",
                "batch_dim": batch_dim,
                "sharded_dims": split,
                "sharded_axes": [list(per_dim[d]) for d in split],
                "input": operand.name,
                "input_batch_dim": in_dim,
                "input_batch_shards": in_shards,
                "batch_input": input_name,
                "batch_axes": list(axes or ()),
                "bytes": constraint.shape.byte_size,
            },
        )
        finding = with_torch_source(ctx, finding, analysis.module, constraint)
        if finding.source is None:
            # torch_xla's mark keeps only its own frames in the module: the call is the runner's record's
            call = _recorded_mark(ctx, constraint, batch_dim, split)
            if call is not None:
                finding = dataclasses.replace(finding, source=call)
        source = finding.source
        marked = called_on(source.file, source.line) if source is not None else None
        if source is not None and marked is not None and assigned_name(source.file, source.line) is None \
                and finding.suggestion is not None:
            # the line is the sharding call itself: its spec is the fix, written there (a second mark on the
            # value is refused by torch_xla, and would contradict the first in JAX)
            suggestion = finding.suggestion
            written = jax_spec(spec) if ctx.framework == "jax" else torch_spec(spec)
            mesh = mesh_expression(source.file, source.line) or "mesh"
            marked_jax = rename_value(rename_value(suggestion.jax, "h", marked), "mesh", mesh)
            marked_torch = rename_value(rename_value(suggestion.torch_xla, "h", marked), "mesh", mesh)
            return dataclasses.replace(finding, suggestion=dataclasses.replace(
                suggestion, jax=marked_jax, torch_xla=marked_torch, edits=(),
                summary=f"{suggestion.summary} Line {source.line} is that constraint, on {marked}: write {written} "
                        "as its spec.",
                no_edit=f"line {source.line} is the constraint itself: its spec is the edit, made by hand"))
        finding = with_user_variable(finding, "h")
        if finding.source is None:
            return finding
        lever = user_constraint_respec({"sharding_calls": ctx.sharding_calls}, finding.source.file,
                                       finding.source.line, constraint.shape.dims, batch_dim, spec, ctx.framework,
                                       finding.source.line)
        return with_lever(finding, lever, ctx.framework)

    def _lookups(self, ctx: RuleContext, analysis: BatchAnalysis, module: HloModule) -> Iterator[Finding]:
        """Embedding lookups and loop carries that lose the batch from some axes (see the docstring): one
        finding each."""
        mesh = ctx.mesh
        assert mesh is not None
        for computation in module.computations:
            for value in computation.instructions:
                if value.opcode not in ("gather", "get-tuple-element") or value.shape.is_tuple or \
                        value.shape.byte_size < self.options.min_bytes:
                    continue
                if value.opcode == "gather":
                    found, kind = lookup_losing_batch(analysis, computation.name, value, mesh), "lookup"
                else:
                    found, kind = carry_losing_batch(analysis, computation, value, mesh), "carry"
                if found is not None:
                    yield boundary_finding(self, ctx, analysis, computation.name, value, found, kind)

    def _finding(self, ctx: RuleContext, analysis: BatchAnalysis, computation: str, dot: Instruction,
                 partitioned_name: str | None, module_paths: frozenset[str], times: int,
                 judged: tuple[int, int, list[int], Instruction, int, int]) -> Finding:
        """The finding of one judged dot (``times``: its executions per step; ``judged``: what
        :func:`~hlo_doctor.rules._program_layouts.dot_losing_batch` found)."""
        batch_dim, param, sharded, operand, in_dim, in_shards = judged
        mesh = ctx.mesh
        per_dim = dim_axes(dot.sharding, dot.shape.rank, mesh) if mesh is not None else None
        tiles = dim_tiles(dot.sharding, dot.shape.rank) or ()
        where = ", ".join(
            f"dim {d} ({dot.shape.dims[d]}) over {axes_text(per_dim[d]) if per_dim else f'{tiles[d]} shards'}"
            for d in sharded
        )
        axes = batch_axes(ctx, analysis, param)
        input_name = parameter_name(ctx, analysis.inputs[param])
        body = analysis.module.computation(computation)
        users = body.users() if body is not None else {}
        value, value_dim = _value_of_line(ctx, analysis, users, computation, dot, batch_dim, param)
        spec: list = [None] * value.shape.rank
        spec[value_dim] = axes or (f"<axes of {input_name}'s batch>",)
        jax_code, torch_code = constraint_code(spec, "h")
        name = partitioned_name or dot.name
        message = (
            f"{dot.opcode} {dot.name} ({dot.shape}) leaves its batch dimension {batch_dim} replicated and "
            f"shards {where}, although its input {operand.name} is batch-sharded {in_shards} ways "
            f"(dim {in_dim}, from the batch input {input_name}): the partitioner must gather or reshard the "
            "batch into this layer, and each device's matmul covers every row of the batch for its shard of "
            f"dim {sharded[0]}" + (f" ({times} times a step, in a loop)" if times > 1 else "")
        )
        summary = (
            f"Constrain the output of {dot.name} (the activation h) to stay batch-sharded over "
            f"{axes_text(axes)} on dim {batch_dim}, as its input is."
        ) if value is dot else (
            f"Constrain the activation h that this line makes of {dot.name}'s output ({value.opcode} to "
            f"{value.shape}, its batch on dim {value_dim}) to stay batch-sharded over {axes_text(axes)}, as its "
            "input is."
        )
        finding = self.finding(
            ctx,
            message,
            instruction=dot,
            name=name,
            related=(dot.name, operand.name),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code,
                                  edits=constraint_edit(spec, ctx.framework, "h")),
            evidence={
                "dot": dot.name,
                "shape": str(dot.shape),
                "sharding": dot.sharding.text if dot.sharding is not None else "",
                "batch_dim": batch_dim,
                "sharded_dims": sharded,
                "sharded_axes": [list(per_dim[d]) for d in sharded] if per_dim else [],
                "input": operand.name,
                "input_batch_dim": in_dim,
                "input_batch_shards": in_shards,
                "batch_input": input_name,
                "batch_axes": list(axes or ()),
                "bytes": dot.shape.byte_size,
                "executions_per_step": times,
            },
        )
        finding = with_torch_source(ctx, finding, analysis.module, dot)
        path = module_path_of(dot) if ctx.framework == "torch_xla" else None
        if path is not None and finding.source is None:
            # only library frames, and no call of the module from the user's code: the fix is a forward
            # hook on the module the runner named in the op_name
            hook = forward_hook_lever(ctx.dump.run_record, path, module_paths, spec, batch_dim)
            if hook is not None:
                hooked = with_lever(finding, hook, ctx.framework)
                return dataclasses.replace(hooked, message=hooked.message.replace(
                    " (the op records only library frames;", f" (the op records only library frames, of {path};", 1))
        finding = with_user_variable(finding, "h")
        at_rules = at_flax_rules(finding, ctx.dump.run_record, spec, ctx.framework, ctx.program_files)
        if at_rules is not finding or finding.source is None:
            return at_rules
        # the user's own constraint a line on may be what splits the features
        lever = user_constraint_respec({"sharding_calls": ctx.sharding_calls}, finding.source.file, finding.source.line,
                                       value.shape.dims, value_dim, spec, ctx.framework,
                                       _constraint_reached(users, value))
        return with_lever(finding, lever, ctx.framework)


def _value_of_line(ctx: RuleContext, analysis: BatchAnalysis, users: Mapping[str, list[Instruction]],
                   computation: str, dot: Instruction, batch_dim: int, param: int) -> tuple[Instruction, int]:
    """The value the dot's source line makes, and its batch dim: the dot itself, or what the same
    line makes of it by layout ops alone (a per-example layer under ``vmap`` writes ``w @ x`` and
    transposes the ``[features, batch]`` product to the batch-major value the line assigns).
    ``users``: each value's users in the dot's computation."""
    source = ctx.user_source(dot)[0]
    if source is None:
        return dot, batch_dim
    current, dim = dot, batch_dim
    for _ in range(4):
        following = users.get(current.name, [])
        if len(following) != 1 or following[0].opcode not in ("transpose", "copy", "bitcast"):
            break
        step = following[0]
        where = ctx.user_source(step)[0]
        dims = [d for d, p in analysis.batch_dims((computation, step.name)).items() if p == param]
        if where is None or (where.file, where.line) != (source.file, source.line) or len(dims) != 1:
            break
        current, dim = step, dims[0]
    return current, dim


def _constraint_reached(users: Mapping[str, list[Instruction]], value: Instruction) -> int | None:
    """The line of the program's own sharding constraint that ``value`` reaches through elementwise
    and layout ops alone (``users``: each value's users in its computation), on a value of its shape
    and sharding (what set its sharding), or None."""
    if value.sharding is None:
        return None
    frontier, seen = [value], {value.name}
    while frontier and len(seen) < 32:
        current = frontier.pop(0)
        for user in users.get(current.name, []):
            if user.name in seen:
                continue
            seen.add(user.name)
            if sharding_call_of(user) is not None:
                if user.shape.dims == value.shape.dims and user.sharding is not None \
                        and user.sharding.tile_assignment == value.sharding.tile_assignment:
                    where = user_frame(user.source)
                    return where.line if where is not None else None
                continue
            if user.opcode in NOT_ELEMENTWISE or user.opcode in RESHARD_COLLECTIVES or user.shape.is_tuple:
                continue
            frontier.append(user)
    return None


def _weights(ctx: RuleContext, analysis: BatchAnalysis, updated: frozenset[int]) -> frozenset[int]:
    """The weights of the propagated module: the parameters the step updates; an inference step's
    from the per-device module's classification, when that module reads."""
    weights = updated | analysis.weights
    if weights:
        return weights
    try:
        params = ctx.semantics.parameters
    except (ParseError, ShardingError):
        return frozenset()  # a damaged partitioned snapshot: the constraints are judged without it
    return params.weights if params is not None else frozenset()


def _reaches_back(computation, constraint: Instruction, outputs: set[tuple[str, str]]) -> bool:  # noqa: ANN001
    """Whether ``constraint``'s operand is, through a few single-operand ops, the output of a judged dot."""
    name = constraint.operands[0] if constraint.operands else None
    for _ in range(6):
        if name is None:
            return False
        if (computation.name, name) in outputs:
            return True
        op = computation.get(name)
        if op is None or len(op.operands) != 1:
            return False
        name = op.operands[0]
    return False


def _recorded_mark(ctx: RuleContext, constraint: Instruction, batch_dim: int, split: list[int]) -> SourceRef | None:
    """The program line of the recorded sharding call that made ``constraint``: a call on a value of
    its shape whose spec leaves ``batch_dim`` whole and splits the ``split`` dims, seen past a helper
    of the user's that only calls the sharding API (its caller's line); None unless one line does."""
    lines: set[tuple[str, int]] = set()
    for call in ctx.sharding_calls:
        spec = parse_spec_text(str(call.get("spec", "")))
        if spec is None or tuple(call.get("shape") or ()) != tuple(constraint.shape.dims) \
                or len(spec) != constraint.shape.rank or spec[batch_dim] is not None \
                or not all(spec[d] for d in split):
            continue
        frames = tuple(StackFrame(str(f.get("file", "")), str(f.get("function", "")), int(f.get("line", 0)))
                       for f in call.get("stack") or () if isinstance(f, dict) and f.get("file") and f.get("line"))
        if not frames:
            continue
        found, _ = context_user_frame(SourceLocation(frames[0].file, frames[0].line, frames[0].function,
                                                     None, frames), ctx.traced_function)
        if found is not None:
            lines.add((found.file, found.line))
    if len(lines) != 1:
        return None
    ((file, line),) = lines
    return SourceRef(file, line, None)
