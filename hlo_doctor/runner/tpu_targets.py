"""TPU targets for deviceless compiles: ``hlo-doctor run --target v4:4x4x8 -- python train.py``.

libtpu (``pip install hlo-doctor[tpu-target]``, i.e. ``jax[tpu]==0.10.2``)
compiles for a TPU topology on a machine without TPUs: with
``JAX_PLATFORMS=cpu``, ``jax.experimental.topologies.get_topology_desc(
topology_name="v4:4x4x8", platform="tpu", num_slices=N)`` gives compile-only
devices with their ``process_index`` (host), ``slice_index`` and ``coords``,
and the real TPU pipeline (partitioner, collective fusions, layouts) writes its
dump. Nothing runs on a TPU.

Spellings (``parse_tpu_target``):

* ``CHIP:GRID``, JAX's own names: ``v4:2x2x1``, ``v4:4x4x8``, ``v5p:2x2x1``
  (JAX calls it ``v5``), ``v5e:4x4``, ``v6e:2x2``, ``v6e:16x16``;
* Cloud TPU slice names ``CHIP-N``: ``v4-256`` and ``v5p-8`` count
  TensorCores (2 per chip), ``v5e-16`` / ``v5litepod-16`` and ``v6e-16``
  count chips; each maps to the usual grid (``v4-256`` -> ``v4:4x4x8``);
* multi-slice: append ``xNslices`` to either, ``v5e:4x4x2slices``,
  ``v4-16x2slices``: N slices joined by DCN (MegaScale device ids).

Devices: one per chip. v4 and v5p chips have two TensorCores that JAX on a
real v4/v5p drives as one device (megacore); the deviceless v4 topology
lists both cores, so the target keeps core 0 of each chip, as a real
``jax.devices()`` would show. Hosts hold 2x2x1 chips (4 per host) on every
generation named here, as the topology reports; a host is a block of the chip
grid, not a run of ids.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from hlo_doctor.errors import HloDoctorError

PLATFORM = "tpu"
CHIPS = ("v4", "v5e", "v5p", "v6e")
# our chip name -> the topology name's prefix JAX/libtpu accept
_JAX_CHIP = {"v4": "v4", "v5e": "v5e", "v5p": "v5", "v6e": "v6e"}
_ALIASES = {"v5": "v5p", "v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}
_THREE_D = frozenset({"v4", "v5p"})
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
# Grids for Cloud TPU slice sizes (chips), the shapes GCP provisions by default.
_GRIDS_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
             128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16),
             4096: (16, 16, 16)}
_GRIDS_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
             256: (16, 16)}
_SLICES = re.compile(r"(?P<rest>.*?)x(?P<slices>\d+)slices?")
_GRID = re.compile(r"\d+(?:x\d+){1,2}")
_MAX_CHIPS = 8192


class TpuTargetError(HloDoctorError, ValueError):
    """A TPU ``--target`` that cannot be used."""


@dataclass(frozen=True, slots=True)
class TpuTarget:
    """A TPU slice (or several) to compile for: chip generation, chip grid, slice count."""

    chip: str  # v4, v5e, v5p, v6e
    grid: tuple[int, ...]
    slices: int = 1
    platform: str = PLATFORM

    @property
    def name(self) -> str:
        return self.chip

    @property
    def topology_name(self) -> str:
        """The name libtpu accepts: ``v4:4x4x8``, ``v5:2x2x1`` (v5p)."""
        return f"{_JAX_CHIP[self.chip]}:{'x'.join(map(str, self.grid))}"

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.grid)

    @property
    def chips_per_host(self) -> int:
        return min(4, self.chips_per_slice)

    @property
    def hosts(self) -> int:
        return self.slices * max(1, self.chips_per_slice // self.chips_per_host)

    @property
    def devices_per_host(self) -> int:
        """Devices per host (one per chip); hosts are grid blocks, not id runs."""
        return self.chips_per_host

    @property
    def device_count(self) -> int:
        return self.slices * self.chips_per_slice

    @property
    def label(self) -> str:
        """``v5e_4x4`` / ``v5e_4x4x2slices``: for folder names."""
        return str(self).replace(":", "_")

    def __str__(self) -> str:
        grid = "x".join(map(str, self.grid))
        return f"{self.chip}:{grid}" + (f"x{self.slices}slices" if self.slices > 1 else "")

    def to_json(self) -> dict[str, Any]:
        """The sidecar's ``target`` entry (also what the child reads from its environment)."""
        return {
            "name": self.chip,
            "platform": self.platform,
            "topology_name": self.topology_name,
            "num_slices": self.slices,
            "chips_per_slice": self.chips_per_slice,
            "hosts": self.hosts,
            "devices_per_host": self.devices_per_host,
            "device_count": self.device_count,
            "cores_per_chip": _CORES_PER_CHIP[self.chip],
            "one_device_per_chip": True,
        }


