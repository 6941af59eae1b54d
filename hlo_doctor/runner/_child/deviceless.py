"""Compile for a GPU cluster or a TPU slice without one: topology devices, placeholders, and jit interception.

Used twice: in the child process of ``hlo-doctor run --target`` (the runner
copies this file next to ``sitecustomize.py``, which imports it when
``HLO_DOCTOR_TARGET`` is set) and in-process by
:func:`hlo_doctor.runner.targets.compile_for_target`. It imports only the
standard library at load time, and jax on first use, so it never depends on
hlo_doctor being importable in the child.

How a script runs deviceless (JAX with ``JAX_PLATFORMS=cpu``; the jax CUDA
plugin only has to be installed):

* ``jax.devices()``, ``jax.device_count()``, ``jax.local_devices()``,
  ``jax.make_mesh`` and ``mesh_utils.create_device_mesh`` give the
  compile-only devices of the target topology (``process_index`` set per host).
  A ``Mesh`` built from CPU devices is rebuilt on the topology devices with the
  same ids.
* ``jax.device_put(x, sharding)`` and ``jax.make_array_from_callback`` onto
  those devices return a ``jax.ShapeDtypeStruct`` that carries the sharding
  (a placeholder): nothing is transferred.
* Calling a ``jax.jit`` function with placeholders, or with shardings over the
  topology devices, lowers and compiles it for the target instead of running
  it and returns placeholders for its outputs (one compile per distinct input
  signature). Calls with tracers (nested jit, grad) and calls that touch no
  target device run as usual.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys

TARGET_VAR = "HLO_DOCTOR_TARGET"
PLATFORM = "cuda"

_topologies: dict[tuple, object] = {}


# --- the topology ------------------------------------------------------------------


def topology_devices(config_text: str, hosts: int, devices_per_host: int, name: str = "target"):
    """The compile-only devices of ``hosts`` x ``devices_per_host`` GPUs described by the config."""
    key = (config_text, hosts, devices_per_host)
    topology = _topologies.get(key)
    if topology is None:
        from jax.experimental import topologies

        try:
            topology = topologies.get_topology_desc(
                topology_name=f"{name}-{hosts}x{devices_per_host}", platform=PLATFORM,
                target_config=config_text, topology=f"1x{hosts}x{devices_per_host}",
            )
        except NotImplementedError as error:
            raise RuntimeError(
                "the jax CUDA plugin is not available for deviceless compiles: install "
                "`jax-cuda12-plugin` and `jax-cuda12-pjrt` (same version as jaxlib) and set "
                f"JAX_PLATFORMS=cpu before jax starts ({error})"
            ) from None
        _topologies[key] = topology
    return list(topology.devices)


def tpu_topology_devices(topology_name: str, num_slices: int = 1):
    """The compile-only devices of a TPU topology (``v4:4x4x8``), one per chip.

    A v4 topology lists both TensorCores of each chip; JAX on a real v4 drives
    them as one megacore device, so only core 0 of each chip is kept.
    """
    key = ("tpu", topology_name, num_slices)
    topology = _topologies.get(key)
    if topology is None:
        from jax.experimental import topologies

        try:
            topology = topologies.get_topology_desc(
                topology_name=topology_name, platform="tpu", num_slices=num_slices)
        except RuntimeError as error:
            raise RuntimeError(
                "libtpu is not available for deviceless TPU compiles: install "
                f"`jax[tpu]` (same version as jax) and set JAX_PLATFORMS=cpu ({error})"
            ) from None
        _topologies[key] = topology
    return [d for d in topology.devices if getattr(d, "core_on_chip", 0) == 0]


def device_record(device) -> dict:
    """What the sidecar keeps of one target device: id, host, slice, coordinates, kind."""
    record = {"id": int(device.id), "process_index": int(device.process_index),
              "kind": str(device.device_kind)}
    for name in ("slice_index", "core_on_chip"):
        value = getattr(device, name, None)
        if value is not None:
            record[name] = int(value)
    coords = getattr(device, "coords", None)
    if coords is not None:
        record["coords"] = [int(c) for c in coords]
    return record


def is_target_device(device) -> bool:
    return getattr(device, "platform", None) in ("gpu", "tpu") and _is_compile_only(device)


def _is_compile_only(device) -> bool:
    client = getattr(device, "client", None)
    return type(client).__name__ == "CompileOnlyPyClient"


def sharding_devices(sharding):
    """The devices of a jax Sharding or Device; () for anything else."""
    if sharding is None:
        return ()
    if hasattr(sharding, "_device_assignment"):
        try:
            return tuple(sharding._device_assignment)
        except Exception:  # noqa: BLE001 - an abstract mesh has no devices
            return ()
    if hasattr(sharding, "platform") and hasattr(sharding, "id"):
        return (sharding,)
    return ()


def on_target(sharding) -> bool:
    devices = sharding_devices(sharding)
    return bool(devices) and all(is_target_device(d) for d in devices)


# --- placeholders ------------------------------------------------------------------


def placeholder(leaf, sharding=None):
    """A ``jax.ShapeDtypeStruct`` for an array-like leaf (keeping its target sharding)."""
    import jax

    if isinstance(leaf, jax.ShapeDtypeStruct):
        keep = sharding if sharding is not None else leaf.sharding
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=keep,
                                    weak_type=leaf.weak_type)
    aval = jax.typeof(leaf)
    if sharding is None:
        own = getattr(leaf, "sharding", None)
        sharding = own if on_target(own) else None
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding,
                                weak_type=getattr(aval, "weak_type", False))


def as_sharding(device_or_sharding):
    import jax

    if isinstance(device_or_sharding, jax.sharding.Sharding):
        return device_or_sharding
    return jax.sharding.SingleDeviceSharding(device_or_sharding)


def _is_array_leaf(leaf) -> bool:
    import jax
    import numpy as np

    return isinstance(leaf, (jax.ShapeDtypeStruct, jax.Array, np.ndarray, np.generic,
                             bool, int, float, complex))


def _is_tracer(leaf) -> bool:
    import jax

    return isinstance(leaf, jax.core.Tracer)


def outputs_of(compiled):
    """Placeholders for a compiled function's outputs (shape, dtype, sharding)."""
    import jax

    def strip(info):
        if isinstance(info, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=info.sharding,
                                        weak_type=info.weak_type)
        return info

    return jax.tree_util.tree_map(strip, compiled.out_info)


