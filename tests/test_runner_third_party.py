"""The runner's records for third-party libraries: Keras' DeviceMesh/LayoutMap, Flax's logical
axis rules and nnx.jit state paths, torch module paths; with stand-ins (fast) and, where the
`third-party` extra is installed, with the real libraries through the gallery programs."""

from __future__ import annotations

import importlib.util
import os
import textwrap
from pathlib import Path

import pytest

from hlo_doctor.examples import EXAMPLES
from hlo_doctor.runner import run_example, run_script
from hlo_doctor.runner.extras import EXTRAS, extras_for
from hlo_doctor.runner.sidecar import build_sidecar

HAVE_THIRD_PARTY = all(importlib.util.find_spec(m) is not None for m in EXTRAS["third-party"])
HAVE_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


_FAKE_KERAS = """
import collections, re

class TensorLayout:
    def __init__(self, axes, device_mesh=None):
        self.axes = tuple(axes)

class DeviceMesh:
    def __init__(self, shape, axis_names, devices=None):
        self.shape = tuple(shape)
        self.axis_names = tuple(axis_names)
        self.devices = devices or [f"cpu:{i}" for i in range(8)]

class LayoutMap:
    def __init__(self, device_mesh):
        self._layout_map = collections.OrderedDict()

    def __setitem__(self, key, layout):
        self._layout_map[key] = TensorLayout(layout) if isinstance(layout, tuple) else layout

    def __getitem__(self, key):
        if key in self._layout_map:
            return self._layout_map[key]
        found = [k for k in self._layout_map if re.fullmatch(k, key)]
        return self._layout_map[found[0]] if found else None
"""

_FAKE_FLAX_SPMD = """
import contextlib

_rules = ()

def set_logical_axis_rules(rules):
    global _rules
    _rules = rules

@contextlib.contextmanager
def logical_axis_rules(rules):
    global _rules
    old, _rules = _rules, rules
    try:
        yield
    finally:
        _rules = old
"""

_FAKE_NNX_GRAPH = """
class Param:
    def __init__(self, shape):
        self.shape = shape

class Module:
    pass

def is_graph_node(x):
    return isinstance(x, Module)

def flatten(node):
    return None, sorted(((k,), v) for k, v in vars(node).items())
"""

_FAKE_NNX_COMPILATION = """
class JitWrapped:
    def __init__(self, fun):
        self.fun = fun

    def __call__(self, *args, **kwargs):
        return self.fun(*args, **kwargs)

def jit(fun=None, **options):
    if fun is None:
        import functools
        return functools.partial(jit, **options)
    return JitWrapped(fun)
"""

_FAKE_TORCH_MODULE = """
class Module:
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in vars(self).items():
            if isinstance(child, Module):
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self):
        for path, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Param):
                    yield (f"{path}.{name}" if path else name), value

    def __call__(self, *args):
        return self.forward(*args)

class Param:
    dtype = "float32"
    def __init__(self, *shape):
        self.shape = shape
"""

_USER_SCRIPT = """
import jax
import flax.core.spmd as spmd
import flax.nnx.graph as graph
import flax.nnx.transforms.compilation as compilation
import keras.src.distribution.distribution_lib as dist
import torch.nn.modules.module as nn

mesh = dist.DeviceMesh((2, 4), ("batch", "model"))
layout = dist.LayoutMap(mesh)
layout["dense.*kernel"] = ("batch", "model")
layout["dense_0/kernel"]
layout["ffw/kernel"]
layout["ffw/kernel"]
with spmd.logical_axis_rules([("batch", "data"), ("embed", ("data", "model"))]):
    pass
spmd.set_logical_axis_rules([("embed", "data")])

class Model(graph.Module):
    def __init__(self):
        self.w_in = graph.Param((4, 8))
        self.embed = graph.Param((16, 4))

@compilation.jit
def train_step(model, tokens):
    return tokens

@compilation.jit(static_argnums=0)
def other(x):
    return x

train_step(Model(), 3)
train_step(Model(), 4)
other(5)

class Attention(nn.Module):
    def __init__(self):
        self.o_proj = nn.Param(64, 64)

    def forward(self, x):
        return x

class Layer(nn.Module):
    def __init__(self):
        self.self_attn = Attention()

    def forward(self, x):
        return self.self_attn(x)

model = Layer()
model(1)
model(2)
"""


