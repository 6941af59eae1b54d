"""Make a large, real after-partitioning HLO module for the parser benchmarks.

Compiles an unrolled llama-like train step (value_and_grad + SGD) with JAX on
8 virtual CPU devices (FSDP x TP mesh) and dumps every pass snapshot. The
module after SPMD partitioning is the benchmark input.

    python benchmarks/make_big_module.py [--layers 48] [--out benchmarks/_data/big] [--fast-backend]

Run in a fresh process: XLA_FLAGS must be set before jax is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "_data" / "big")
    parser.add_argument("--fast-backend", action="store_true",
                        help="compile the CPU code with XLA's backend optimization level 0 and without LLVM's "
                             "expensive passes (for big inputs: a 520-layer compile otherwise takes more "
                             "than 15 minutes here)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["XLA_FLAGS"] = (
        f"--xla_dump_to={args.out} --xla_dump_hlo_pass_re=spmd-partitioning "
        "--xla_force_host_platform_device_count=8"
    ) + (" --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true" if args.fast_backend else "")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("fsdp", "tp"))
    d_model, d_ff, heads, seq, batch, vocab = 256, 1024, 8, 128, 16, 4096

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    def rms_norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    def layer(x, p):
        h = rms_norm(x, p["norm1"])
        q = (h @ p["wq"]).reshape(batch, seq, heads, -1)
        k = (h @ p["wk"]).reshape(batch, seq, heads, -1)
        v = (h @ p["wv"]).reshape(batch, seq, heads, -1)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        attention = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        x = x + attention.reshape(batch, seq, d_model) @ p["wo"]
        h = rms_norm(x, p["norm2"])
        x = x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
        return x

    def loss(params, tokens):
        x = params["embed"][tokens]
        for p in params["layers"]:
            x = layer(x, p)
        logits = rms_norm(x, params["norm"]) @ params["embed"].T
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    def train_step(params, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        return value, jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    def weight(shape, axes):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=spec(*axes))

    layer_params = {
        "norm1": weight((d_model,), (None,)),
        "norm2": weight((d_model,), (None,)),
        "wq": weight((d_model, d_model), ("fsdp", "tp")),
        "wk": weight((d_model, d_model), ("fsdp", "tp")),
        "wv": weight((d_model, d_model), ("fsdp", "tp")),
        "wo": weight((d_model, d_model), ("tp", "fsdp")),
        "w_gate": weight((d_model, d_ff), ("fsdp", "tp")),
        "w_up": weight((d_model, d_ff), ("fsdp", "tp")),
        "w_down": weight((d_ff, d_model), ("tp", "fsdp")),
    }
    params = {
        "embed": weight((vocab, d_model), ("fsdp", None)),
        "norm": weight((d_model,), (None,)),
        "layers": [dict(layer_params) for _ in range(args.layers)],
    }
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=spec("fsdp", None))
    jax.jit(train_step).lower(params, tokens).compile()
    biggest = max(args.out.glob("*after_spmd-partitioning*.txt"), key=lambda p: p.stat().st_size)
    print(f"{biggest} {biggest.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
