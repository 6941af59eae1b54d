"""Shardy's own account of where each sharding came from.

Dumped with ``shardy-verbose`` (the runner does), Shardy writes
``shardy/<module>/02.after_propagation.mlir`` whose values carry
``sdy.sharding_origins`` (per mesh axis: ``"self"``, ``"input: K"``,
``"output: K"`` or ``"constraint_N"``), ``sdy.propagation_edges`` and, on
the constraint ops (``sdy.sharding_constraint`` / ``sdy.reshard``),
``sdy.sharding_origin_name = "constraint_N"``.

:func:`read_origins` reads them (a line scan, not an MLIR parser: the dump
prints one op per line) and maps the ops of the entry function ``@main`` to
the HLO instructions of the after-propagation snapshot (after shardy-xla):
function arguments to entry parameters by number, each top-level op to the
next unmapped entry instruction with the same opcode and result dims, in
program order (shardy-xla keeps the order). Ops inside regions (while
bodies, reducers) and ops with no HLO counterpart stay unmapped and are
counted in :attr:`ShardyOrigins.unmapped`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hlo_doctor.hlo.ir import HloModule, Instruction

__all__ = ["AxisOrigin", "ShardyOrigins", "ShardyValue", "find_origins_file", "read_origins"]

_OP = re.compile(r"^(\s*)(%[\w#:]+)\s*=\s*\"?([a-z_]+\.[\w.]+|call|func\.call)\"?(.*)$")
_ORIGINS = re.compile(r"sdy\.sharding_origins\s*=\s*(\[[^\]]*\]|\{[^}]*\})")
_ORIGIN_NAME = re.compile(r'sdy\.sharding_origin_name\s*=\s*"([^"]+)"')
_PAIR = re.compile(r'"?([\w.]+)"?\s*=\s*"([^"]*)"')
_TENSOR = re.compile(r"tensor<((?:\d+x)*)[a-z]\w*>")
_ARG = re.compile(r"%arg(\d+):\s*tensor<[^>]*>\s*(\{)?")

_OPCODES = {
    "stablehlo.dot_general": "dot",
    "stablehlo.dot": "dot",
    "stablehlo.broadcast_in_dim": "broadcast",
    "sdy.reshard": "copy",
    "sdy.sharding_constraint": "copy",
    "stablehlo.custom_call": "custom-call",
    "func.call": "call",
    "call": "call",
}


@dataclass(frozen=True, slots=True)
class AxisOrigin:
    """Shardy's origin of one axis: kind, argument/result index, constraint name."""

    kind: str  # "self" | "input" | "output" | "constraint"
    index: int | None = None
    constraint: str | None = None

    @classmethod
    def parse(cls, text: str) -> AxisOrigin:
        text = text.strip()
        if text == "self":
            return cls("self")
        for kind in ("input", "output"):
            if text.startswith(kind + ":"):
                return cls(kind, int(text.split(":", 1)[1]))
        return cls("constraint", None, text)


@dataclass(frozen=True, slots=True)
class ShardyValue:
    """One MLIR value with origins and the HLO instruction it maps to."""

    mlir: str  # "%arg0", "%7", "result0"
    line: int
    origins: dict[str, AxisOrigin]
    instruction: str | None  # HLO instruction name in the entry computation
    origin_name: str | None = None  # "constraint_N" on a constraint op


@dataclass
class ShardyOrigins:
    path: str
    values: list[ShardyValue] = field(default_factory=list)
    constraints: dict[str, str] = field(default_factory=dict)  # constraint_N -> HLO name
    unmapped: int = 0

    def by_instruction(self) -> dict[str, ShardyValue]:
        return {v.instruction: v for v in self.values if v.instruction is not None}


def find_origins_file(shardy_dumps) -> Path | None:
    """The ``*after_propagation.mlir`` among a module's Shardy dumps."""
    for path in shardy_dumps or ():
        if str(path).endswith("after_propagation.mlir"):
            return Path(path)
    return None


