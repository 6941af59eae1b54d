"""GPU targets for deviceless compiles: ``hlo-doctor run --target h100:2x8``.

TPU targets (``v4:4x4x8``, ``v4-256``, ``v5e:4x4x2slices``) parse here too and
live in :mod:`hlo_doctor.runner.tpu_targets`.

A target is a GPU model (a ``stream_executor.GpuTargetConfigProto`` text file)
and a cluster shape, HOSTS x DEVICES per host. JAX's CUDA plugin compiles for
it on a CPU-only machine (``JAX_PLATFORMS=cpu``): the real XLA:GPU pipeline
(SPMD partitioning, collective combining, the latency-hiding scheduler) runs and
writes ``*.sm_X.Y_gpu_after_optimizations.txt`` into the dump. Nothing runs on
a GPU; the plugin only has to be installed (``pip install hlo-doctor[gpu-target]``).

Built-in targets (configs in ``target_configs/``, derived from openxla/xla,
Apache-2.0; see the NOTICE there):

========  ==========================  ==================
name      GPU                         default shape
========  ==========================  ==================
``h100``  NVIDIA H100 SXM 80 GB       1 host x 8 devices
``a100``  NVIDIA A100 SXM4 80 GB      1 host x 8 devices
========  ==========================  ==================

:func:`compile_for_target` compiles one function in this process; the runner
compiles a whole script's ``jax.jit`` calls in a child (``_child/deviceless.py``).

Which scripts work with ``hlo-doctor run --target``:

* JAX scripts that build their mesh from ``jax.devices()``, ``jax.make_mesh`` or
  ``mesh_utils.create_device_mesh`` (these give the target's devices, with
  ``process_index`` per host), and whose jitted functions take
  ``jax.ShapeDtypeStruct`` pytrees, arrays placed with ``jax.device_put`` /
  ``jax.make_array_from_callback`` on that mesh, or NumPy/CPU arrays when the
  ``jax.jit`` has ``in_shardings`` on it;
* ``jax.jit(f).lower(...).compile()`` scripts (the gallery's style);
* training loops: each call returns ``ShapeDtypeStruct`` placeholders for its
  outputs, which can feed the next call (one compile per distinct signature).

What does not: anything that needs concrete values from a target computation
(``float(loss)``, ``print`` of values, host-side control flow on outputs,
``jnp`` operations or optimizer ``init`` on placeholders outside ``jit``,
checkpoints), ``jax.distributed.initialize``, ``pmap``, and torch_xla.
Compute those pieces inside the jitted function, or on NumPy before
``device_put``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hlo_doctor.errors import HloDoctorError
from hlo_doctor.runner._child import deviceless  # the deviceless compile, also run in-process
from hlo_doctor.runner.dump_dir import prepare_dump_dir as _prepare_dump_dir
from hlo_doctor.runner.environment import TPU_DEVICELESS_ENV
from hlo_doctor.runner.flags import DUMP_PASS_RE
from hlo_doctor.runner.sidecar import build_sidecar, write_sidecar
from hlo_doctor.runner.tpu_targets import CHIPS, TpuTargetError, is_tpu_target_name, parse_tpu_target
from hlo_doctor.runner.trim import trim_dump

if TYPE_CHECKING:
    from hlo_doctor.runner.tpu_targets import TpuTarget

CONFIG_DIR = Path(__file__).parent / "target_configs"
PLATFORM = "cuda"
_SHAPE = re.compile(r"(?P<hosts>\d+)x(?P<devices>\d+)")
_MAX_DEVICES = 4096
# Repeated-enum debug options: compiler_options wants the enum names, comma-separated.
_ENUM_LIST_OPTIONS = frozenset({"xla_gpu_disable_async_collectives"})


class TargetError(HloDoctorError, ValueError):
    """A ``--target`` or ``--target-config`` value that cannot be used."""


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A built-in target: a GPU model and its default cluster shape."""

    name: str
    description: str
    config_file: str
    hosts: int = 1
    devices_per_host: int = 8

    @property
    def config_path(self) -> Path:
        return CONFIG_DIR / self.config_file


TARGET_SPECS: dict[str, TargetSpec] = {
    spec.name: spec
    for spec in (
        TargetSpec("h100", "NVIDIA H100 SXM 80 GB", "h100_sxm.txtpb"),
        TargetSpec("a100", "NVIDIA A100 SXM4 80 GB", "a100_sxm_80.txtpb"),
    )
}


