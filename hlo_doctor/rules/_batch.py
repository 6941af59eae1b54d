"""Suggestion and source helpers of the batch rules, over :mod:`hlo_doctor.semantics.batch_dims`.

The batch analysis itself (batch inputs, batch dims of every value) lives in
the analysis layer; this module names axes and parameters the way the user
wrote them and finds the user's line of a torch_xla module call.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterable, Iterator

from hlo_doctor.graph.dataflow import DataflowGraph
from hlo_doctor.graph.dim_maps import DOTS
from hlo_doctor.graph.mesh import dim_axes
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.hlo.opcodes import COLLECTIVE_OPCODES
from hlo_doctor.program.suggest import argument_name
from hlo_doctor.rules.base import Finding, SourceRef
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics.batch_dims import (  # noqa: F401 - re-exported for the rules
    BatchAnalysis,
    _Propagation,
    analyze_batch,
    buffer_donors,
    parameter_sharding,
)
from hlo_doctor.semantics.cost import matmul_flops
from hlo_doctor.semantics.opclasses import MATMULS
from hlo_doctor.semantics.parameters import EntryParameters

__all__ = [
    "BatchAnalysis", "activation_matmuls", "analyze_batch", "axes_text", "batch_axes", "batch_input", "buffer_donors",
    "matmul_traffic_axes", "paired_tensor_axes", "parameter_name",
    "parameter_sharding",
    "torch_module_source", "with_torch_source",
]


# --------------------------------------------------------------------------
# The batch input and the matmuls on data


def batch_input(module: HloModule, params: EntryParameters) -> Instruction | None:
    """The largest data input of rank >= 1 (the first of equals, in parameter order): the batch."""
    entry = module.entry
    data = [p for p in entry.parameters() if p.parameter_number in params.data and not p.shape.is_tuple
            and p.shape.rank >= 1] if entry is not None else []
    return max(data, key=lambda p: p.shape.byte_size) if data else None


def activation_matmuls(module: HloModule, graph: DataflowGraph,
                       params: EntryParameters) -> Iterator[tuple[Computation, Instruction, float]]:
    """Each dot or convolution of ``module`` that derives from a data input, with its FLOPs (> 0)."""
    data_mask = params.data_mask()
    for computation, dot in module.instructions():
        if dot.opcode not in MATMULS or len(dot.operands) < 2 or dot.shape.is_tuple:
            continue
        node = graph.id_of((computation.name, dot.name))
        if node is None or not graph.parameter_bits(node) & data_mask:
            continue
        flops = matmul_flops(dot, computation)
        if flops > 0:
            yield computation, dot, flops


# --------------------------------------------------------------------------
# Mesh axes and source lines for suggestions and findings


def batch_axes(ctx: RuleContext, analysis: BatchAnalysis, param: int) -> tuple[str, ...] | None:
    """The mesh axes the batch input is split over on dim 0, as the user wrote them where known.

    From the runner's record of the user's ``mark_sharding`` of a tensor with
    this shape (torch_xla), else read from the tile assignment over the mesh;
    mesh axes of size 1 that no dim uses are named too, as a mesh like
    ``('fsdp', 'replica')`` with ``replica=1`` is written ``P(('fsdp', 'replica'), None)``.
    """
    instruction = analysis.inputs.get(param)
    if instruction is None:
        return None
    rank = instruction.shape.rank
    global_dims = (analysis.global_batch[param], *instruction.shape.dims[1:])
    recorded = _recorded_axes(ctx, global_dims)
    if recorded:
        return recorded
    mesh = ctx.mesh
    sharding = parameter_sharding(instruction, ctx)
    if mesh is None or sharding is None:
        return None
    per_dim = dim_axes(sharding, rank, mesh)
    if not per_dim or not per_dim[0]:
        return None
    axes = tuple(per_dim[0])
    used = {a for dims in per_dim for a in dims}
    unused = [a for a in mesh.axis_names if a not in used]
    if unused and all(mesh.axis_size(a) == 1 for a in unused) and set(axes) <= set(mesh.axis_names):
        axes = tuple(a for a in mesh.axis_names if a in axes or a in unused)
    return axes


def _recorded_axes(ctx: RuleContext, dims: tuple[int, ...]) -> tuple[str, ...] | None:
    record = ctx.dump.run_record or {}
    calls = record.get("sharding_calls") if isinstance(record, dict) else None
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, dict) or tuple(call.get("shape") or ()) != tuple(dims):
            continue
        try:
            spec = ast.literal_eval(str(call.get("spec")))
        except (ValueError, SyntaxError):
            continue
        if isinstance(spec, (tuple, list)) and spec and spec[0] is not None:
            first = spec[0]
            axes = (first,) if isinstance(first, str) else tuple(first)
            if all(isinstance(a, str) for a in axes):
                return axes
    return None


def parameter_name(ctx: RuleContext, param: Instruction, *, with_shape: bool = True) -> str:
    """How the user knows an entry parameter: JAX's argument name (``x``), else its name after propagation;
    under torch_xla, whose parameters are all ``xla__device_data``, the module path the runner recorded
    (``model.layers.0.self_attn.o_proj.weight``), else its name and global shape (``p10.34 f32[256,256]``;
    ``with_shape=False``: only its name, for a message that prints the shape next to it). See
    :func:`hlo_doctor.semantics.parameters.torch_parameter_names`.

    The argument name is read from the ``before_optimizations`` module first: the partitioner
    copies a parameter's metadata, but not always faithfully (a jax 0.4.35 Shardy compile
    labelled the partitioned parameter 0 ``b2``); then from the parameter itself.
    """
    number = param.parameter_number
    if ctx.framework != "torch_xla":
        original = ctx.argument_names.get(number) if number is not None else None
        if original is not None:
            return original
        name = argument_name(param)
        if name != param.name:
            return name
    module = ctx.sharded
    if number is not None and module is not None and module.entry is not None:
        param = next((p for p in module.entry.parameters() if p.parameter_number == number), param)
    if ctx.framework != "torch_xla":
        return argument_name(param)
    params = ctx.semantics.parameters
    label = params.names.get(number) if params is not None and number is not None else None
    if label is None:
        return param.name
    if not with_shape and label == f"{param.name} {param.shape}":
        return param.name
    return label


def axes_text(axes: Iterable[str] | None) -> str:
    axes = tuple(axes or ())
    if not axes:
        return "?"
    return repr(axes[0]) if len(axes) == 1 else "(" + ", ".join(repr(a) for a in axes) + ")"


# torch module class -> the aten ops one call of it lowers its matmul/convolution to
_TORCH_OPS = {
    "Linear": ("aten__addmm", "aten__mm", "aten__matmul", "aten__linear"),
    "Conv1d": ("aten__convolution", "aten__convolution_overrideable"),
    "Conv2d": ("aten__convolution", "aten__convolution_overrideable"),
    "Conv3d": ("aten__convolution", "aten__convolution_overrideable"),
}


def torch_module_source(ctx: RuleContext, module: HloModule, dot: Instruction) -> tuple[SourceRef, str] | None:
    """The user's line of the nn.Module call that a torch_xla dot/convolution came from.

    torch_xla's metadata names only library frames (``torch/nn/modules/linear.py``).
    The runner records each ``nn.Module`` call with the user's stack. When the
    module's dots of one aten op (e.g. ``aten__addmm``), in program order, are
    exactly as many as the recorded calls of the matching class
    (``Linear``), the k-th dot is the k-th call. None otherwise.
    """
    if ctx.framework != "torch_xla":
        return None
    metadata = dot.metadata
    op_type = metadata.op_type if metadata is not None else None
    if not op_type:
        return None
    record = ctx.dump.run_record or {}
    found_calls = record.get("module_calls") if isinstance(record, dict) else None
    calls = found_calls if isinstance(found_calls, list) else []
    for cls, ops in _TORCH_OPS.items():
        if op_type not in ops:
            continue
        mine = []
        for call in calls or ():
            if isinstance(call, dict) and str(call.get("module_class", "")).rsplit(".", 1)[-1] == cls:
                mine.extend([call] * int(call.get("count") or 1))
        dots = [i for _, i in module.instructions()
                if i.opcode in DOTS and i.metadata is not None and i.metadata.op_type in ops]
        if not mine or len(dots) != len(mine) or dot not in dots:
            return None
        call = mine[dots.index(dot)]
        stack = call.get("stack") or []
        frame = stack[0] if stack else call
        if not frame.get("file") or not frame.get("line"):
            return None
        return SourceRef(str(frame["file"]), int(frame["line"]), frame.get("function")), cls
    return None


def with_torch_source(ctx: RuleContext, finding: Finding, module: HloModule, dot: Instruction | None) -> Finding:
    """``finding`` with the user's line of the nn.Module call of ``dot`` when the dump has only library frames."""
    if finding.source is not None or dot is None:
        return finding
    found = torch_module_source(ctx, module, dot)
    if found is None:
        return finding
    source, cls = found
    message = finding.message.replace(
        " (the dump records only library frames for this op, no line of your code)", "")
    message += f" (line of the {cls} call, from the runner's record of nn.Module calls)"
    return dataclasses.replace(finding, source=source, message=message)



