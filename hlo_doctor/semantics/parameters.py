"""What each entry parameter of a module is: a weight (model or optimizer state), data, or a scalar.

Decided from what the program does with it, never from its name:

* **scalar**: one element (a learning rate, a step count, a Python scalar
  torch_xla passes as ``f32[]``);
* **state**: a value the step returns updated. torch_xla's ``buffer_donor``
  entries (exactly the weights and optimizer state of a training step), the
  parameters aliased to an output (``input_output_alias``: donated JAX
  arguments), and parameters that reach an output of their own shape
  through elementwise ops only (``w - lr * g``: an update) and are not data;
* **data**: integer arrays (tokens, labels, masks), every non-state array of
  a training step (one that updates some state: torch_xla's, or JAX's), and arrays whose dim 0 reaches a layer's matmul as the
  activation's free dim while the other operand does not derive from them
  (see :mod:`hlo_doctor.semantics.batch_dims`): a residual ``x + f(x @ w)``
  keeps ``x`` data;
* **weight**: every other array (state included).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hlo_doctor.dump import Role
from hlo_doctor.graph.dataflow import DataflowGraph
from hlo_doctor.graph.source import split_module_path
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.semantics.batch_dims import analyze_batch, buffer_donors, contracted_inputs, meets_batch
from hlo_doctor.semantics.view import ModuleView

__all__ = ["EntryParameters", "classify_parameters", "is_integer", "torch_parameter_names", "updated_parameters", "updates_of"]

_ALIAS = re.compile(r"\}\s*:\s*\(\s*(\d+)\s*,")
# Ops through which an updated weight keeps its identity (an optimizer's elementwise update).
_UPDATE_OPS = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "select", "convert", "copy", "bitcast",
    "reshape", "negate", "sqrt", "rsqrt", "clamp", "fusion", "dynamic-update-slice", "power", "abs", "sign",
})

_RESHAPING = frozenset({"dynamic-slice", "slice", "all-gather", "all-to-all", "collective-permute", "pad"})
_ARITHMETIC = frozenset({"add", "subtract", "multiply", "divide", "fusion"})


def is_integer(element_type: str) -> bool:
    """Integer and boolean element types: indices, labels, masks, counts."""
    return element_type == "pred" or element_type[:1] in ("s", "u")


@dataclass(frozen=True, slots=True)
class EntryParameters:
    """Entry parameter numbers by what they are (see the module docstring)."""

    weights: frozenset[int]
    data: frozenset[int]
    scalars: frozenset[int]
    state: frozenset[int]
    names: dict[int, str]

    def data_mask(self) -> int:
        """The data inputs as bits of parameter numbers (as the graph's ``parameter_bits``)."""
        return _bits(self.data)

    def weight_mask(self) -> int:
        """The weights as bits of parameter numbers (as the graph's ``parameter_bits``)."""
        return _bits(self.weights)

    def kind(self, number: int) -> str:
        if number in self.scalars:
            return "scalar"
        if number in self.data:
            return "data"
        return "weight"


def classify_parameters(view: ModuleView, module: HloModule, graph: DataflowGraph) -> EntryParameters:
    """The entry parameters of the per-device ``module`` by what they are."""
    entry = module.entry
    params = [p for p in entry.parameters() if p.parameter_number is not None] if entry is not None else []
    scalars = frozenset(_numbers(p for p in params if p.shape.is_tuple is False and p.shape.num_elements <= 1))
    donors = buffer_donors(view)
    state = (set(donors) | _aliased(view)) - scalars
    arrays = [p for p in params if p.parameter_number not in scalars and not p.shape.is_tuple]
    data: set[int] = set()
    for param in arrays:
        number = param.parameter_number
        if number is None or number in state:
            continue
        if is_integer(param.shape.element_type) or donors:
            data.add(number)
    if not donors and state:
        # A training step that donates its state: what it does not update is its input.
        data |= _numbers(arrays) - state
    elif not donors:
        updated = updated_parameters(module, graph, params) - data - scalars
        batch = analyze_batch(view, module, graph, per_device=True, require_sharded=False,
                              exclude=frozenset(state) | frozenset(data), follow=False)
        sources = set(batch.matmul_inputs)
        if updated - sources:
            # A training step: some weights are updated that no matmul reads as an activation. Then
            # being updated outweighs reaching a matmul as its free dim, which a weight does too:
            # a norm scale (its dim 0 is free in the weight-gradient matmul of the layer it scales),
            # a weight applied as ``w @ x.T`` (its dim 0 is the output's free dim).
            sources -= updated
        elif sources:
            # No update tells weights from data (an eval step): the data's batch dim is never
            # contracted, and a weight applied as ``w @ x.T`` has its dim 0 contracted by the next layer.
            # A contracted source is a weight when other data (tokens, or another source) carries a
            # batch that no dot contracts, and its dim 0 is not that batch's extent (a batch input's
            # dim 0 can look contracted where the batch is lost in a loop's carries).
            contracted = contracted_inputs(module, graph, frozenset(sources | data))
            rows = {p.parameter_number: p.shape.dims[0] for p in arrays if p.shape.rank >= 1}
            batch_rows = {rows.get(n) for n in (sources | data) - contracted}
            if batch_rows:
                sources = {n for n in sources if n not in contracted or rows.get(n) in batch_rows}
        data |= sources
        # Updated in place (w - lr * g) without being donated: state too, unless it is an activation's source.
        state |= updated - data
        if state:
            # A training step: what it does not update is its input (float targets, masks, features).
            data |= _numbers(arrays) - state
        elif data:
            # An eval step: an input that meets the batch elementwise on its own dim 0 is data too
            # (a float mask that weighs the loss per token; it reaches no matmul).
            data |= meets_batch(module, graph, frozenset(data), frozenset(_numbers(arrays)) - data)
    if view.framework == "torch_xla":
        sharded = view.sharded
        global_params = sharded.entry.parameters() if sharded is not None and sharded.entry is not None else params
        names = torch_parameter_names(global_params, view.dump.run_record, exclude=frozenset(data))
    else:
        names = {number: _name(p) for p in params if (number := p.parameter_number) is not None}
    weights = frozenset(_numbers(arrays)) - data
    return EntryParameters(weights, frozenset(data), scalars, frozenset(state), names)


def _numbers(params: Iterable[Instruction]) -> set[int]:
    """The parameter numbers of ``params``."""
    return {number for p in params if (number := p.parameter_number) is not None}


def _name(param: Instruction) -> str:
    metadata = param.metadata
    if metadata is not None and metadata.op_name:
        return split_module_path(metadata.op_name)[1]
    return param.name


# torch dtype (as the runner records it) -> HLO element type
_TORCH_TYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "s64",
                "int32": "s32", "int16": "s16", "int8": "s8", "uint8": "u8", "bool": "pred"}


