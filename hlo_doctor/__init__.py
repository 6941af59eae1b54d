"""hlo-doctor: diagnose sharding problems in XLA SPMD programs from HLO dumps.

The Python API, imported on first use::

    hlo_doctor.analyze_dump(path, **options) -> Report
    hlo_doctor.analyze_jax(fn, *args, devices=None, **jit_kwargs) -> Report
"""

from __future__ import annotations

from typing import Any

from hlo_doctor._version import __version__

__all__ = ["__version__", "analyze_dump", "analyze_jax"]


def __getattr__(name: str) -> Any:
    if name in ("analyze_dump", "analyze_jax"):
        # Imported on first use, so that ``import hlo_doctor`` (and reading __version__) stays cheap.
        from hlo_doctor import api

        return getattr(api, name)
    raise AttributeError(f"module 'hlo_doctor' has no attribute {name!r}")
