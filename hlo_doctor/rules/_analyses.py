"""Small analyses shared through RuleContext: execution counts per step, dot FLOPs."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction

COLLECTIVE_KINDS = (
    "all-gather", "all-reduce", "reduce-scatter", "all-to-all",
    "collective-permute", "collective-broadcast", "ragged-all-to-all",
)

_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')


def collective_kind(instruction: Instruction, module: HloModule | None = None) -> str | None:
    """all-gather, all-reduce, ... for a collective or its -start; None otherwise (and for -done)."""
    opcode = instruction.opcode
    if opcode in COLLECTIVE_KINDS:
        return opcode
    if opcode.endswith("-start") and opcode[: -len("-start")] in COLLECTIVE_KINDS:
        return opcode[: -len("-start")]
    if opcode == "async-start":
        printed = instruction.printed_opcode or ""
        if printed.endswith("-start") and printed[: -len("-start")] in COLLECTIVE_KINDS:
            return printed[: -len("-start")]
        if module is not None:
            for name in instruction.called_computations:
                called = module.computation(name)
                root = called.root if called is not None else None
                if root is not None and root.opcode in COLLECTIVE_KINDS:
                    return root.opcode
    return None


def walk(module: HloModule) -> Iterator[tuple[Computation, Instruction, int]]:
    """Every instruction reachable from the entry, with how often it runs per step.

    While bodies count their known trip count (backend_config, else a
    ``compare(i, constant(N)), direction=LT`` condition); fusion, call and
    async computations count once per caller; reduction bodies are skipped.
    """
    entry = module.entry
    if entry is None:
        return
    by_name = {c.name: c for c in module.computations}
    seen: set[tuple[str, int]] = set()
    stack: list[tuple[Computation, int]] = [(entry, 1)]
    while stack:
        computation, times = stack.pop()
        if (computation.name, times) in seen:
            continue
        seen.add((computation.name, times))
        for instruction in computation.instructions:
            yield computation, instruction, times
            opcode = instruction.opcode
            if opcode == "while":
                trips = trip_count(instruction, by_name)
                body = instruction.attribute("body")
                if body is not None and body.lstrip("%") in by_name:
                    stack.append((by_name[body.lstrip("%")], times * trips))
            elif opcode in ("fusion", "call", "async-start", "conditional"):
                for name in instruction.called_computations:
                    if name in by_name:
                        stack.append((by_name[name], times))


def trip_count(instruction: Instruction, by_name: dict[str, Computation]) -> int:
    config = instruction.backend_config or ""
    match = _TRIP.search(config)
    if match:
        return int(match.group(1))
    condition = instruction.attribute("condition")
    computation = by_name.get((condition or "").lstrip("%"))
    if computation is not None:
        for inner in computation.instructions:
            if inner.opcode == "compare" and inner.attribute("direction") == "LT":
                for operand in inner.operands:
                    const = computation.get(operand)
                    if const is not None and const.opcode == "constant" and const.literal:
                        try:
                            return max(1, int(const.literal.strip()))
                        except ValueError:
                            pass
    return 1


def execution_counts(module: HloModule) -> dict[str, int]:
    """How often each computation reachable from the entry runs per step."""
    counts: dict[str, int] = {}
    for computation, _, times in walk(module):
        counts[computation.name] = max(counts.get(computation.name, 0), times)
    return counts


_DIM_LABELS = re.compile(r"^(\w+)_(\w+)->(\w+)$")


def instruction_flops(instruction: Instruction, computation: Computation) -> float:
    """2 * MACs of a dot or convolution (per device when the module is partitioned)."""
    if instruction.opcode == "dot":
        lhs = computation.get(instruction.operands[0]) if instruction.operands else None
        if lhs is None:
            return 0.0
        text = instruction.attribute("lhs_contracting_dims") or "{}"
        dims = [int(x) for x in re.findall(r"\d+", text)]
        contracted = math.prod(lhs.shape.dims[d] for d in dims if d < lhs.shape.rank)
        return 2.0 * instruction.shape.num_elements * contracted
    if instruction.opcode == "convolution" and len(instruction.operands) >= 2:
        rhs = computation.get(instruction.operands[1])
        if rhs is None or instruction.shape.is_tuple:
            return 0.0
        labels = _DIM_LABELS.match((instruction.attribute("dim_labels") or "").strip())
        kernel = rhs.shape.dims
        if labels and len(labels.group(2)) == len(kernel) and "o" in labels.group(2):
            output_features = kernel[labels.group(2).index("o")]
        else:
            output_features = kernel[-1] if kernel else 1
        per_output = math.prod(kernel) // max(output_features, 1)
        return 2.0 * instruction.shape.num_elements * per_output
    return 0.0


def count_flops(module: HloModule) -> float:
    total = 0.0
    for computation, instruction, times in walk(module):
        if instruction.opcode in ("dot", "convolution"):
            total += times * instruction_flops(instruction, computation)
    return total


def backend_config_json(instruction: Instruction) -> dict:
    text = instruction.backend_config
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
