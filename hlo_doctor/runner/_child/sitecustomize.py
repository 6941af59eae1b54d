"""Instrumentation loaded into the child process that ``hlo-doctor run`` starts.

The runner copies this file into a temporary directory and puts that directory
first on the child's ``PYTHONPATH``, so Python's ``site`` imports it at start-up.
It must stay cheap and self-contained: it imports only the standard library,
never jax or torch. Framework modules are patched right after they are first
imported, through a meta path finder that wraps their loader.

What it records, as JSON lines appended to the file named by
``HLO_DOCTOR_EVENTS``:

* ``mesh``: every device mesh built (``jax.sharding.Mesh``, which also covers
  ``jax.make_mesh``; ``torch_xla.distributed.spmd.Mesh`` and ``HybridMesh``);
* ``sharding_call``: each ``xs.mark_sharding`` call (torch_xla) and each
  ``jax.lax.with_sharding_constraint`` call, with the user's stack;
* ``module_call``: each ``torch.nn.Module.__call__`` made from user code,
  once per (module class, call site);
* ``module_tree``: for each module the user's code calls directly (the model),
  once: its submodules' paths (``model.layers.0.self_attn.o_proj``) and
  classes, and its parameters' paths and shapes;
* ``keras_mesh`` / ``keras_layout`` / ``keras_variable_layout``: Keras 3's
  ``DeviceMesh`` (axis names, shape, the user's line), each ``LayoutMap`` key
  set (its axes, the user's line), and for each variable path Keras looked up
  the key it matched (``null``: none, so Keras replicates it);
* ``keras_state``: for each state layout Keras' JAX trainer builds for a jitted
  step (``train_step``: trainable, non-trainable, optimizer and metrics
  variables; ``test_step``: no optimizer's; ``predict_step``: the model's
  only), once per model: each group's variable paths, shapes and dtypes in
  order (the HLO's ``state[g][i]`` is variable i of group g);
* ``flax_logical_rules``: the rules of each ``nn.logical_axis_rules`` /
  ``nn.set_logical_axis_rules`` call (Flax linen), with the user's stack;
* ``nnx_jit_call``: for each function ``nnx.jit`` compiles, once: the flattened
  state paths of each graph-node argument, in the order nnx.jit names them in
  the HLO (``model.states[0][i]`` is the i-th);
* ``process``: device count and framework versions, when the child exits.

Under torch_xla it also writes each submodule's path into the HLO's op_name
(``model.layers.0.self_attn.o_proj/aten__mm``), see :func:`_label_module_io`.

With ``HLO_DOCTOR_TARGET`` set (``hlo-doctor run --target``), it also loads
``_hlo_doctor_deviceless`` from the same folder, which makes JAX compile for
the target GPU topology instead of running (see that module), and records
``target_devices`` and ``target_compile`` events.

Any existing ``sitecustomize`` further down ``sys.path`` is loaded afterwards.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import sysconfig
import threading
import weakref

_EVENTS_VAR = "HLO_DOCTOR_EVENTS"
_TARGET_VAR = "HLO_DOCTOR_TARGET"
_USER_PATHS_VAR = "HLO_DOCTOR_USER_PATHS"
_MAX_FRAMES = 12
_HERE = os.path.dirname(os.path.abspath(__file__))

_LIBRARY_PARTS = (
    os.sep + "site-packages" + os.sep,
    os.sep + "dist-packages" + os.sep,
)
_LIBRARY_PACKAGES = ("jax", "jaxlib", "torch", "torch_xla", "numpy", "flax", "optax", "keras", "keras_hub",
                     "transformers")
_lock = threading.Lock()


def _library_roots() -> tuple[str, ...]:
    roots = []
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(os.path.realpath(path) + os.sep)
    return tuple(roots)


_STDLIB_ROOTS = _library_roots()
_USER_ROOTS = tuple(
    os.path.realpath(p) + os.sep
    for p in os.environ.get(_USER_PATHS_VAR, "").split(os.pathsep)
    if p
)


def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    if path.startswith(_HERE + os.sep):
        return False
    if any(path.startswith(root) for root in _USER_ROOTS):
        return True
    if any(part in path for part in _LIBRARY_PARTS):
        return False
    if any(path.startswith(root) for root in _STDLIB_ROOTS):
        return False
    parts = path.split(os.sep)
    return not any(package in parts for package in _LIBRARY_PACKAGES)


def _user_stack(skip: int = 2) -> list[dict]:
    """The caller's stack, innermost first, keeping user frames only."""
    frames = []
    frame = sys._getframe(skip)
    while frame is not None and len(frames) < _MAX_FRAMES:
        code = frame.f_code
        if _is_user_file(code.co_filename):
            frames.append(
                {"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name}
            )
        frame = frame.f_back
    return frames


def _emit(event: dict) -> None:
    path = os.environ.get(_EVENTS_VAR)
    if not path:
        return
    line = json.dumps(event, default=repr) + "\n"
    with _lock:
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write(line)
        except OSError:
            pass


def _report_error(where: str, error: Exception) -> None:
    _emit({"event": "instrumentation_error", "where": where, "error": repr(error)})


def _guard(function):
    """Instrumentation must never break the user's program."""

    def guarded(*args, **kwargs):
        try:
            function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - report and carry on
            _report_error(function.__name__, error)

    guarded.__name__ = function.__name__
    return guarded


def _ints(values) -> list[int]:
    return [int(v) for v in values]


# --- JAX -------------------------------------------------------------------


@_guard
def _record_jax_mesh(mesh) -> None:
    if not mesh.axis_names:
        return
    devices = mesh.devices
    _emit(
        {
            "event": "mesh",
            "framework": "jax",
            "kind": type(mesh).__name__,
            "axis_names": [str(a) for a in mesh.axis_names],
            "shape": _ints(devices.shape),
            "device_ids": [int(d.id) for d in devices.flat],
            "stack": _user_stack(3),
        }
    )


def _patch_jax_mesh(module) -> None:
    mesh_class = module.Mesh
    original = mesh_class.__dict__["__new__"]
    original = getattr(original, "__func__", original)

    def __new__(cls, *args, **kwargs):
        if _target is not None:
            args, kwargs = _substitute_target_devices(args, kwargs)
        mesh = original(cls, *args, **kwargs)
        _record_jax_mesh(mesh)
        return mesh

    mesh_class.__new__ = staticmethod(__new__)


def _substitute_target_devices(args, kwargs):
    """A Mesh the user builds from CPU devices is built on the target's devices instead."""
    caller = sys._getframe(2)
    if not _is_user_file(caller.f_code.co_filename):
        return args, kwargs
    try:
        import numpy as np

        if args:
            devices = _target.substitute_mesh_devices(np.asarray(args[0], dtype=object))
            return (devices, *args[1:]), kwargs
        if "devices" in kwargs:
            devices = _target.substitute_mesh_devices(np.asarray(kwargs["devices"], dtype=object))
            return args, {**kwargs, "devices": devices}
    except Exception as error:  # noqa: BLE001 - fall back to the user's devices
        _report_error("substitute_target_devices", error)
    return args, kwargs


def _patch_jax_pjit(module) -> None:
    original = module.with_sharding_constraint

    def with_sharding_constraint(x, shardings):
        _record_sharding_call("with_sharding_constraint", shardings, x, None)
        return original(x, shardings)

    with_sharding_constraint.__doc__ = original.__doc__
    with_sharding_constraint.__wrapped__ = original
    module.with_sharding_constraint = with_sharding_constraint


# --- torch_xla ---------------------------------------------------------------


@_guard
def _record_torch_xla_mesh(mesh) -> None:
    _emit(
        {
            "event": "mesh",
            "framework": "torch_xla",
            "kind": type(mesh).__name__,
            "axis_names": [str(a) for a in (mesh.axis_names or ())],
            "shape": _ints(mesh.mesh_shape),
            "device_ids": _ints(list(mesh.device_ids)),
            "stack": _user_stack(3),
        }
    )


@_guard
def _record_sharding_call(function: str, spec, tensor, mesh) -> None:
    stack = _user_stack(3)
    if not stack:
        return
    if hasattr(spec, "spec") and hasattr(spec, "mesh"):  # a jax NamedSharding
        spec, mesh = spec.spec, spec.mesh
    event = {"event": "sharding_call", "function": function, "spec": repr(spec)}
    axis_names = getattr(mesh, "axis_names", None)
    if axis_names is not None:
        event["mesh_axis_names"] = [str(a) for a in axis_names]
    shape = getattr(tensor, "shape", None)
    if shape is not None:
        event["shape"] = _ints(shape)
    event["stack"] = stack
    _emit(event)


def _patch_torch_xla_sharding(module) -> None:
    mesh_class = module.Mesh
    original_init = mesh_class.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _record_torch_xla_mesh(self)

    mesh_class.__init__ = __init__

    original_mark = module.mark_sharding

    def mark_sharding(t, mesh, partition_spec, *args, **kwargs):
        _record_sharding_call("mark_sharding", partition_spec, t, mesh)
        return original_mark(t, mesh, partition_spec, *args, **kwargs)

    mark_sharding.__doc__ = original_mark.__doc__
    mark_sharding.__wrapped__ = original_mark
    module.mark_sharding = mark_sharding


# --- torch.nn.Module ---------------------------------------------------------

_seen_module_calls: dict[tuple, dict] = {}


@_guard
def _record_module_call(module) -> None:
    stack = _user_stack(3)
    if not stack:
        return
    key = (type(module).__qualname__, stack[0]["file"], stack[0]["line"])
    seen = _seen_module_calls.get(key)
    if seen is not None:
        seen["count"] += 1
        return
    cls = type(module)
    _seen_module_calls[key] = {
        "event": "module_call",
        "module_class": f"{cls.__module__}.{cls.__qualname__}",
        "file": stack[0]["file"],
        "line": stack[0]["line"],
        "stack": stack,
        "count": 1,
    }


_MAX_TREE = 4000
_seen_module_trees: set[int] = set()


def _called_from_user_code(depth: int) -> bool:
    frame = sys._getframe(depth)
    return frame is not None and _is_user_file(frame.f_code.co_filename)


@_guard
def _record_module_tree(module) -> None:
    """The paths of a module the user calls directly (the model) and of its parameters, once."""
    if id(module) in _seen_module_trees:
        return
    _seen_module_trees.add(id(module))
    cls = type(module)
    modules = []
    labels = "torch_xla" in sys.modules
    for path, sub in module.named_modules():
        _seen_module_trees.add(id(sub))  # a submodule the user's code calls is part of this tree
        if len(modules) >= _MAX_TREE:
            break
        modules.append({"path": path, "class": f"{type(sub).__module__}.{type(sub).__qualname__}"})
        if labels and _PATH.match(path):  # a ModuleDict key of other characters is not written
            _remember_path(sub, path)
    parameters = []
    for path, param in module.named_parameters():
        if len(parameters) >= _MAX_TREE:
            break
        parameters.append({"path": path, "shape": _ints(param.shape), "dtype": str(param.dtype)})
    _emit({"event": "module_tree", "module_class": f"{cls.__module__}.{cls.__qualname__}",
           "modules": modules, "parameters": parameters, "stack": _user_stack(4)})


def _patch_torch_module(module) -> None:
    module_class = module.Module
    original_call = module_class.__call__

    def __call__(self, *args, **kwargs):
        _record_module_call(self)
        if id(self) not in _seen_module_trees and _called_from_user_code(2):
            _record_module_tree(self)
        path = _path_of(self) if _module_paths else None
        if path is None:
            return original_call(self, *args, **kwargs)
        running = _running_paths()
        _label_module_io(path, running, (args, kwargs), output=False)
        running.append(path)
        try:
            result = original_call(self, *args, **kwargs)
        finally:
            running.pop()
        _label_module_io(path, running, result, output=True)
        return result

    module_class.__call__ = __call__


# --- torch_xla: module paths in the HLO's op_name ----------------------------------

# module -> its path in the tree recorded for the model the user calls (torch_xla only)
_module_paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_labeled: dict[int, weakref.ref] = {}  # id -> the tensor, for each tensor given a path (or left without one)
_running = threading.local()
# The prefix call keeps only the outermost N frames of each op's stack as its source location
# (N=2 turns every line into torch/nn/modules/module.py; 0 fails to lower): more frames than
# any stack has keep the location as it was.
_ALL_FRAMES = 1 << 16
_PATH = re.compile(r"^[\w.-]*$")
_MAX_WALK = 64


def _remember_path(module, path: str) -> None:
    try:
        _module_paths.setdefault(module, path)
    except TypeError:  # a module class that defines __eq__ without __hash__ gets no path
        pass


def _path_of(module) -> str | None:
    try:
        return _module_paths.get(module)
    except TypeError:
        return None


def _running_paths() -> list:
    paths = getattr(_running, "paths", None)
    if paths is None:
        paths = _running.paths = []
    return paths


def _tensors(value, found: list, depth: int = 0) -> list:
    """The tensors in a module's arguments or output: tensors, tuples, lists and mappings
    (``ModelOutput``), a few levels deep."""
    torch = sys.modules.get("torch")
    if torch is None or depth > 4 or len(found) >= _MAX_WALK:
        return found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value[:_MAX_WALK]:
            _tensors(item, found, depth + 1)
    elif isinstance(value, dict):
        for item in list(value.values())[:_MAX_WALK]:
            _tensors(item, found, depth + 1)
    return found


def _claim(tensor) -> bool:
    """Whether ``tensor`` has no path yet; it then has one (the caller gives it)."""
    key = id(tensor)
    ref = _labeled.get(key)
    if ref is not None and ref() is tensor:
        return False
    try:
        _labeled[key] = weakref.ref(tensor, lambda _, key=key: _labeled.pop(key, None))
    except TypeError:
        return False
    return True


def _label_module_io(path: str, running: list, value, output: bool) -> None:
    """Write a module path into the op_name of the XLA ops that make a module's tensors.

    ``torch_xla._XLAC._set_xla_custom_op_name_prefix(t, path + "/", depth)`` names the op of
    ``t``'s IR node ``path/aten__mm`` in the HLO metadata; when the graph is lowered, the ops it
    reaches first that have no name of their own take the same prefix (the matmul inside a
    ``Linear``, its weight's ``xla__device_data``). Ops torch_xla scopes itself
    (``aten__add.3/aten__add``) keep their name. Only metadata changes: the HLO's ops and
    shardings are the same.

    Innermost wins, deterministically: a tensor gets a path once. A module's output gets
    the module's path unless an inner module's output already has one (``self_attn`` returns
    ``o_proj``'s output: it stays ``...self_attn.o_proj``); a module's tensor arguments get the
    path of the module that is running when it is called (its caller made them), so the ops
    the caller ran before the call do not take the callee's path. The root (path ``""``) names
    nothing, and the tensors the user's code passes it are left without a path.
    """
    try:
        xlac = getattr(sys.modules.get("torch_xla"), "_XLAC", None)
        prefix_of = getattr(xlac, "_set_xla_custom_op_name_prefix", None)
        if prefix_of is None:
            return
        owner = path if output else (running[-1] if running else "")
        for tensor in _tensors(value, []):
            if not _claim(tensor) or not owner or tensor.device.type != "xla":
                continue
            prefix_of(tensor, owner + "/", _ALL_FRAMES)
    except Exception as error:  # noqa: BLE001 - report once and stop labelling
        _module_paths.clear()
        _report_error("label_module_io", error)


# --- Keras 3 and Flax: recorders in a sibling module (_child/third_party.py) ------------


def _third_party(name: str):
    def patch(module) -> None:
        import _hlo_doctor_third_party as recorders

        getattr(recorders, name)(module)

    return patch


def _versions() -> dict:
    from importlib import metadata

    versions = {"python": sys.version.split()[0]}
    for name in ("jax", "jaxlib", "torch", "torch_xla", "numpy", "transformers", "flax", "optax", "keras",
                 "keras_hub"):
        if name in sys.modules:
            try:
                versions[name] = metadata.version(name.replace("_hub", "-hub"))
            except metadata.PackageNotFoundError:
                pass
    return versions


def _device_count():
    """JAX's device count, when JAX already started a backend (never start one)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None or not getattr(bridge, "_backends", None):
        return None
    try:
        return int(sys.modules["jax"].device_count())
    except Exception:  # noqa: BLE001
        return None


def _at_exit() -> None:
    for event in _seen_module_calls.values():
        _emit(event)
    _emit({"event": "process", "device_count": _device_count(), "versions": _versions()})


# --- import hooks -------------------------------------------------------------

_PATCHES = {
    "jax._src.mesh": _patch_jax_mesh,
    "jax._src.pjit": _patch_jax_pjit,
    "torch_xla.distributed.spmd.xla_sharding": _patch_torch_xla_sharding,
    "torch.nn.modules.module": _patch_torch_module,
    "keras.src.distribution.distribution_lib": _third_party("_patch_keras_distribution"),
    "keras.src.backend.jax.trainer": _third_party("_patch_keras_jax_trainer"),
    "flax.core.spmd": _third_party("_patch_flax_spmd"),
    "flax.nnx.transforms.compilation": _third_party("_patch_nnx_compilation"),
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as error:  # noqa: BLE001
            _report_error(module.__name__, error)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def _chain_sitecustomize() -> None:
    """Run the sitecustomize this one shadows, if there is one."""
    path = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_hlo_doctor_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_target = None


def _install_target() -> None:
    """``--target``: compile for the GPU topology instead of running (see deviceless.py)."""
    global _target
    if not os.environ.get(_TARGET_VAR):
        return
    import _hlo_doctor_deviceless as deviceless

    _target = deviceless.ChildTarget.from_env(_emit)
    _PATCHES["jax"] = _target.patch_jax
    _PATCHES["jax._src.mesh_utils"] = _target.patch_mesh_utils
    _PATCHES["jax._src.stages"] = _target.patch_stages


def _install() -> None:
    if not os.environ.get(_EVENTS_VAR):
        return
    try:
        _install_target()
    except Exception as error:  # noqa: BLE001
        _report_error("install_target", error)
    if not any(isinstance(f, _PatchingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder())
        atexit.register(_at_exit)


_install()
_chain_sitecustomize()