def _origins(text: str | None) -> list[dict[str, AxisOrigin]]:
    if not text:
        return []
    if text.startswith("["):
        return [
            {a: AxisOrigin.parse(o) for a, o in _PAIR.findall(part)}
            for part in re.findall(r"\{[^}]*\}", text)
        ]
    return [{a: AxisOrigin.parse(o) for a, o in _PAIR.findall(text)}]


def _dims(text: str) -> tuple[int, ...] | None:
    match = _TENSOR.search(text)
    if match is None:
        return None
    return tuple(int(d) for d in match.group(1).split("x") if d)


def _result_type(rest: str) -> str:
    # the text after the last " : " (the op's type), then after "->" if any
    tail = rest.rsplit(" : ", 1)[-1]
    return tail.rsplit("->", 1)[-1]


def read_origins(path: str | Path, module: HloModule) -> ShardyOrigins:
    """Read Shardy's origins from ``path`` and map them to ``module``'s entry."""
    text = Path(path).read_text(encoding="utf-8")
    result = ShardyOrigins(str(path))
    entry = module.entry
    if entry is None:
        return result
    params = {p.parameter_number: p for p in entry.parameters()}
    lines = text.splitlines()
    main_line = next((i for i, line in enumerate(lines) if "func.func" in line and "@main" in line), None)
    if main_line is None:
        return result
    header = lines[main_line]
    # Arguments: split the signature at "%argN:".
    signature, _, results = header.partition(") -> ")
    pieces = re.split(r"(?=%arg\d+:)", signature)
    for piece in pieces:
        match = _ARG.match(piece)
        if match is None:
            continue
        number = int(match.group(1))
        found = _ORIGINS.search(piece)
        origins = _origins(found.group(1) if found else None)
        param = params.get(number)
        if origins and origins[0]:
            result.values.append(
                ShardyValue(f"%arg{number}", main_line + 1, origins[0], param.name if param else None)
            )
    root = entry.root
    for index, piece in enumerate(re.split(r"(?=tensor<)", results)[1:]):
        found = _ORIGINS.search(piece)
        origins = _origins(found.group(1) if found else None)
        if origins and origins[0]:
            name = None
            if root is not None:
                if root.opcode == "tuple" and index < len(root.operands):
                    name = root.operands[index]
                elif index == 0:
                    name = root.name
            result.values.append(ShardyValue(f"result{index}", main_line + 1, origins[0], name))
    # Ops of @main's body: the indentation of its first op is the top level.
    instructions = list(entry.instructions)
    used: set[str] = set()
    cursor = 0
    indent = None
    for number in range(main_line + 1, len(lines)):
        line = lines[number]
        if line.strip() == "}" and (indent is None or len(line) - len(line.lstrip()) < indent):
            break
        match = _OP.match(line)
        if match is None:
            continue
        depth = len(match.group(1))
        if indent is None:
            indent = depth
        found = _ORIGINS.search(line)
        name_match = _ORIGIN_NAME.search(line)
        origins = _origins(found.group(1) if found else None)
        if depth != indent:
            if origins:
                result.unmapped += 1
            continue
        op = match.group(3)
        opcode = _OPCODES.get(op, op.split(".", 1)[-1].replace("_", "-"))
        dims = _dims(_result_type(match.group(4)))
        hlo: Instruction | None = None
        for position in range(cursor, len(instructions)):
            candidate = instructions[position]
            if candidate.name in used or candidate.opcode == "parameter":
                continue
            same_opcode = candidate.opcode == opcode or (
                opcode == "copy" and candidate.opcode == "custom-call"
            )
            if same_opcode and (dims is None or candidate.shape.is_tuple or candidate.shape.dims == dims):
                hlo = candidate
                cursor = position + 1
                break
        if hlo is not None:
            used.add(hlo.name)
        origin_name = name_match.group(1) if name_match else None
        if origin_name and hlo is not None:
            result.constraints[origin_name] = hlo.name
        for index, per_result in enumerate(origins or []):
            if not per_result:
                continue
            if hlo is None:
                result.unmapped += 1
            result.values.append(
                ShardyValue(
                    match.group(2) if len(origins) == 1 else f"{match.group(2)}#{index}",
                    number + 1,
                    per_result,
                    hlo.name if hlo is not None and index == 0 else None,
                    origin_name,
                )
            )
    return result
