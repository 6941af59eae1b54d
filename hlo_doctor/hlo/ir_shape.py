"""IR values: element types, shapes, layouts and text positions."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

# Bits per element of each XLA primitive type (xla_data.proto PrimitiveType).
ELEMENT_BITS: Mapping[str, int] = {
    "pred": 8,
    "s1": 1, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u1": 1, "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f4e2m1fn": 4, "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8,
    "f8e4m3fnuz": 8, "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128,
    "token": 0, "opaque": 0, "tuple": 0,
}


class Position(NamedTuple):
    """A 1-based line and column in the parsed text (a tuple: one per instruction)."""

    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout ``{minor_to_major:tiles...}``; only minor_to_major is interpreted."""

    minor_to_major: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Shape:
    """An array, token or tuple shape.

    ``dims`` are the (upper-bound) sizes; ``dynamic`` marks ``<=N`` bounded and
    ``?`` unbounded dimensions. A tuple has ``element_type == "tuple"`` and its
    elements in ``tuple_shapes``.
    """

    element_type: str
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    tuple_shapes: tuple[Shape, ...] = ()
    # Derived once when the shape is made (the parser makes one per shape text), not on every
    # read: the analyses ask these of every value they visit.
    is_tuple: bool = field(init=False, compare=False, repr=False)
    rank: int = field(init=False, compare=False, repr=False)
    num_elements: int = field(init=False, compare=False, repr=False)
    byte_size: int = field(init=False, compare=False, repr=False)  # the whole value's (a tuple's leaves summed)

    def __post_init__(self) -> None:
        is_tuple = self.element_type == "tuple"
        elements = math.prod(self.dims)
        if is_tuple:
            size = sum(s.byte_size for s in self.tuple_shapes)
        else:
            size = (elements * ELEMENT_BITS.get(self.element_type, 0) + 7) // 8
        object.__setattr__(self, "is_tuple", is_tuple)
        object.__setattr__(self, "rank", len(self.dims))
        object.__setattr__(self, "num_elements", elements)
        object.__setattr__(self, "byte_size", size)

    def leaves(self) -> Iterator[Shape]:
        """The array shapes of a tuple, depth first; an array yields itself."""
        if self.is_tuple:
            for element in self.tuple_shapes:
                yield from element.leaves()
        else:
            yield self

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        if self.element_type in ("token", "opaque"):
            return f"{self.element_type}[]"
        dims = ",".join(
            (f"<={d}" if dyn else str(d)) if d >= 0 else "?"
            for d, dyn in zip(self.dims, self.dynamic or (False,) * len(self.dims), strict=False)
        )
        return f"{self.element_type}[{dims}]"