@dataclass(frozen=True, slots=True)
class Target:
    """A GPU cluster to compile for: ``hosts`` x ``devices_per_host`` GPUs of one config."""

    name: str
    config_path: Path
    hosts: int
    devices_per_host: int
    platform: str = PLATFORM

    @property
    def device_count(self) -> int:
        return self.hosts * self.devices_per_host

    @property
    def topology(self) -> str:
        """JAX's topology string: slices x hosts x devices per host."""
        return f"1x{self.hosts}x{self.devices_per_host}"

    @property
    def label(self) -> str:
        """``h100_2x8``: for folder names."""
        return f"{self.name}_{self.hosts}x{self.devices_per_host}"

    def __str__(self) -> str:
        return f"{self.name}:{self.hosts}x{self.devices_per_host}"

    def config_text(self) -> str:
        return self.config_path.read_text(encoding="utf-8")

    def to_json(self) -> dict[str, Any]:
        """The sidecar's ``target`` entry (also what the child reads from its environment)."""
        builtin = self.config_path.parent == CONFIG_DIR.resolve()
        return {
            "name": self.name,
            # a built-in config by file name (portable), the user's own by path
            "config": self.config_path.name if builtin else str(self.config_path),
            "config_path": str(self.config_path),
            "hosts": self.hosts,
            "devices_per_host": self.devices_per_host,
            "device_count": self.device_count,
            "platform": self.platform,
            "topology": self.topology,
        }


def target_names() -> tuple[str, ...]:
    return tuple(sorted(TARGET_SPECS)) + CHIPS


def _choices() -> str:
    return ", ".join(f"{n}[:HOSTSxDEVICES]" for n in sorted(TARGET_SPECS)) + (
        ", or a TPU: v4:4x4x8, v4-256, v5p:2x2x1, v5e:4x4, v6e:2x2 (xNslices for multi-slice)")


def parse_target(text: str | None, *, config_file: str | Path | None = None) -> Target | TpuTarget:
    """``"h100"``, ``"h100:2x8"`` or, with ``config_file``, any ``NAME[:HOSTSxDEVICES]``;
    a TPU (``"v4:4x4x8"``, ``"v4-256"``, ``"v5e:4x4x2slices"``) gives a
    :class:`~hlo_doctor.runner.tpu_targets.TpuTarget`.

    Without ``text`` the config file's stem names the target (1 host x 8 devices).
    Raises :class:`TargetError` with the valid choices.
    """
    if text is None and config_file is None:
        raise TargetError(f"give a target: one of {_choices()}")

    if text is not None and is_tpu_target_name(text):
        if config_file is not None:
            raise TargetError("--target-config is a GPU config; a TPU target takes none")
        try:
            return parse_tpu_target(text)
        except TpuTargetError as error:
            raise TargetError(str(error)) from None
    name, _, shape = (text or "").strip().partition(":")
    name = name.strip().lower()
    spec = TARGET_SPECS.get(name)
    if config_file is not None:
        config_path = Path(config_file)
        check_config_file(config_path)
        name = name or re.sub(r"[^A-Za-z0-9_.-]", "_", config_path.stem)
        hosts, devices = (spec.hosts, spec.devices_per_host) if spec else (1, 8)
    elif spec is None:
        raise TargetError(
            f"unknown target {name or text!r}; choose one of: {_choices()} "
            "(or pass --target-config FILE)"
        )
    else:
        config_path = spec.config_path
        hosts, devices = spec.hosts, spec.devices_per_host
    if shape:
        match = _SHAPE.fullmatch(shape.strip())
        if match is None:
            raise TargetError(
                f"bad cluster shape {shape!r} in {text!r}: expected HOSTSxDEVICES, e.g. {name}:2x8"
            )
        hosts, devices = int(match["hosts"]), int(match["devices"])
        if hosts < 1 or devices < 1 or hosts * devices > _MAX_DEVICES:
            raise TargetError(
                f"bad cluster shape {shape!r}: hosts and devices must be at least 1, "
                f"at most {_MAX_DEVICES} devices in all"
            )
    return Target(name, config_path.resolve(), hosts, devices)


def check_config_file(path: Path) -> None:
    """A readable text file that looks like a ``GpuTargetConfigProto``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TargetError(f"--target-config {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise TargetError(f"--target-config {path}: not a text file") from None
    if "gpu_device_info" not in text:
        raise TargetError(
            f"--target-config {path}: not a GpuTargetConfigProto text file "
            "(no gpu_device_info); see hlo_doctor/runner/target_configs/ for examples"
        )


def target_env_value(target: Target | TpuTarget) -> str:
    """The ``HLO_DOCTOR_TARGET`` value the child reads."""
    return json.dumps(target.to_json(), sort_keys=True)


# --- in-process compile -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TargetCompile:
    """What :func:`compile_for_target` made: the dump, its sidecar, and jax's ``Compiled``."""

    dump_dir: Path
    sidecar_path: Path
    sidecar: dict[str, Any]
    compiled: Any


