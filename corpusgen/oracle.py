"""The oracle: the role each collective of a generated program plays, from what the generator knows.

hlo-doctor must decide roles from the dataflow alone. The oracle may use
names, because the generator chose them: its registry says which entry
parameter (by its argument path, JAX's ``op_name`` of the parameter) is a
weight, optimizer state, data or labels, and which output leaf is a new
weight or new optimizer state. JAX's ``op_name`` gives the phase
(``transpose(jvp(...))`` is the backward pass; the generator's optimizer runs
under a ``named_scope`` of its own).

The definitions (those of ``hlo-doctor collectives``):

- a value *is a gradient* when it reaches a new weight or new optimizer state
  output through elementwise ops and moves only (no matmul, reduce, gather or
  scatter in between): it is already the gradient, not an activation that a
  later contraction turns into one;
- ``weight-gather``: an all-gather (or ring permute) of a value derived from no
  data, or of a gradient or updated weight;
- ``activation-gather``: an all-gather of a value derived from the data;
- ``gradient-reduce``: an all-reduce / reduce-scatter of a gradient;
- ``activation-reduce``: of any other value derived from the data;
- ``scalar-reduce``: a reduction of at most 64 elements (every weight of a
  generated program is larger);
- ``index-gather``: integer or boolean operands;
- ``reshard``: an all-gather used only by dynamic slices (gathered, then each
  device cuts its piece again), an all-to-all or permute outside an expert or pipeline block;
- ``expert-dispatch`` / ``pipeline-send``: an all-to-all / permute inside the
  generator's ``moe`` / ``pipeline`` scope;
- ``other``: a reduction of weights only, a collective whose groups are all of
  one device.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpusgen.hlo_walk import Instr, Module

__all__ = ["COLLECTIVES", "LabelledCollective", "label_collectives", "phase_of"]

COLLECTIVES = frozenset({
    "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
    "ragged-all-to-all", "collective-broadcast", "all-gather-start", "all-reduce-start",
    "collective-permute-start",
})
WEIGHTISH = frozenset({"weight", "optimizer-state"})
DATAISH = frozenset({"data", "labels"})
SCALAR_ELEMENTS = 64
# Ops a gradient passes through unchanged in meaning on its way to the update.
_PASS = frozenset({
    "reduce", "add", "subtract", "multiply", "divide", "negate", "sqrt", "rsqrt", "power", "maximum", "minimum",
    "select", "clamp", "convert", "copy", "bitcast", "reshape", "transpose", "broadcast", "abs", "sign",
    "dynamic-slice", "dynamic-update-slice", "slice", "concatenate", "pad", "tuple", "get-tuple-element",
    "while", "call", "conditional", "parameter", "all-reduce", "reduce-scatter", "all-gather",
    "collective-permute", "all-to-all", "exponential", "log", "tanh", "compare", "and", "or", "not",
    "opt-barrier", "custom-call", "fusion", "async-start", "async-done", "all-reduce-start",
    "all-reduce-done", "all-gather-start", "all-gather-done",
})
_MOVES = frozenset({"copy", "bitcast", "reshape", "transpose", "convert"})
_INTEGER = re.compile(r"^(s|u)\d+$|^pred$")


# Natural pathologies: what XLA's propagation did to a program that asked for nothing wrong, and the
# rules that name their root cause.
NATURAL = {
    "natural-redundant-compute": ("replicated-batch", "non-batch-dim-sharding"),
    "natural-batch-traffic": ("activation-all-gather", "non-batch-dim-sharding", "replicated-batch", "reshard-churn"),
}


_ACTIVATION_TRAFFIC = ("activation-gather", "activation-reduce", "reshard")
# A table lookup and its gradient's scatter-add (torch_xla's ops; JAX's primitives). XLA's partitioner picks
# how to partition a gather or scatter by its own memory and communication cost model (gather_scatter_handler:
# GatherPartitionMethodsOrderedByCost): the masked lookup of a vocab-split table all-reduced over the split
# axes, the table's feature split all-to-all-ed to the rows. That traffic is the lookup's, for the table's
# layout, not a layout the activations were not asked to have. A collective-permute inside it is not: it
# reorders rows between two device orders of the batch's axes (the program's own mark against its
# constraints, or an order in which the gathered axis is not minor), which another order avoids.
_LOOKUP_OPS = frozenset({"aten__index_select", "aten__index_put", "aten__embedding", "aten__embedding_dense_backward",
                         "gather", "scatter-add", "scatter_add"})


def stray_traffic(tensor_axes: set[str], collectives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Activation collectives over any axis but the tensor axes (by name): traffic the layout did not ask
    for. A reshard of a weight or of its gradient (a weight's shard permuted into another device order
    before its gather, the gradient permuted back to the weight's) moves no activation, and a table
    lookup's gathers, reductions and all-to-alls are the partitioner's strategy for the table's layout
    (``_LOOKUP_OPS``): neither is counted."""
    return [c for c in collectives if c["role"] in _ACTIVATION_TRAFFIC and not set(c["axes"]) <= tensor_axes
            and c.get("moves") not in ("weight", "gradient")
            and (c.get("op") not in _LOOKUP_OPS or c["kind"] == "collective-permute")]