# --- jit interception ------------------------------------------------------------------


class DevicelessJit:
    """Stands in for the object ``jax.jit(fun, **kwargs)`` returns.

    ``lower``/``trace``/``eval_shape`` and every other attribute go to the real
    jitted function; a call compiles for the target instead of running when
    :meth:`_targets` says it should.
    """

    def __init__(self, jitted, fun, jit_kwargs, on_compile):
        self._jitted = jitted
        self._fun = fun
        self._jit_kwargs = jit_kwargs
        self._on_compile = on_compile
        self._cache: dict = {}
        functools.update_wrapper(self, fun, updated=())

    def __getattr__(self, name):
        return getattr(self._jitted, name)

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return functools.partial(self, instance)

    def __call__(self, *args, **kwargs):
        import jax

        static_nums, static_names = self._static()
        dynamic = [a for i, a in enumerate(args) if i not in static_nums]
        dynamic += [v for k, v in kwargs.items() if k not in static_names]
        leaves = jax.tree_util.tree_leaves(dynamic)
        if any(_is_tracer(leaf) for leaf in leaves) or not self._targets(leaves):
            return self._jitted(*args, **kwargs)

        def convert(value):
            return jax.tree_util.tree_map(
                lambda leaf: placeholder(leaf) if _is_array_leaf(leaf) else leaf, value)

        new_args = [a if i in static_nums else convert(a) for i, a in enumerate(args)]
        new_kwargs = {k: v if k in static_names else convert(v) for k, v in kwargs.items()}
        key = _signature_key(new_args, new_kwargs)
        compiled = self._cache.get(key) if key is not None else None
        if compiled is None:
            try:
                compiled = self._jitted.lower(*new_args, **new_kwargs).compile()
            except Exception as error:  # noqa: BLE001 - only "does not fit" is kept going
                if "RESOURCE_EXHAUSTED" not in str(error):
                    raise
                # The step does not fit the target's memory: XLA has dumped the optimized module
                # and its buffer assignment already (what `hlo-doctor memory` reads), so the
                # script goes on with placeholders of the outputs' shapes.
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                print(f"hlo-doctor: {getattr(self._fun, '__name__', 'the step')} does not fit the target's "
                      f"memory, its dump is kept (hlo-doctor memory DUMP): {first}", file=sys.stderr)
                return jax.eval_shape(self._jitted, *new_args, **new_kwargs)
            if key is not None:
                self._cache[key] = compiled
            self._on_compile(self._fun, compiled)
        return outputs_of(compiled)

    def _targets(self, leaves) -> bool:
        import jax

        for leaf in leaves:
            if isinstance(leaf, jax.ShapeDtypeStruct):
                return True
            if on_target(getattr(leaf, "sharding", None)):
                return True
        for name in ("in_shardings", "out_shardings"):
            spec = self._jit_kwargs.get(name)
            if spec is not None:
                found = jax.tree_util.tree_leaves(
                    spec, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))
                if any(on_target(s) for s in found):
                    return True
        return False

    def _static(self) -> tuple[set[int], set[str]]:
        nums = self._jit_kwargs.get("static_argnums")
        names = self._jit_kwargs.get("static_argnames")
        nums = {nums} if isinstance(nums, int) else set(nums or ())
        names = {names} if isinstance(names, str) else set(names or ())
        try:
            params = list(inspect.signature(self._fun).parameters)
        except (TypeError, ValueError):
            params = []
        nums = {n + len(params) if n < 0 else n for n in nums}
        names |= {params[n] for n in nums if 0 <= n < len(params)}
        nums |= {params.index(n) for n in names if n in params}
        return nums, names


