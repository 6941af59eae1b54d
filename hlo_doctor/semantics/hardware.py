"""Hardware profiles: peak bf16 FLOP/s and collective bandwidth, for cost estimates.

Bundled profiles live in ``hlo_doctor/semantics/profiles/NAME.json`` (``h100``,
``a100``, ``tpu-v4``, ``tpu-v5e``, ``tpu-v5p``, ``tpu-v6e``), each with the
sources of its numbers. :func:`profile_for_dump` picks one from what a dumped
module says about its hardware (a TPU dump's topology names the chip).
``--hardware`` takes a bundled name or the path of a JSON file with the same
keys. Bandwidths are bytes per second *each way* per device, the figure a
ring collective is limited by; they are datasheet peaks, so estimates from
them are optimistic lower bounds on communication time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from hlo_doctor.errors import InputError

if TYPE_CHECKING:
    from hlo_doctor.dump import DumpModule

__all__ = [
    "HardwareProfile",
    "bundled_profiles",
    "load_profile",
    "profile_for_backend",
    "profile_for_dump",
    "profile_names",
]

_MAX_DEVICES_PER_HOST = 1 << 20
_FIELDS = ("name", "peak_bf16_flops", "intra_host_bandwidth", "inter_host_bandwidth", "devices_per_host")


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    peak_bf16_flops: float  # FLOP/s per device, dense
    intra_host_bandwidth: float  # bytes/s each way per device, inside a host (NVLink, ICI)
    inter_host_bandwidth: float  # bytes/s each way per device, between hosts
    devices_per_host: int
    description: str = ""
    sources: tuple[str, ...] = ()
    # Optional keys. ``peak_flops``: dense FLOP/s per device by element type (``bf16``,
    # ``f16``, ``f32``, ``f8e4m3fn``, ``s8`` ...), falling back to ``peak_bf16_flops``.
    # ``platform``: ``gpu`` or ``tpu`` (from the name when absent). ``inter_slice_bandwidth``:
    # bytes/s each way per device between TPU slices (DCN); None when not modelled.
    peak_flops: tuple[tuple[str, float], ...] = ()
    platform: str = "gpu"
    inter_slice_bandwidth: float | None = None
    memory_bandwidth: float | None = None  # HBM bytes/s per device
    hbm_bytes: int | None = None  # HBM capacity per device (what `hlo-doctor memory` holds the peak against)

    def peak_for(self, element_type: str) -> float:
        """Dense peak FLOP/s for dots of ``element_type`` (bf16's when the profile has no figure)."""
        table = dict(self.peak_flops)
        return table.get(element_type, self.peak_bf16_flops)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> HardwareProfile:
        missing = [key for key in _FIELDS if key not in data]
        if missing:
            raise InputError(f"hardware profile lacks {', '.join(missing)}", path=where)
        devices = data["devices_per_host"]
        if isinstance(devices, bool) or not isinstance(devices, int):
            raise InputError(f"bad hardware profile: devices_per_host must be an integer from 1 to "
                             f"{_MAX_DEVICES_PER_HOST} (devices), not {devices!r}", path=where)
        try:
            profile = cls(
                name=str(data["name"]),
                peak_bf16_flops=float(data["peak_bf16_flops"]),
                intra_host_bandwidth=float(data["intra_host_bandwidth"]),
                inter_host_bandwidth=float(data["inter_host_bandwidth"]),
                devices_per_host=int(data["devices_per_host"]),
                description=str(data.get("description", "")),
                sources=tuple(str(s) for s in data.get("sources", ())),
                peak_flops=tuple(sorted((str(k), float(v)) for k, v in dict(data.get("peak_flops", {})).items())),
                platform=str(data.get("platform") or ("tpu" if str(data["name"]).startswith("tpu") else "gpu")),
                inter_slice_bandwidth=(float(data["inter_slice_bandwidth"])
                                       if data.get("inter_slice_bandwidth") is not None else None),
                memory_bandwidth=(float(data["memory_bandwidth"])
                                  if data.get("memory_bandwidth") is not None else None),
                hbm_bytes=int(data["hbm_bytes"]) if data.get("hbm_bytes") is not None else None,
            )
        except (TypeError, ValueError, AttributeError, OverflowError) as error:
            raise InputError(f"bad hardware profile: {error}", path=where) from None
        profile._check_ranges(where)
        return profile

    def _check_ranges(self, where: str) -> None:
        """Every figure is a finite positive number (a zero bandwidth would divide by zero, a
        negative one would hide costs); InputError naming the field, its unit and the valid range."""
        figures: list[tuple[str, float | None, str]] = [
            ("peak_bf16_flops", self.peak_bf16_flops, "FLOP/s per device"),
            ("intra_host_bandwidth", self.intra_host_bandwidth, "bytes/s each way per device"),
            ("inter_host_bandwidth", self.inter_host_bandwidth, "bytes/s each way per device"),
            ("inter_slice_bandwidth", self.inter_slice_bandwidth, "bytes/s each way per device"),
            ("memory_bandwidth", self.memory_bandwidth, "bytes/s per device"),
            ("hbm_bytes", self.hbm_bytes, "bytes of memory per device"),
            *((f"peak_flops.{kind}", value, "FLOP/s per device") for kind, value in self.peak_flops),
        ]
        for key, value, unit in figures:
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InputError(f"bad hardware profile: {key} must be a finite number > 0 ({unit}), "
                                 f"not {value!r}", path=where)
        if not 1 <= self.devices_per_host <= _MAX_DEVICES_PER_HOST:
            raise InputError(f"bad hardware profile: devices_per_host must be an integer from 1 to "
                             f"{_MAX_DEVICES_PER_HOST} (devices), not {self.devices_per_host!r}", path=where)


def _profile_dir():
    return resources.files("hlo_doctor.semantics") / "profiles"


def bundled_profiles() -> dict[str, HardwareProfile]:
    """Every bundled profile by name."""
    found = {}
    for entry in sorted(_profile_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            profile = HardwareProfile.from_dict(json.loads(entry.read_text()), entry.name)
            found[profile.name] = profile
    return found


def load_profile(name_or_path: str) -> HardwareProfile:
    """A bundled profile by name (case-insensitive), or a JSON file's. Raises InputError."""
    profiles = bundled_profiles()
    key = name_or_path.lower()
    if key in profiles:
        return profiles[key]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise InputError(error.strerror or str(error), path=str(path)) from None
        except ValueError as error:
            raise InputError(f"not valid JSON: {error}", path=str(path)) from None
        if not isinstance(data, dict):
            raise InputError("a hardware profile must be a JSON object", path=str(path))
        return HardwareProfile.from_dict(data, str(path))
    raise InputError(f"unknown hardware '{name_or_path}' (bundled: {', '.join(sorted(profiles))}, or a JSON file)")


def profile_names() -> list[str]:
    """Names of the bundled hardware profiles."""
    return sorted(bundled_profiles())


# The compute capability in a GPU after-optimizations file name (``sm_9.0a_gpu``) -> bundled profile.
_GPU_ARCHITECTURES = {"8.0": "a100", "9.0": "h100", "9.0a": "h100", "10.0": "b200", "10.0a": "b200"}


def profile_for_backend(backend: str | None) -> HardwareProfile | None:
    """The bundled profile of a GPU backend named like ``sm_9.0a_gpu`` / ``sm_90a_gpu``, else None."""
    if not backend or not backend.startswith("sm_"):
        return None
    arch = backend[3:].removesuffix("_gpu")
    if "." not in arch and len(arch) >= 2:  # sm_90a -> 9.0a, sm_100 -> 10.0
        digits = arch.rstrip("abcdefghijklmnopqrstuvwxyz")
        arch = f"{digits[:-1]}.{digits[-1]}{arch[len(digits):]}"
    name = _GPU_ARCHITECTURES.get(arch)
    return bundled_profiles().get(name) if name else None


def profile_for_dump(dump_module: DumpModule | None) -> HardwareProfile | None:
    """The bundled profile of the hardware a module was compiled for: a TPU's chip from
    ``topology.textproto`` (``tpu-v4``, ``tpu-v5e``, ``tpu-v5p``, ``tpu-v6e``), a GPU's from
    the optimized module's backend prefix (``sm_9.0a_gpu`` -> ``h100``); None for CPU
    dumps and unknown hardware."""
    if dump_module is None:
        return None
    chip = dump_module.tpu_chip
    if chip:
        return bundled_profiles().get(f"tpu-{chip}")
    return profile_for_backend(dump_module.backend)
