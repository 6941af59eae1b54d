"""One cost model: FLOPs and time of matmuls, time of collectives, and how much of it overlaps.

**FLOPs.** A ``dot`` does ``2 * |output| * prod(contracting dims)`` (batch
dims are part of the output, so a batched matmul counts each batch once); a
``convolution`` ``2 * |output| * input features per group * kernel taps``,
where a spatial dim's taps are ``ceil(window / lhs_dilate)`` (the kernel's
input-feature dim is already divided by the group count; TPU's matmuls
written as base-dilated convolutions meet one real input per batch dim); a
GEMM library call (``__cublas$gemm``, ``__cublas$lt$matmul``) reads its
contracting dims from ``gemm_backend_config``; a fusion counts the matmuls
it fuses. Times are per device, at the profile's dense peak for the matmul's
element type (:meth:`~hlo_doctor.semantics.hardware.HardwareProfile.peak_for`).

**Collectives** take their ring wire bytes (:mod:`hlo_doctor.graph.collectives`)
over the bandwidth of the link they use: across the slow boundary (hosts on
GPU, slices on TPU) the inter-host / inter-slice bandwidth, else the
intra-host (NVLink, ICI) one. Latency is not modelled, so times are lower
bounds: the model's documented accuracy is the bandwidth figures' (datasheet
peaks, within about 2x of what a collective achieves).

**Links.** Collectives inside the fast domain and those across the slow
boundary use different links and run side by side: the step's communication
time is that of its busiest link.

**Overlap.** In a scheduled module an async collective hides behind the
matmuls scheduled between its start and its done; a synchronous one hides
nothing. In an unscheduled module (CPU, the partitioned snapshot) weight
gathers (prefetchable: they do not depend on the previous layer) and
gradient reductions (they overlap the rest of the backward pass) are taken
as hidden up to the step's compute time; activation traffic, reshards and
scalar reductions sit on the critical path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.semantics.execution import backend_config_json, walk

if TYPE_CHECKING:
    from hlo_doctor.semantics import ModuleSemantics
    from hlo_doctor.semantics.collective_model import CollectiveFacts
    from hlo_doctor.semantics.hardware import HardwareProfile

__all__ = [
    "OVERLAPPABLE_ROLES",
    "CostModel",
    "StepCost",
    "matmul_element_type",
    "matmul_flops",
    "module_flops",
]

# Roles whose collectives do not wait on the preceding compute and can run beside it.
OVERLAPPABLE_ROLES = frozenset({"weight-gather", "gradient-reduce"})
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")


def _ints(values) -> list[int]:  # noqa: ANN001 - JSON lists of ints or digit strings
    return [int(v) for v in values or () if str(v).lstrip("-").isdigit()]


def _dims(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").strip("{} ").split(",") if x.strip().lstrip("-").isdigit()]


def matmul_flops(instruction: Instruction, computation: Computation, module: HloModule | None = None,
                 _memo: dict[str, float] | None = None) -> float:
    """FLOPs of one matmul-like op (dot, convolution, GEMM call, or a fusion of them); 0 for others."""
    opcode = instruction.opcode
    if opcode == "dot":
        lhs = computation.get(instruction.operands[0]) if instruction.operands else None
        if lhs is None or lhs.shape.is_tuple or instruction.shape.is_tuple:
            return 0.0
        contracted = math.prod(lhs.shape.dims[d] for d in _dims(instruction.attribute("lhs_contracting_dims"))
                               if d < lhs.shape.rank)
        return 2.0 * instruction.shape.num_elements * contracted
    if opcode == "convolution" and len(instruction.operands) >= 2:
        return _convolution_flops(instruction, computation)
    if opcode == "custom-call":
        target = (instruction.attribute("custom_call_target") or "").strip('"')
        if target in _GEMM_TARGETS:
            return _gemm_flops(instruction, computation)
        return 0.0
    if opcode == "fusion" and module is not None:
        memo = _memo if _memo is not None else {}
        return sum(_computation_flops(module, name, memo) for name in instruction.called_computations)
    return 0.0


def _convolution_flops(instruction: Instruction, computation: Computation) -> float:
    """2 * |output| * input features per group * the kernel taps that land on real input.

    A tap count per spatial dim is ``ceil(window / lhs_dilate)``: TPU writes a matmul's batch
    dims as spatial dims of a base-dilated convolution (``lhs_dilate`` = window size), where
    each output element meets one real input element per such dim, not a whole window.
    """
    rhs = computation.get(instruction.operands[1])
    result = instruction.shape if not instruction.shape.is_tuple else next(instruction.shape.leaves(), None)
    if rhs is None or result is None or rhs.shape.is_tuple:
        return 0.0
    labels = (instruction.attribute("dim_labels") or "").strip()
    kernel_labels = labels.split("_", 1)[1].split("->")[0] if "_" in labels and "->" in labels else ""
    kernel = rhs.shape.dims
    if len(kernel_labels) == len(kernel) and "i" in kernel_labels:
        input_features = kernel[kernel_labels.index("i")]
        spatial = [kernel[i] for i, label in enumerate(kernel_labels) if label not in "io"]
    else:  # no labels: the last kernel dim is the output features
        input_features = math.prod(kernel[:-1]) if kernel else 1
        spatial = []
    window = _window(instruction.attribute("window"))
    sizes = window.get("size") or spatial
    dilation = window.get("lhs_dilate") or [1] * len(sizes)
    taps = math.prod(-(-size // max(dilate, 1)) for size, dilate in zip(sizes, dilation, strict=False))
    return 2.0 * result.num_elements * input_features * taps


def _window(text: str | None) -> dict[str, list[int]]:
    """``window={size=8x32 stride=7x31 lhs_dilate=8x32}`` -> {"size": [8, 32], ...}."""
    out: dict[str, list[int]] = {}
    for part in (text or "").strip("{} ").split():
        key, _, value = part.partition("=")
        if key in ("size", "lhs_dilate") and value:
            try:
                out[key] = [int(v) for v in value.split("x")]
            except ValueError:
                continue
    return out


def _gemm_flops(instruction: Instruction, computation: Computation) -> float:
    config = backend_config_json(instruction).get("gemm_backend_config") or {}
    numbers = config.get("dot_dimension_numbers") or {}
    lhs = computation.get(instruction.operands[0]) if instruction.operands else None
    result = next(instruction.shape.leaves(), None) if instruction.shape.is_tuple else instruction.shape
    if lhs is None or result is None or lhs.shape.is_tuple:
        return 0.0
    contracting = _ints(numbers.get("lhs_contracting_dimensions"))
    if contracting:
        k = math.prod(lhs.shape.dims[d] for d in contracting if d < lhs.shape.rank)
    else:
        # lhs [batch..., m, k], result [batch..., m, n]: k = |lhs| * n / |result|
        n = result.dims[-1] if result.rank else 1
        k = max(1, lhs.shape.num_elements * n // max(result.num_elements, 1))
    return 2.0 * result.num_elements * k


def _computation_flops(module: HloModule, name: str, memo: dict[str, float]) -> float:
    if name in memo:
        return memo[name]
    memo[name] = 0.0  # a cycle counts nothing
    computation = module.computation(name)
    total = 0.0
    if computation is not None:
        for inner in computation.instructions:
            total += matmul_flops(inner, computation, module, memo)
    memo[name] = total
    return total


def matmul_element_type(instruction: Instruction, computation: Computation, module: HloModule | None = None) -> str:
    """The element type a matmul-like op multiplies (its first operand's; a fusion's first matmul's)."""
    if instruction.opcode == "fusion" and module is not None:
        for name in instruction.called_computations:
            called = module.computation(name)
            if called is None:
                continue
            for inner in called.instructions:
                if inner.opcode in ("dot", "convolution", "custom-call", "fusion"):
                    found = matmul_element_type(inner, called, module)
                    if found:
                        return found
        return instruction.shape.element_type
    operand = computation.get(instruction.operands[0]) if instruction.operands else None
    if operand is None or operand.shape.is_tuple:
        return instruction.shape.element_type if not instruction.shape.is_tuple else "f32"
    return operand.shape.element_type


def module_flops(module: HloModule) -> dict[str, float]:
    """Per-device matmul FLOPs per step by element type (loop bodies times their trip count)."""
    totals: dict[str, float] = {}
    memo: dict[str, float] = {}
    for computation, instruction, times in walk(module):
        if instruction.opcode not in ("dot", "convolution", "custom-call"):
            continue  # fusions are walked into: their dots are counted where they are
        flops = matmul_flops(instruction, computation, module, memo)
        if flops:
            dtype = matmul_element_type(instruction, computation, module)
            totals[dtype] = totals.get(dtype, 0.0) + flops * times.count
    return totals


@dataclass(frozen=True, slots=True)
class StepCost:
    """The estimated per-device time of a step, split into compute and communication."""

    compute_seconds: float
    communication_seconds: float
    exposed_communication_seconds: float
    flops: float
    by_role: dict[str, float]  # role -> communication seconds
    link_seconds: float = 0.0  # the busiest link's: collectives on different links run side by side

    @property
    def bound_fraction(self) -> float:
        """The busiest link's time over it plus compute: at 0.5 or more, communication bounds the step."""
        total = self.compute_seconds + self.link_seconds
        return self.link_seconds / total if total > 0 else 0.0

    @property
    def communication_fraction(self) -> float:
        """The share of the step spent in communication nothing hides."""
        total = self.compute_seconds + self.exposed_communication_seconds
        return self.exposed_communication_seconds / total if total > 0 else 0.0


class CostModel:
    """Times of one module's matmuls and collectives on one hardware profile."""

    def __init__(self, semantics: ModuleSemantics, hardware: HardwareProfile) -> None:
        self.semantics = semantics
        self.hardware = hardware

    def bandwidth(self, crosses_slow_boundary: bool | None) -> float:
        hardware = self.hardware
        if not crosses_slow_boundary:
            return hardware.intra_host_bandwidth
        if hardware.platform == "tpu":
            return hardware.inter_slice_bandwidth or hardware.inter_host_bandwidth
        return hardware.inter_host_bandwidth

    def collective_seconds(self, facts: CollectiveFacts) -> float:
        """Seconds per execution on the wire, at the bandwidth of the link it crosses."""
        return facts.op.wire_bytes_per_device / self.bandwidth(facts.crosses_slow_boundary)

    def matmul_seconds(self, flops: float, element_type: str) -> float:
        return flops / self.hardware.peak_for(element_type)

    @property
    def machine_balance(self) -> float:
        """FLOPs the device does in the time it moves one byte over its fastest link."""
        return self.hardware.peak_bf16_flops / self.hardware.intra_host_bandwidth

    def step(self) -> StepCost:
        """The step's compute, communication and exposed communication (see the module docstring)."""
        module = self.semantics.view.per_device
        flops_by_type = module_flops(module) if module is not None else {}
        compute = sum(self.matmul_seconds(f, t) for t, f in flops_by_type.items())
        communication = 0.0
        exposed = 0.0
        hideable = 0.0
        by_role: dict[str, float] = {}
        by_link: dict[bool, float] = {}
        scheduled = module is not None and (module.attribute("is_scheduled") or "").strip() == "true"
        for role in self.semantics.roles:
            facts = role.facts
            seconds = self.collective_seconds(facts) * facts.executions.count
            communication += seconds
            link = bool(facts.crosses_slow_boundary)
            by_link[link] = by_link.get(link, 0.0) + seconds
            by_role[role.role] = by_role.get(role.role, 0.0) + seconds
            if scheduled and facts.schedule_position is not None:
                exposed += max(0.0, seconds - self._overlap_seconds(facts) * facts.executions.count)
            elif role.role in OVERLAPPABLE_ROLES:
                hideable += seconds
            else:
                exposed += seconds
        exposed += max(0.0, hideable - compute)
        return StepCost(compute, communication, exposed, sum(flops_by_type.values()), by_role,
                        max(by_link.values(), default=0.0))

    def _overlap_seconds(self, facts: CollectiveFacts) -> float:
        """Matmul time scheduled between an async collective's start and its done."""
        start, done = facts.schedule_position or (-1, -1)
        module = self.semantics.view.per_device
        computation = module.computation(facts.computation) if module is not None else None
        if computation is None or start < 0 or done <= start + 1:
            return 0.0
        seconds = 0.0
        memo: dict[str, float] = {}
        for instruction in computation.instructions[start + 1 : done]:
            flops = matmul_flops(instruction, computation, module, memo)
            if flops:
                seconds += self.matmul_seconds(flops, matmul_element_type(instruction, computation, module))
        return seconds