# Natural redundant compute is repeated work on the batch: it shows in the matmuls. The JAX generator reads
# the FLOPs from XLA's cost analysis (every op, the unsharded lowering against the compiled partitioned
# module); when the partitioned module's matmuls do not repeat (their FLOPs per device times the devices are
# within this factor of the program's), the excess is elsewhere: the optimizer update, which plain data
# parallelism repeats on the devices of its axes by design (seed 2026 0378a: 75.5 M elementwise values per
# device, as many as the whole program's). The torch_xla generator measures the matmuls alone.
MATMUL_REPEAT_FLOOR = 1.1


def matmul_redundancy(dump: Path, devices: int) -> float | None:
    """Per-device matmul FLOPs of the partitioned module times ``devices``, over the program's (the module
    before partitioning); loop bodies count once in both. None when either module is missing."""
    from corpusgen.hlo_walk import parse_module
    from corpusgen.torch_oracle import dot_flops

    partitioned = sorted(dump.glob("*after_spmd-partitioning*.txt")) or sorted(
        dump.glob("*after_tpu-spmd-partitioning*.txt"))
    program = sorted(dump.glob("*before_spmd-partitioning*.txt")) or sorted(
        dump.glob("*before_sharding-propagation*.txt"))
    if not partitioned or not program:
        return None
    total = dot_flops(parse_module(program[0].read_text()))
    return dot_flops(parse_module(partitioned[0].read_text())) * devices / total if total else None


def reorder_rules(collectives: list[dict[str, Any]]) -> list[str]:
    """Rules a program may report besides its pathology: a collective-permute inside a table lookup
    reorders the batch's rows between two orders of its axes (the order the program writes them in is
    not the one the lookup's gather needs), a cause of its own that reshard-churn names."""
    return ["reshard-churn"] if any(c["kind"] == "collective-permute" and c.get("op") in _LOOKUP_OPS
                                    for c in collectives) else []


def natural_rules(pathology: str, axis_roles: dict[str, str], collectives: list[dict]) -> list[str]:
    """The rules of which one must name a natural ``pathology``'s root cause. Redundant compute whose
    labelled collectives include an activation all-gathered over an axis that is not a tensor axis
    (the batch's rows gathered for a matmul instead of its weight: pytorch/xla#6778's pattern, which
    the reviewed ``fsdp-activation-gather`` fixtures name ``activation-all-gather``) may be named so too."""
    rules = list(NATURAL[pathology])
    tensor = {name for name, role in axis_roles.items() if role == "tensor"}
    if pathology == "natural-redundant-compute" and any(
            c["role"] == "activation-gather" and not set(c["axes"]) <= tensor for c in collectives):
        rules.append("activation-all-gather")
    return rules


@dataclass(frozen=True)
class LabelledCollective:
    instruction: str
    computation: str
    kind: str
    role: str
    phase: str
    why: str
    axes: tuple[str, ...] = ()
    crosses_hosts: bool | None = None
    moves: str | None = None
    """What the operand is: ``activation`` (derived from the data), ``gradient`` (derived from the data,
    reaching an update elementwise) or ``weight`` (from the weights only); None: a truth written before
    it was recorded."""
    op: str | None = None
    """The op the collective's metadata names (the last piece of its ``op_name``: ``aten__index_select``,
    ``gather``), where the partitioner made it."""

    def as_json(self) -> dict:
        return {"instruction": self.instruction, "computation": self.computation, "kind": self.kind,
                "role": self.role, "phase": self.phase, "why": self.why, "axes": list(self.axes),
                "crosses_hosts": self.crosses_hosts, "moves": self.moves,
                "op": self.op}


