"""What a TPU dump says about its hardware: the chip, the chip grid, and hosts.

``topology.textproto`` of a TPU compile names the chip in ``platform_version``
(``"TFRT TPU v5 lite\\nBuilt on ..."``) and carries a serialized
``xla.TpuPjRtTopologyDescriptionProto`` in ``platform_specific_topology``.
Its schema is not published; the fields read here were identified on
deviceless compiles with libtpu 0.0.42.1 (``v4:2x2x1``, ``v4:4x4x8``,
``v5e:4x4``, ``v5:2x2x1``, ``v6e:2x2``), where the chip grid is
``chips_per_host_bounds * host_bounds``:

* field 1, a message: 1 = chip generation (3 = v4, 4 = v5, 5 = v6),
  2 = variant (``"lite"`` for v5e/v6e), 5 = ``chips_per_host_bounds``
  and 6 = ``host_bounds``, each a message of x (1), y (2), z (3).

Device ids: a chip's id is ``x + X*y + X*Y*z`` over the chip grid (X, Y);
with C TensorCores per device-visible chip (v4 deviceless compiles expose
both cores: 2) device ``d`` is core ``d % C`` of chip ``d // C``. In
multi-slice compiles device ids are MegaScale ids, ``(slice + 1) * 100000 +
local id``. A host is a ``chips_per_host_bounds`` block of the grid.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hlo_doctor.dump import protowire

__all__ = ["TpuTopology", "chip_of_version", "decode_tpu_topology", "MEGASCALE_SLICE_STRIDE"]

MEGASCALE_SLICE_STRIDE = 100_000
_GENERATIONS = {3: "v4", 4: "v5", 5: "v6"}
# platform_version / device_kind text -> chip name, as the hardware profiles name them.
_CHIP_NAMES = (
    (re.compile(r"\bv6\s*lite\b|\bv6e\b", re.I), "v6e"),
    (re.compile(r"\bv5\s*lite\b|\bv5e\b", re.I), "v5e"),
    (re.compile(r"\bv5p\b|\bv5\b", re.I), "v5p"),
    (re.compile(r"\bv4\b", re.I), "v4"),
)


def chip_of_version(text: str | None) -> str | None:
    """``"TFRT TPU v5 lite ..."`` -> ``"v5e"``, ``"TPU v4"`` -> ``"v4"``; None when no TPU chip is named."""
    if not text or "tpu" not in text.lower():
        return None
    first_line = text.splitlines()[0]
    for pattern, name in _CHIP_NAMES:
        if pattern.search(first_line):
            return name
    return None


@dataclass(frozen=True, slots=True)
class TpuTopology:
    """The chip grid of one slice and how it is split into hosts."""

    chip: str | None  # v4, v5e, v5p, v6e
    chips_per_host_bounds: tuple[int, int, int]
    host_bounds: tuple[int, int, int]

    @property
    def chip_bounds(self) -> tuple[int, int, int]:
        (c0, c1, c2), (h0, h1, h2) = self.chips_per_host_bounds, self.host_bounds
        return (c0 * h0, c1 * h1, c2 * h2)

    @property
    def chips(self) -> int:
        return math.prod(self.chip_bounds)

    @property
    def hosts(self) -> int:
        return math.prod(self.host_bounds)

    @property
    def chips_per_host(self) -> int:
        return math.prod(self.chips_per_host_bounds)

    def host_of_chip(self, chip_id: int) -> int:
        """The host (process) index of a chip id within its slice."""
        cx, cy, cz = self.chips_per_host_bounds
        hx, hy, _ = self.host_bounds
        gx, gy, _ = self.chip_bounds
        x, y, z = chip_id % gx, (chip_id // gx) % gy, chip_id // (gx * gy)
        return x // cx + hx * (y // cy) + hx * hy * (z // cz)

    def host_of(self, devices: tuple[int, ...] | list[int]) -> dict[int, int] | None:
        """Physical device -> host index (hosts numbered slice by slice), or None when the
        device ids do not fit this grid."""
        by_slice: dict[int, list[int]] = {}
        for device in devices:
            by_slice.setdefault(device // MEGASCALE_SLICE_STRIDE, []).append(device)
        out: dict[int, int] = {}
        for rank, (slice_key, members) in enumerate(sorted(by_slice.items())):
            local = [d - slice_key * MEGASCALE_SLICE_STRIDE for d in members]
            # cores per chip: 2 where both TensorCores of a v4 chip are devices, else 1
            # (a megacore view may list only core 0 of each chip: ids 0, 2, 4 ...)
            cores = -(-(max(local) + 1) // self.chips)
            if cores > 2 or (cores == 2 and (max(local) + 1) <= self.chips):
                return None
            for device, local_id in zip(members, local, strict=False):
                out[device] = rank * self.hosts + self.host_of_chip(local_id // cores)
        return out


def slice_of(devices: tuple[int, ...] | list[int]) -> dict[int, int] | None:
    """Slice index of MegaScale device ids (``(slice + 1) * 100000 + local``); None for
    plain ids (one slice)."""
    if not devices or min(devices) < MEGASCALE_SLICE_STRIDE:
        return None
    return {d: d // MEGASCALE_SLICE_STRIDE - 1 for d in devices}


def decode_tpu_topology(data: bytes, platform_version: str | None = None) -> TpuTopology | None:
    """The chip grid from a serialized ``TpuPjRtTopologyDescriptionProto``; None when it
    does not hold one."""
    try:
        inner = protowire.as_message(protowire.first(data, 1))
        if inner is None:
            return None
        per_host = _bounds(protowire.as_message(protowire.first(inner, 5)))
        hosts = _bounds(protowire.as_message(protowire.first(inner, 6)))
        generation = protowire.first(inner, 1)
        variant = protowire.first(inner, 2)
    except protowire.WireError:
        return None
    if per_host is None or hosts is None:
        return None
    chip = chip_of_version(platform_version)
    if chip is None and isinstance(generation, int) and generation in _GENERATIONS:
        name = _GENERATIONS[generation]
        lite = isinstance(variant, bytes) and variant == b"lite"
        chip = {"v4": "v4", "v5": "v5e" if lite else "v5p", "v6": "v6e"}[name]
    return TpuTopology(chip, per_host, hosts)


def _bounds(data: bytes | None) -> tuple[int, int, int] | None:
    if data is None:
        return None
    x, y, z = (v if isinstance(v, int) and v > 0 else 1 for v in (protowire.first(data, n) for n in (1, 2, 3)))
    return (x, y, z)
