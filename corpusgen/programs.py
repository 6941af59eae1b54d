"""Random but realistic JAX SPMD steps, built from blocks, with the generator's own registry.

A :class:`ProgramSpec` is drawn from a seed (:func:`random_spec`): the mesh
(1 to 3 axes, random names that never tell their role, each axis given a
role: data, fsdp or tensor), the host layout and physical device order, the
model (an MLP stack or a transformer: dense layers in four operand orders,
attention with head folds and GQA, RMSNorm / LayerNorm, tied or untied
embeddings), the step (train with SGD or AdamW, bf16 compute over f32
weights, layers unrolled or under ``lax.scan``, with or without
``jax.checkpoint``; or an eval step) and at most one injected pathology.

:func:`build` turns a spec into ``(fn, args, registry)``: a function to jit,
its arguments as ``jax.ShapeDtypeStruct`` with shardings (nothing is
allocated), and the registry the oracle reads (which argument path is a
weight, optimizer state, data or labels; what each output leaf is).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PATHOLOGIES", "ProgramSpec", "build", "device_layout", "random_spec"]

# Pathology -> the hlo-doctor rule that must report it.
PATHOLOGIES = {
    "replicated-batch-input": "replicated-batch",
    "replicated-batch-mid": "replicated-batch",
    "feature-dim-constraint": "non-batch-dim-sharding",
    "replicated-weight": "replicated-large-parameter",
    "cross-host-tensor": "cross-host-tensor-parallel",
    "conflicting-constraints": "reshard-churn",
    "uneven-dim": "uneven-sharding-padding",
}
# Mesh axis names: some of them name a role, never reliably the axis's own.
_AXIS_NAMES = ("x", "y", "z", "i", "j", "rows", "cols", "data", "model", "fsdp", "tp", "dp", "replica", "batch")
_ROLES = ("data", "fsdp", "tensor")
_DENSES = ("xw", "wxT", "einsum-any", "vmap")


@dataclass
class Axis:
    name: str
    size: int
    role: str


@dataclass
class ProgramSpec:
    seed: int
    devices: int
    hosts: int
    axes: list[Axis]
    physical: list[str]  # axis names, major to minor, in the order device ids are laid out
    model: str  # "mlp" | "transformer"
    layers: int
    batch: int
    seq: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    features: int
    norm: str  # "rms" | "layer" | "none"
    dense: list[str]  # one per layer (the scanned body uses dense[0])
    head_fold: bool
    tied: bool
    bias: bool
    train: bool
    optimizer: str  # "sgd" | "adamw"
    bf16: bool
    scan: bool
    remat: bool
    constrain_layers: bool
    shard_norms: bool
    injection: str | None
    injection_axis: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def devices_per_host(self) -> int:
        return self.devices // self.hosts

    def axes_with(self, *roles: str) -> list[Axis]:
        return [a for a in self.axes if a.role in roles]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _factorizations(n: int, parts: int) -> list[list[int]]:
    if parts == 1:
        return [[n]] if n >= 2 else []
    out = []
    for first in range(2, n + 1):
        if n % first == 0:
            out.extend([first, *rest] for rest in _factorizations(n // first, parts - 1))
    return out


def random_spec(seed: int, injection: str | None = "random", *, devices: int | None = None,
                hosts: int | None = None, exclude: tuple[str, ...] = ()) -> ProgramSpec:
    """A spec drawn from ``seed``. ``injection``: a pathology name, None (clean), "random" (any or
    none) or "any" (one of the pathologies but ``exclude``). ``devices`` and ``hosts``: fixed by a
    target, else drawn."""
    rng = random.Random(seed)
    for _ in range(200):
        spec = _draw(rng, seed, injection, devices, hosts, exclude)
        if spec is not None:
            return spec
    raise RuntimeError(f"no legal spec for seed {seed} and injection {injection!r}")


def _draw(rng: random.Random, seed: int, injection: str | None, fixed_devices: int | None = None,
          fixed_hosts: int | None = None, exclude: tuple[str, ...] = ()) -> ProgramSpec | None:
    devices = fixed_devices or rng.choice((4, 8, 8, 16))
    parts = rng.choice((1, 2, 2, 3))
    shapes = _factorizations(devices, parts)
    if not shapes:
        return None
    sizes = rng.choice(shapes)
    names = rng.sample(_AXIS_NAMES, len(sizes))
    roles = [rng.choice(_ROLES) for _ in sizes]
    if roles.count("tensor") > 1:
        return None
    axes = [Axis(n, s, r) for n, s, r in zip(names, sizes, roles, strict=True)]
    if injection == "random":
        injection = rng.choice((None, None, *(p for p in PATHOLOGIES if p not in exclude)))
    elif injection == "any":
        injection = rng.choice(tuple(p for p in PATHOLOGIES if p not in exclude))
    hosts = fixed_hosts or rng.choice([h for h in (1, 2, 4) if devices // h >= 2])
    tensor = [a for a in axes if a.role == "tensor"]
    # Physical order: tensor axes minor (inside a host), the rest shuffled.
    others = [a.name for a in axes if a.role != "tensor"]
    rng.shuffle(others)
    physical = others + [a.name for a in tensor]
    if tensor and tensor[0].size > devices // hosts:
        return None  # a clean layout needs the tensor axis inside a host
    model = rng.choice(("mlp", "transformer"))
    batch_shards = _product(a.size for a in axes if a.role in ("data", "fsdp"))
    tp = tensor[0].size if tensor else 1
    spec = ProgramSpec(
        seed=seed, devices=devices, hosts=hosts, axes=axes, physical=physical, model=model,
        layers=rng.choice((1, 2, 2)), batch=batch_shards * rng.choice((1, 2, 3)) * (2 if batch_shards == 1 else 1),
        seq=rng.choice((16, 32)), hidden=rng.choice((256, 384, 512)), ffn=rng.choice((1024, 1536, 2048)),
        heads=tp * rng.choice((2, 4)), kv_heads=tp * rng.choice((1, 2)), head_dim=rng.choice((32, 64)),
        vocab=rng.choice((1024, 2048, 4096)), features=rng.choice((128, 256)),
        norm=rng.choice(("rms", "layer", "none")), dense=[], head_fold=rng.random() < 0.5,
        tied=rng.random() < 0.4, bias=rng.random() < 0.4, train=rng.random() < 0.8,
        optimizer=rng.choice(("sgd", "adamw")), bf16=rng.random() < 0.3, scan=rng.random() < 0.3,
        remat=rng.random() < 0.3, constrain_layers=rng.random() < 0.5, shard_norms=rng.random() < 0.5,
        injection=injection,
    )
    if spec.kv_heads > spec.heads or spec.heads % spec.kv_heads:
        spec.kv_heads = spec.heads
    spec.dense = [rng.choice(_DENSES) for _ in range(spec.layers)]
    if spec.scan:
        spec.layers = rng.choice((2, 3))
        spec.dense = [spec.dense[0]] * spec.layers
    if spec.bf16 and spec.model == "mlp" and spec.dense[0] == "vmap":
        spec.bf16 = False
    return spec if _apply_injection(spec, rng) else None


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _apply_injection(spec: ProgramSpec, rng: random.Random) -> bool:
    """Make the spec carry its pathology; False when this spec cannot carry it."""
    kind = spec.injection
    batch_axes = spec.axes_with("data", "fsdp")
    tensor = spec.axes_with("tensor")
    if kind is None:
        return True
    if kind in ("replicated-batch-input", "replicated-batch-mid"):
        if not batch_axes:
            return False
        spec.injection_axis = rng.choice(batch_axes).name
        if kind == "replicated-batch-mid" and spec.layers < 2:
            spec.layers = 2
            spec.dense = spec.dense * 2
        return True
    if kind == "feature-dim-constraint":
        if not batch_axes:
            return False
        spec.dense = ["xw"] * spec.layers
        return True
    if kind == "replicated-weight":
        return bool(spec.axes_with("fsdp", "tensor"))
    if kind == "cross-host-tensor":
        return bool(tensor) and spec.hosts >= 2  # device_layout puts the tensor axis major
    if kind == "conflicting-constraints":
        return bool(batch_axes)
    if kind == "uneven-dim":
        if not tensor:
            return False
        spec.dense = ["xw"] * spec.layers
        spec.injection_axis = tensor[0].name
        return True
    raise ValueError(f"unknown pathology {kind!r}")


def physical_order(spec: ProgramSpec) -> list[str]:
    """The axes major to minor as device ids are laid out; the injected cross-host mistake puts the
    tensor axis major, so its groups span hosts."""
    if spec.injection == "cross-host-tensor":
        tensor = [a.name for a in spec.axes if a.role == "tensor"]
        return tensor + [n for n in spec.physical if n not in tensor]
    return list(spec.physical)


def ffn_size(spec: ProgramSpec) -> int:
    """The MLP width: the injected uneven mistake makes it not divide the tensor axis."""
    if spec.injection == "uneven-dim":
        shards = next(a.size for a in spec.axes if a.role == "tensor")
        return shards * (spec.ffn // shards) + max(1, shards // 2)
    return spec.ffn


def device_layout(spec: ProgramSpec) -> list[int]:
    """The physical device id of each logical partition id (the mesh's devices, row-major)."""
    import numpy as np

    names = [a.name for a in spec.axes]
    size_of = {a.name: a.size for a in spec.axes}
    physical = physical_order(spec)
    ids = np.arange(spec.devices).reshape([size_of[n] for n in physical])
    return [int(i) for i in ids.transpose([physical.index(n) for n in names]).reshape(-1)]


# -- building the JAX program ----------------------------------------------------------------------

def build(spec: ProgramSpec, devices) -> tuple[Any, tuple, dict[str, Any]]:
    """``(fn, args, registry)`` for ``spec`` on ``devices`` (a list of JAX devices)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    names = [a.name for a in spec.axes]
    size_of = {a.name: a.size for a in spec.axes}
    ids = np.array(device_layout(spec)).reshape([size_of[n] for n in names])
    mesh = Mesh(np.array(devices, dtype=object)[ids], tuple(names))
    batch_axes = tuple(a.name for a in spec.axes_with("data", "fsdp"))
    fsdp_axes = tuple(a.name for a in spec.axes_with("fsdp"))
    tensor = next((a.name for a in spec.axes_with("tensor")), None)
    fsdp_size = _product(size_of[a] for a in fsdp_axes)

    def axes_or_none(axes):
        axes = tuple(axes)
        return None if not axes else axes[0] if len(axes) == 1 else axes

    input_batch = batch_axes
    if spec.injection == "replicated-batch-input":
        input_batch = tuple(a for a in batch_axes if a != spec.injection_axis)
    B = axes_or_none(input_batch)
    # The program's own constraints follow its input layout (a batch left off an axis at the
    # input stays off it: the user's whole configuration leaves that axis out).
    BA = axes_or_none(input_batch)
    compute = jnp.bfloat16 if spec.bf16 else jnp.float32

    # -- weights: (shape, dim kinds); sharded by role ------------------------------------------
    D, F, H, KV, K, V = spec.hidden, ffn_size(spec), spec.heads, spec.kv_heads, spec.head_dim, spec.vocab
    layer_shapes: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {}
    if spec.norm != "none":
        layer_shapes["norm_scale"] = ((D,), ("model",))
        if spec.norm == "layer":
            layer_shapes["norm_bias"] = ((D,), ("model",))
    if spec.model == "transformer":
        layer_shapes["wq"] = ((D, H, K), ("model", "heads", "kv"))
        layer_shapes["wk"] = ((D, KV, K), ("model", "heads", "kv"))
        layer_shapes["wv"] = ((D, KV, K), ("model", "heads", "kv"))
        layer_shapes["wo"] = ((H, K, D), ("heads", "kv", "model"))
        if spec.norm != "none":
            layer_shapes["mlp_norm_scale"] = ((D,), ("model",))
    if spec.bias:
        layer_shapes["b_in"] = ((F,), ("ffn",))

    def shapes_of_layer(orientation: str) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
        if orientation == "wxT":  # stored as the program multiplies them: w @ x.T
            dense = {"w_in": ((F, D), ("ffn", "model")), "w_out": ((D, F), ("model", "ffn"))}
        else:
            dense = {"w_in": ((D, F), ("model", "ffn")), "w_out": ((F, D), ("ffn", "model"))}
        return {**layer_shapes, **dense}
    top_shapes: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {}
    if spec.model == "transformer":
        top_shapes["embed"] = ((V, D), ("vocab", "model"))
    else:
        top_shapes["proj"] = ((spec.features, D), ("in", "model"))
    if not (spec.model == "transformer" and spec.tied):
        top_shapes["head"] = ((D, V), ("model", "vocab"))
    if spec.norm != "none":
        top_shapes["final_norm"] = ((D,), ("model",))

    def weight_spec(shape, kinds, name):
        parts: list[Any] = [None] * len(shape)
        small = len(shape) == 1
        if tensor is not None:
            for i, kind in enumerate(kinds):
                if kind in ("ffn", "heads", "vocab") and shape[i] % size_of[tensor] == 0:
                    parts[i] = tensor
                    break
        if fsdp_axes and (not small or spec.shard_norms):
            order = sorted(range(len(shape)), key=lambda i: -shape[i])
            for i in order:
                if parts[i] is None and shape[i] % fsdp_size == 0:
                    parts[i] = axes_or_none(fsdp_axes)
                    break
                if parts[i] == tensor and tensor is not None and shape[i] % (fsdp_size * size_of[tensor]) == 0:
                    parts[i] = (*fsdp_axes, tensor)
                    break
        return P(*parts)

    params_spec: dict[str, Any] = {}
    params_shape: dict[str, Any] = {}
    for name, (shape, kinds) in top_shapes.items():
        params_shape[name], params_spec[name] = shape, weight_spec(shape, kinds, name)
    if spec.scan:
        stacked = {}
        stacked_spec = {}
        for name, (shape, kinds) in shapes_of_layer(spec.dense[0]).items():
            stacked[name] = (spec.layers, *shape)
            stacked_spec[name] = P(None, *weight_spec(shape, kinds, name))
        params_shape["layers"], params_spec["layers"] = stacked, stacked_spec
    else:
        per_layer = [shapes_of_layer(orientation) for orientation in spec.dense]
        params_shape["layers"] = [{n: s for n, (s, _) in shapes.items()} for shapes in per_layer]
        params_spec["layers"] = [{n: weight_spec(s, k, n) for n, (s, k) in shapes.items()} for shapes in per_layer]
    if spec.injection == "replicated-weight":
        _replicate_largest(spec, params_shape, params_spec, P)

    def shaped(shapes, specs, dtype):
        return jax.tree.map(lambda s, p: jax.ShapeDtypeStruct(s, dtype, sharding=NamedSharding(mesh, p)),
                            shapes, specs, is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(i, int) for i in x))

    params = shaped(params_shape, params_spec, jnp.float32)
    S = spec.seq
    batch: dict[str, Any] = {}
    if spec.model == "transformer":
        batch["tokens"] = jax.ShapeDtypeStruct((spec.batch, S), jnp.int32, sharding=NamedSharding(mesh, P(B, None)))
    else:
        batch["features"] = jax.ShapeDtypeStruct((spec.batch, S, spec.features), jnp.float32,
                                                 sharding=NamedSharding(mesh, P(B, None, None)))
    batch["labels"] = jax.ShapeDtypeStruct((spec.batch, S), jnp.int32, sharding=NamedSharding(mesh, P(B, None)))
    batch["mask"] = jax.ShapeDtypeStruct((spec.batch, S), jnp.float32, sharding=NamedSharding(mesh, P(B, None)))

    wsc = jax.lax.with_sharding_constraint

    def constrain(x, *parts):
        return wsc(x, NamedSharding(mesh, P(*parts)))

    def norm(x, p, scale, bias=None):
        if spec.norm == "none" or scale not in p:
            return x
        x32 = x.astype(jnp.float32)
        if spec.norm == "rms":
            y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        else:
            mean = jnp.mean(x32, axis=-1, keepdims=True)
            var = jnp.mean((x32 - mean) ** 2, axis=-1, keepdims=True)
            y = (x32 - mean) * jax.lax.rsqrt(var + 1e-5)
        y = y * p[scale].astype(jnp.float32)
        if bias is not None and bias in p:
            y = y + p[bias].astype(jnp.float32)
        return y.astype(x.dtype)

    def attention(x, p):
        q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
        k = jnp.einsum("bsd,dhk->bshk", x, p["wk"])
        v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
        if KV != H:
            k = jnp.repeat(k, H // KV, axis=2)
            v = jnp.repeat(v, H // KV, axis=2)
        causal = jnp.tril(jnp.ones((S, S), dtype=bool))
        nb = x.shape[0]
        if spec.head_fold:
            fold = lambda t: t.transpose(0, 2, 1, 3).reshape(nb * H, S, K)  # noqa: E731
            scores = jnp.einsum("nsk,ntk->nst", fold(q), fold(k)) / (K ** 0.5)
            scores = jnp.where(causal[None], scores, -1e9)
            o = jnp.einsum("nst,ntk->nsk", jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype),
                           fold(v))
            o = o.reshape(nb, H, S, K).transpose(0, 2, 1, 3)
        else:
            scores = jnp.einsum("bshk,bthk->bhst", q, k) / (K ** 0.5)
            scores = jnp.where(causal[None, None], scores, -1e9)
            probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
            o = jnp.einsum("bhst,bthk->bshk", probs, v)
        return jnp.einsum("bshk,hkd->bsd", o, p["wo"])

    def mlp(x, p, orient, layer):
        act = jax.nn.gelu
        if orient == "xw":
            h = jnp.einsum("bsd,df->bsf", x, p["w_in"])
            if "b_in" in p:
                h = h + p["b_in"]
            if spec.injection == "feature-dim-constraint" and layer == 0:
                h = constrain(h, None, None, BA)
            elif spec.injection == "uneven-dim" and layer == 0 or spec.constrain_layers:
                h = constrain(h, BA, None, tensor)
            return jnp.einsum("bsf,fd->bsd", act(h), p["w_out"])
        if orient == "wxT":
            nb = x.shape[0]
            t = x.reshape(nb * S, D)
            h = p["w_in"] @ t.T  # [F, tokens]: the batch is dim 1
            if "b_in" in p:
                h = h + p["b_in"][:, None]
            z = p["w_out"] @ act(h)  # [D, tokens]
            return z.T.reshape(nb, S, D)
        if orient == "einsum-any":
            h = jnp.einsum("bsd,df->sfb", x, p["w_in"])  # the batch is the last dim
            if "b_in" in p:
                h = h + p["b_in"][None, :, None]
            return jnp.einsum("sfb,fd->bsd", act(h), p["w_out"])
        # vmap over a per-example layer
        def one(xi):
            hi = xi @ p["w_in"]
            if "b_in" in p:
                hi = hi + p["b_in"]
            return act(hi) @ p["w_out"]
        return jax.vmap(one)(x)

    def block(x, p, layer, orient):
        with jax.named_scope(f"layer{layer}"):
            if spec.model == "transformer":
                x = x + attention(norm(x, p, "norm_scale", "norm_bias"), p)
                x = x + mlp(norm(x, p, "mlp_norm_scale"), p, orient, layer)
            else:
                x = x + mlp(norm(x, p, "norm_scale", "norm_bias"), p, orient, layer)
            if spec.injection == "replicated-batch-mid" and layer == 0:
                kept = tuple(a for a in batch_axes if a != spec.injection_axis)
                x = constrain(x, axes_or_none(kept), None, None)
            elif spec.injection == "conflicting-constraints" and layer == 0:
                x = constrain(x, BA, None, None)
                x = constrain(x, None, BA, None)
                x = constrain(x, None, None, BA)
                x = constrain(x, None, BA, None)
            elif spec.constrain_layers:
                x = constrain(x, BA, None, None)
            return x

    def forward(p, b):
        p = jax.tree.map(lambda w: w.astype(compute), p)
        if spec.model == "transformer":
            x = p["embed"][b["tokens"]]
        else:
            x = jnp.einsum("bsi,id->bsd", b["features"].astype(compute), p["proj"])
        if spec.scan:
            body = lambda h, lp: (block(h, lp, 0, spec.dense[0]), None)  # noqa: E731
            if spec.remat:
                body = jax.checkpoint(body)
            x, _ = jax.lax.scan(body, x, p["layers"])
        else:
            for i, lp in enumerate(p["layers"]):
                fn = (lambda h, q, i=i: block(h, q, i, spec.dense[i]))
                x = (jax.checkpoint(fn) if spec.remat else fn)(x, lp)
        x = norm(x, {"s": p["final_norm"]} if "final_norm" in p else {}, "s")
        if "head" in p:
            logits = jnp.einsum("bsd,dv->bsv", x, p["head"])
        else:
            logits = jnp.einsum("bsd,vd->bsv", x, p["embed"])
        return logits.astype(jnp.float32)

    def loss_fn(p, b):
        logits = forward(p, b)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, b["labels"][..., None], axis=-1)[..., 0]
        return jnp.sum(nll * b["mask"]) / jnp.maximum(jnp.sum(b["mask"]), 1.0)

    registry: dict[str, Any] = {"param_classes": {}, "output_classes": [], "scopes": {}}
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        registry["param_classes"]["params" + jax.tree_util.keystr(path)] = "weight"
    registry["param_classes"].update({
        "batch['tokens']": "data", "batch['features']": "data", "batch['labels']": "labels",
        "batch['mask']": "data",
    })
    n_leaves = len(jax.tree.leaves(params))

    if not spec.train:
        def eval_step(params, batch):
            return loss_fn(params, batch)
        registry["output_classes"] = ["scalar"]
        return eval_step, (params, batch), registry

    if spec.optimizer == "adamw":
        opt_state = {"m": params, "v": params,
                     "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, P()))}
        for path, _ in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
            registry["param_classes"]["opt_state" + jax.tree_util.keystr(path)] = "optimizer-state"
        registry["param_classes"]["opt_state['count']"] = "scalar"
    else:
        opt_state = {}

    def train_step(params, opt_state, batch):
        p, opt = params, opt_state
        loss, grads = jax.value_and_grad(loss_fn)(p, batch)
        with jax.named_scope("optimizer"):
            if spec.optimizer == "adamw":
                count = opt["count"] + 1
                m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], grads)
                v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], grads)
                c = count.astype(jnp.float32)
                new_p = jax.tree.map(
                    lambda w, m, v: w - 1e-3 * ((m / (1 - 0.9 ** c)) / (jnp.sqrt(v / (1 - 0.999 ** c)) + 1e-8)
                                                + 0.01 * w), p, m, v)
                new_opt = {"m": m, "v": v, "count": count}
            else:
                new_p = jax.tree.map(lambda w, g: w - 0.01 * g, p, grads)
                new_opt = {}
        return new_p, new_opt, loss

    outputs = ["weight"] * n_leaves
    if spec.optimizer == "adamw":
        # jax.tree leaves of a dict are in sorted key order: count, m, v
        outputs += ["scalar"] + ["optimizer-state"] * (2 * n_leaves)
    registry["output_classes"] = [*outputs, "scalar"]
    return train_step, (params, opt_state, batch), registry


def _replicate_largest(spec: ProgramSpec, shapes: dict, specs: dict, P) -> None:  # noqa: N803
    """Leave the largest sharded weight replicated (its peers stay sharded)."""
    candidates = []
    for name in ("head", "embed", "proj"):
        if name in shapes:
            candidates.append(((name,), shapes[name]))
    layers = shapes["layers"]
    if isinstance(layers, dict):
        candidates += [(("layers", n), s) for n, s in layers.items()]
    else:
        candidates += [(("layers", 0, n), s) for n, s in layers[0].items()]
    def size(shape):
        return _product(shape)
    candidates = [(k, s) for k, s in candidates if len(s) >= 2]
    key, shape = max(candidates, key=lambda c: size(c[1]))
    target = specs
    for part in key[:-1]:
        target = target[part]
    target[key[-1]] = P()
    spec.injection_axis = "/".join(str(k) for k in key)