def is_tpu_target_name(text: str) -> bool:
    """Whether ``text`` names a TPU chip (``v4:...``, ``v5e-16``, ``v5litepod-16``)."""
    head = re.split(r"[:-]", text.strip().lower(), maxsplit=1)[0]
    return _ALIASES.get(head, head) in CHIPS


def parse_tpu_target(text: str) -> TpuTarget:
    """``v4:4x4x8``, ``v4-256``, ``v5e:4x4x2slices``... -> :class:`TpuTarget`."""
    raw = text.strip().lower()
    slices = 1
    match = _SLICES.fullmatch(raw)
    if match is not None:
        raw, slices = match["rest"], int(match["slices"])
        if slices < 1:
            raise TpuTargetError(f"bad slice count in {text!r}: at least 1")
    if ":" in raw:
        head, _, shape = raw.partition(":")
        chip = _ALIASES.get(head, head)
        if chip not in CHIPS:
            raise TpuTargetError(_unknown(text))
        if _GRID.fullmatch(shape) is None:
            raise TpuTargetError(f"bad chip grid {shape!r} in {text!r}: expected e.g. "
                                 f"{'v4:4x4x8' if chip in _THREE_D else 'v5e:4x4'}")
        grid = tuple(int(n) for n in shape.split("x"))
        if chip in _THREE_D and len(grid) != 3:
            raise TpuTargetError(f"{chip} has a 3D chip grid: {chip}:XxYxZ, e.g. {chip}:2x2x1")
        if chip not in _THREE_D and len(grid) != 2:
            raise TpuTargetError(f"{chip} has a 2D chip grid: {chip}:XxY, e.g. {chip}:4x4")
    elif "-" in raw:
        head, _, count = raw.partition("-")
        chip = _ALIASES.get(head, head)
        if chip not in CHIPS or not count.isdigit():
            raise TpuTargetError(_unknown(text))
        size = int(count)
        chips = size // 2 if chip in _THREE_D else size  # v4-N / v5p-N count TensorCores
        grids: dict[int, tuple[int, ...]] = dict(_GRIDS_3D if chip in _THREE_D else _GRIDS_2D)
        if chip in _THREE_D and size % 2 or chips not in grids:
            unit = "TensorCores (2 per chip)" if chip in _THREE_D else "chips"
            sizes = ", ".join(f"{chip}-{n * 2 if chip in _THREE_D else n}" for n in sorted(grids))
            raise TpuTargetError(f"no standard grid for {text!r} (N counts {unit}); one of: {sizes}, "
                                 f"or give the grid, e.g. {chip}:{'x'.join(map(str, next(iter(grids.values()))))}")
        grid = grids[chips]
    else:
        raise TpuTargetError(_unknown(text))
    if any(n < 1 for n in grid) or math.prod(grid) * slices > _MAX_CHIPS:
        raise TpuTargetError(f"bad TPU target {text!r}: every dimension at least 1, "
                             f"at most {_MAX_CHIPS} chips in all")
    return TpuTarget(chip, grid, slices)


def _unknown(text: str) -> str:
    return (f"unknown TPU target {text!r}; expected CHIP:GRID (v4:2x2x1, v4:4x4x8, v5p:2x2x1, "
            f"v5e:4x4, v6e:2x2) or CHIP-N (v4-256, v5e-16), optionally followed by xNslices")
