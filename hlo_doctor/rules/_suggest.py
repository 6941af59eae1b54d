"""Sharding code for suggestions, written with the program's own mesh axis names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

DimAxes = Sequence[str] | None  # the mesh axes one tensor dim is sharded over (None: not sharded)

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import Instruction


def argument_name(param: Instruction) -> str:
    """How the user knows an entry parameter: JAX records the argument name (``x``) as
    its ``op_name``; otherwise (torch_xla, other tools) the parameter's HLO name."""
    metadata = param.metadata
    if metadata is not None and metadata.op_name and "/" not in metadata.op_name and metadata.op_type is None:
        return metadata.op_name
    return param.name


def python_identifier(name: str, default: str = "param") -> str:
    """``name`` made into a Python identifier for suggested code (``default`` when nothing is left)."""
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned if cleaned and not cleaned[0].isdigit() else default


def _axes_text(axes: DimAxes) -> str:
    if not axes:
        return "None"
    if len(axes) == 1:
        return repr(axes[0])
    return "(" + ", ".join(repr(a) for a in axes) + ")"


def jax_spec(dims: Sequence[DimAxes]) -> str:
    """``P(('fsdp', 'replica'), None)``."""
    return "P(" + ", ".join(_axes_text(a) for a in dims) + ")"


def torch_spec(dims: Sequence[DimAxes]) -> str:
    """``(('fsdp', 'replica'), None)`` (torch_xla partition spec)."""
    inner = ", ".join(_axes_text(a) for a in dims)
    return f"({inner},)" if len(dims) == 1 else f"({inner})"


def constraint_code(dims: Sequence[DimAxes], value: str = "x") -> tuple[str, str]:
    """(JAX, torch_xla) code that constrains ``value`` to the spec."""
    return (
        f"{value} = jax.lax.with_sharding_constraint({value}, NamedSharding(mesh, {jax_spec(dims)}))",
        f"xs.mark_sharding({value}, mesh, {torch_spec(dims)})",
    )


def parameter_code(dims: Sequence[DimAxes], value: str = "param") -> tuple[str, str]:
    """(JAX, torch_xla) code that places a parameter with the spec."""
    jax_code = f"{value} = jax.device_put({value}, NamedSharding(mesh, {jax_spec(dims)}))  # or jit's in_shardings"
    return (jax_code, f"xs.mark_sharding({value}, mesh, {torch_spec(dims)})")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
