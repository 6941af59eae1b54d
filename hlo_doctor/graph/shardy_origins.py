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
first unmapped entry instruction with the same opcode and result dims, in
program order (shardy-xla keeps the order). Ops inside regions (while
bodies, reducers) and ops with no HLO counterpart stay unmapped and are
counted in :attr:`ShardyOrigins.unmapped`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction

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
    instruction: str | None  # HLO instruction name (in ``computation``)
    origin_name: str | None = None  # "constraint_N" on a constraint op
    computation: str | None = None  # None: the entry computation


@dataclass
class ShardyOrigins:
    path: str
    values: list[ShardyValue] = field(default_factory=list)
    constraints: dict[str, str] = field(default_factory=dict)  # constraint_N -> HLO name
    constraint_keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (computation, name)
    unmapped: int = 0
    # Results of a multi-result op that the HLO never reads (no get-tuple-element of them):
    # they have no HLO value of their own to map to.
    unread: int = 0
    entry: str | None = None  # the entry computation's name

    def by_instruction(self) -> dict[str, ShardyValue]:
        """Values of the entry computation by HLO instruction name."""
        return {v.instruction: v for v in self.values if v.instruction is not None and v.computation in (None, self.entry)}

    def by_key(self) -> dict[tuple[str, str], ShardyValue]:
        """Every mapped value by (computation, instruction)."""
        return {(v.computation or self.entry, v.instruction): v
                for v in self.values if v.instruction is not None and self.entry is not None}


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


class _Scope:
    """The instructions of one HLO computation, queued per opcode in program order."""

    def __init__(self, computation: Computation) -> None:
        self.computation = computation
        self.queues: dict[str, list[Instruction]] = defaultdict(list)
        for instruction in computation.instructions:
            if instruction.opcode != "parameter":
                self.queues[instruction.opcode].append(instruction)
        self.heads: dict[str, int] = defaultdict(int)
        self.used: set[str] = set()

    def take(self, opcode: str, dims: tuple[int, ...] | None) -> Instruction | None:
        """The first unused instruction with ``opcode`` (a constraint may be a custom-call) and ``dims``."""
        for candidate_opcode in (opcode, "custom-call") if opcode == "copy" else (opcode,):
            queue = self.queues.get(candidate_opcode, [])
            start = self.heads[candidate_opcode]
            while start < len(queue) and queue[start].name in self.used:
                start += 1
            self.heads[candidate_opcode] = start
            for candidate in queue[start:]:
                if candidate.name not in self.used and (
                    dims is None or candidate.shape.is_tuple or candidate.shape.dims == dims
                ):
                    self.used.add(candidate.name)
                    return candidate
        return None

    def tuple_element(self, instruction: Instruction, index: int) -> Instruction | None:
        """The ``get-tuple-element`` of ``instruction`` with this index (a multi-result op's value)."""
        if not instruction.shape.is_tuple:
            return instruction if index == 0 else None
        for user in self.queues.get("get-tuple-element", ()):
            if user.operands[:1] == (instruction.name,) and user.attribute("index") == str(index):
                return user
        return None


def _export_tuple(entry: Computation, name: str | None) -> str | None:
    """The ``tuple`` the MLIR->HLO export put in front of a result: when a returned value's
    sharding differs from the result's, the export returns ``get-tuple-element(tuple(value))``
    with the result's sharding on the get-tuple-element. Neither op is in Shardy's MLIR, so
    both take the function result's origins, axis by axis; None when ``name`` is no such
    get-tuple-element."""
    instruction = entry.get(name) if name is not None else None
    if instruction is None or instruction.opcode != "get-tuple-element" or len(instruction.operands) != 1:
        return None
    operand = entry.get(instruction.operands[0])
    if operand is None or operand.opcode != "tuple":
        return None
    return operand.name


