"""The optional extras the runner needs, checked before a child process starts.

A missing extra is one line with the pip command that installs it, instead of
an ImportError in the child's traceback after the dump folder was made.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from hlo_doctor.errors import HloDoctorError

__all__ = ["EXTRAS", "TARGET_EXTRAS", "MissingExtra", "extras_for", "missing_modules", "require_extras"]

# extra (as pyproject spells it) -> the modules of it that the runner and the child import
EXTRAS: dict[str, tuple[str, ...]] = {
    "jax": ("jax", "jaxlib"),
    "torch-xla": ("torch_xla",),
    "gpu-target": ("jax_cuda12_plugin", "jax_plugins.xla_cuda12"),
    "tpu-target": ("libtpu",),
    # the gallery's third-party programs (Example.extra)
    "third-party": ("transformers", "flax", "optax", "keras", "keras_hub", "equinox"),
}


class MissingExtra(HloDoctorError, RuntimeError):
    """An extra the run needs is not installed; the message holds the pip command."""


# a deviceless target's platform (``Target.platform``, ``TpuTarget.platform``) -> the extra that compiles for it
TARGET_EXTRAS: dict[str, str] = {"cuda": "gpu-target", "tpu": "tpu-target"}


def extras_for(framework: str | None, *, target_platform: str | None = None) -> list[str]:
    """The extras a run with this framework (``jax``/``torch_xla``) needs, compiling for a target of
    ``target_platform`` (``cuda``, ``tpu``; None: on CPU devices): a TPU target needs only the
    ``tpu-target`` extra, a GPU one only ``gpu-target``."""
    needed = []
    if framework is not None:
        needed.append("torch-xla" if framework.replace("-", "_") == "torch_xla" else "jax")
    if target_platform is not None:
        needed.append(TARGET_EXTRAS[target_platform])
    return needed


def missing_modules(modules: tuple[str, ...], python: str | None = None) -> list[str]:
    """Which of ``modules`` the interpreter ``python`` (default: this one) cannot import."""
    if python is None or python == sys.executable:
        return [name for name in modules if not _found_here(name)]
    probe = ("import importlib.util, sys\n"
             "def found(n):\n"
             "    try:\n        return importlib.util.find_spec(n) is not None\n"
             "    except (ImportError, ValueError):\n        return False\n"
             "print(' '.join(n for n in sys.argv[1:] if not found(n)))")
    try:
        result = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=60,
                                check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []  # the run itself will say what is wrong with the interpreter
    return result.stdout.split() if result.returncode == 0 else []


def require_extras(extras: list[str], python: str | None = None) -> None:
    """Raise :class:`MissingExtra` naming the first extra whose modules ``python`` cannot import."""
    for extra in extras:
        missing = missing_modules(EXTRAS[extra], python)
        if missing:
            where = f" for {python}" if python and python != sys.executable else ""
            raise MissingExtra(f"the {extra} extra is not installed{where} (no module {', '.join(missing)}): "
                               f"pip install 'hlo-doctor[{extra}]'")


def _found_here(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
