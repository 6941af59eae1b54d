"""A small llama-like decoder shared by the llama-* and train-step examples.

RMSNorm, rotary attention, SwiGLU MLP, untied embeddings; plain dicts of
arrays, no framework. Run the ``llama_*.py`` scripts, not this file.
"""

import jax
import jax.numpy as jnp

CONFIG = {
    "vocab": 1024, "d_model": 256, "heads": 4, "head_dim": 64, "ffn": 768,
    "layers": 2, "batch": 8, "seq": 128,
}
# Parameter name -> (shape as config keys, kind). The kind picks the sharding.
LAYER_PARAMS = {
    "attn_norm": (("d_model",), "norm"),
    "wq": (("d_model", "qkv"), "in"),
    "wk": (("d_model", "qkv"), "in"),
    "wv": (("d_model", "qkv"), "in"),
    "wo": (("qkv", "d_model"), "out"),
    "mlp_norm": (("d_model",), "norm"),
    "w_gate": (("d_model", "ffn"), "in"),
    "w_up": (("d_model", "ffn"), "in"),
    "w_down": (("ffn", "d_model"), "out"),
}
TOP_PARAMS = {
    "embed": (("vocab", "d_model"), "embed"),
    "final_norm": (("d_model",), "norm"),
    "unembed": (("d_model", "vocab"), "unembed"),
}


def _dims(cfg, names):
    sizes = dict(cfg, qkv=cfg["heads"] * cfg["head_dim"])
    return tuple(sizes[n] for n in names)


def abstract_params(cfg, sharding_for, *, stacked=False):
    """ShapeDtypeStructs for every parameter; ``sharding_for(kind, stacked)`` gives the sharding."""
    params = {
        name: jax.ShapeDtypeStruct(_dims(cfg, dims), jnp.float32,
                                   sharding=sharding_for(kind, False))
        for name, (dims, kind) in TOP_PARAMS.items()
    }
    if stacked:
        params["layers"] = {
            name: jax.ShapeDtypeStruct((cfg["layers"], *_dims(cfg, dims)), jnp.float32,
                                       sharding=sharding_for(kind, True))
            for name, (dims, kind) in LAYER_PARAMS.items()
        }
    else:
        params["layers"] = [
            {name: jax.ShapeDtypeStruct(_dims(cfg, dims), jnp.float32,
                                        sharding=sharding_for(kind, False))
             for name, (dims, kind) in LAYER_PARAMS.items()}
            for _ in range(cfg["layers"])
        ]
    return params


def rms_norm(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def rope(x):
    _, seq, _, dim = x.shape
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def block(x, p, cfg, constrain):
    b, s, _ = x.shape
    h = rms_norm(x, p["attn_norm"])

    def heads(w):
        return constrain((h @ w).reshape(b, s, cfg["heads"], cfg["head_dim"]), "heads")

    q, k, v = rope(heads(p["wq"])), rope(heads(p["wk"])), heads(p["wv"])
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(cfg["head_dim"]).astype(x.dtype)
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, jnp.finfo(x.dtype).min)
    attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    x = constrain(x + attn.reshape(b, s, -1) @ p["wo"], "residual")

    h = rms_norm(x, p["mlp_norm"])
    gated = constrain(jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"]), "ffn")
    return constrain(x + gated @ p["w_down"], "residual")


def forward(params, tokens, cfg, constrain, *, scan=False):
    # Gather the embedding table whole before the lookup (as FSDP does for every weight):
    # a lookup into a sharded table makes the partitioner shuffle the token ids instead.
    table = constrain(params["embed"], "table")
    x = constrain(table[tokens], "residual")
    if scan:
        def step(x, p):
            return block(x, p, cfg, constrain), None

        x, _ = jax.lax.scan(step, x, params["layers"])
    else:
        for p in params["layers"]:
            x = block(x, p, cfg, constrain)
    return rms_norm(x, params["final_norm"]) @ params["unembed"]


def loss_fn(params, tokens, targets, cfg, constrain, *, scan=False):
    logits = forward(params, tokens, cfg, constrain, scan=scan)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()
