"""Random ``nn.Module`` programs under torch_xla SPMD, with the generator's own registry.

A :class:`TorchSpec` is drawn from a seed (:func:`random_spec`): a mesh of 1
or 2 axes on 4 to 16 CPU devices (random names that never tell the role;
FSDPv2 needs its axis named ``fsdp``), the host layout and physical device
order, the sharding style (``mark``: ``xs.mark_sharding`` on weights, inputs
and activations; ``fsdpv2`` / ``fsdpv2-output``: every block and the model
wrapped in ``SpmdFullyShardedDataParallel``, with its default ``shard_output``
or a custom one), the model (an MLP stack, or transformer-ish blocks:
``Linear``, ``LayerNorm`` / ``RMSNorm``, attention with head reshapes that fold
the batch with the heads or not) and the step (a train step, ``loss.backward()``
+ SGD or AdamW, or an eval graph), and at most one injected pathology.

Run as a script (``python corpusgen/torch_programs.py --spec S.json --registry
R.json``, through ``hlo_doctor.runner.run_script``, which sets up torch_xla's
CPU devices, ``XLA_HLO_DEBUG`` and the dump flags before torch_xla is
imported), it builds the program from the spec, runs one step and writes the
registry: the class of each entry parameter *by number* (torch_xla's HLO names
every parameter ``xla__device_data``) and of each output, taken from torch_xla
itself: the tensor ids of the graph's device data, in parameter order
(``torch_xla._XLAC._get_tensors_xla_device_data_node``, the order a graph's
lowering numbers its parameters), matched with the ids of the tensors the
program made (weights, optimizer state, data, labels). The child then checks
the match against the compiled module: the same parameter count and shapes in
order, the same output count and shapes, and, for a train step, the header's
``buffer_donor`` entries exactly the weights and optimizer state.

This file runs in the child with nothing but the standard library, numpy and
torch_xla: it imports nothing from the repository.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TORCH_PATHOLOGIES", "TorchSpec", "random_spec"]

# The pathologies of corpusgen.programs.PATHOLOGIES a torch_xla program can carry.
TORCH_PATHOLOGIES = (
    "replicated-batch-input", "replicated-batch-mid", "feature-dim-constraint", "replicated-weight",
    "cross-host-tensor", "conflicting-constraints", "uneven-dim",
)
_AXIS_NAMES = ("x", "y", "z", "i", "j", "rows", "cols", "data", "model", "tp", "dp", "replica", "batch")
_STYLES = ("mark", "mark", "fsdpv2", "fsdpv2-output")


@dataclass
class TorchAxis:
    name: str
    size: int
    role: str


@dataclass
class TorchSpec:
    seed: int
    devices: int
    hosts: int
    axes: list[TorchAxis]
    physical: list[str]  # axis names, major to minor, in the order device ids are laid out
    style: str  # "mark" | "fsdpv2" | "fsdpv2-output"
    model: str  # "mlp" | "transformer"
    layers: int
    batch: int
    seq: int
    hidden: int
    ffn: int
    heads: int
    head_dim: int
    vocab: int
    features: int
    norm: str  # "rms" | "layer" | "none"
    head_fold: bool
    tied: bool
    bias: bool
    train: bool
    optimizer: str  # "sgd" | "adamw"
    constrain_layers: bool
    shard_norms: bool
    injection: str | None
    injection_axis: str | None = None
    framework: str = "torch_xla"
    notes: list[str] = field(default_factory=list)

    @property
    def devices_per_host(self) -> int:
        return self.devices // self.hosts

    def axes_with(self, *roles: str) -> list[TorchAxis]:
        return [a for a in self.axes if a.role in roles]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TorchSpec:
        return cls(**{**data, "axes": [TorchAxis(**a) for a in data["axes"]]})


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def random_spec(seed: int, injection: str | None = "random") -> TorchSpec:
    """A spec drawn from ``seed``. ``injection``: a pathology name, None (clean), "random" or "any"."""
    rng = random.Random(seed)
    for _ in range(200):
        spec = _draw(rng, seed, injection)
        if spec is not None:
            return spec
    raise RuntimeError(f"no legal torch_xla spec for seed {seed} and injection {injection!r}")


def _draw(rng: random.Random, seed: int, injection: str | None) -> TorchSpec | None:
    devices = rng.choice((4, 8, 8, 16))
    style = rng.choice(_STYLES)
    two = rng.random() < 0.6
    if two:
        first = rng.choice([d for d in (2, 4, 8) if devices % d == 0 and devices // d >= 2])
        sizes = [first, devices // first]
    else:
        sizes = [devices]
    if style == "mark":
        roles = [rng.choice(("data", "fsdp", "tensor")) for _ in sizes]
        if roles.count("tensor") > 1:
            return None
        names = rng.sample(_AXIS_NAMES, len(sizes))
    else:  # FSDPv2 shards over an axis it requires to be named 'fsdp'; a second one is extra_data_axis
        roles = ["fsdp"] + ["data"] * (len(sizes) - 1)
        names = ["fsdp", *rng.sample(_AXIS_NAMES, len(sizes) - 1)]
    axes = [TorchAxis(n, s, r) for n, s, r in zip(names, sizes, roles, strict=True)]
    if injection == "random":
        injection = rng.choice((None, None, *TORCH_PATHOLOGIES))
    elif injection == "any":
        injection = rng.choice(TORCH_PATHOLOGIES)
    hosts = rng.choice([h for h in (1, 2, 4) if devices // h >= 2])
    tensor = [a for a in axes if a.role == "tensor"]
    others = [a.name for a in axes if a.role != "tensor"]
    rng.shuffle(others)
    physical = others + [a.name for a in tensor]
    if tensor and tensor[0].size > devices // hosts:
        return None
    batch_shards = _product(a.size for a in axes if a.role in ("data", "fsdp"))
    tp = tensor[0].size if tensor else 1
    spec = TorchSpec(
        seed=seed, devices=devices, hosts=hosts, axes=axes, physical=physical, style=style,
        model=rng.choice(("mlp", "transformer")), layers=rng.choice((1, 2, 2)),
        batch=batch_shards * rng.choice((1, 2)) * (2 if batch_shards == 1 else 1), seq=rng.choice((8, 16)),
        hidden=rng.choice((128, 256)), ffn=rng.choice((512, 768)), heads=tp * rng.choice((2, 4)),
        head_dim=rng.choice((16, 32)), vocab=rng.choice((512, 1024)), features=rng.choice((64, 128)),
        norm=rng.choice(("rms", "layer", "none")), head_fold=rng.random() < 0.5, tied=rng.random() < 0.4,
        bias=rng.random() < 0.5, train=rng.random() < 0.8, optimizer=rng.choice(("sgd", "adamw")),
        constrain_layers=rng.random() < 0.5, shard_norms=rng.random() < 0.5, injection=injection,
    )
    return spec if _apply_injection(spec, rng) else None


def _apply_injection(spec: TorchSpec, rng: random.Random) -> bool:
    kind = spec.injection
    batch_axes = spec.axes_with("data", "fsdp")
    tensor = spec.axes_with("tensor")
    if kind is None:
        return True
    if kind in ("replicated-batch-input", "replicated-batch-mid"):
        if not batch_axes or spec.style != "mark":  # FSDPv2's shard_output re-marks every block's output
            return False
        spec.injection_axis = rng.choice(batch_axes).name
        if kind == "replicated-batch-mid":
            spec.layers = max(spec.layers, 2)
        return True
    if kind in ("feature-dim-constraint", "conflicting-constraints"):
        return bool(batch_axes)
    if kind == "replicated-weight":
        return bool(spec.axes_with("fsdp", "tensor"))
    if kind == "cross-host-tensor":
        return bool(tensor) and spec.hosts >= 2
    if kind == "uneven-dim":
        if not tensor:
            return False
        spec.injection_axis = tensor[0].name
        return True
    raise ValueError(f"unknown pathology {kind!r}")


def ffn_size(spec: TorchSpec) -> int:
    """The MLP width: the injected uneven mistake makes it not divide the tensor axis."""
    if spec.injection == "uneven-dim":
        shards = next(a.size for a in spec.axes if a.role == "tensor")
        return shards * (spec.ffn // shards) + max(1, shards // 2)
    return spec.ffn


def device_layout(spec: TorchSpec) -> list[int]:
    """The device id at each row-major mesh index (the mesh's ``device_ids``); the injected
    cross-host mistake lays the tensor axis major, so its groups span hosts."""
    import numpy as np

    names = [a.name for a in spec.axes]
    size_of = {a.name: a.size for a in spec.axes}
    physical = list(spec.physical)
    if spec.injection == "cross-host-tensor":
        tensor = [a.name for a in spec.axes if a.role == "tensor"]
        physical = tensor + [n for n in physical if n not in tensor]
    ids = np.arange(spec.devices).reshape([size_of[n] for n in physical])
    return [int(i) for i in ids.transpose([physical.index(n) for n in names]).reshape(-1)]


# -- the weights' kinds and layouts (shared by the parent and the child) --------------------------

def param_kinds(path: str, ndim: int) -> tuple[str, ...]:
    """What each dim of a parameter is, from the generator's own module names."""
    leaf = path.split(".")[-2:] if "." in path else [path]
    module, what = (leaf[0], leaf[1]) if len(leaf) == 2 else ("", leaf[0])
    if what == "bias" or ndim == 1:
        return {"up": ("ffn",), "q": ("heads",), "k": ("heads",), "v": ("heads",)}.get(module, ("model",))
    return {
        "up": ("ffn", "model"), "down": ("model", "ffn"), "q": ("heads", "model"), "k": ("heads", "model"),
        "v": ("heads", "model"), "o": ("model", "heads"), "embed": ("vocab", "model"), "head": ("vocab", "model"),
        "proj": ("model", "in"),
    }.get(module, ("model",) * ndim)


def weight_spec(spec: TorchSpec, path: str, shape: tuple[int, ...]) -> tuple:
    """The partition spec the ``mark`` style gives a weight: the tensor axis on its ffn / heads /
    vocab dim, the FSDP axes on its largest other dim that they divide."""
    kinds = param_kinds(path, len(shape))
    size_of = {a.name: a.size for a in spec.axes}
    tensor = next((a.name for a in spec.axes_with("tensor")), None)
    fsdp = tuple(a.name for a in spec.axes_with("fsdp"))
    fsdp_size = _product(size_of[a] for a in fsdp)
    parts: list[Any] = [None] * len(shape)
    if tensor is not None:
        for i, kind in enumerate(kinds):
            uneven_ok = spec.injection == "uneven-dim" and kind == "ffn"
            if kind in ("ffn", "heads", "vocab") and (shape[i] % size_of[tensor] == 0 or uneven_ok):
                parts[i] = tensor
                break
    if fsdp and (len(shape) > 1 or spec.shard_norms):
        for i in sorted(range(len(shape)), key=lambda i: -shape[i]):
            if parts[i] is None and shape[i] % fsdp_size == 0:
                parts[i] = fsdp[0] if len(fsdp) == 1 else fsdp
                break
    return tuple(parts)


# -- the child: build, run one step, write the registry -------------------------------------------

def _batch_spec(spec: TorchSpec, leave_off: str | None = None) -> Any:
    axes = tuple(a.name for a in spec.axes_with("data", "fsdp") if a.name != leave_off)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _child_main(spec_path: Path, registry_path: Path) -> int:  # noqa: C901, PLR0915 - one program, top to bottom
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch import nn
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    data = json.loads(spec_path.read_text())
    spec = TorchSpec.from_json(data["spec"])
    xr.use_spmd()
    torch.manual_seed(spec.seed)
    device = torch_xla.device()
    names = tuple(a.name for a in spec.axes)
    mesh = xs.Mesh(np.array(data["device_ids"]), tuple(a.size for a in spec.axes), names)
    D, F, H, K, V, S = spec.hidden, ffn_size(spec), spec.heads, spec.head_dim, spec.vocab, spec.seq
    input_leave_off = spec.injection_axis if spec.injection == "replicated-batch-input" else None
    BA = _batch_spec(spec, input_leave_off)  # the program's own constraints follow its input layout
    tensor = next((a.name for a in spec.axes_with("tensor")), None)

    def mark(t, parts):
        xs.mark_sharding(t, mesh, tuple(parts))

    def make_norm():
        if spec.norm == "rms":
            return nn.RMSNorm(D)
        if spec.norm == "layer":
            return nn.LayerNorm(D)
        return nn.Identity()

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(D, H * K, bias=spec.bias) for _ in range(3))
            self.o = nn.Linear(H * K, D, bias=spec.bias)

        def forward(self, x):
            b = x.shape[0]
            q, k, v = (p(x).view(b, S, H, K).transpose(1, 2) for p in (self.q, self.k, self.v))  # [B,H,S,K]
            causal = torch.ones(S, S, device=x.device, dtype=torch.bool).tril()
            if spec.head_fold:
                q, k, v = (t.reshape(b * H, S, K) for t in (q, k, v))
                scores = torch.bmm(q, k.transpose(1, 2)) / K ** 0.5
                scores = scores.masked_fill(~causal, -1e9)
                out = torch.bmm(scores.softmax(-1), v).view(b, H, S, K)
            else:
                scores = (q @ k.transpose(-1, -2)) / K ** 0.5
                scores = scores.masked_fill(~causal, -1e9)
                out = scores.softmax(-1) @ v
            return self.o(out.transpose(1, 2).reshape(b, S, H * K))

    class MLP(nn.Module):
        def __init__(self, layer: int):
            super().__init__()
            self.layer = layer
            self.up = nn.Linear(D, F, bias=spec.bias)
            self.down = nn.Linear(F, D, bias=spec.bias)

        def forward(self, x):
            h = self.up(x)
            if spec.injection == "feature-dim-constraint" and self.layer == 0:
                mark(h, (None, None, BA))
            elif spec.style == "mark" and (spec.constrain_layers or spec.injection == "uneven-dim" and self.layer == 0):
                mark(h, (BA, None, tensor))
            return self.down(nn.functional.gelu(h))

    class Block(nn.Module):
        def __init__(self, layer: int):
            super().__init__()
            self.layer = layer
            self.norm1 = make_norm()
            self.attn = Attention() if spec.model == "transformer" else None
            self.norm2 = make_norm() if spec.model == "transformer" else None
            self.mlp = MLP(layer)

        def forward(self, x):
            if self.attn is not None:
                x = x + self.attn(self.norm1(x))
                x = x + self.mlp(self.norm2(x))
            else:
                x = x + self.mlp(self.norm1(x))
            if spec.injection == "replicated-batch-mid" and self.layer == 0:
                mark(x, (_batch_spec(spec, spec.injection_axis), None, None))
            elif spec.injection == "conflicting-constraints" and self.layer == 0:
                for parts in ((BA, None, None), (None, BA, None), (None, None, BA), (None, BA, None)):
                    mark(x, parts)
            elif spec.style == "mark" and spec.constrain_layers:
                mark(x, (BA, None, None))
            return x

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            if spec.model == "transformer":
                self.embed = nn.Embedding(V, D)
            else:
                self.proj = nn.Linear(spec.features, D, bias=spec.bias)
            self.blocks = nn.ModuleList(Block(i) for i in range(spec.layers))
            self.final_norm = make_norm()
            self.head = None if spec.model == "transformer" and spec.tied else nn.Linear(D, V, bias=False)

        def forward(self, x):
            x = self.embed(x) if spec.model == "transformer" else self.proj(x)
            for block in self.blocks:
                x = block(x)
            x = self.final_norm(x)
            return self.head(x) if self.head is not None else x @ self.embed.weight.T

    model = Model()
    replicated = _largest_weight(model) if spec.injection == "replicated-weight" else None
    data_axis = next((a.name for a in spec.axes_with("data")), None)
    if spec.style == "mark":
        model = model.to(device)
        for path, param in model.named_parameters():
            parts = (None,) * param.dim() if path == replicated else weight_spec(spec, path, tuple(param.shape))
            if any(p is not None for p in parts) or path == replicated:
                mark(param, parts)
        wrapped = model
    else:
        def shard_output(output, mesh):
            xs.mark_sharding(output, mesh, (_batch_spec(spec),) + (None,) * (output.dim() - 1))
        custom = shard_output if spec.style == "fsdpv2-output" else None
        extra = {"extra_data_axis": data_axis} if data_axis else {}
        model = model.to(device)
        if replicated is not None:  # FSDPv2 leaves a parameter that is already marked alone
            mark(dict(model.named_parameters())[replicated], (None, None))
        # Wrapped as the FSDPv2 guide does: each Linear (its output marked on the batch, so the
        # weights are gathered, not the activations), then each block, then the model.
        for owner in list(model.modules()):
            for name, child in list(owner.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(owner, name, FSDPv2(child, mesh=mesh, shard_output=custom, **extra))
        for i, block in enumerate(model.blocks):
            model.blocks[i] = FSDPv2(block, mesh=mesh, shard_output=custom, **extra)
        wrapped = FSDPv2(model, mesh=mesh, shard_output=custom, **extra)
    optimizer = None
    if spec.train:
        params = list(wrapped.parameters())
        optimizer = (torch.optim.AdamW(params, lr=1e-3) if spec.optimizer == "adamw"
                     else torch.optim.SGD(params, lr=1e-2))

    def batch():
        if spec.model == "transformer":
            x = torch.randint(0, V, (spec.batch, S)).to(device)
            mark(x, (_batch_spec(spec, input_leave_off), None))
        else:
            x = torch.randn(spec.batch, S, spec.features).to(device)
            mark(x, (_batch_spec(spec, input_leave_off), None, None))
        labels = torch.randint(0, V, (spec.batch, S)).to(device)
        mark(labels, (_batch_spec(spec, input_leave_off), None))
        return x, labels

    tid = torch_xla._XLAC._xla_get_tensor_id
    if optimizer is not None and spec.optimizer == "adamw":
        # A first update makes AdamW's state, so that the step kept reads it as device data.
        for p in wrapped.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch_xla.sync()
    dump = _dump_dir()
    before = set(dump.glob("module_*.before_optimizations.txt"))

    classes: dict[int, str] = {}
    params = list(wrapped.parameters())
    for p in params:
        classes[tid(p)] = "weight"
    replicated_id = tid(dict(model.named_parameters())[replicated]) if replicated is not None else None
    states = []
    if optimizer is not None:
        for p in params:
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.device.type == "xla":
                    classes[tid(value)] = "optimizer-state"
                    states.append(value)
    x, labels = batch()
    classes[tid(x)] = "data"
    classes[tid(labels)] = "labels"

    def step(x, labels):
        """One step, pending (not run): its outputs and their classes, in the order of their tensor ids."""
        if optimizer is None:
            with torch.no_grad():
                loss = nn.functional.cross_entropy(wrapped(x).reshape(-1, V), labels.reshape(-1))
            return [(loss, "scalar")]
        loss = nn.functional.cross_entropy(wrapped(x).reshape(-1, V), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        outputs = [(loss, "scalar")] + [(p, "weight") for p in params] + [(s, "optimizer-state") for s in states]
        return sorted(outputs, key=lambda pair: tid(pair[0]))

    def compiled(before: set[Path]) -> Path:
        made = sorted(set(dump.glob("module_*.before_optimizations.txt")) - before)
        if len(made) != 1:
            raise SystemExit(f"expected one module for the step, got {[m.name for m in made]}")
        return made[0]

    outputs = step(x, labels)
    ids, values = torch_xla._XLAC._get_tensors_xla_device_data_node([t for t, _ in outputs])
    shapes = [list(v.shape) for v in values]
    del values
    param_classes = {}
    unknown = []
    for number, (ident, shape) in enumerate(zip(ids, shapes, strict=True)):
        cls = classes.get(ident)
        if cls is None:
            if shape:
                unknown.append(f"parameter {number} {shape} (tensor id {ident})")
            cls = "scalar"
        param_classes[number] = cls
    output_classes = [cls for _, cls in outputs]
    output_shapes = [list(t.shape) for t, _ in outputs]
    loss = outputs[0][0] if outputs[0][1] == "scalar" else next(t for t, c in outputs if c == "scalar")
    torch_xla.sync()
    kept = compiled(before)
    problems = list(unknown)
    if optimizer is not None:
        # Reading a graph's device data keeps torch_xla from donating the weights' buffers in that
        # compile: the step is run again, the same graph on a new batch, and that compile is kept.
        # Its parameters must be those of the step read above (shapes in order, the weights and
        # optimizer state exactly the donated buffers).
        problems += _check_against_module(kept.read_text(), shapes, output_shapes, param_classes, False)
        before = set(dump.glob("module_*.before_optimizations.txt"))
        again = step(*batch())  # held, as the first step's outputs were: the same roots, in the same order
        torch_xla.sync()
        del again
        kept = compiled(before)
    module = kept.name.removesuffix(".before_optimizations.txt")
    problems += _check_against_module(kept.read_text(), shapes, output_shapes, param_classes, spec.train)
    registry = {"param_classes": {str(k): v for k, v in param_classes.items()}, "output_classes": output_classes,
                "module": module, "param_shapes": shapes, "output_shapes": output_shapes,
                "weight_paths": [p for p, _ in wrapped.named_parameters()], "replicated_weight": replicated,
                "replicated_parameter": ids.index(replicated_id) if replicated_id in ids else None,
                "problems": problems}
    registry_path.write_text(json.dumps(registry, indent=1) + "\n")
    print(f"loss {float(loss.detach().cpu()):.4f}; {len(param_classes)} parameters, {len(outputs)} outputs; {module}")
    return 1 if problems else 0


def _largest_weight(model) -> str:
    """The path of the largest 2-D weight (its peers stay sharded)."""
    matrices = [(p.numel(), path) for path, p in model.named_parameters() if p.dim() == 2]
    return max(matrices)[1]


def _dump_dir() -> Path:
    import os

    match = re.search(r"--xla_dump_to=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if not match:
        raise SystemExit("XLA_FLAGS has no --xla_dump_to: run this through hlo_doctor.runner.run_script")
    return Path(match.group(1).strip('"'))




def _closing(text: str, start: int) -> int:
    """The index just past the parenthesis group that opens at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)

_DIMS = re.compile(r"\b[a-z]+\d*\[([\d,]*)\]")


def _check_against_module(text: str, shapes: list[list[int]], output_shapes: list[list[int]],
                          param_classes: dict[int, str], train: bool) -> list[str]:
    """What does not match between the registry and the compiled module's header (empty: all does)."""
    header = text.split("\n", 1)[0]
    start = header.find("entry_computation_layout={(")
    if start < 0:
        return ["no entry_computation_layout in the module header"]
    start += len("entry_computation_layout={")
    arrow = _closing(header, start)
    end = _closing(header, arrow + 2) if header.startswith("->(", arrow) else header.find("}", arrow) + 1
    inputs = [[int(d) for d in m.split(",") if d] for m in _DIMS.findall(header[start:arrow])]
    outputs = [[int(d) for d in m.split(",") if d] for m in _DIMS.findall(header[arrow + 2:end])]
    problems = []
    if inputs != shapes:
        problems.append(f"parameter shapes differ: module {inputs}, device data {shapes}")
    if len(outputs) != len(output_shapes) or any(
            sorted(a) != sorted(b) for a, b in zip(outputs, output_shapes, strict=False)):
        # An output may be laid out transposed ([in, out] for a weight's [out, in]); its dims agree as a multiset.
        problems.append(f"output shapes differ: module {outputs}, registry {output_shapes}")
    if train:
        donors = {int(n) for n in re.findall(r"\((\d+), \{\}\)", header.split("buffer_donor={", 1)[-1].split("}, ")[0])} \
            if "buffer_donor={" in header else set()
        updated = {n for n, c in param_classes.items() if c in ("weight", "optimizer-state")}
        if donors != updated:
            problems.append(f"buffer donors {sorted(donors)} are not the weights and optimizer state {sorted(updated)}")
    return problems


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="JSON: {'spec': TorchSpec, 'device_ids': [...]}")
    parser.add_argument("--registry", required=True, help="where to write the registry (JSON)")
    options = parser.parse_args()
    raise SystemExit(_child_main(Path(options.spec), Path(options.registry)))
