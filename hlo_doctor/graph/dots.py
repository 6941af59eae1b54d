"""Operand roles of a dot or convolution: batch, contracting and free dims.

For ``dot`` the roles come from ``lhs_batch_dims``/``rhs_batch_dims`` and
``lhs_contracting_dims``/``rhs_contracting_dims``. The output of a dot is laid
out as XLA defines it: batch dims (in the order listed), then the lhs free
dims, then the rhs free dims, each in increasing operand order.

For ``convolution`` the roles come from ``dim_labels`` (``b01f_01io->b01f``):
the input's ``b`` is batch (-> output ``b``), its ``f`` contracts with the
kernel's ``i``, the kernel's ``o`` maps to the output ``f``; spatial dims
(digits) of input and output are paired by digit (``spatial``; the kernel's
spatial dims are windows, with no output dim). ``batch_group_count`` and
``feature_group_count`` are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hlo_doctor.errors import OpKindError
from hlo_doctor.hlo.attributes import parse_int_list
from hlo_doctor.hlo.ir import Instruction

__all__ = ["DimRole", "DotDims", "dot_dims"]


@dataclass(frozen=True, slots=True)
class DimRole:
    """One operand dim: its role and the output dim it maps to (None if none)."""

    operand: int  # 0 = lhs / input, 1 = rhs / kernel
    dim: int
    role: str  # "batch" | "contracting" | "free" | "spatial" | "window"
    output_dim: int | None


@dataclass(frozen=True, slots=True, eq=False)
class DotDims:
    """The dims of a dot's operands by role. One object per distinct dot kind (``dot_dims``
    caches them), compared and hashed by identity: a dim map cached by it must not hash its
    roles over again for every dot."""

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]
    roles: tuple[tuple[DimRole, ...], tuple[DimRole, ...]]

    def role(self, operand: int, dim: int) -> DimRole:
        return self.roles[operand][dim]

    def output_dim(self, operand: int, dim: int) -> int | None:
        return self.roles[operand][dim].output_dim

    def operand_dims(self, output_dim: int) -> list[tuple[int, int]]:
        """The (operand, dim) pairs that map to ``output_dim``."""
        return [(r.operand, r.dim) for side in self.roles for r in side if r.output_dim == output_dim]


def _ints(text: str | None) -> tuple[int, ...]:
    return tuple(parse_int_list(text)) if text else ()


def dot_dims(instruction: Instruction, lhs_rank: int, rhs_rank: int) -> DotDims:
    """Roles of a ``dot``/``convolution``'s operand dims (ranks of the two operands)."""
    if instruction.opcode == "convolution":
        return _convolution_dims(instruction, lhs_rank, rhs_rank)
    if instruction.opcode != "dot":
        raise OpKindError(f"{instruction.name} is a {instruction.opcode}, not a dot or convolution")
    # One read of the line's first attributes (XLA prints a dot's dims before its metadata),
    # not a split of the whole line: the analyses ask this of every dot, in every pass.
    return _dot_dims(*instruction.attributes_of(_DOT_DIMS_KEYS), lhs_rank, rhs_rank)


_DOT_DIMS_KEYS = ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")


# Cached by the four dims attributes as written and the two ranks: a big module has
# thousands of dots but few distinct dot kinds.
@lru_cache(maxsize=4096)
def _dot_dims(lb_text: str | None, rb_text: str | None, lc_text: str | None, rc_text: str | None,
              lhs_rank: int, rhs_rank: int) -> DotDims:
    lb, rb = _ints(lb_text), _ints(rb_text)
    lc, rc = _ints(lc_text), _ints(rc_text)
    lf = tuple(d for d in range(lhs_rank) if d not in lb and d not in lc)
    rf = tuple(d for d in range(rhs_rank) if d not in rb and d not in rc)
    lhs: dict[int, DimRole] = {}
    rhs: dict[int, DimRole] = {}
    for i, (l, r) in enumerate(zip(lb, rb, strict=False)):
        lhs[l] = DimRole(0, l, "batch", i)
        rhs[r] = DimRole(1, r, "batch", i)
    for l in lc:
        lhs[l] = DimRole(0, l, "contracting", None)
    for r in rc:
        rhs[r] = DimRole(1, r, "contracting", None)
    out = len(lb)
    for l in lf:
        lhs[l] = DimRole(0, l, "free", out)
        out += 1
    for r in rf:
        rhs[r] = DimRole(1, r, "free", out)
        out += 1
    roles = (tuple(lhs[d] for d in range(lhs_rank)), tuple(rhs[d] for d in range(rhs_rank)))
    return DotDims(lb, rb, lc, rc, lf, rf, roles)


def _convolution_dims(instruction: Instruction, lhs_rank: int, rhs_rank: int) -> DotDims:
    labels = instruction.attribute("dim_labels")
    if not labels or "->" not in labels or "_" not in labels:
        raise OpKindError(f"{instruction.name}: convolution without dim_labels")
    operands, output = labels.split("->")
    lhs_labels, rhs_labels = operands.split("_")
    out_index = {c: i for i, c in enumerate(output)}
    lhs = []
    for d, c in enumerate(lhs_labels[:lhs_rank]):
        if c == "b":
            lhs.append(DimRole(0, d, "batch", out_index.get("b")))
        elif c == "f":
            lhs.append(DimRole(0, d, "contracting", None))
        else:
            lhs.append(DimRole(0, d, "spatial", out_index.get(c)))
    rhs = []
    for d, c in enumerate(rhs_labels[:rhs_rank]):
        if c == "o":
            rhs.append(DimRole(1, d, "free", out_index.get("f")))
        elif c == "i":
            rhs.append(DimRole(1, d, "contracting", None))
        else:
            rhs.append(DimRole(1, d, "window", None))
    pick = lambda side, role: tuple(r.dim for r in side if r.role == role)
    return DotDims(
        pick(lhs, "batch"), (), pick(lhs, "contracting"), pick(rhs, "contracting"),
        pick(lhs, "spatial"), pick(rhs, "free"), (tuple(lhs), tuple(rhs)),
    )