def phase_of(op_name: str, optimizer_scope: str = "optimizer") -> str:
    if not op_name:
        return "unknown"  # an op the partitioner made without metadata
    if f"{optimizer_scope}/" in op_name or op_name.endswith(optimizer_scope):
        return "optimizer"
    if "transpose(" in op_name:
        return "backward"
    return "forward"


def _iota(dims: list[int], perm: list[int] | None) -> list[int]:
    """XLA's iota tile list: arange over ``dims``, transposed by ``perm``, flattened."""
    import numpy as np

    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if perm is not None:
        ids = ids.transpose(perm)
    return [int(i) for i in ids.reshape(-1)]


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def groups_of(instr: Instr, device_count: int) -> list[list[int]]:
    """The groups of logical partition ids a collective talks within (a permute: its pairs)."""
    attrs = instr.attributes
    if instr.opcode.startswith("collective-permute"):
        match = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs)
        return [_ints(p) for p in re.findall(r"\{\d+,\d+\}", match.group(1))] if match else []
    match = re.search(r"replica_groups=", attrs)
    if not match:
        return [list(range(device_count))]
    text = attrs[match.end():]
    if text.startswith("{}"):
        return [list(range(device_count))]
    if text.startswith("["):
        iota = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
        if not iota:
            return [list(range(device_count))]
        shape = _ints(iota.group(1))
        flat = _iota(_ints(iota.group(2)), _ints(iota.group(3)) if iota.group(3) else None)
        size = shape[-1]
        return [flat[i:i + size] for i in range(0, len(flat), size)]
    if text.startswith("mesh["):
        close = text.find("]")
        axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", text[:close + 1])]
        rest = text[close + 1:]
        ids_match = re.match(r",\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\)", rest)
        total = 1
        for _, size in axes:
            total *= size
        if ids_match:
            flat = _iota(_ints(ids_match.group(1)), _ints(ids_match.group(2)) if ids_match.group(2) else None)
            rest = rest[ids_match.end():]
        else:
            explicit = re.match(r",\s*device_ids=\(([\d,\s]+)\)", rest)
            flat = _ints(explicit.group(1)) if explicit else list(range(total))
            rest = rest[explicit.end():] if explicit else rest
        opened = rest.find("{")
        chosen = set(re.findall(r"'([^']+)'", rest[opened + 1:rest.find("}", opened)])) if opened >= 0 else set()
        import numpy as np

        grid = np.array(flat).reshape([size for _, size in axes])
        varying = [i for i, (name, _) in enumerate(axes) if name in chosen]
        fixed = [i for i in range(len(axes)) if i not in varying]
        moved = grid.transpose(fixed + varying).reshape(-1, int(np.prod([axes[i][1] for i in varying] or [1])))
        return [[int(x) for x in row] for row in moved]
    groups = re.match(r"\{((?:\{[\d,\s]*\},?\s*)*)\}", text)
    if not groups:
        return [list(range(device_count))]
    return [_ints(g) for g in re.findall(r"\{[\d,\s]*\}", groups.group(1))]


def axes_of(groups: list[list[int]], mesh: list[tuple[str, int]]) -> list[str]:
    """The user's mesh axes along which the members of the groups differ (partition id = row-major mesh index)."""
    import numpy as np

    shape = [size for _, size in mesh]
    varying: set[int] = set()
    for group in groups:
        coords = [np.unravel_index(p, shape) for p in group if p < int(np.prod(shape))]
        for axis in range(len(shape)):
            if len({c[axis] for c in coords}) > 1:
                varying.add(axis)
    return [mesh[i][0] for i in sorted(varying)]


