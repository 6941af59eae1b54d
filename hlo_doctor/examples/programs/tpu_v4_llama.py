"""The seed's TPU job: a 2-layer llama train step on TPU v4, 128 chips in 32 hosts.

Compiled deviceless for `v4:4x4x8` (one device per chip, as JAX shows a v4):
`hlo-doctor run --example tpu-v4-llama --target v4:4x4x8`. bf16 parameters
and activations, d_model 4096, 32 heads of 128, SwiGLU ffn 11008, vocab
32000, sequences of 767 tokens; one step of value_and_grad + SGD.

bad: mesh (32 'data', 4 'model'), global batch 256 sharded over 'data', every
weight FSDP-sharded over 'data' and Megatron-sharded over 'model'. Each
device holds activations bf16[8,767,4096] split only 4 ways, so its matmuls
are small next to the 4-way tensor-parallel all-reduces of those activations
and the 32-way weight gathers: the step is communication-bound.

fixed: the same model as 128-way FSDP (mesh (128 'data',)), global batch 1024,
so each device holds a whole bf16[8,767,4096] activation and the only traffic
is the weight all-gathers and gradient reduce-scatters.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import llama_model

DEVICES = 128
CONFIG = {"vocab": 32000, "d_model": 4096, "heads": 32, "head_dim": 128, "ffn": 11008,
          "layers": 2, "seq": 767}
BATCH = {"bad": 256, "fixed": 1024}
LEARNING_RATE = 1e-2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES)  # set by --target
    parser.add_argument("--devices-per-host", type=int)  # set by --target; unused
    args = parser.parse_args(argv)
    if args.devices != DEVICES or jax.device_count() < DEVICES:
        raise SystemExit("needs 128 TPU v4 chips: `hlo-doctor run --example tpu-v4-llama "
                         "--target v4:4x4x8`")
    cfg = dict(CONFIG, batch=BATCH[args.variant])
    devices = np.array(jax.devices()[:DEVICES])
    if args.variant == "bad":
        mesh = Mesh(devices.reshape(32, 4), ("data", "model"))
        weights = {"norm": P(), "in": P("data", "model"), "out": P("model", "data"),
                   "embed": P("data", None), "unembed": P("data", "model")}
        activations = {"table": P(), "residual": P("data", None, None),
                       "heads": P("data", None, "model", None), "ffn": P("data", None, "model")}
    else:
        mesh = Mesh(devices, ("data",))
        weights = {"norm": P(), "in": P("data", None), "out": P("data", None),
                   "embed": P("data", None), "unembed": P("data", None)}
        activations = {"table": P(), "residual": P("data", None, None),
                       "heads": P("data", None, None, None), "ffn": P("data", None, None)}

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, weights[kind])

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activations[kind]))

    params = jax.tree.map(
        lambda p: jax.ShapeDtypeStruct(p.shape, jnp.bfloat16, sharding=p.sharding),
        llama_model.abstract_params(cfg, sharding_for))
    batch = NamedSharding(mesh, P("data", None))
    tokens = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32, sharding=batch)
    targets = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32, sharding=batch)

    def train_step(params, tokens, targets):
        loss, grads = jax.value_and_grad(llama_model.loss_fn)(
            params, tokens, targets, cfg, constrain)
        params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return params, loss

    param_shardings = jax.tree.map(lambda p: p.sharding, params)
    step = jax.jit(train_step, out_shardings=(param_shardings, NamedSharding(mesh, P())),
                   donate_argnums=0)
    step.lower(params, tokens, targets).compile()


if __name__ == "__main__":
    main()