@pytest.fixture
def fake_libraries(tmp_path):
    lib = tmp_path / "lib"
    for package in ("jax", "flax", "flax/core", "flax/nnx", "flax/nnx/transforms", "keras", "keras/src",
                    "keras/src/distribution", "torch", "torch/nn", "torch/nn/modules"):
        _write(lib / package / "__init__.py", "")
    _write(lib / "flax" / "core" / "spmd.py", _FAKE_FLAX_SPMD)
    _write(lib / "flax" / "nnx" / "graph.py", _FAKE_NNX_GRAPH)
    _write(lib / "flax" / "nnx" / "transforms" / "compilation.py", _FAKE_NNX_COMPILATION)
    _write(lib / "keras" / "src" / "distribution" / "distribution_lib.py", _FAKE_KERAS)
    _write(lib / "torch" / "nn" / "modules" / "module.py", _FAKE_TORCH_MODULE)
    script = _write(tmp_path / "user" / "train.py", _USER_SCRIPT)
    return script, dict(os.environ, PYTHONPATH=str(lib))


def test_the_child_records_keras_flax_nnx_and_module_paths(tmp_path, fake_libraries):
    script, env = fake_libraries
    sidecar = run_script(script, [], dump_dir=tmp_path / "dump", framework="jax", env=env).sidecar
    assert sidecar["instrumentation_errors"] == []

    keras = sidecar["keras"]
    [mesh] = keras["meshes"]
    assert mesh["axis_names"] == ["batch", "model"] and mesh["shape"] == [2, 4]
    assert mesh["stack"][0]["line"] == 8 and len(mesh["devices"]) == 8
    [layout] = keras["layouts"]
    assert layout == {"key": "dense.*kernel", "axes": ["batch", "model"], "stack": layout["stack"]}
    assert layout["stack"][0]["line"] == 10
    assert keras["variables"] == [
        {"path": "dense_0/kernel", "matched_key": "dense.*kernel", "axes": ["batch", "model"]},
        {"path": "ffw/kernel", "matched_key": None, "axes": None},  # unmatched: Keras replicates it
    ]

    context, assigned = sidecar["flax_logical_rules"]
    assert context["function"] == "logical_axis_rules"
    assert context["rules"] == [["batch", "data"], ["embed", ["data", "model"]]]
    assert context["stack"][0]["line"] == 14
    assert assigned["function"] == "set_logical_axis_rules" and assigned["rules"] == [["embed", "data"]]

    [call] = [c for c in sidecar["nnx_jit_calls"] if c["function"] == "train_step"]  # once per function
    [model] = call["arguments"]
    assert model["name"] == "model"
    assert [(leaf["index"], leaf["path"], leaf["shape"]) for leaf in model["leaves"]] == [
        (0, "embed", [16, 4]), (1, "w_in", [4, 8])]
    assert call["stack"][0]["line"] == 31
    assert [c["function"] for c in sidecar["nnx_jit_calls"]].count("train_step") == 1

    [tree] = sidecar["module_trees"]  # the module the user calls, not the one it calls
    assert tree["module_class"].endswith("Layer")
    assert [m["path"] for m in tree["modules"]] == ["", "self_attn"]
    assert tree["parameters"] == [{"path": "self_attn.o_proj", "shape": [64, 64], "dtype": "float32"}]
    assert tree["stack"][0]["line"] == 50


