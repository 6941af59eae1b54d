"""What each value of an optimized (or partitioned) module is, from the dataflow: the memory classes.

Every entry instruction gets one class, decided from where its value comes
from and where it goes, never from names:

* ``weights``, ``optimizer_state``, ``inputs``: entry parameters, by the kind
  the analysis layer gave them (optimizer state is state that never reaches a
  matmul, a reduction or a collective: it only updates itself and its weight);
* ``gathered_weights``: an all-gather of weights only, and what is made from
  it and other weights only (a cast, a copy): FSDP's gathered copies;
* ``gradients``: a value made from the data that reaches an update of the
  step's state (a weight or optimizer-state output) through no matmul but its
  own: the gradient matmuls and their reductions;
* ``collective_buffers``: what other collectives produce (activation
  all-reduces, all-to-alls, permutes, the small tuples of async pairs);
* ``activations``: other values made from the data (the forward's results
  kept for the backward, and the backward's own);
* ``temporaries``: everything else (casts of local weight shards, constants,
  an optimizer's scratch values, unused heap).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.hlo.opcodes import COLLECTIVE_OPCODES

__all__ = ["CLASSES", "ValueClasses", "classify_values", "collective_of"]

CLASSES = ("weights", "optimizer_state", "gradients", "activations", "gathered_weights",
           "collective_buffers", "inputs", "outputs", "temporaries")

_WEIGHT, _STATE, _DATA = 1, 2, 4
_MATMULS = frozenset({"dot", "convolution", "ragged-dot"})
_REDUCTIONS = frozenset({"reduce", "reduce-window", "all-reduce", "reduce-scatter", "all-reduce-start"})
# Ops whose value is the same bytes (or a view of them) as their operand's.
_VIEWS = frozenset({"bitcast", "get-tuple-element", "tuple", "optimization-barrier", "copy-done",
                    "all-gather-done", "all-reduce-done", "collective-permute-done", "async-done"})


@dataclass(frozen=True, slots=True)
class ValueClasses:
    """The class of each entry instruction's value, and which are collectives."""

    by_name: dict[str, str]
    collectives: dict[str, str]  # instruction -> collective opcode it runs (all-gather, ...)


def collective_of(instruction: Instruction, module: HloModule, depth: int = 2) -> str | None:
    """The collective an instruction runs: itself, its ``-start``/``-done`` form, or one inside the
    computations it calls (a TPU async-collective fusion, an async-start wrapper); None otherwise."""
    opcode = instruction.opcode
    for suffix in ("-start", "-done"):
        opcode = opcode.removesuffix(suffix)
    if opcode in COLLECTIVE_OPCODES:
        return opcode
    if depth == 0:
        return None
    for name in instruction.called_computations:
        called = module.computation(name)
        if called is None:
            continue
        for inner in called.instructions:
            found = collective_of(inner, module, depth - 1)
            if found is not None:
                return found
    return None


def _contains(instruction: Instruction, module: HloModule, opcodes: frozenset[str], depth: int = 2) -> bool:
    if instruction.opcode in opcodes:
        return True
    if depth == 0:
        return False
    for name in instruction.called_computations:
        called = module.computation(name)
        if called is not None and any(_contains(i, module, opcodes, depth - 1) for i in called.instructions):
            return True
    return False


