"""replicated-large-parameter: a large entry parameter left fully replicated."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.graph.mesh import dim_axes
from hlo_doctor.graph.sharding import layout
from hlo_doctor.hlo.ir import HloModule, Instruction
from hlo_doctor.program.levers import parameter_respec, with_lever
from hlo_doctor.program.library_levers import (
    keras_layout_key,
    keras_layout_template,
    nnx_partitioning,
    nnx_partitioning_template,
)
from hlo_doctor.program.source import recorded_parameter_path
from hlo_doctor.program.suggest import argument_name, parameter_code, python_identifier
from hlo_doctor.rules._batch import buffer_donors
from hlo_doctor.rules._memory import parameter_classes
from hlo_doctor.rules._program_layouts import constraint_layouts
from hlo_doctor.rules._weight_dim import weight_shard_dim
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.units import format_bytes

_LARGE = 1024 * 1024  # bytes: a parameter this big is judged whatever the model


@dataclass(frozen=True, slots=True)
class ReplicatedLargeParameterOptions:
    min_bytes: int = 64 * 1024
    """No parameter smaller than this many bytes (the whole value) is judged."""
    min_share_of_median: float = 0.5
    """A parameter under 1 MiB is judged only when it is a matrix of at least this share of the median
    sharded matrix (a small model's weights); 0: never."""


class ReplicatedLargeParameter(Rule):
    """A large entry parameter is fully replicated while comparable parameters are sharded.

    **What it finds**

    An entry parameter of at least 1 MiB (or, in a small model, a matrix at
    least half the median sharded matrix) whose sharding after
    propagation is replicated on every device, in a module where at least
    one other *weight* that large is sharded (so the program
    does shard its weights, FSDP-style, and this one was missed). Weights are
    compared with weights only: which parameters are weights and which are
    data (the batch input, tokens, labels) or scalars is decided by the
    analysis layer from the dataflow (:mod:`hlo_doctor.semantics.parameters`),
    so a data-parallel program, whose weights are all replicated on purpose
    while its batch is sharded, gets no finding; nor does one whose optimizer
    state alone is sharded (ZeRO-1): the state does not count as a sharded weight.
    Nor does a weight split only over axes that split the batch, that a
    constraint of the program puts on an activation's features, and never
    gathered: its matmuls run split over the batch's axes, so it took that
    activation's feature split (propagated into the weights, in this step or
    the step before whose output it is): that is
    ``non-batch-dim-sharding``'s finding, not a placement of the program's to
    compare with.

    **Why it hurts**

    Every device keeps the whole tensor, its gradient and its optimizer
    state: ``(1 - 1/n)`` of that memory is wasted on each of the *n* devices.
    Because nothing ever needs to all-gather it, the program runs without
    any visible communication cost, so it goes unnoticed until memory runs out.

    **Example**

    ```
    %w_in.0 = f32[512,2048] parameter(1), sharding={devices=[4,1]<=[4]}
    %unembed.0 = f32[512,8192] parameter(3), sharding={replicated}
    ```

    **Fix**

    Shard it like the other weights, over their axis, on the dim its forward
    matmul asks for: the contracting dim when the activation it meets is split
    over the same axis (FSDP: otherwise propagation splits the output's
    features), else the Megatron pairing (free dim for the first matmul of a
    pair, contracting for the second); the largest dim that divides when no
    matmul reads it. Written where the program sets the parameter's sharding:
    the ``P()`` of its ``jax.ShapeDtypeStruct``/``device_put``; a Keras
    ``LayoutMap`` key that matches the variable; ``nnx.with_partitioning`` on
    the NNX layer's initializer.

    ```python
    # JAX
    unembed = jax.device_put(unembed, NamedSharding(mesh, P('fsdp', None)))
    # torch_xla
    xs.mark_sharding(model.unembed.weight, mesh, ('fsdp', None))
    # Keras: a key the variable's path matches
    layout_map[r"decoder_block_\\d+/ffw_linear/kernel"] = ('model', None)
    ```

    **Options**

    * ``min_bytes`` (int, default 65536): no parameter smaller is flagged
      or counts as comparable;
    * ``min_share_of_median`` (float, default 0.5): a parameter of at least
      1 MiB is always judged; a smaller one only when it is a matrix (rank
      >= 2) of at least this share of the median sharded matrix (a small
      model's weights), and the same holds for the comparable sharded
      parameters (0: only parameters of 1 MiB or more).
    """

    id = "replicated-large-parameter"
    cause_rank = 50
    severity = Severity.WARNING
    reads = frozenset({"per_device", "sharded"})
    summary = "A large parameter is fully replicated while comparable parameters are sharded."
    Options = ReplicatedLargeParameterOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.per_device
        shapes = ctx.global_parameter_shapes
        if module is None or module.entry is None or shapes is None:
            raise RuleSkipped("no partitioned snapshot with the global parameter shapes in a header")
        n = ctx.num_partitions
        if n <= 1:
            return
        params = module.entry.parameters()
        classes = ctx.semantics.parameters
        if classes is not None:
            # weights are compared with weights: the batch input and other data never count
            params = [p for p in params if p.parameter_number in classes.weights]
        else:
            donors = buffer_donors(ctx)
            if donors:
                params = [p for p in params if p.parameter_number in donors]
        replicated: list[Instruction] = []
        sharded: list[tuple[Instruction, tuple[int, ...]]] = []
        for param in params:
            sharding = param.sharding
            number = param.parameter_number
            if number is None or number >= len(shapes):
                continue
            shape = shapes[number]
            if sharding is None or shape.is_tuple or sharding.is_tuple or shape.rank == 0:
                continue
            try:
                lay = layout(sharding, shape, n)
            except ValueError:
                continue
            if lay.is_replicated:
                replicated.append(param)
            elif lay.num_shards > 1 and not lay.is_manual:
                sharded.append((param, lay.tiles_per_dim))
        large = self._large(shapes, [param for param, _ in sharded])
        replicated = [param for param in replicated if large(param)]
        sharded = [(param, tiles) for param, tiles in sharded if large(param)]
        if replicated and sharded and classes is not None:
            # optimizer state sharded while its weights are replicated is ZeRO-1, a layout of its
            # own: the state is no comparable weight (replicated-optimizer-state judges the state)
            state = {n for n, c in parameter_classes(ctx).items() if c == "optimizer_state"}
            sharded = [(param, tiles) for param, tiles in sharded if param.parameter_number not in state]
        if replicated and sharded:
            feature_split, gathered = _feature_split_axes(ctx), _gathered_weights(ctx)
            sharded = [(param, tiles) for param, tiles in sharded
                       if not _split_like_the_batch(ctx, param, feature_split, gathered)]
        if not replicated or not sharded:
            return
        shard_count, axes = _weight_axes(ctx, sharded)
        for param in replicated:
            yield self._finding(ctx, module, param, sharded, shard_count, axes)

    def _large(self, shapes, sharded: list[Instruction]):
        """Whether a parameter is large enough to judge: at least ``min_bytes``, and 1 MiB or, in a small
        model, a matrix of at least ``min_share_of_median`` of the median sharded matrix."""
        matrices = sorted(shapes[p.parameter_number].byte_size for p in sharded if shapes[p.parameter_number].rank >= 2)
        share = self.options.min_share_of_median
        small_model_floor = share * matrices[len(matrices) // 2] if matrices and share > 0 else None

        def large(param: Instruction) -> bool:
            shape = shapes[param.parameter_number]
            if shape.byte_size < self.options.min_bytes:
                return False
            return shape.byte_size >= _LARGE or (
                small_model_floor is not None and shape.rank >= 2 and shape.byte_size >= small_model_floor)

        return large

    def _finding(self, ctx, module: HloModule, param, sharded, shard_count, axes) -> Finding:
        shape = ctx.global_parameter_shapes[param.parameter_number]
        name = _user_name(ctx, param)
        dims = sorted(range(shape.rank), key=lambda d: (-shape.dims[d], d))
        dim = _dim_from_uses(ctx, param, shape.dims, axes, shard_count)
        if dim is None:  # no matmul decides: the largest dim that divides
            dim = next((d for d in dims if shape.dims[d] % shard_count == 0), None)
        per_device = shape.byte_size // shard_count if shard_count else shape.byte_size
        spec: list = [None] * shape.rank
        axis_names = tuple(axes) if axes else (f"<axis of size {shard_count}>",)
        if dim is not None:
            spec[dim] = axis_names
        jax_code, torch_code = parameter_code(spec, python_identifier(name.split(" (")[0]))
        examples = ", ".join(_user_name(ctx, p) for p, _ in sharded[:3])
        anchor = param
        message = (
            f"parameter {name} ({shape}, {format_bytes(shape.byte_size)}) is replicated on all {ctx.num_partitions} devices "
            f"while {len(sharded)} comparable parameter{'s are' if len(sharded) != 1 else ' is'} sharded "
            f"({examples}); sharding it {shard_count} ways would save {format_bytes(shape.byte_size - per_device)} per device"
        )
        if dim is None:
            summary = (f"Shard {name} over {'/'.join(axis_names)}: no dimension divides by {shard_count}, "
                       "so pad one or pick an axis that divides it.")
        else:
            summary = f"Shard {name} on dimension {dim} (size {shape.dims[dim]}) over {'/'.join(axis_names)}, like the other weights."
        edit_target = python_identifier(name.split(" (")[0])
        finding = self.finding(
            ctx,
            message,
            instruction=anchor,
            related=(param.name, *(p.name for p, _ in sharded[:5])),
            source_from=_first_user_with_source(ctx, module, param),
            suggestion=Suggestion(summary=summary, jax=jax_code, torch_xla=torch_code,
                                  no_edit=None if dim is not None else "no dimension divides by the shard count"),
            evidence={
                "bytes": shape.byte_size,
                "bytes_per_device_if_sharded": per_device,
                "bytes_saved_per_device": shape.byte_size - per_device,
                "num_partitions": ctx.num_partitions,
                "shards_suggested": shard_count,
                "comparable_sharded_parameters": len(sharded),
                "suggested_dim": -1 if dim is None else dim,
            },
        )
        return _at_lever(ctx, finding, name, shape.dims, spec, edit_target) if dim is not None else finding


def _dim_from_uses(ctx: RuleContext, param: Instruction, shape, axes, shard_count: int) -> int | None:
    """The dim the weight's forward matmul asks for (see rules._weight_dim), read where the
    shardings of its neighbours are global: the snapshot after propagation."""
    module = ctx.sharded
    if not axes or module is None or module.entry is None:
        return None
    twin = next((p for p in module.entry.parameters() if p.parameter_number == param.parameter_number), None)
    if twin is None or tuple(twin.shape.dims) != tuple(shape):
        return None
    graph = ctx.sharded_graph
    return weight_shard_dim(graph, twin, shape, axes, shard_count, ctx.mesh) if graph is not None else None


def _feature_split_axes(ctx: RuleContext) -> set[str]:
    """The mesh axes that the program's own sharding constraints put on a dim other than the batch's
    of a value that carries the batch (a hidden activation split over the data axes)."""
    module, analysis, mesh = ctx.sharded, ctx.propagated_batch, ctx.mesh
    if module is None or analysis is None or mesh is None:
        return set()
    return {axis for layout, batch_dims in constraint_layouts(module, analysis, mesh)
            for dim, axes in enumerate(layout) if dim not in batch_dims for axis in axes}


def _gathered_weights(ctx: RuleContext) -> set[int] | None:
    """The entry parameters some weight-gather collective gathers (FSDP gathers its weights); None
    without the per-device graph."""
    graph = ctx.semantics.view.graph
    if graph is None:
        return None
    return {number for role in ctx.semantics.roles if role.role == "weight-gather"
            for number in graph.entry_parameters(role.facts.key)}


def _split_like_the_batch(ctx: RuleContext, param: Instruction, feature_split: set[str],
                          gathered: set[int] | None) -> bool:
    """Whether a sharded weight is no placement to compare with: it is split only over axes that split
    the batch and that a constraint of the program puts on an activation's features
    (``feature_split``), and no collective gathers it (``gathered``: FSDP gathers its weights before
    their matmuls), so its matmuls run split over the batch's axes: the weight took that activation's
    feature split (non-batch-dim-sharding's finding), in this step's propagation or an earlier one's."""
    mesh, sharding = ctx.mesh, param.sharding
    batch = set(ctx.semantics.batch_split_axes)
    shapes = ctx.global_parameter_shapes
    number = param.parameter_number
    if mesh is None or sharding is None or gathered is None or not batch or shapes is None or number is None \
            or number in gathered:
        return False
    try:
        per_dim = dim_axes(sharding, shapes[number].rank, mesh)
    except (ValueError, KeyError):
        return False
    axes = {a.split(":(")[0] for dims in per_dim or () for a in dims}
    return bool(axes) and axes <= batch and bool(axes & feature_split)


def _weight_axes(ctx: RuleContext, sharded) -> tuple[int, tuple[str, ...] | None]:
    """The shard count the other weights use on their sharded dim, and its mesh axes."""
    counts: dict[int, int] = {}
    for _, tiles in sharded:
        for t in tiles:
            if t > 1:
                counts[t] = counts.get(t, 0) + 1
    shard_count = max(counts, key=lambda c: (counts[c], c)) if counts else ctx.num_partitions
    mesh = ctx.mesh
    axes = None
    if mesh is not None:
        fsdp = mesh.fsdp_axes()
        if fsdp and math.prod(mesh.axis_size(a) for a in fsdp) == shard_count:
            axes = fsdp
        else:
            axes = mesh.axes_for(shard_count)
        # torch_xla meshes like ('fsdp', 'replica') with replica=1: name both, as users write them
        if axes and len(axes) == 1 and len(mesh.axis_names) > 1 and mesh.num_devices == shard_count:
            axes = mesh.axis_names if all(
                s == 1 for a, s in zip(mesh.axis_names, mesh.axis_sizes) if a not in axes
            ) else axes
    return shard_count, axes


def _first_user_with_source(ctx: RuleContext, module: HloModule, param: Instruction) -> Instruction:
    entry = module.entry
    if ctx.user_source(param)[0] is not None or entry is None:
        return param
    frontier = {param.name}
    for _ in range(4):  # follow a few copies/reshapes to the first op with a user line
        users = [i for i in entry.instructions if frontier.intersection(i.operands)]
        for user in users:
            if ctx.user_source(user)[0] is not None:
                return user
        frontier = {u.name for u in users}
        if not frontier:
            break
    return param


def _user_name(ctx: RuleContext, param: Instruction) -> str:
    """The parameter as the user knows it: its recorded variable path when the op_name is positional
    (``nnx.jit``'s ``model.states[0][5]`` is ``unembed/kernel``, Keras' ``state[0][7]`` is
    ``decoder_block_0/ffw_gating/kernel``), else its argument name."""
    name = argument_name(param)
    shapes = ctx.global_parameter_shapes
    number = param.parameter_number
    shape = shapes[number].dims if shapes is not None and number is not None and number < len(shapes) else None
    path = recorded_parameter_path(ctx.dump.run_record, ctx.traced_function, name, shape)
    return f"{path} ({name})" if path else name


def _at_lever(ctx: RuleContext, finding: Finding, name: str, shape, spec: list, target: str) -> Finding:
    """Keras: the LayoutMap key its variable misses; Flax NNX: with_partitioning on its layer."""
    record = ctx.dump.run_record
    path = name.split(" (")[0] if " (" in name else None  # a recorded variable path of a positional state
    if isinstance(record, dict) and record.get("keras"):
        lever = keras_layout_key(record, shape, spec, path) if path is not None else None
        return with_lever(finding, lever, ctx.framework)
    if path is not None:
        return with_lever(finding, nnx_partitioning(ctx.program_path, path, spec), ctx.framework)
    lever = parameter_respec(ctx.program_path, target, spec, ctx.framework, ctx.traced_function)
    if lever is None and not record and ctx.framework == "jax":
        # a dump made without the runner: the placement in another of the program's files (the
        # script, beside the model), else the program's Keras LayoutMap or NNX metadata
        programs = ctx.program_files
        placed = [found for program in programs if program != ctx.program_path
                  for found in [parameter_respec(program, target, spec, ctx.framework, ctx.traced_function)] if found]
        lever = (placed[0] if len(placed) == 1 else None) or keras_layout_template(programs, name, spec) \
            or nnx_partitioning_template(programs, name, spec)
    return with_lever(finding, lever, ctx.framework)