def target_devices(target: str | Target | TpuTarget) -> list[Any]:
    """The compile-only JAX devices of a target, to build meshes for :func:`compile_for_target`."""
    target = parse_target(target) if isinstance(target, str) else target
    _use_cpu_platform()
    if target.platform == "tpu":
        for name, value in TPU_DEVICELESS_ENV.items():
            os.environ.setdefault(name, value)  # read when libtpu loads
        return deviceless.tpu_topology_devices(target.topology_name, target.slices)
    return deviceless.topology_devices(target.config_text(), target.hosts,
                                       target.devices_per_host, target.name)


def compile_for_target(
    fn: Any,
    *args: Any,
    target: str | Target | TpuTarget,
    dump_dir: str | Path,
    compiler_options: Mapping[str, Any] | None = None,
    **jit_kwargs: Any,
) -> TargetCompile:
    """Compile ``jax.jit(fn, **jit_kwargs)`` for a GPU target, dumping into ``dump_dir``.

    ``args`` are arrays or ``jax.ShapeDtypeStruct`` pytrees. Shardings over
    :func:`target_devices` are used as they are; a ``NamedSharding`` over other
    devices (say, a CPU mesh) is moved onto the target's devices with the same
    ids. ``compiler_options`` are extra XLA debug options, e.g.
    ``{"xla_gpu_disable_async_collectives": "allgather,reducescatter,allreduce"}``.

    Runs in this process: jax must start with ``JAX_PLATFORMS=cpu`` (set here
    when jax has no backend yet). Writes ``hlo_doctor_run.json`` and trims the dump.
    """

    target = parse_target(target) if isinstance(target, str) else target
    devices = target_devices(target)
    import jax

    dump = _prepare_dump_dir(Path(dump_dir))
    by_id = {int(d.id): d for d in devices}
    placed = jax.tree_util.tree_map(lambda leaf: _retarget(leaf, by_id), list(args))
    options: dict[str, Any] = {"xla_dump_to": str(dump), "xla_dump_hlo_pass_re": DUMP_PASS_RE}
    for name, value in (compiler_options or {}).items():
        if name in _ENUM_LIST_OPTIONS and isinstance(value, str):
            value = value.upper()  # XLA_FLAGS takes "allgather"; compiler_options "ALLGATHER"
        options[name] = value
    compiled = jax.jit(fn, **jit_kwargs).lower(*placed).compile(compiler_options=options)

    events: list[dict[str, Any]] = [{
        "event": "target_devices", "devices": [deviceless.device_record(d) for d in devices],
    }]
    shardings = [s for s in jax.tree_util.tree_leaves(compiled.input_shardings)
                 if deviceless.on_target(s)]
    compile_event: dict[str, Any] = {"event": "target_compile",
                                     "function": getattr(fn, "__qualname__", repr(fn))}
    if shardings:
        compile_event["device_ids"] = [int(d.id) for d in shardings[0]._device_assignment]
    events.append(compile_event)
    sidecar = build_sidecar(
        command=["compile_for_target", compile_event["function"]], framework="jax",
        partitioner="shardy" if jax.config.jax_use_shardy_partitioner else "gspmd",
        devices=target.device_count, devices_per_host=target.devices_per_host,
        events=events, target=target, dump_dir=dump,
    )
    sidecar_path = write_sidecar(dump, sidecar)
    trim_dump(dump)
    return TargetCompile(dump, sidecar_path, sidecar, compiled)


def _use_cpu_platform() -> None:
    """The CUDA plugin and libtpu compile deviceless only while JAX's platform is the CPU."""
    import jax
    from jax._src import xla_bridge

    if getattr(xla_bridge, "_backends", None):
        return  # too late to choose; topology_devices explains a failure
    if not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")


def _retarget(leaf: Any, by_id: Mapping[int, Any]) -> Any:
    """A ShapeDtypeStruct whose NamedSharding's mesh uses the target's devices."""
    import jax
    import numpy as np

    if not isinstance(leaf, jax.ShapeDtypeStruct):
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
            return deviceless.placeholder(leaf)
        return leaf
    sharding = leaf.sharding
    if not isinstance(sharding, jax.sharding.NamedSharding) or deviceless.on_target(sharding):
        return leaf
    mesh = sharding.mesh
    devices = np.empty(mesh.devices.shape, dtype=object)
    for index, device in np.ndenumerate(mesh.devices):
        if int(device.id) not in by_id:
            raise TargetError(
                f"mesh device {device.id} is not on target with {len(by_id)} devices"
            )
        devices[index] = by_id[int(device.id)]
    new_mesh = jax.sharding.Mesh(devices, mesh.axis_names, axis_types=mesh.axis_types)
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=leaf.weak_type,
                                sharding=jax.sharding.NamedSharding(new_mesh, sharding.spec))