# --------------------------------------------------------------------------
# Tensor parallelism by design

_PAIR_HOPS = 48  # ops walked back from a reduction, or from a matmul's operand, before giving up


def paired_tensor_axes(ctx: RuleContext, params: EntryParameters) -> set[str]:
    """Mesh axes over which the forward pass runs column- and row-parallel matmul pairs (Megatron).

    Read in the partitioned module: a forward activation reduction over the axis sums the partial
    products of a matmul with a weight operand (row-parallel) whose data operand comes, through
    no collective, from another matmul with a weight operand (column-parallel): the feature split
    the first one makes is the contracting split of the second, kept on purpose. A batch split
    over no axis then repeats by design along that axis (tensor parallelism of the whole batch),
    and its activation gathers (of sharded norms, of the head) are not the weights-only marking
    of pytorch/xla#6778. Neither the all-dim-0 FSDP marks of that report (column-parallel
    everywhere, gathered between layers) nor row-parallel layers on a replicated input (each
    input sliced from a reduced, replicated value) make such a pair.
    """
    graph = ctx.semantics.view.graph
    if graph is None:
        return set()
    weights, data = params.weight_mask(), params.data_mask()
    found: set[str] = set()
    for role in ctx.semantics.roles:
        axes = {a.split(":(")[0] for a in role.facts.op.mesh_axes or ()}
        if role.role != "activation-reduce" or role.phase != "forward" or not axes - found:
            continue
        node = graph.id_of(role.facts.key)
        if node is None:
            continue
        row = _weight_matmul_upstream(graph, graph.sources_of(node), weights, data)
        if row is None:
            continue
        data_side = [o for o in graph.sources_of(row) if graph.parameter_bits(o) & data]
        if _weight_matmul_upstream(graph, data_side, weights, data) is not None:
            found |= axes
    return found