def test_the_sidecar_keeps_third_party_records_once_each():
    rules = {"event": "flax_logical_rules", "function": "logical_axis_rules", "rules": [["batch", "data"]],
             "stack": []}
    lookup = {"event": "keras_variable_layout", "path": "a/kernel", "matched_key": None, "axes": None}
    sidecar = build_sidecar(command=["python", "t.py"], framework="jax", partitioner="shardy", devices=8,
                            devices_per_host=4, events=[rules, dict(rules), lookup, dict(lookup)])
    assert sidecar["flax_logical_rules"] == [{k: v for k, v in rules.items() if k != "event"}]
    assert sidecar["keras"]["variables"] == [{"path": "a/kernel", "matched_key": None, "axes": None}]
    assert "keras" not in build_sidecar(command=["python"], framework="jax", partitioner=None, devices=1,
                                        devices_per_host=None, events=[])


def test_third_party_examples_name_their_extra():
    third_party = [e for e in EXAMPLES if e.extra == "third-party"]
    assert {e.name for e in third_party} >= {"hf-1d-params-torch-xla", "hf-fsdpv2-torch-xla", "flax-linen-rules",
                                             "flax-nnx-partitioning", "keras-layout-map",
                                             "keras-model-axis-across-hosts"}
    for example in third_party:
        assert set(example.variants) <= {"bad", "fixed", "healthy"}
        assert "third-party" in EXTRAS and extras_for(example.frameworks[0])


_FAKE_KERAS_TRAINER = """
class Array:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

class Variable:
    def __init__(self, path, *shape, dtype="float32"):
        self.path, self.shape = path, shape
        self.value = Array(shape, dtype)

class JAXTrainer:  # keras/src/backend/jax/trainer.py's state builder, as in keras 3.15.1
    def _get_jax_state(self, trainable_variables=False, non_trainable_variables=False,
                       optimizer_variables=False, metrics_variables=False, purge_model_variables=False):
        state = []
        if trainable_variables:
            state.append([v.value for v in self.trainable_variables])
        if non_trainable_variables:
            state.append([v.value for v in self.non_trainable_variables])
        if optimizer_variables:
            state.append([v.value for v in self.optimizer.variables])
        if metrics_variables:
            state.append([v.value for v in self.metrics_variables])
        return tuple(state)
"""

_KERAS_TRAINER_SCRIPT = """
import types
import keras.src.backend.jax.trainer as trainer
from keras.src.backend.jax.trainer import Variable

class Model(trainer.JAXTrainer):
    def __init__(self):
        self.trainable_variables = [Variable("dense_0/kernel", 4, 8), Variable("dense_0/bias", 8)]
        self.non_trainable_variables = [Variable("norm/mean", 8)]
        self.metrics_variables = [Variable("loss/total")]
        self.optimizer = types.SimpleNamespace(variables=[Variable("sgd/iteration", dtype="int32")])

class Flaky(Model):
    reads = 0

    @property
    def trainable_variables(self):  # the hook's second read fails: the user's call must not
        Flaky.reads += 1
        if Flaky.reads > 1:
            raise RuntimeError("second read")
        return [Variable("x/kernel", 2, 2)]

    @trainable_variables.setter
    def trainable_variables(self, value):
        pass

model = Model()
for _ in range(3):  # train_on_batch in a loop: recorded once
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
assert len(state) == 4
model._get_jax_state(trainable_variables=True, non_trainable_variables=True, metrics_variables=True)
model._get_jax_state(True, True)  # predict_on_batch's flags, positionally
assert len(Flaky()._get_jax_state(trainable_variables=True)) == 1
print("done")
"""


