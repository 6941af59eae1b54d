"""A small, independent reader of XLA's HLO text, for the oracle.

The oracle must not inherit hlo-doctor's mistakes, so it does not use
hlo-doctor's parser or graph: this module reads just what the oracle needs
(instruction names, opcodes, operands, a few attributes, tuple slots) from the
partitioned module JAX 0.10.2 prints, and builds a slot-level dataflow graph:
each value is one slot, or one slot per element of a tuple, so a loop's
carried state keeps its elements apart.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from dataclasses import dataclass, field

__all__ = ["Instr", "Module", "parse_module"]

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(")
_NAME = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_CALLED = re.compile(r"\b(to_apply|calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_INDEX = re.compile(r"\bindex=(\d+)")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")


def _matching(text: str, start: int) -> int:
    """The index just past the parenthesis or brace group that opens at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _split_top(text: str) -> list[str]:
    """``text`` split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Instr:
    """One instruction: what the oracle reads of it."""

    computation: str
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attributes: str
    is_root: bool

    @property
    def slots(self) -> int:
        """1 for an array; the element count of a tuple."""
        if not self.shape.startswith("("):
            return 1
        return max(1, len(_split_top(re.sub(r"/\*.*?\*/", "", self.shape[1:-1]))))

    @property
    def element_type(self) -> str:
        match = _ARRAY.match(self.shape)
        return match.group(1) if match else ""

    @property
    def dims(self) -> tuple[int, ...]:
        match = _ARRAY.match(self.shape)
        if not match or not match.group(2):
            return ()
        return tuple(int(d) for d in match.group(2).split(","))

    @property
    def elements(self) -> int:
        count = 1
        for d in self.dims:
            count *= d
        return count

    @property
    def op_name(self) -> str:
        match = _OP_NAME.search(self.attributes)
        return match.group(1) if match else ""

    @property
    def parameter_number(self) -> int | None:
        return int(self.operands[0]) if self.opcode == "parameter" else None

    def called(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for key, value in _CALLED.findall(self.attributes):
            out[key].append(value)
        match = _BRANCHES.search(self.attributes)
        if match:
            out["branches"] = [b.strip().lstrip("%") for b in match.group(1).split(",") if b.strip()]
        return out

    def index(self) -> int:
        match = _INDEX.search(self.attributes)
        return int(match.group(1)) if match else 0


def _parse_instruction(computation: str, line: str) -> Instr | None:
    match = _NAME.match(line)
    if not match:
        return None
    rest = line[match.end():]
    if rest.startswith("("):
        end = _matching(rest, 0)
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren]
    end = _matching(rest, paren)
    inside = _COMMENT.sub("", rest[paren + 1:end - 1])
    attributes = rest[end:]
    if opcode in ("parameter", "constant", "iota", "partition-id", "replica-id", "rng-get-and-update-state"):
        operands = [inside.strip()] if opcode == "parameter" else []
    else:
        operands = [p.split()[-1].lstrip("%") for p in _split_top(inside)]
    return Instr(computation, match.group(2), shape, opcode, operands, attributes, bool(match.group(1)))


@dataclass
class Module:
    """The computations of one HLO module, and a slot-level dataflow graph over them."""

    entry: str
    computations: dict[str, list[Instr]]
    by_name: dict[tuple[str, str], Instr] = field(default_factory=dict)
    edges: dict[tuple[str, str, int], list[tuple[str, str, int]]] = field(default_factory=dict)

    def instr(self, computation: str, name: str) -> Instr:
        return self.by_name[(computation, name)]

    def root(self, computation: str) -> Instr:
        body = self.computations[computation]
        return next((i for i in body if i.is_root), body[-1])

    def parameters(self, computation: str) -> dict[int, Instr]:
        return {int(i.operands[0]): i for i in self.computations[computation] if i.opcode == "parameter"}

    def instructions(self):
        for body in self.computations.values():
            yield from body

    def users(self) -> dict[tuple[str, str], list[Instr]]:
        out: dict[tuple[str, str], list[Instr]] = defaultdict(list)
        for instr in self.instructions():
            for operand in instr.operands:
                out[(instr.computation, operand)].append(instr)
        return out

    # -- the slot graph -------------------------------------------------------------------
    def build_edges(self) -> None:
        edges: dict[tuple[str, str, int], list[tuple[str, str, int]]] = defaultdict(list)

        def slots(comp: str, name: str) -> list[tuple[str, str, int]]:
            instr = self.by_name.get((comp, name))
            return [(comp, name, k) for k in range(instr.slots if instr else 1)]

        def link_all(srcs, dsts) -> None:
            for s in srcs:
                edges[s].extend(dsts)

        def link_slotwise(src_comp, src_name, dst_comp, dst_name) -> None:
            src, dst = slots(src_comp, src_name), slots(dst_comp, dst_name)
            if len(src) == len(dst):
                for s, d in zip(src, dst, strict=True):
                    edges[s].append(d)
            else:
                link_all(src, dst)

        for instr in self.instructions():
            comp, me = instr.computation, instr.name
            called = instr.called()
            if instr.opcode == "get-tuple-element":
                k = instr.index()
                link_all([(comp, instr.operands[0], k)], slots(comp, me))
            elif instr.opcode == "tuple":
                for k, operand in enumerate(instr.operands):
                    link_all(slots(comp, operand), [(comp, me, k)])
            elif instr.opcode == "opt-barrier":
                link_slotwise(comp, instr.operands[0], comp, me)  # a tuple passed through, element by element
            elif instr.opcode == "while":
                body, cond = called["body"][0], called["condition"][0]
                body_param = self.parameters(body)[0].name
                cond_param = self.parameters(cond)[0].name
                link_slotwise(comp, instr.operands[0], body, body_param)
                link_slotwise(comp, instr.operands[0], cond, cond_param)
                root = self.root(body).name
                link_slotwise(body, root, body, body_param)
                link_slotwise(body, root, comp, me)
            elif instr.opcode == "conditional":
                branches = called.get("branches") or (called.get("true_computation", []) +
                                                      called.get("false_computation", []))
                for k, branch in enumerate(branches):
                    params = self.parameters(branch)
                    if 0 in params and k + 1 < len(instr.operands):
                        link_slotwise(comp, instr.operands[k + 1], branch, params[0].name)
                    link_slotwise(branch, self.root(branch).name, comp, me)
            elif instr.opcode in ("call", "fusion", "async-start") or (
                    instr.opcode == "custom-call" and "calls" in called):
                callee = called["calls"][0] if "calls" in called else called["to_apply"][0]
                params = self.parameters(callee)
                for k, operand in enumerate(instr.operands):
                    if k in params:
                        link_slotwise(comp, operand, callee, params[k].name)
                link_slotwise(callee, self.root(callee).name, comp, me)
            else:
                for operand in instr.operands:
                    link_all(slots(comp, operand), slots(comp, me))
        self.edges = dict(edges)

    def taint(self, sources: dict[tuple[str, str, int], int]) -> dict[tuple[str, str, int], int]:
        """Bitsets propagated forward from ``sources`` to a fixpoint (loops included)."""
        bits: dict[tuple[str, str, int], int] = dict(sources)
        queue = deque(sources)
        while queue:
            node = queue.popleft()
            value = bits[node]
            for nxt in self.edges.get(node, ()):
                old = bits.get(nxt, 0)
                if old | value != old:
                    bits[nxt] = old | value
                    queue.append(nxt)
        return bits


def parse_module(text: str) -> Module:
    """The module in ``text`` (one HLO module, as XLA prints it)."""
    computations: dict[str, list[Instr]] = {}
    entry = ""
    current: str | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("//") or line.startswith("HloModule"):
            continue
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            match = _HEADER.match(line)
            if match:
                current = match.group(2)
                computations[current] = []
                if match.group(1):
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        if current is not None:
            instr = _parse_instruction(current, line)
            if instr is not None:
                computations[current].append(instr)
    module = Module(entry, computations)
    module.by_name = {(i.computation, i.name): i for i in module.instructions()}
    module.build_edges()
    return module
