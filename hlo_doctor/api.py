"""The Python API: analyze a jitted JAX function, or a dump folder, in one call.

:func:`analyze_jax` compiles ``jax.jit(fn).lower(*args).compile()`` in this
process with XLA's dump options passed as per-compile ``compiler_options``
(no environment variables needed), writes the runner's sidecar
(``hlo_doctor_run.json``: the meshes of the arguments' shardings, the device
assignment and the host layout) next to the dump, and analyzes the folder
with :func:`hlo_doctor.analysis.analyze_dump` — the same code path as
``hlo-doctor analyze``.

With ``target="h100:2x8"`` (``NAME[:HOSTSxDEVICES]``, see
:mod:`hlo_doctor.runner.targets`) the compile is deviceless for that GPU
cluster instead: the real XLA:GPU pipeline runs on this CPU-only machine
through JAX's CUDA plugin (``pip install hlo-doctor[gpu-target]``), the dump
gains a scheduled ``*.sm_X.Y_gpu_after_optimizations.txt``, and the sidecar
records the target, its hosts (``process_index``) and the device assignment.
The analysis then picks the GPU's hardware profile and the host layout itself.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hlo_doctor.analysis import Report, analyze_dump
from hlo_doctor.errors import InputError
from hlo_doctor.runner.sidecar import (
    SCHEMA_VERSION,
    SIDECAR_NAME,
    installed_versions,
)
from hlo_doctor.runner.targets import TargetError, compile_for_target, parse_target

DUMP_PASSES = "spmd|propagation|shardy-verbose"

__all__ = ["analyze_dump", "analyze_jax", "compile_jax_dump", "ensure_cpu_devices"]


def ensure_cpu_devices(count: int) -> None:
    """Make JAX's CPU backend have at least ``count`` devices.

    Works only before JAX creates its backends (``jax_num_cpu_devices``);
    afterwards it checks and raises InputError with what to do instead.
    """
    import jax

    try:
        from jax._src import xla_bridge

        initialized = bool(xla_bridge._backends)
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        initialized = True
    if not initialized:
        jax.config.update("jax_num_cpu_devices", max(count, jax.config.jax_num_cpu_devices or 1))
        if not jax.config.jax_platforms:
            jax.config.update("jax_platforms", "cpu")
    available = len(jax.devices())
    if available < count:
        raise InputError(
            f"need {count} devices but JAX already started with {available}; set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count} (or the pytest option "
            f"--hlo-doctor-devices={count}) before JAX starts"
        )


def compile_jax_dump(
    fn: Callable[..., Any],
    *args: Any,
    dump_dir: str | os.PathLike[str],
    devices: int | None = None,
    partitioner: str | None = None,
    devices_per_host: int | None = None,
    target: str | None = None,
    compiler_options: Mapping[str, Any] | None = None,
    **jit_kwargs: Any,
) -> Path:
    """Compile ``jax.jit(fn, **jit_kwargs)`` for ``args`` and dump every sharding pass to ``dump_dir``.

    With ``target`` (``"h100:2x8"``) the compile is deviceless for that GPU
    cluster (:func:`hlo_doctor.runner.targets.compile_for_target`); ``devices``
    must then be None and ``devices_per_host``, if given, must match the
    target. ``compiler_options`` are extra XLA debug options for this compile,
    e.g. ``{"xla_gpu_disable_async_collectives": "allgather,reducescatter"}``.
    """
    if partitioner not in (None, "shardy", "gspmd"):
        raise InputError(f"partitioner must be 'shardy' or 'gspmd', not {partitioner!r}")
    if target is not None:
        return _compile_for_target(fn, args, dump_dir, target, devices, partitioner, devices_per_host,
                                   compiler_options, jit_kwargs)
    if devices is not None:
        ensure_cpu_devices(devices)
    import jax

    dump = Path(dump_dir)
    dump.mkdir(parents=True, exist_ok=True)
    with _partitioner(partitioner) as shardy:
        jitted = fn if hasattr(fn, "lower") and not jit_kwargs else jax.jit(fn, **jit_kwargs)
        jitted.lower(*args).compile(compiler_options={
            **dict(compiler_options or {}), "xla_dump_to": str(dump), "xla_dump_hlo_pass_re": DUMP_PASSES,
        })
    _write_sidecar(dump, args, "shardy" if shardy[0] else "gspmd", devices_per_host)
    return dump


def _compile_for_target(fn, args, dump_dir, target, devices, partitioner, devices_per_host,
                        compiler_options, jit_kwargs) -> Path:
    try:
        parsed = parse_target(target)
    except TargetError as error:
        raise InputError(str(error)) from None
    if devices is not None:
        raise InputError(
            f"target {parsed} has {parsed.device_count} devices: drop devices={devices} "
            "(build the mesh from hlo_doctor.runner.targets.target_devices(target))"
        )
    if devices_per_host is not None and devices_per_host != parsed.devices_per_host:
        raise InputError(
            f"devices_per_host={devices_per_host} contradicts target {parsed} "
            f"({parsed.devices_per_host} devices per host)"
        )
    with _partitioner(partitioner):
        try:
            result = compile_for_target(fn, *args, target=parsed, dump_dir=dump_dir,
                                        compiler_options=compiler_options, **jit_kwargs)
        except TargetError as error:
            raise InputError(str(error)) from None
    return result.dump_dir


@contextmanager
def _partitioner(partitioner: str | None) -> Iterator[list[bool]]:
    """Use Shardy or GSPMD for the compiles inside; yields [whether Shardy was used]."""
    import jax

    previous = jax.config.jax_use_shardy_partitioner
    if partitioner is not None:
        jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
    used = [bool(jax.config.jax_use_shardy_partitioner)]
    try:
        yield used
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def analyze_jax(
    fn: Callable[..., Any],
    *args: Any,
    devices: int | None = None,
    partitioner: str | None = None,
    devices_per_host: int | None = None,
    dump_dir: str | os.PathLike[str] | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    hardware: str | None = None,
    rule_options: dict[str, dict[str, Any]] | None = None,
    target: str | None = None,
    compiler_options: Mapping[str, Any] | None = None,
    **jit_kwargs: Any,
) -> Report:
    """Compile ``fn`` for ``args`` (arrays or ``jax.ShapeDtypeStruct`` with shardings) and analyze it.

    ``devices`` makes sure JAX has that many CPU devices (before JAX starts);
    ``partitioner`` picks Shardy or GSPMD for this compile; the dump goes to
    ``dump_dir`` (a temporary folder by default, kept with the report's
    ``dump`` path). Other keyword arguments go to ``jax.jit``.

    ``target`` compiles for a GPU cluster without a GPU: ``"h100"``,
    ``"a100:2x8"``, any ``NAME[:HOSTSxDEVICES]`` of
    :mod:`hlo_doctor.runner.targets` (needs the jax CUDA plugin:
    ``pip install hlo-doctor[gpu-target]``; JAX must start with
    ``JAX_PLATFORMS=cpu``, which is set here when JAX has not started yet).
    Give ``args`` as ``jax.ShapeDtypeStruct`` with ``NamedSharding`` over a
    mesh of the target's devices, or over CPU devices with the same ids
    (these are moved onto the target's devices)::

        from hlo_doctor.runner.targets import target_devices
        mesh = Mesh(np.array(target_devices("h100:2x8")), ("fsdp",))
        w = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, P("fsdp")))
        report = hlo_doctor.analyze_jax(train_step, w, batch, target="h100:2x8")

    The dump then has the scheduled ``*.sm_9.0a_gpu_after_optimizations.txt``,
    and its sidecar the hosts (``process_index``) and device assignment, so
    communication-bound uses the GPU's hardware profile and
    cross-host-tensor-parallel the host layout without ``hardware`` or
    ``devices_per_host``. ``devices`` must be None with a target.
    ``compiler_options`` are extra XLA debug options for the compile (either
    path), e.g. ``{"xla_gpu_disable_async_collectives": "allgather"}``.
    """
    folder = Path(dump_dir) if dump_dir is not None else Path(tempfile.mkdtemp(prefix="hlo-doctor-"))
    compile_jax_dump(
        fn, *args, dump_dir=folder, devices=devices, partitioner=partitioner,
        devices_per_host=devices_per_host, target=target, compiler_options=compiler_options,
        **jit_kwargs,
    )
    return analyze_dump(
        folder,
        select=select,
        ignore=ignore,
        devices_per_host=devices_per_host,
        hardware=hardware,
        rule_options=rule_options,
    )


def _meshes_of(args: Any) -> list[dict[str, Any]]:
    """The distinct meshes of the NamedShardings found in ``args`` (any pytree)."""
    import jax

    meshes: dict[tuple, dict[str, Any]] = {}
    for leaf in jax.tree_util.tree_leaves(args):
        mesh = getattr(getattr(leaf, "sharding", None), "mesh", None)
        if mesh is None or not hasattr(mesh, "axis_names") or not hasattr(mesh, "devices"):
            continue
        ids = [int(d.id) for d in mesh.devices.flat]
        key = (tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(ids))
        meshes.setdefault(
            key,
            {
                "axis_names": [str(a) for a in mesh.axis_names],
                "shape": list(mesh.devices.shape),
                "device_ids": ids,
                "kind": "Mesh",
                "stack": [],
            },
        )
    return list(meshes.values())


def _write_sidecar(dump: Path, args: Any, partitioner: str, devices_per_host: int | None) -> None:
    import jax

    meshes = _meshes_of(args)
    record = {
        "schema_version": SCHEMA_VERSION,
        "command": ["hlo_doctor.analyze_jax"],
        "framework": "jax",
        "versions": installed_versions("jax"),
        "partitioner": partitioner,
        "device_count": len(jax.devices()),
        "devices_per_host": devices_per_host,
        "meshes": meshes,
        # JAX assigns partitions to the mesh's devices in row-major order.
        "device_assignment": meshes[0]["device_ids"] if len(meshes) == 1 else None,
        "sharding_calls": [],
        "module_calls": [],
        "example": None,
        "instrumentation_errors": [],
    }
    (dump / SIDECAR_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