class _Labeller:
    def __init__(self, module: Module, param_classes: dict[str, str], output_classes: list[str],
                 device_count: int, scopes: dict[str, str], mesh: list[tuple[str, int]] | None = None,
                 device_ids: list[int] | None = None, devices_per_host: int | None = None,
                 phase: Callable[[Instr], str] | None = None, mesh_index_of: list[int] | None = None) -> None:
        self.module = module
        self.phase = phase or (lambda instr: phase_of(instr.op_name))
        self.mesh_index_of = mesh_index_of
        self.mesh = mesh
        self.device_ids = device_ids
        self.devices_per_host = devices_per_host
        self.device_count = device_count
        self.scopes = scopes
        entry = module.entry
        self.classes: dict[int, str] = {}
        sources: dict[tuple[str, str, int], int] = {}
        for number, param in module.parameters(entry).items():
            path = param.op_name.replace("\\'", "'")
            # by argument path (JAX's op_name), or by number (torch_xla names none of them)
            cls = param_classes.get(number, param_classes.get(path, "scalar"))
            self.classes[number] = cls
            sources[(entry, param.name, 0)] = 1 << number
        self.bits = module.taint(sources)
        self.weight_mask = sum(1 << n for n, c in self.classes.items() if c in WEIGHTISH)
        self.data_mask = sum(1 << n for n, c in self.classes.items() if c in DATAISH)
        root = module.root(entry)
        self.update_slots = {(entry, root.name, k) for k, c in enumerate(output_classes) if c in WEIGHTISH}
        self.users = module.users()

    def derived(self, instr: Instr) -> int:
        bits = 0
        for operand in instr.operands:
            for k in range(self.module.by_name[(instr.computation, operand)].slots):
                bits |= self.bits.get((instr.computation, operand, k), 0)
        return bits

    def is_gradient(self, instr: Instr) -> bool:
        """Whether ``instr``'s value reaches a weight or optimizer-state update through elementwise ops only."""
        module = self.module
        start = [(instr.computation, instr.name, k) for k in range(instr.slots)]
        seen = set(start)
        queue = deque(start)
        while queue:
            node = queue.popleft()
            if node in self.update_slots:
                return True
            for nxt in module.edges.get(node, ()):
                if nxt in seen:
                    continue
                target = module.by_name.get(nxt[:2])
                # a scatter(-add) onto the value passes it on: the tied embedding's head gradient is the
                # base the lookup's row gradients are added to (TPU lowers the sum so); its updates do not
                scatter_base = target is not None and target.opcode == "scatter" and \
                    bool(target.operands) and target.operands[0] == node[1]
                if target is None or (target.opcode not in _PASS and not scatter_base):
                    continue
                if target.opcode == "custom-call" and "Sharding" not in target.attributes:
                    continue
                if target.opcode == "reduce" and not self._degenerate_reduce(target):
                    continue
                seen.add(nxt)
                queue.append(nxt)
        return False

    def _degenerate_reduce(self, instr: Instr) -> bool:
        """A reduce over dims of size 1 only: a reshape, not a contraction."""
        operand = self.module.by_name.get((instr.computation, instr.operands[0]))
        match = re.search(r"dimensions=\{([\d,]*)\}", instr.attributes)
        if operand is None or not match:
            return False
        dims = operand.dims
        return all(dims[int(d)] == 1 for d in match.group(1).split(",") if d)

    def only_sliced(self, instr: Instr) -> bool:
        """Whether every use of ``instr`` (through moves) is a dynamic slice: gathered, then each device
        cuts its own piece again."""
        frontier, found = [instr], False
        while frontier:
            current = frontier.pop()
            for user in self.users.get((current.computation, current.name), ()):
                if user.opcode in _MOVES:
                    frontier.append(user)
                elif user.opcode == "dynamic-slice":
                    found = True  # each device cuts its own piece again (a static slice only drops padding)
                else:
                    return False
        return found

    def scope(self, instr: Instr) -> str | None:
        name = instr.op_name
        for scope, role in self.scopes.items():
            if f"{scope}/" in name or f"{scope})" in name:
                return role
        return None

    def label(self, instr: Instr) -> LabelledCollective:
        kind = instr.opcode.removesuffix("-start")
        phase = self.phase(instr)
        data = bool(self.derived(instr) & self.data_mask)
        gradient = data and phase != "forward" and self.is_gradient(instr)
        role, why = self._role(instr, kind, data, gradient)
        groups = groups_of(instr, self.device_count)
        at = self.mesh_index_of
        in_mesh = [[at[p] for p in g if p < len(at)] for g in groups] if at else groups
        axes = tuple(axes_of(in_mesh, self.mesh)) if self.mesh else ()
        crosses = None
        if self.device_ids is not None and self.devices_per_host:
            ids, per_host = self.device_ids, self.devices_per_host
            crosses = any(len({ids[p] // per_host for p in g if p < len(ids)}) > 1 for g in groups)
        return LabelledCollective(instr.name, instr.computation, kind, role, phase, why, axes, crosses,
                                  "gradient" if gradient else "activation" if data else "weight",
                                  instr.op_name.rsplit("/", 1)[-1] or None)

    def _role(self, instr: Instr, kind: str, data: bool, gradient: bool) -> tuple[str, str]:
        """``data``: the operand derives from the data inputs; ``gradient``: it is also a gradient
        (past the forward pass, reaching an update elementwise)."""
        operand = self.module.by_name.get((instr.computation, instr.operands[0])) if instr.operands else None
        element_type = operand.element_type if operand is not None else instr.element_type
        elements = operand.elements if operand is not None else instr.elements
        if kind == "collective-broadcast":
            return "other", "a broadcast"
        if all(len(set(g)) <= 1 for g in groups_of(instr, self.device_count)):
            return "other", "every group is one device"
        if _INTEGER.match(element_type or ""):
            if kind in ("all-reduce", "reduce-scatter") and elements <= SCALAR_ELEMENTS:
                return "scalar-reduce", "an integer count"
            return "index-gather", "integer or boolean data"
        reducing = kind in ("all-reduce", "reduce-scatter")
        if reducing and elements == 1 and not gradient:
            return "scalar-reduce", "one element: a loss, metric or norm"
        scoped = self.scope(instr)
        if kind in ("all-to-all", "ragged-all-to-all"):
            if scoped == "expert-dispatch" or kind == "ragged-all-to-all":
                return "expert-dispatch", "an all-to-all in the generator's MoE block"
            return "reshard", "an all-to-all outside an MoE block"
        if kind == "collective-permute":
            if scoped == "pipeline-send":
                return "pipeline-send", "a permute in the generator's pipeline block"
            if scoped == "ring":
                if not data:
                    return "weight-gather", "a ring of weights"
                return ("gradient-reduce", "a ring of gradients") if gradient else (
                    "activation-gather", "a ring of activations")
            return "reshard", "a permute outside a pipeline or ring block"
        if kind == "all-gather":
            if self.only_sliced(instr):
                return "reshard", "gathered, then only dynamically sliced"
            if not data:
                return "weight-gather", "derived from weights only"
            if gradient:
                return "weight-gather", "a gradient or updated weight (reaches an update elementwise)"
            return "activation-gather", "derived from the data"
        if reducing:
            if not data:
                return "other", "a reduction of weights only"
            if gradient:
                return "gradient-reduce", "reaches a weight or optimizer-state update elementwise"
            return "activation-reduce", "derived from the data, not yet a gradient"
        return "other", kind


def label_collectives(module: Module, param_classes: dict[str | int, str], output_classes: list[str],
                      device_count: int, scopes: dict[str, str] | None = None,
                      mesh: list[tuple[str, int]] | None = None, device_ids: list[int] | None = None,
                      devices_per_host: int | None = None, phase: Callable[[Instr], str] | None = None,
                      mesh_index_of: list[int] | None = None) -> list[LabelledCollective]:
    """Every collective of ``module`` (a partitioned module), labelled from the generator's registry.

    ``param_classes``: argument path (the entry parameter's op_name) -> class;
    ``output_classes``: class of each output leaf, in order; ``scopes``:
    named-scope -> role for blocks whose collectives the generator knows;
    ``mesh``: the user's mesh axes (name, size) in order, whose row-major
    index is the logical partition id; ``device_ids``: the physical device of
    each partition id, with ``devices_per_host`` to say which groups cross hosts.

    For torch_xla (no parameter names): ``param_classes`` keyed by entry
    parameter number; ``phase``: the phase of an instruction from its metadata
    (default: JAX's ``op_name``); ``mesh_index_of``: the row-major mesh index
    of each partition id, when it is not the partition id itself (torch_xla's
    partition ids are device ids; its mesh lists them in any order).
    """
    labeller = _Labeller(module, param_classes, output_classes, device_count, scopes or {}, mesh, device_ids,
                         devices_per_host, phase, mesh_index_of)
    return [labeller.label(i) for i in module.instructions() if i.opcode in COLLECTIVES]
