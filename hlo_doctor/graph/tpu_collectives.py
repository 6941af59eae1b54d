"""TPU-only forms of collectives in an optimized module, for :mod:`hlo_doctor.graph.collectives`.

* **MegaScale DCN transfers.** In a multi-slice compile the part of a
  collective that crosses slices becomes a host-transfer ``send``/``recv``
  pair handled by the MegaScale runtime (seen with libtpu 0.0.42.1)::

      %send = (f32[1,30,1280], u32[], token[]) send(%bitcast, %after-all), channel_id=4,
          is_host_transfer=true, frontend_attributes={..., _xla_host_transfer_rendezvous="all-gather.10_0",
          _xla_megascale_target="{1,2}x{0:15}", _xla_megascale_transfer_type="ALL_GATHER"}
      %recv = (f32[2,30,1280], u32[], token[]) recv(%after-all), ... same rendezvous ...

  The ``send`` is the collective (its ``recv-done`` the done op): the kind
  is the transfer type, the groups are one device of each slice named by
  ``_xla_megascale_target`` (``{slices}x{local ids}``, MegaScale ids
  ``slice * 100000 + local``), bytes in are the send's operand, bytes out the
  recv's data.
* **Async collective fusions.** A ``fusion`` named ``async-collective-start``
  (``kind=kCustom``) whose body holds a collective runs it asynchronously up
  to its ``async-collective-done``. The body's collective is reported once,
  named by the start fusion.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import Computation, HloModule, Instruction

MEGASCALE_TYPE = "_xla_megascale_transfer_type"
MEGASCALE_TARGET = "_xla_megascale_target"
RENDEZVOUS = "_xla_host_transfer_rendezvous"
ASYNC_COLLECTIVE_START = "async-collective-start"
ASYNC_COLLECTIVE_DONE = "async-collective-done"
_TRANSFER_KINDS = {
    "ALL_GATHER": "all-gather", "ALL_REDUCE": "all-reduce", "REDUCE_SCATTER": "reduce-scatter",
    "ALL_TO_ALL": "all-to-all", "COLLECTIVE_PERMUTE": "collective-permute", "BROADCAST": "collective-broadcast",
}
_SET = re.compile(r"\{([^{}]*)\}")
_STRIDE = 100_000


def frontend_attribute(instruction: Instruction, key: str) -> str | None:
    """One value of an instruction's ``frontend_attributes={k="v",...}``."""
    text = instruction.attribute("frontend_attributes")
    if not text or key not in text:
        return None
    match = re.search(re.escape(key) + r'\s*=\s*"([^"\\]*(?:\\.[^"\\]*)*)"', text)
    return match.group(1) if match else None


def megascale_kind(instruction: Instruction) -> str | None:
    """The collective a MegaScale ``send`` carries (``all-gather``...), or None."""
    if instruction.opcode != "send":
        return None
    kind = frontend_attribute(instruction, MEGASCALE_TYPE)
    if kind is None:
        return None
    return _TRANSFER_KINDS.get(kind, kind.lower().replace("_", "-"))


def megascale_physical_groups(instruction: Instruction) -> tuple[tuple[int, ...], ...]:
    """``{1,2}x{0:15}`` -> ((100000, 200000), (100001, 200001), ...): one device per slice.

    The slice numbers are MegaScale's (``slice_index + 1``, as in the device ids)."""
    text = frontend_attribute(instruction, MEGASCALE_TARGET) or ""
    parts = _SET.findall(text)
    if len(parts) != 2:
        return ()
    slices, local = (_id_set(p) for p in parts)
    return tuple(tuple(s * _STRIDE + d for s in slices) for d in local)


def _id_set(text: str) -> list[int]:
    out: list[int] = []
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            continue
        if ":" in piece:
            low, high = piece.split(":", 1)
            if low.strip().isdigit() and high.strip().isdigit():
                out.extend(range(int(low), int(high) + 1))
        elif piece.isdigit():
            out.append(int(piece))
    return out


def megascale_recv(computation: Computation, send: Instruction) -> Instruction | None:
    """The ``recv`` of the same rendezvous as ``send``."""
    key = frontend_attribute(send, RENDEZVOUS)
    if key is None:
        return None
    for instruction in computation.instructions:
        if instruction.opcode == "recv" and frontend_attribute(instruction, RENDEZVOUS) == key:
            return instruction
    return None


def is_async_collective_fusion(instruction: Instruction) -> bool:
    return instruction.opcode == "fusion" and instruction.name.lstrip("%").startswith(ASYNC_COLLECTIVE_START)


def fused_collective(module: HloModule, fusion: Instruction, collective_opcodes: frozenset[str]
                     ) -> tuple[str, str] | None:
    """(computation, instruction) of the collective inside an async collective fusion."""
    for name in fusion.called_computations:
        called = module.computation(name)
        if called is None:
            continue
        for instruction in called.instructions:
            if instruction.opcode in collective_opcodes:
                return called.name, instruction.name
    return None
