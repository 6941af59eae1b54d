"""What each collective is for, decided from where its operand comes from in the dataflow.

Every collective (and every operand of a combined one) gets one role:

``weight-gather``
    an all-gather of a value derived from weights only (FSDP's gathers).
``gradient-reduce``
    an all-reduce / reduce-scatter of a value derived from the batch whose
    batch dim has been contracted away (by the weight-gradient matmul).
``activation-reduce``
    an all-reduce / reduce-scatter of a value that still carries the batch
    dim: a tensor-parallel partial sum.
``activation-gather``
    an all-gather of a value that carries the batch dim, or a ring rotation
    (collective-permute whose pairs close into cycles) of such data: a
    gather in pieces, as XLA's windowed einsums do (of weights:
    ``weight-gather``; of partial sums whose batch dim is contracted:
    ``gradient-reduce``).
``reshard``
    a collective-permute or all-to-all that moves a value between two
    shardings, or an all-gather that is sliced again (XLA's involuntary full
    rematerialization).
``expert-dispatch``
    an all-to-all next to a matmul whose batch dim pairs tokens with the
    expert-sharded weights (MoE), and every ragged-all-to-all.
``pipeline-send``
    a collective-permute (not a ring: the last stage sends to no one) of data that a loop carries between iterations
    (its result goes into the loop state, or it sends what the previous
    iteration left there) and that a matmul with a weight computed.
``scalar-reduce``
    a reduction of a value of at most a few elements (loss, metrics, norms)
    that is not the gradient of a weight of that size.
``index-gather``
    integer or boolean data: labels, masks, token ids.
``other``
    anything else (a permute whose pairs are all self-pairs, a broadcast).

Which entry parameters are weights or data is decided by
:mod:`hlo_doctor.semantics.parameters`, and which dims carry the batch by
:mod:`hlo_doctor.semantics.batch_dims`; names are never read to decide.
The phase (``forward``, ``backward``, ``optimizer``, ``unknown``) comes from
the dataflow too: collectives downstream of a gradient reduction are the
optimizer's, ancestors of the step's scalar loss the forward pass's, the
rest of a training step the backward pass's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property

from hlo_doctor.graph.dataflow import NO_NODE, DataflowGraph, NodeKey, set_bits
from hlo_doctor.graph.dim_maps import DOTS
from hlo_doctor.semantics.batch_dims import BatchAnalysis
from hlo_doctor.semantics.collective_model import CollectiveFacts, OperandFacts
from hlo_doctor.semantics.gradients import UPDATES, UpdateSearch, is_parameter_value
from hlo_doctor.semantics.parameters import EntryParameters, is_integer

__all__ = [
    "ACTIVATION_ROLES",
    "ROLES",
    "CollectiveRole",
    "OperandRole",
    "assign_roles",
    "forward_pass",
    "loss_nodes",
]

ROLES = (
    "weight-gather", "gradient-reduce", "activation-reduce", "activation-gather", "reshard",
    "expert-dispatch", "pipeline-send", "scalar-reduce", "index-gather", "other",
)
ACTIVATION_ROLES = frozenset({"activation-reduce", "activation-gather"})
PHASES = ("forward", "backward", "optimizer", "unknown")

# A reduction of at most this many elements is a loss, metric or norm.
SCALAR_ELEMENTS = 64
_REDUCING = frozenset({"all-reduce", "reduce-scatter"})
# Elementwise ops an optimizer updates a weight with, and ops that move a value unchanged.
# How far the neighbourhood searches (expert matmuls, pipeline stages, gradient targets) look.
_HOPS = 12


@dataclass(frozen=True, slots=True)
class OperandRole:
    """The role of one operand of a collective, and why."""

    role: str
    parameters: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class CollectiveRole:
    """A collective's role (that of its largest operand), phase, parameters and reason."""

    facts: CollectiveFacts
    role: str
    phase: str
    parameters: tuple[int, ...]
    reason: str
    operands: tuple[OperandRole, ...]

    @property
    def instruction(self) -> str:
        return self.facts.instruction


