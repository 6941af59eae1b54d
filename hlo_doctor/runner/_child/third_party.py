"""Recorders the child's bootstrap installs for Keras 3 and Flax (linen and NNX).

Copied beside ``sitecustomize.py`` as ``_hlo_doctor_third_party.py`` (see runner/run.py)
and imported when one of these libraries is, so the bootstrap stays one readable file per
concern. Every recorder emits through the bootstrap's own ``_emit``.
"""

from __future__ import annotations

import sys

from sitecustomize import _MAX_TREE, _emit, _guard, _ints, _user_stack  # the bootstrap, fully loaded by now

# --- Keras 3 distribution API ----------------------------------------------------

_seen_variable_layouts: set[str] = set()


def _axes(layout) -> list | None:
    axes = getattr(layout, "axes", layout)
    if axes is None:
        return None
    return [a if a is None else str(a) if isinstance(a, str) else [str(b) for b in a] for a in axes]


@_guard
def _record_keras_mesh(mesh) -> None:
    _emit({"event": "keras_mesh", "axis_names": [str(a) for a in mesh.axis_names],
           "shape": _ints(mesh.shape), "devices": [str(d) for d in getattr(mesh.devices, "flat", mesh.devices)],
           "stack": _user_stack(3)})


@_guard
def _record_keras_layout(key, layout) -> None:
    _emit({"event": "keras_layout", "key": str(key), "axes": _axes(layout), "stack": _user_stack(3)})


@_guard
def _record_keras_lookup(layout_map, key, result) -> None:
    if not isinstance(key, str) or key in _seen_variable_layouts:
        return
    _seen_variable_layouts.add(key)
    import re

    keys = getattr(layout_map, "_layout_map", {})
    matched = key if key in keys else next((k for k in keys if re.fullmatch(k, key)), None)
    _emit({"event": "keras_variable_layout", "path": key, "matched_key": matched,
           "axes": _axes(result) if result is not None else None})


def _patch_keras_distribution(module) -> None:
    mesh_class = module.DeviceMesh
    original_mesh_init = mesh_class.__init__

    def mesh_init(self, *args, **kwargs):
        original_mesh_init(self, *args, **kwargs)
        _record_keras_mesh(self)

    mesh_class.__init__ = mesh_init

    layout_class = module.LayoutMap
    original_set = layout_class.__setitem__
    original_get = layout_class.__getitem__

    def __setitem__(self, key, layout):
        original_set(self, key, layout)
        _record_keras_layout(key, layout)

    def __getitem__(self, key):
        result = original_get(self, key)
        _record_keras_lookup(self, key, result)
        return result

    layout_class.__setitem__ = __setitem__
    layout_class.__getitem__ = __getitem__


# The groups of the state Keras' JAX trainer passes its jitted step (``_get_jax_state``'s flags,
# in its order); the HLO names variable i of group g ``state[g][i]``.
_KERAS_STATE_GROUPS = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")
# the step each set of groups is built for (keras/src/backend/jax/trainer.py: train_on_batch, fit;
# test_on_batch, evaluate; predict_on_batch, predict)
_KERAS_STEPS = {
    _KERAS_STATE_GROUPS: "train_step",
    ("trainable_variables", "non_trainable_variables", "metrics_variables"): "test_step",
    ("trainable_variables", "non_trainable_variables"): "predict_step",
}
_seen_keras_states: set[tuple] = set()


@_guard
def _record_keras_state(trainer, args, kwargs, state) -> None:
    flags = dict(zip(_KERAS_STATE_GROUPS, args))
    flags.update((name, kwargs[name]) for name in _KERAS_STATE_GROUPS if name in kwargs)
    names = tuple(name for name in _KERAS_STATE_GROUPS if flags.get(name))
    key = (id(trainer), names, tuple(len(group) for group in state))
    if key in _seen_keras_states:
        return
    _seen_keras_states.add(key)
    if len(state) != len(names):
        raise ValueError(f"{len(state)} state groups for the flags {names}")
    groups = []
    for name, values in zip(names, state):
        owner = trainer.optimizer if name == "optimizer_variables" else trainer
        variables = list(getattr(owner, "variables" if name == "optimizer_variables" else name))
        if len(variables) != len(values):
            raise ValueError(f"{name}: {len(variables)} variables for {len(values)} state values")
        recorded = []
        for variable, value in list(zip(variables, values))[:_MAX_TREE]:
            shape = getattr(value, "shape", None)
            recorded.append({"path": str(getattr(variable, "path", "")),
                             "shape": _ints(shape) if shape is not None else None,
                             "dtype": str(getattr(value, "dtype", ""))})
        groups.append({"name": name, "variables": recorded})
    _emit({"event": "keras_state", "function": _KERAS_STEPS.get(names), "groups": groups,
           "stack": _user_stack(3)})