def torch_parameter_names(params: Iterable[Instruction], run_record: object,
                          exclude: frozenset[int] = frozenset()) -> dict[int, str]:
    """How the user knows each torch_xla entry parameter (all named ``xla__device_data`` in the dump).

    The module path of the ``nn.Module`` parameter it is (``model.layers.0.self_attn.o_proj.weight``),
    when the runner recorded the model's parameters (``module_trees``) and exactly one of them is a
    direct parameter of the module whose forward first reads it (the op_name's module path) with its
    global shape and dtype, and no other entry parameter matches that path; otherwise its name and
    global shape (``p10.34 f32[256,256]``). Parameter numbers in ``exclude`` (the data) are never
    given a path. ``params`` should carry global shapes (the after-propagation module's).
    """
    recorded = _recorded_parameters(run_record)
    claims: dict[int, str] = {}
    fallback: dict[int, str] = {}
    for param in params:
        number = param.parameter_number
        if number is None:
            continue
        fallback[number] = f"{param.name} {param.shape}"
        metadata = param.metadata
        owner = split_module_path(metadata.op_name)[0] if metadata is not None else None
        if owner is None or number in exclude or param.shape.is_tuple:
            continue
        found = [path for path, shape, element_type in recorded
                 if path.rpartition(".")[0] == owner and shape == param.shape.dims
                 and element_type == param.shape.element_type]
        if len(found) == 1:
            claims[number] = found[0]
    taken = Counter(claims.values())
    return {number: claims[number] if taken[claims.get(number, "")] == 1 else label
            for number, label in fallback.items()}