class _Judge:
    """Role decisions for the collectives of one module."""

    def __init__(self, graph: DataflowGraph, params: EntryParameters, batch: BatchAnalysis) -> None:
        self.graph = graph
        self.params = params
        self.batch = batch
        self.data_mask = params.data_mask()
        self.weight_mask = params.weight_mask()
        self._ordered: dict[int, tuple[int, ...]] = {}
        self._contracting: dict[int, bool] = {}  # matmul node -> whether it contracts a batch dim
        self._shared_ints: list[int] = []

    def ordered(self, bits: int) -> tuple[int, ...]:
        """The parameter numbers of the bitset ``bits``, ascending: one shared tuple per distinct
        bitset, of shared ints.

        A gradient or a deep layer's activation derives from parameters of every layer, so the
        roles of a module of L layers would otherwise hold about L x L new ints.
        """
        found = self._ordered.get(bits)
        if found is None:
            shared = self._shared_ints
            if bits.bit_length() > len(shared):
                shared.extend(range(len(shared), bits.bit_length()))
            found = self._ordered[bits] = tuple(shared[n] for n in set_bits(bits))
        return found

    # -- facts about a value ------------------------------------------------
    def derived(self, key: NodeKey) -> frozenset[int]:
        node = self.graph.id_of(key)
        return _numbers(self.graph.parameter_bits(node)) if node is not None else frozenset()

    @cached_property
    def weights_by_dims(self) -> dict[tuple[int, ...], list[int]]:
        """Per-device weight shapes -> the weights of that shape."""
        entry = self.graph.module.entry
        out: dict[tuple[int, ...], list[int]] = {}
        for param in entry.parameters() if entry is not None else ():
            if param.parameter_number in self.params.weights and not param.shape.is_tuple:
                out.setdefault(param.shape.dims, []).append(param.parameter_number)
        return out

    def names(self, numbers) -> str:
        return ", ".join(self.params.names.get(n, f"parameter {n}") for n in sorted(numbers)[:4]) + (
            ", ..." if len(numbers) > 4 else "")

    # -- one operand ----------------------------------------------------------
    def operand_role(self, facts: CollectiveFacts, operand: OperandFacts) -> OperandRole:
        kind = facts.effective_kind
        shape = operand.shape
        node = self.graph.id_of(operand.key)
        bits = self.graph.parameter_bits(node) if node is not None else 0
        # Parameter sets from bitsets: a gradient derives from hundreds of parameters, and only the
        # data and weight parts (masks) are read; a role keeps its numbers as a shared tuple (ordered).
        data_bits, weight_bits = bits & self.data_mask, bits & self.weight_mask
        data = self.ordered(data_bits)
        weights = self.ordered(weight_bits)
        batch_dims = self.batch.batch_dims(operand.key) if data else {}
        if facts.self_only:
            return OperandRole("other", self.ordered(bits), "every device sends only to itself: no traffic")
        if kind == "collective-broadcast":
            return OperandRole("other", self.ordered(bits), "a broadcast from one device")
        if is_integer(shape.element_type):
            if kind in _REDUCING and shape.num_elements <= SCALAR_ELEMENTS:
                return OperandRole("scalar-reduce", self.ordered(data_bits),
                                   f"operand is {shape}: a count or flag")
            return OperandRole("index-gather", self.ordered(data_bits or bits),
                               f"operand is {shape}: integer or boolean data (indices, labels, masks)")
        if kind in _REDUCING and shape.num_elements <= SCALAR_ELEMENTS and not batch_dims and (
                not data or self.gradient_target(facts, operand) is None) and (
                shape.num_elements <= 1 or not data):
            # (several elements derived from the data are per-token partial sums whose batch dim the
            # tracking lost, as a vocab-parallel softmax makes: an activation's, below)
            return OperandRole("scalar-reduce", self.ordered(bits),
                               f"operand is {shape}, {shape.num_elements} element(s): a loss, metric or norm")
        if kind == "ragged-all-to-all":
            return OperandRole("expert-dispatch", self.ordered(data_bits), "a ragged all-to-all routes tokens by count")
        if kind == "all-to-all":
            expert = self.expert_matmul(facts, operand)
            if expert is not None:
                return OperandRole("expert-dispatch", self.ordered(data_bits or bits),
                                   f"{expert} pairs the moved tokens with expert weights on its batch dim")
            return OperandRole("reshard", self.ordered(bits),
                               "an all-to-all that moves the sharded dim of a value: a reshard")
        if kind == "collective-permute":
            return self.permute_role(facts, operand, bits, bool(batch_dims))
        if kind == "all-gather":
            if facts.rematerialized:
                return OperandRole("reshard", self.ordered(bits),
                                   f"gathered and sliced again by {facts.sliced_by}: a reshard between two "
                                   "shardings (involuntary full rematerialization)")
            if not data:
                what = self.names(weights) if weights else "constants"
                return OperandRole("weight-gather", self.ordered(weight_bits),
                                   f"operand derives only from the weights {what}")
            if self._reaches_update_from(facts):
                return OperandRole("weight-gather", self.ordered(weight_bits),
                                   "operand is a weight's gradient or update: it reaches the update of a weight "
                                   "through elementwise ops only")
            if batch_dims:
                dim, param = next(iter(sorted(batch_dims.items())))
                return OperandRole("activation-gather", self.ordered(data_bits),
                                   f"operand carries dim {dim} of the batch input {self.names([param])}: an activation")
            if weights and self.params.state and node not in self.forward_nodes and self._weight_shaped(facts, operand):
                return OperandRole("weight-gather", self.ordered(weight_bits),
                                   f"operand is weight-shaped, computed from the weights {self.names(weights)} and "
                                   "the batch with its batch dim reduced (an updated weight or a gradient)")
            return OperandRole("activation-gather", self.ordered(data_bits),
                               f"operand derives from the data {self.names(data)}")
        if kind in _REDUCING:
            if not data:
                return OperandRole("other", self.ordered(weight_bits),
                                   f"a reduction of values derived from the weights {self.names(weights)} only")
            if self._reaches_update_from(facts):
                target = self.gradient_target(facts, operand)
                of = f"the gradient of {self.names([target])}" if target is not None else "a weight gradient"
                return OperandRole("gradient-reduce", (target,) if target is not None else self.ordered(data_bits),
                                   f"operand derives from the batch {self.names(data)} and the result reaches the "
                                   f"update of a weight through elementwise ops only: {of}")
            if batch_dims:
                dim, param = next(iter(sorted(batch_dims.items())))
                return OperandRole("activation-reduce", self.ordered(data_bits),
                                   f"operand carries dim {dim} of the batch input {self.names([param])}: partial "
                                   "sums of an activation (tensor parallelism)")
            source = self.contracting_dot(operand.key)
            if not self.params.state or node in self.forward_nodes or not self._weight_shaped(facts, operand):
                # no update reached, and no training, or in the forward pass, or not of a weight's
                # shape: partial sums of an activation whose batch dim the tracking lost
                return OperandRole("activation-reduce", self.ordered(data_bits),
                                   f"operand derives from the data {self.names(data)} and is no weight's gradient "
                                   "(it reaches no update through elementwise ops): partial sums of an activation")
            target = self.gradient_target(facts, operand)
            by = f" (by {source})" if source else ""
            of = f": the gradient of {self.names([target])}" if target is not None else ": a weight gradient"
            return OperandRole("gradient-reduce", (target,) if target is not None else self.ordered(data_bits),
                               f"operand derives from the batch {self.names(data)} with its batch dim "
                               f"contracted{by}{of}")
        return OperandRole("other", self.ordered(bits), f"a {kind}")

    def _weight_shaped(self, facts: CollectiveFacts, operand: OperandFacts) -> bool:
        """Whether the operand or the result has the per-device shape of a weight."""
        node = self.graph.id_of(facts.result_key)
        result = self.graph.instruction_at[node].shape if node is not None else None
        by_dims = self.weights_by_dims
        return operand.shape.dims in by_dims or (result is not None and not result.is_tuple and result.dims in by_dims)

    def _reaches_update_from(self, facts: CollectiveFacts) -> bool:
        node = self.graph.id_of(facts.result_key)
        return node is not None and self.updates.reaches_update(node)

    def permute_role(self, facts: CollectiveFacts, operand: OperandFacts, bits: int, batch_dims: bool) -> OperandRole:
        """A collective-permute: a ring (a gather or reduction in pieces), a pipeline send or a reshard.

        ``bits``: the entry parameters the operand derives from, as a bitset.
        """
        data_bits, weight_bits = bits & self.data_mask, bits & self.weight_mask
        data = _numbers(data_bits)
        if _is_ring(facts.op.logical_groups) and len(facts.op.mesh_axes or ()) == 1:
            # every device passes its block on around a cycle: a gather in pieces (XLA's windowed
            # einsum / collective matmul), of a weight or of an activation
            if not data:
                return OperandRole("weight-gather", self.ordered(weight_bits),
                                   f"a ring rotation of the weights {self.names(_numbers(weight_bits))}: a gather in pieces")
            if batch_dims:
                return OperandRole("activation-gather", self.ordered(data_bits),
                                   "a ring rotation of data that carries the batch: an activation gathered in "
                                   "pieces (a windowed einsum / collective matmul)")
            return OperandRole("gradient-reduce", self.ordered(data_bits),
                               "a ring rotation of partial sums over the batch (its batch dim contracted): a "
                               "gradient reduce-scattered in pieces (a windowed einsum)")
        # A pipeline stage sends to another device on every pair; a permute that leaves some
        # devices' data where it is (self pairs) reorders a layout: a reshard.
        keeps_some = any(len(p) == 2 and p[0] == p[1] for p in facts.op.logical_groups)
        stage = self.pipeline_stage(facts, operand) if data and not keeps_some else None
        if stage is not None:
            return OperandRole("pipeline-send", self.ordered(data_bits),
                               f"the output of {stage} is sent to the next device and carried into the "
                               "next loop iteration: a pipeline stage's activation")
        return OperandRole("reshard", self.ordered(bits),
                           "a collective-permute that moves a value between devices: a reshard")

    # -- neighbourhoods -------------------------------------------------------
    def _walk(self, start: NodeKey, *, forward: bool, limit: int = _HOPS, most: int = 512):
        """Nodes within ``limit`` hops of ``start`` (the ``most`` nearest), breadth first, with their hop count."""
        graph = self.graph
        first = graph.id_of(start)
        if first is None:
            return
        seen = {first}
        queue = deque([(first, 0)])
        while queue:
            node, hops = queue.popleft()
            yield node, hops
            if hops >= limit:
                continue
            if len(seen) >= most:
                continue
            nexts = graph.targets_of(node) if forward else graph.sources_of(node)
            for other in nexts:
                if other not in seen and other != NO_NODE:
                    seen.add(other)
                    queue.append((other, hops + 1))

    def _weight_only(self, node: int) -> bool:
        bits = self.graph.parameter_bits(node)
        return bits != 0 and not any(bits >> p & 1 for p in self.params.data)

    def expert_matmul(self, facts: CollectiveFacts, operand: OperandFacts) -> str | None:
        """A nearby matmul with a batch dim whose other operand is a weight: an expert layer."""
        graph = self.graph
        at = graph.instruction_at
        for start, forward in ((facts.result_key, True), (operand.key, False)):
            for node, _ in self._walk(start, forward=forward, limit=8):
                instruction = at[node]
                if instruction.opcode != "dot" or len(instruction.operands) < 2:
                    continue
                if not (instruction.attribute("lhs_batch_dims") or "").strip("{} "):
                    continue
                sides = graph.operand_ids[node][:2]
                if any(s != NO_NODE and self._weight_only(s) for s in sides):
                    return instruction.name
        return None

    def pipeline_stage(self, facts: CollectiveFacts, operand: OperandFacts) -> str | None:
        """The matmul that computed a permuted value that a loop carries between iterations, if any.

        Carried: the permuted value reaches the loop body's root (the next iteration's state), or
        the permute reads a value the previous iteration left in the loop state.
        """
        graph = self.graph
        at = graph.instruction_at
        carried = any(kind == "loop_carried"
                      for node, _ in self._walk(facts.result_key, forward=True, limit=8)
                      for _, kind in graph.calls_out_of.get(node, ()))
        if not carried:
            for node, _ in self._walk(operand.key, forward=False, limit=2):
                if any(kind == "loop_carried" for _, kind in graph.calls_into.get(node, ())):
                    carried = True
                    break
        if not carried:
            return None
        for node, _ in self._walk(operand.key, forward=False):
            instruction = at[node]
            if instruction.opcode in DOTS and len(instruction.operands) >= 2:
                sides = [s for s in graph.operand_ids[node][:2] if s != NO_NODE]
                weights = self.params.weights
                if len(sides) == 2 and any(graph.parameter_bits(s) >> w & 1 for s in sides for w in weights):
                    return instruction.name
        return None

    def contracting_dot(self, key: NodeKey) -> str | None:
        """The nearest matmul upstream of ``key`` that contracts the batch dim of an operand."""
        at = self.graph.instruction_at
        for node, _ in self._walk(key, forward=False, limit=8):
            if at[node].opcode in DOTS and self._contracts_batch(node):
                return at[node].name
        return None

    def _contracts_batch(self, node: int) -> bool:
        """Whether the matmul ``node`` contracts the batch dim of an operand (judged once per
        matmul: the gradient reductions of one layer walk up to the same ones)."""
        found = self._contracting.get(node)
        if found is None:
            found = self._contracting[node] = self._judge_contracting(node)
        return found

    def _judge_contracting(self, node: int) -> bool:
        graph = self.graph
        roles = graph.dot_dims(node)
        if roles is None:
            return False
        for side, operand in enumerate(graph.operand_ids[node][:2]):
            dims = self.batch.batch_dims(graph.keys[operand])
            if any(d < len(roles.roles[side]) and roles.role(side, d).role == "contracting" for d in dims):
                return True
        return False

    def gradient_target(self, facts: CollectiveFacts, operand: OperandFacts) -> int | None:
        """The weight a reduced gradient updates, else the one weight of its shape.

        An update is an elementwise op, a few elementwise steps downstream of the reduction, whose
        other operand is one weight itself (``w - lr * g``), of the op's own shape.
        """
        graph = self.graph
        at = graph.instruction_at
        weights = self.params.weights
        for node, _ in self._walk(facts.result_key, forward=True, limit=8):
            instruction = at[node]
            if instruction.opcode not in UPDATES or instruction.shape.is_tuple:
                continue
            for source in graph.operand_ids[node]:
                if source == NO_NODE or at[source].shape.dims != instruction.shape.dims:
                    continue
                bits = graph.parameter_bits(source)
                if bits and bits & (bits - 1) == 0 and bits.bit_length() - 1 in weights and \
                        self._is_parameter_value(source):
                    return bits.bit_length() - 1
        node = graph.id_of(facts.result_key)
        if node is None or at[node].shape.is_tuple:
            return None
        matches = self.weights_by_dims.get(at[node].shape.dims, [])
        return matches[0] if len(matches) == 1 else None

    @cached_property
    def updates(self) -> UpdateSearch:
        """Which values are already a weight's gradient (see :mod:`hlo_doctor.semantics.gradients`)."""
        return UpdateSearch(self.graph, self.params, self.weights_by_dims)

    @cached_property
    def losses(self) -> list[int]:
        return loss_nodes(self.graph, self.params)

    @cached_property
    def forward_nodes(self) -> frozenset[int]:
        """The nodes the step's loss derives from: its forward pass (empty when it has no loss)."""
        return forward_pass(self.graph, self.losses)

    def _is_parameter_value(self, node: int) -> bool:
        return is_parameter_value(self.graph, node)


