"""The runner's child writes each submodule's path into the op_name of its ops (torch_xla).

Faked torch and torch_xla: ``_set_xla_custom_op_name_prefix`` records which tensor got
which prefix, and the user's script prints the record. The real behaviour (the op_name
``model.layers.0.self_attn.o_proj/aten__mm``, the same HLO otherwise) is checked by the
hf-1d-params-torch-xla fixtures, regenerated with torch_xla 2.9.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from hlo_doctor.runner import run_script

_FAKE_TORCH = """
class device:
    def __init__(self, type):
        self.type = type

class Tensor:
    def __init__(self, name, kind="xla"):
        self.name = name
        self.device = device(kind)
"""

_FAKE_MODULE = """
class Module:
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in vars(self).items():
            if isinstance(child, Module):
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self):
        return iter(())

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)
"""

_FAKE_XLAC = """
LABELS = []

def _set_xla_custom_op_name_prefix(tensor, prefix, depth):
    LABELS.append([tensor.name, prefix, depth])
    return True
"""

_USER = """
import json, sys
import torch
import torch_xla
import torch_xla._XLAC as xlac
import torch.nn.modules.module as nn

class Linear(nn.Module):
    def __init__(self, name):
        self.name = name

    def forward(self, x):
        return torch.Tensor(self.name + "(" + x.name + ")")

class Attention(nn.Module):
    def __init__(self):
        self.q_proj = Linear("q")
        self.o_proj = Linear("o")

    def forward(self, hidden_states):
        h = torch.Tensor("relu")
        q = self.q_proj(hidden_states)
        return self.o_proj(h), q  # o_proj's output is attention's output too

class Unhashable(nn.Module):
    __hash__ = None

    def forward(self, x):
        return torch.Tensor("unhashable")

class Layer(nn.Module):
    def __init__(self):
        self.self_attn = Attention()
        self.mlp = Linear("mlp")
        self.odd = Unhashable()  # no path, and no error

    def forward(self, x):
        a, _ = self.self_attn(hidden_states=torch.Tensor("norm"))
        self.odd(a)
        return {"out": self.mlp(a), "cpu": torch.Tensor("cpu", "cpu")}

model = Layer()
model(torch.Tensor("input"))
print("LABELS=" + json.dumps(xlac.LABELS))
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_each_tensor_gets_the_path_of_the_innermost_module_that_made_it(tmp_path):
    lib = tmp_path / "lib"
    for package in ("torch/nn", "torch/nn/modules", "torch_xla"):
        _write(lib / package / "__init__.py", "")
    _write(lib / "torch" / "__init__.py", _FAKE_TORCH)
    _write(lib / "torch" / "nn" / "modules" / "module.py", _FAKE_MODULE)
    _write(lib / "torch_xla" / "_XLAC.py", _FAKE_XLAC)
    script = _write(tmp_path / "user" / "train.py", _USER)
    env = dict(os.environ, PYTHONPATH=str(lib))
    result = run_script(script, [], dump_dir=tmp_path / "dump", framework="torch_xla", env=env)
    assert result.sidecar["instrumentation_errors"] == []
    out = result.stdout or ""
    labels = json.loads(out.split("LABELS=", 1)[1].splitlines()[0])
    assert {depth for _, _, depth in labels} == {1 << 16}  # every frame kept: the source lines stay as they were
    assert [(name, prefix) for name, prefix, _ in labels] == [
        ("q(norm)", "self_attn.q_proj/"),
        ("relu", "self_attn/"),  # made by self_attn and passed to o_proj: its caller's path
        ("o(relu)", "self_attn.o_proj/"),  # innermost wins: self_attn returns it and does not rename it
        ("mlp(o(relu))", "mlp/"),
    ]  # the root names nothing ("norm", its input, its dict output); a CPU tensor gets no name