def _signature_key(args, kwargs):
    import jax

    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    parts = []
    for leaf in leaves:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            parts.append((leaf.shape, str(leaf.dtype), leaf.sharding, leaf.weak_type))
        else:
            parts.append(leaf)
    key = (tree, tuple(parts))
    try:
        hash(key)
    except TypeError:
        return None
    return key


# --- the child: patch jax -----------------------------------------------------------------


class ChildTarget:
    """The target of this child process, from ``HLO_DOCTOR_TARGET`` (JSON)."""

    def __init__(self, spec: dict, emit):
        self.spec = spec
        self.emit = emit
        self._devices = None

    @classmethod
    def from_env(cls, emit):
        text = os.environ.get(TARGET_VAR)
        return cls(json.loads(text), emit) if text else None

    @property
    def backend_names(self) -> tuple[str, ...]:
        return ("tpu",) if self.spec.get("platform") == "tpu" else ("gpu", "cuda")

    def devices(self):
        if self._devices is None:
            if self.spec.get("platform") == "tpu":
                self._devices = tpu_topology_devices(self.spec["topology_name"],
                                                     int(self.spec.get("num_slices", 1)))
            else:
                with open(self.spec["config_path"], encoding="utf-8") as f:
                    config = f.read()
                self._devices = topology_devices(config, int(self.spec["hosts"]),
                                                 int(self.spec["devices_per_host"]),
                                                 self.spec.get("name", "target"))
            self.emit({"event": "target_devices",
                       "devices": [device_record(d) for d in self._devices]})
        return self._devices

    def record_compile(self, fun, compiled) -> None:
        event = {"event": "target_compile",
                 "function": getattr(fun, "__qualname__", repr(fun))}
        try:
            shardings = [s for s in compiled.input_shardings[0] if on_target(s)]
            if shardings:
                event["device_ids"] = [int(d.id) for d in shardings[0]._device_assignment]
        except Exception:  # noqa: BLE001 - the record is optional
            pass
        self.emit(event)

    # -- patches, applied when the modules are first imported ----------------------
    def patch_jax(self, jax) -> None:
        target = self

        def devices(backend=None):
            if backend is None or str(backend) in target.backend_names:
                return list(target.devices())
            return original_devices(backend)

        def device_count(backend=None):
            return len(devices(backend))

        def local_devices(process_index=None, backend=None, host_id=None):
            index = process_index if process_index is not None else (host_id or 0)
            if backend is None or str(backend) in target.backend_names:
                return [d for d in target.devices() if d.process_index == index]
            return original_local_devices(process_index, backend, host_id)

        def local_device_count(backend=None):
            return len(local_devices(backend=backend))

        def process_count(backend=None):
            return len({d.process_index for d in target.devices()})

        original_devices = jax.devices
        original_local_devices = jax.local_devices
        original_make_mesh = jax.make_mesh
        original_device_put = jax.device_put
        original_from_callback = jax.make_array_from_callback
        original_jit = jax.jit

        @functools.wraps(original_make_mesh)
        def make_mesh(axis_shapes, axis_names, *args, devices=None, **kwargs):
            if devices is None:
                devices = target.devices()
            return original_make_mesh(axis_shapes, axis_names, *args, devices=devices, **kwargs)

        @functools.wraps(original_device_put)
        def device_put(x, device=None, *args, **kwargs):
            if device is None:
                return original_device_put(x, device, *args, **kwargs)
            shardings = jax.tree_util.tree_leaves(
                device, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))
            if not shardings or not all(on_target(s) for s in shardings):
                return original_device_put(x, device, *args, **kwargs)
            if len(shardings) == 1 and (isinstance(device, jax.sharding.Sharding)
                                        or is_target_device(device)):
                sharding = as_sharding(device)
                return jax.tree_util.tree_map(lambda leaf: placeholder(leaf, sharding), x)
            return jax.tree_util.tree_map(
                lambda s, sub: jax.tree_util.tree_map(
                    lambda leaf: placeholder(leaf, as_sharding(s)), sub),
                device, x, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding)
                or is_target_device(s))

        @functools.wraps(original_from_callback)
        def make_array_from_callback(shape, sharding, data_callback, *args, **kwargs):
            if not on_target(sharding):
                return original_from_callback(shape, sharding, data_callback, *args, **kwargs)
            index = next(iter(sharding.devices_indices_map(tuple(shape)).values()))
            dtype = jax.numpy.asarray(data_callback(index)).dtype
            return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)

        @functools.wraps(original_jit)
        def jit(fun=None, *args, **kwargs):
            if fun is None:
                return lambda f: jit(f, *args, **kwargs)
            jitted = original_jit(fun, *args, **kwargs)
            return DevicelessJit(jitted, fun, kwargs, target.record_compile)

        jax.devices = devices
        jax.device_count = device_count
        jax.local_devices = local_devices
        jax.local_device_count = local_device_count
        jax.process_count = process_count
        jax.make_mesh = make_mesh
        jax.device_put = device_put
        jax.make_array_from_callback = make_array_from_callback
        jax.jit = jit
        sharding_module = getattr(jax, "sharding", None)
        if sharding_module is not None and hasattr(sharding_module, "make_mesh"):
            sharding_module.make_mesh = make_mesh

    def patch_mesh_utils(self, module) -> None:
        target = self
        for name in ("create_device_mesh", "create_hybrid_device_mesh"):
            original = getattr(module, name, None)
            if original is None:
                continue

            def wrapper(*args, _original=original, **kwargs):
                bound = inspect.signature(_original).bind_partial(*args, **kwargs)
                if bound.arguments.get("devices") is None:
                    bound.arguments["devices"] = target.devices()
                return _original(*bound.args, **bound.kwargs)

            functools.update_wrapper(wrapper, original)
            setattr(module, name, wrapper)

    def substitute_mesh_devices(self, devices):
        """CPU devices -> the topology devices with the same ids (other arrays unchanged)."""
        flat = list(devices.flat)
        if not flat or any(is_target_device(d) for d in flat):
            return devices
        if any(getattr(d, "platform", None) != "cpu" for d in flat):
            return devices
        by_id = {int(d.id): d for d in self.devices()}
        if not all(int(d.id) in by_id for d in flat):
            return devices
        import numpy as np

        out = np.empty(devices.shape, dtype=object)
        for index, d in np.ndenumerate(devices):
            out[index] = by_id[int(d.id)]
        return out

    def patch_stages(self, module) -> None:
        """Calling a ``Compiled`` made for the target returns placeholders instead of running."""
        original = module.Compiled.__call__

        def __call__(compiled, *args, **kwargs):
            if _compiled_for_target(compiled):
                return outputs_of(compiled)
            return original(compiled, *args, **kwargs)

        module.Compiled.__call__ = __call__


def _compiled_for_target(compiled) -> bool:
    import jax

    try:
        shardings = jax.tree_util.tree_leaves((compiled.input_shardings,
                                               compiled.output_shardings))
    except Exception:  # noqa: BLE001
        return False
    return any(on_target(s) for s in shardings)