def _numbers(bits: int) -> frozenset[int]:
    """The set bit positions of ``bits``."""
    return frozenset(set_bits(bits))


def _is_ring(pairs: tuple[tuple[int, ...], ...]) -> bool:
    """Whether source->target pairs form rotations: cycles, all of one length, that cover their devices.

    The caller also asks that the pairs move along one mesh axis: a reshard between two device
    orders is a permutation too, but it moves over several axes at once.
    """
    real = [p for p in pairs if len(p) == 2 and p[0] != p[1]]
    if not real:
        return False
    following = dict(real)
    if len(following) != len(real) or set(following) != set(following.values()):
        return False
    lengths = set()
    seen: set[int] = set()
    for start in following:
        if start in seen:
            continue
        length, current = 0, start
        while current not in seen:
            seen.add(current)
            current = following[current]
            length += 1
        if current != start:
            return False
        lengths.add(length)
    return len(lengths) == 1


def assign_roles(
    graph: DataflowGraph,
    params: EntryParameters,
    batch: BatchAnalysis,
    collectives: tuple[CollectiveFacts, ...],
) -> tuple[CollectiveRole, ...]:
    """The role, phase, parameters and reason of every collective, in the order given."""
    judge = _Judge(graph, params, batch)
    judged = []
    first = {id(f): tuple(judge.operand_role(f, o) for o in f.operands) for f in collectives}
    # An all-to-all over the groups of an expert dispatch, on data, is the dispatch's other half
    # (the combine, or the backward pass's) even when no expert matmul is within reach.
    dispatch_groups = {f.op.logical_groups for f in collectives
                       if any(o.role == "expert-dispatch" for o in first[id(f)])}
    for facts in collectives:
        operands = first[id(facts)]
        if facts.effective_kind == "all-to-all" and facts.op.logical_groups in dispatch_groups:
            operands = tuple(
                OperandRole("expert-dispatch", o.parameters,
                            "an all-to-all over the devices of the module's expert dispatch, on data routed "
                            "to or from the experts") if o.role == "reshard" and
                set(o.parameters) & params.data else o
                for o in operands)
        if not operands:
            operands = (OperandRole("other", (), "no array operand"),)
        sizes = [o.bytes_in for o in facts.operands] or [0]
        main = operands[max(range(len(operands)), key=lambda i: sizes[i] if i < len(sizes) else 0)]
        judged.append((facts, main, operands))
    phases = _phases(graph, params, judged, judge)
    return tuple(
        CollectiveRole(facts, main.role, phase, main.parameters, main.reason, operands)
        for (facts, main, operands), phase in zip(judged, phases, strict=False)
    )


