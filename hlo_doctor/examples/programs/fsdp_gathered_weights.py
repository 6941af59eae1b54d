"""An FSDP + AdamW train step on 2 hosts of 8 H100s that keeps every layer's gathered weights for the backward.

Six MLP blocks (d_model 4096, ffn 16384) with f32 master weights sharded
over 'fsdp' on 16 GPUs, matmuls in bf16. Autodiff saves what the backward
needs, and the backward of `x @ w` needs `w`: the gathered bf16 copy of
every layer's weights is kept from the forward to the backward, so the
gathered weights of all six layers are alive at once and FSDP's saving is
lost. The fixed variant wraps each block in `jax.checkpoint` with a policy that saves
nothing (`jax.checkpoint_policies.nothing_saveable`): the backward
recomputes the block, so the weights are gathered again layer by layer.

Run it through `hlo-doctor run --example fsdp-gathered-weights` (compiled
for `h100:2x8` without a GPU; nothing is allocated).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 16
D_MODEL, FFN, LAYERS, BATCH, SEQ = 4096, 16384, 6, 32, 1152
LEARNING_RATE, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-4, 0.9, 0.95, 1e-8, 0.1


def block(x, w_in, w_out):
    h = jax.nn.gelu(x @ w_in.astype(jnp.bfloat16))
    return x + h @ w_out.astype(jnp.bfloat16)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--devices-per-host", type=int)  # set by --target; unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --target h100:2x8`")
    mesh = Mesh(np.array(jax.devices()[:n]), ("fsdp",))
    weight = NamedSharding(mesh, P("fsdp", None))
    batch = NamedSharding(mesh, P("fsdp", None, None))

    layer = block
    if args.variant == "fixed":
        layer = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)

    def loss_fn(params, x, y):
        for w_in, w_out in params:
            x = jax.lax.with_sharding_constraint(layer(x, w_in, w_out), batch)
        return jnp.mean(jnp.square(x.astype(jnp.float32) - y))

    def train_step(params, mu, nu, x, y, step):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        mu = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, nu, grads)
        scale = jnp.sqrt(1 - BETA2 ** step) / (1 - BETA1 ** step)
        params = jax.tree.map(
            lambda p, m, v: p - LEARNING_RATE * (scale * m / (jnp.sqrt(v) + EPS) + WEIGHT_DECAY * p),
            params, mu, nu)
        return params, mu, nu, loss

    def weights():
        return [(jax.ShapeDtypeStruct((D_MODEL, FFN), jnp.float32, sharding=weight),
                 jax.ShapeDtypeStruct((FFN, D_MODEL), jnp.float32, sharding=weight)) for _ in range(LAYERS)]

    params, mu, nu = weights(), weights(), weights()
    x = jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), jnp.bfloat16, sharding=batch)
    y = jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), jnp.float32, sharding=batch)
    step = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, P()))
    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    params, mu, nu, loss = step_fn(params, mu, nu, x, y, step)
    print(f"loss {loss.shape} {loss.dtype}")


if __name__ == "__main__":
    main()