def _recorded_parameters(run_record: object) -> list[tuple[str, tuple[int, ...], str]]:
    """(path, shape, HLO element type) of every parameter the runner recorded (``module_trees``)."""
    trees = run_record.get("module_trees") if isinstance(run_record, dict) else None
    found = []
    for tree in trees if isinstance(trees, list) else ():
        entries = tree.get("parameters") if isinstance(tree, dict) else None
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, dict):
                continue
            path, shape, dtype = entry.get("path"), entry.get("shape"), entry.get("dtype")
            element_type = _TORCH_TYPES.get(str(dtype).removeprefix("torch."))
            if (isinstance(path, str) and path and element_type is not None and isinstance(shape, list)
                    and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
                found.append((path, tuple(shape), element_type))
    return found


def _aliased(view: ModuleView) -> set[int]:
    for role in (Role.AFTER_PARTITIONING, Role.AFTER_OPTIMIZATIONS, Role.AFTER_PROPAGATION):
        snapshot = view.module.snapshot(role)
        text = snapshot.header_attribute("input_output_alias") if snapshot is not None else None
        if text:
            return {int(x) for x in _ALIAS.findall(text)}
    return set()


def updated_parameters(module: HloModule, graph: DataflowGraph, params: list[Instruction]) -> set[int]:
    """Parameters that reach an output of their own shape through elementwise update ops only, one of
    them arithmetic (``w - lr * g``; a cache written by ``dynamic-update-slice`` alone is not updated)."""
    entry = module.entry
    root = entry.root if entry is not None else None
    if entry is None or root is None:
        return set()
    by_name = {p.name: p for p in params}
    outputs = [entry.get(n) for n in root.operands] if root.opcode == "tuple" else [root]
    found: set[int] = set()
    for output in outputs:
        if output is not None and not output.shape.is_tuple:
            found |= updates_of(entry, output, by_name)
    return found


def updates_of(computation: Computation, value: Instruction, params: Mapping[str, Instruction]) -> set[int]:
    """The parameters of ``params`` (by name) that ``value`` is an update of: reached from it through
    elementwise update ops only, one of them arithmetic (``w - lr * g``), or through a slice, gather or
    pad of the updated value (the step returns it in another sharding: this device's slice of it, or
    gathered and cut back for an uneven dim)."""
    found: set[int] = set()
    stack: list[tuple[Instruction, bool]] = [(value, False)]
    seen: set[tuple[str, bool]] = set()
    while stack:
        current, arithmetic = stack.pop()
        if (current.name, arithmetic) in seen or len(seen) > 64:
            continue
        seen.add((current.name, arithmetic))
        param = params.get(current.name)
        if param is not None:
            number = param.parameter_number
            if current is not value and number is not None and arithmetic:
                found.add(number)
            continue
        if current.opcode in _RESHAPING:
            operand = computation.get(current.operands[0]) if current.operands else None
            if operand is not None and not operand.shape.is_tuple:
                stack.append((operand, arithmetic))
            continue
        if current.opcode not in _UPDATE_OPS:
            continue
        arithmetic = arithmetic or current.opcode in _ARITHMETIC
        for name in current.operands:
            operand = computation.get(name)
            if operand is not None and not operand.shape.is_tuple and (
                    operand.shape.dims == current.shape.dims or operand.shape.rank == 0):
                stack.append((operand, arithmetic))
    return found


def _bits(numbers: frozenset[int]) -> int:
    bits = 0
    for number in numbers:
        bits |= 1 << number
    return bits