def _patch_keras_jax_trainer(module) -> None:
    trainer_class = module.JAXTrainer
    original = trainer_class._get_jax_state

    def _get_jax_state(self, *args, **kwargs):
        state = original(self, *args, **kwargs)
        _record_keras_state(self, args, kwargs, state)
        return state

    _get_jax_state.__doc__ = original.__doc__
    _get_jax_state.__wrapped__ = original
    trainer_class._get_jax_state = _get_jax_state


# --- Flax -------------------------------------------------------------------------


@_guard
def _record_flax_rules(function: str, rules) -> None:
    recorded = []
    for rule in list(rules or ())[:_MAX_TREE]:
        logical, mesh_axes = rule
        if mesh_axes is not None and not isinstance(mesh_axes, str):
            mesh_axes = [str(a) for a in mesh_axes]
        recorded.append([str(logical), mesh_axes])
    _emit({"event": "flax_logical_rules", "function": function, "rules": recorded,
           "stack": _user_stack(4)})


def _patch_flax_spmd(module) -> None:
    original_context = module.logical_axis_rules
    original_set = module.set_logical_axis_rules

    def logical_axis_rules(rules):
        _record_flax_rules("logical_axis_rules", rules)
        return original_context(rules)

    def set_logical_axis_rules(rules):
        _record_flax_rules("set_logical_axis_rules", rules)
        return original_set(rules)

    for patched, original in ((logical_axis_rules, original_context), (set_logical_axis_rules, original_set)):
        patched.__doc__ = original.__doc__
        patched.__wrapped__ = original
    module.logical_axis_rules = logical_axis_rules
    module.set_logical_axis_rules = set_logical_axis_rules


_seen_nnx_functions: set[int] = set()


@_guard
def _record_nnx_call(wrapped, args, kwargs) -> None:
    function = getattr(wrapped, "fun", None) or getattr(wrapped, "__wrapped__", None)
    if function is None or id(function) in _seen_nnx_functions:
        return
    _seen_nnx_functions.add(id(function))
    import inspect

    graph = sys.modules.get("flax.nnx.graph")
    if graph is None:
        return
    try:
        bound = inspect.signature(function).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {f"args[{i}]": a for i, a in enumerate(args)}
    arguments = []
    for name, value in bound.items():
        if not graph.is_graph_node(value):
            continue
        _, flat = graph.flatten(value)
        leaves = []
        for index, (path, leaf) in enumerate(flat):
            if index >= _MAX_TREE:
                break
            shape = getattr(leaf, "shape", None)
            leaves.append({"index": index, "path": "/".join(str(p) for p in path),
                           "type": type(leaf).__name__,
                           "shape": _ints(shape) if shape is not None else None})
        arguments.append({"name": name, "leaves": leaves})
    _emit({"event": "nnx_jit_call", "function": getattr(function, "__qualname__", repr(function)),
           "arguments": arguments, "stack": _user_stack(4)})


def _patch_nnx_compilation(module) -> None:
    original_jit = module.jit
    patched_types: set[type] = set()

    def jit(*args, **kwargs):
        out = original_jit(*args, **kwargs)
        cls = type(out)
        if callable(out) and cls not in patched_types and cls.__module__.startswith("flax.nnx"):
            patched_types.add(cls)
            original_call = cls.__call__

            def __call__(self, *call_args, **call_kwargs):
                _record_nnx_call(self, call_args, call_kwargs)
                return original_call(self, *call_args, **call_kwargs)

            cls.__call__ = __call__
        return out

    jit.__doc__ = original_jit.__doc__
    jit.__wrapped__ = original_jit
    module.jit = jit


# --- process summary -----------------------------------------------------------