def classify_values(module: HloModule, parameter_classes: Mapping[int, str]) -> ValueClasses:
    """The class of every entry instruction of ``module`` (see the module docstring).

    ``parameter_classes``: entry parameter number -> ``weights``, ``optimizer_state`` or ``inputs``.
    """
    entry = module.entry
    if entry is None:
        return ValueClasses({}, {})
    origin: dict[str, int] = {}
    gathered: set[str] = set()
    collectives: dict[str, str] = {}
    classes: dict[str, str] = {}
    bit = {"weights": _WEIGHT, "optimizer_state": _STATE, "inputs": _DATA}
    for instruction in entry.instructions:
        number = instruction.parameter_number if instruction.opcode == "parameter" else None
        if number is not None:
            kind = parameter_classes.get(number, "inputs")
            origin[instruction.name] = bit.get(kind, _DATA)
            classes[instruction.name] = kind
            continue
        mask = 0
        for operand in instruction.operands:
            mask |= origin.get(operand, 0)
        origin[instruction.name] = mask
        collective = collective_of(instruction, module)
        if collective is not None:
            collectives[instruction.name] = collective
        from_gathered = any(operand in gathered for operand in instruction.operands)
        if mask and not mask & ~_WEIGHT and (collective == "all-gather" or from_gathered):
            gathered.add(instruction.name)
        elif collective == "all-gather" and any(_through_views(entry, operand) in gathered
                                                for operand in instruction.operands):
            gathered.add(instruction.name)  # the done half of a gather of weights (TPU: its tuple's parts)
    on_update = _update_path(entry, module, origin)
    for instruction in entry.instructions:
        name = instruction.name
        if name in classes:
            continue
        mask = origin[name]
        if name in gathered:
            classes[name] = "gathered_weights"
        elif name in on_update and mask & _DATA:
            classes[name] = "gradients"
        elif name in collectives:
            classes[name] = "collective_buffers"
        elif mask & _DATA:
            classes[name] = "activations"
        else:
            classes[name] = "temporaries"
    return ValueClasses(classes, collectives)


def _through_views(entry: Computation, name: str) -> str:
    """The instruction whose bytes ``name`` is, following get-tuple-elements and bitcasts."""
    for _ in range(16):
        instruction = entry.get(name)
        if instruction is None or instruction.opcode not in ("get-tuple-element", "bitcast") or not instruction.operands:
            return name
        name = instruction.operands[0]
    return name


def _update_path(entry: Computation, module: HloModule, origin: dict[str, int]) -> set[str]:
    """Values that reach an output made from the state (weights, optimizer state) through no matmul
    but their own: walking back from each such output, a matmul is taken and the walk stops there."""
    root = entry.root
    if root is None:
        return set()
    outputs = list(root.operands) if root.opcode == "tuple" else [root.name]
    stack = [name for name in outputs if origin.get(name, 0) & (_WEIGHT | _STATE)]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        instruction = entry.get(name)
        if instruction is None or instruction.opcode == "parameter":
            continue
        seen.add(name)
        if name not in outputs and _contains(instruction, module, _MATMULS):
            continue  # the gradient's own matmul: what feeds it is the forward's
        stack.extend(instruction.operands)
    return seen


def reaches_only_updates(module: HloModule, numbers: Iterable[int]) -> frozenset[int]:
    """Those of the entry parameters ``numbers`` that reach no matmul, reduction or collective: they
    only update themselves and the weight they belong to (an optimizer's moments).

    An all-gather on the way is no work of its own when nothing after it is: sharded state
    with replicated weights (ZeRO-1) updates its slice of the weight, and the updated slices
    are gathered into the step's new weights."""
    entry = module.entry
    if entry is None:
        return frozenset()
    wanted = set(numbers)
    params = {p.parameter_number: p for p in entry.parameters() if p.parameter_number in wanted}
    users = entry.users()
    judged: dict[str, bool] = {}  # instruction -> reaches no matmul, reduction or collective

    def only_updates(start: str) -> bool:
        stack, seen = [start], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if judged.get(name) is True:
                continue
            for user in users.get(name, ()):
                if judged.get(user.name) is False or (_feeds_work(user, module)
                                                      and collective_of(user, module) != "all-gather"):
                    return False
                stack.append(user.name)
        return True

    found = set()
    for number, param in params.items():
        answer = only_updates(param.name)
        judged[param.name] = answer
        if answer:
            found.add(number)
    return frozenset(found)


def _feeds_work(user: Instruction, module: HloModule) -> bool:
    if user.opcode in _MATMULS or user.opcode in _REDUCTIONS or collective_of(user, module) is not None:
        return True
    return user.opcode in ("fusion", "call", "while", "conditional") and (
        _contains(user, module, _MATMULS) or _contains(user, module, _REDUCTIONS))


def is_view(instruction: Instruction) -> bool:
    """Whether the instruction's value is its operand's bytes (no buffer of its own)."""
    return instruction.opcode in _VIEWS