def _weight_matmul_upstream(graph: DataflowGraph, starts: list[int], weights: int, data: int) -> int | None:
    """The first matmul with a weights-only operand and a data operand reached backwards from
    ``starts`` without crossing a collective, a parameter or another matmul."""
    def weight_by_data(node: int) -> bool:
        bits = [graph.parameter_bits(o) for o in graph.sources_of(node)]
        return any(b & weights and not b & data for b in bits) and any(b & data for b in bits)
    return _matmul_upstream(graph, starts, weight_by_data)


def matmul_traffic_axes(ctx: RuleContext) -> set[str]:
    """Mesh axes of the activation collectives that move a matmul's product (a feature-split
    layer output gathered, a partial sum reduced): the axes that split some matmul.

    An embedding lookup in a vocab-split table reduces its masked rows over the table's axes
    (or gathers them) with no matmul upstream: that traffic says the table is split, not that a
    matmul is.
    """
    graph = ctx.semantics.view.graph
    if graph is None:
        return set()
    found: set[str] = set()
    for role in ctx.semantics.roles:
        axes = {a.split(":(")[0] for a in role.facts.op.mesh_axes or ()}
        if role.role not in ("activation-reduce", "activation-gather") or not axes - found:
            continue
        node = graph.id_of(role.facts.key)
        if node is not None and _matmul_upstream(graph, graph.sources_of(node)) is not None:
            found |= axes
    return found


def _matmul_upstream(graph: DataflowGraph, starts: list[int],
                     wanted: Callable[[int], bool] = lambda node: True) -> int | None:
    """The first matmul that ``wanted`` accepts, reached backwards from ``starts`` without crossing a
    collective, a parameter or another matmul (one it does not accept ends that path)."""
    seen, queue = set(starts), list(starts)
    while queue and len(seen) <= _PAIR_HOPS:
        node = queue.pop(0)
        opcode = graph.instruction_at[node].opcode
        if opcode in MATMULS:
            if wanted(node):
                return node
            continue
        if opcode in COLLECTIVE_OPCODES or opcode.endswith(("-start", "-done")) or opcode == "parameter":
            continue
        for source in graph.sources_of(node):
            if source not in seen:
                seen.add(source)
                queue.append(source)
    return None