def _phases(graph: DataflowGraph, params: EntryParameters, judged, judge: _Judge) -> list[str]:
    gradient_ids = [graph.id_of(f.result_key) for f, main, _ in judged if main.role == "gradient-reduce"]
    gradient_results = [n for n in gradient_ids if n is not None]
    optimizer = graph.reach_ids(gradient_results, forward=True) - set(gradient_results) if gradient_results else set()
    losses = judge.losses
    forward = judge.forward_nodes if losses else None  # the loss's ancestors, made once with the roles
    training = bool(gradient_results) or bool(params.state) or losses
    out = []
    for facts, main, _ in judged:
        node = graph.id_of(facts.key)
        op_name = facts.op.op_name or ""
        if main.role == "gradient-reduce":
            out.append("backward")
        elif node is not None and node in optimizer:
            out.append("optimizer")
        elif forward is not None and node is not None:
            out.append("forward" if node in forward else "backward")
        elif "transpose(" in op_name:
            out.append("backward")
        elif not training:
            out.append("forward")
        else:
            out.append("unknown")
    return out


def forward_pass(graph: DataflowGraph, losses: list[int]) -> frozenset[int]:
    """The nodes the ``losses`` derive from: the step's forward pass (empty without a loss)."""
    return frozenset(graph.reach_ids(losses, forward=False)) if losses else frozenset()


def loss_nodes(graph: DataflowGraph, params: EntryParameters) -> list[int]:
    """The step's float scalar outputs derived from the data (its loss)."""
    entry = graph.module.entry
    root = entry.root if entry is not None else None
    if entry is None or root is None:
        return []
    names = root.operands if root.opcode == "tuple" else (root.name,)
    local = graph.computation_ids(entry.name)
    found = []
    for name in names:
        node = local.get(name)
        if node is None:
            continue
        shape = graph.instruction_at[node].shape
        if shape.is_tuple or shape.rank != 0 or is_integer(shape.element_type):
            continue
        bits = graph.parameter_bits(node)
        if any(bits >> p & 1 for p in params.data):
            found.append(node)
    return found