def read_origins(path: str | Path, module: HloModule) -> ShardyOrigins:
    """Read Shardy's origins from ``path`` and map them to ``module``'s entry."""
    text = Path(path).read_text(encoding="utf-8")
    result = ShardyOrigins(str(path))
    entry = module.entry
    if entry is None:
        return result
    result.entry = entry.name
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
            wrapper = _export_tuple(entry, name)
            if wrapper is not None:
                result.values.append(ShardyValue(f"result{index}", main_line + 1, origins[0], wrapper))
    # Ops of @main's body: the indentation of its first op is the top level.
    # The ops of a top-level while's `cond` and `do` regions (one level deeper)
    # map to the HLO while's condition and body computations the same way.
    # Per computation and opcode, the instructions in program order
    # (shardy-xla keeps the order); an op takes the first unused one with its
    # opcode and result dims: a queue per opcode, not one cursor, so one op
    # without an HLO twin does not make every later op miss.
    entry_scope = _Scope(entry)
    scope: _Scope | None = entry_scope
    last_while: Instruction | None = None
    indent = None
    for number in range(main_line + 1, len(lines)):
        line = lines[number]
        stripped = line.strip()
        depth = len(line) - len(line.lstrip())
        if stripped == "}" and (indent is None or depth < indent):
            break
        if indent is not None and depth == indent and stripped in ("cond {", "} do {", "}"):
            called = None
            if last_while is not None and stripped != "}":
                name = last_while.attribute("condition" if stripped == "cond {" else "body") or ""
                called = module.computation(name.lstrip("%"))
            scope = _Scope(called) if called is not None else None
            if stripped == "}":
                scope, last_while = entry_scope, None
            continue
        match = _OP.match(line)
        if match is None:
            continue
        depth = len(match.group(1))
        if indent is None:
            indent = depth
        found = _ORIGINS.search(line)
        name_match = _ORIGIN_NAME.search(line)
        origins = _origins(found.group(1) if found else None)
        in_region = scope is not entry_scope
        if scope is None or depth != (indent + 2 if in_region else indent):
            if origins:
                result.unmapped += len([o for o in origins if o])
            continue
        op = match.group(3)
        opcode = _OPCODES.get(op, op.split(".", 1)[-1].replace("_", "-"))
        hlo = scope.take(opcode, _dims(_result_type(match.group(4))))
        if hlo is not None and not in_region and opcode == "while":
            last_while = hlo
        origin_name = name_match.group(1) if name_match else None
        if origin_name and hlo is not None:
            result.constraints[origin_name] = hlo.name
            result.constraint_keys[origin_name] = (scope.computation.name, hlo.name)
        for index, per_result in enumerate(origins or []):
            if not per_result:
                continue
            target = hlo
            if hlo is not None and len(origins) > 1:
                target = scope.tuple_element(hlo, index)
                if target is None:
                    result.unread += 1  # nothing reads this result: no get-tuple-element of it
            elif target is None:
                result.unmapped += 1
            result.values.append(
                ShardyValue(
                    match.group(2) if len(origins) == 1 else f"{match.group(2)}#{index}",
                    number + 1,
                    per_result,
                    target.name if target is not None else None,
                    origin_name,
                    scope.computation.name,
                )
            )
    _manual_computation_origins(entry, result)
    return result


_FULL_TO_SHARD = "SPMDFullToShardShape"
_SHARD_TO_FULL = "SPMDShardToFullShape"


def _manual_computation_origins(entry: Computation, result: ShardyOrigins) -> None:
    """Name ``mc_N_input: K`` / ``mc_N_output: K`` (a shard_map's in/out shardings) as constraints.

    Shardy numbers the manual computations of ``@main`` in program order; the
    MLIR->HLO export turns the N-th into the N-th ``call`` of an
    ``...manual_computation_body...`` computation, whose operand K is an
    ``SPMDFullToShardShape`` custom-call of the value that carries input K's
    sharding, and whose result K reaches an ``SPMDShardToFullShape``.
    """
    users: dict[str, list[Instruction]] = defaultdict(list)
    for instruction in entry.instructions:
        for used in instruction.operands:
            users[used].append(instruction)
    calls = [i for i in entry.instructions if i.opcode == "call"
             and any("manual_computation_body" in name for name in i.called_computations)]
    for number, call in enumerate(calls):
        for index, operand_name in enumerate(call.operands):
            operand = entry.get(operand_name)
            if operand is not None and _target(operand) == _FULL_TO_SHARD and operand.operands:
                source = entry.get(operand.operands[0])
                if source is not None:
                    key = f"mc_{number}_input: {index}"
                    result.constraints.setdefault(key, source.name)
                    result.constraint_keys.setdefault(key, (entry.name, source.name))
        if call.shape.is_tuple:
            elements = [(int(e.attribute("index") or 0), e) for e in users.get(call.name, ())
                        if e.opcode == "get-tuple-element" and (e.attribute("index") or "").isdigit()]
        else:
            elements = [(0, call)]  # one result: the call is its value
        for index, element in elements:
            frontier = [element]
            for _ in range(4):  # through the copies and reshapes the export puts in between
                frontier = [u for f in frontier for u in users.get(f.name, ())]
                done = [u for u in frontier if _target(u) == _SHARD_TO_FULL]
                if done:
                    key = f"mc_{number}_output: {index}"
                    result.constraints.setdefault(key, done[0].name)
                    result.constraint_keys.setdefault(key, (entry.name, done[0].name))
                    break
                frontier = [u for u in frontier if u.opcode in ("copy", "reshape", "bitcast")]


def _target(instruction: Instruction) -> str:
    if instruction.opcode != "custom-call":
        return ""
    return (instruction.attribute("custom_call_target") or "").strip('"')