def test_the_child_records_the_state_each_keras_step_gets(tmp_path):
    """Keras' JAX trainer passes its jitted step ``state``; the HLO's ``state[g][i]`` is variable i
    of group g, recorded with its path, shape and dtype, once per layout; a failing read is an
    instrumentation error, not the user's."""
    lib = tmp_path / "lib"
    for package in ("keras", "keras/src", "keras/src/backend", "keras/src/backend/jax"):
        _write(lib / package / "__init__.py", "")
    _write(lib / "keras" / "src" / "backend" / "jax" / "trainer.py", _FAKE_KERAS_TRAINER)
    script = _write(tmp_path / "user" / "train.py", _KERAS_TRAINER_SCRIPT)
    result = run_script(script, [], dump_dir=tmp_path / "dump", framework="jax",
                        env=dict(os.environ, PYTHONPATH=str(lib)))
    assert result.returncode == 0
    sidecar = result.sidecar
    train, test, predict = sidecar["keras"]["states"]
    assert train["function"] == "train_step" and test["function"] == "test_step"
    assert predict["function"] == "predict_step"
    assert [g["name"] for g in train["groups"]] == ["trainable_variables", "non_trainable_variables",
                                                    "optimizer_variables", "metrics_variables"]
    assert [g["name"] for g in test["groups"]] == ["trainable_variables", "non_trainable_variables",
                                                   "metrics_variables"]
    assert train["groups"][0]["variables"] == [
        {"path": "dense_0/kernel", "shape": [4, 8], "dtype": "float32"},
        {"path": "dense_0/bias", "shape": [8], "dtype": "float32"}]
    assert train["groups"][2]["variables"] == [{"path": "sgd/iteration", "shape": [], "dtype": "int32"}]
    assert train["stack"][0]["line"] == 28
    [error] = sidecar["instrumentation_errors"]
    assert error["where"] == "_record_keras_state" and "second read" in error["error"]


# --- with the real libraries -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_THIRD_PARTY, reason="the third-party extra is not installed")
def test_real_keras_run_records_the_unmatched_ffn_kernels(tmp_path):
    sidecar = run_example("keras-layout-map", framework="jax", variant="bad", dump_dir=tmp_path / "d").sidecar
    variables = {v["path"]: v["matched_key"] for v in sidecar["keras"]["variables"]}
    assert variables["decoder_block_0/ffw_gating/kernel"] is None
    assert variables["decoder_block_0/attention/query/kernel"] == "decoder_block.*attention.*(query|key|value).kernel"
    [state] = [s for s in sidecar["keras"]["states"] if s["function"] == "train_step"]
    trainable, _, optimizer, metrics = state["groups"]  # the HLO's state[0..3]
    assert trainable["variables"][7] == {"path": "decoder_block_0/ffw_gating/kernel", "shape": [512, 512],
                                         "dtype": "float32"}
    assert [v["path"] for v in optimizer["variables"]] == ["sgd/iteration", "sgd/learning_rate"]
    assert len(metrics["variables"]) == 4
    [mesh] = sidecar["keras"]["meshes"]
    assert mesh["axis_names"] == ["batch", "model"] and mesh["shape"] == [2, 4]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_THIRD_PARTY, reason="the third-party extra is not installed")
def test_real_flax_runs_record_rules_and_nnx_paths(tmp_path):
    linen = run_example("flax-linen-rules", framework="jax", variant="bad", dump_dir=tmp_path / "l").sidecar
    assert linen["flax_logical_rules"][0]["rules"][:2] == [["embed", "data"], ["batch", "data"]]
    nnx = run_example("flax-nnx-partitioning", framework="jax", variant="bad", dump_dir=tmp_path / "n").sidecar
    [step] = [c for c in nnx["nnx_jit_calls"] if c["function"].endswith("train_step")]
    model = next(a for a in step["arguments"] if a["name"] == "model")
    assert model["leaves"][5]["path"] == "unembed/kernel"  # the HLO's model.states[0][5]


@pytest.mark.slow
@pytest.mark.skipif(not (HAVE_THIRD_PARTY and HAVE_TORCH_XLA), reason="needs torch_xla and the third-party extra")
def test_real_hugging_face_run_records_module_paths(tmp_path):
    sidecar = run_example("hf-1d-params-torch-xla", framework="torch_xla", variant="bad",
                          dump_dir=tmp_path / "d").sidecar
    [tree] = [t for t in sidecar["module_trees"] if t["module_class"].endswith("LlamaForCausalLM")]
    assert "model.layers.0.self_attn.o_proj" in [m["path"] for m in tree["modules"]]
    assert {"path": "lm_head.weight", "shape": [256, 64], "dtype": "torch.float32"} in tree["parameters"]
