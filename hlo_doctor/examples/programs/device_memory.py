"""An FSDP train step with AdamW on a TPU v5e 4x4 slice (16 chips of 16 GiB), sized to cross the chip's memory.

Four MLP blocks (d_model 12288, ffn 49152): 4.8 B parameters in f32, with
AdamW's two moments 58 GB of state for the whole slice; matmuls in bf16.
The mesh is ('data', 'fsdp') = (4, 4) and the batch is split over both. The
bad variant shards the weights and the moments over 'fsdp' only, so each
chip keeps a quarter of them: 14.5 GB of state, and with the gradients the
step does not fit in 16 GiB (XLA's compile fails with RESOURCE_EXHAUSTED;
the runner keeps its dump). The fixed variant shards them over both axes
(16-way FSDP): a sixteenth each, and the step fits.

Run it through `hlo-doctor run --example device-memory --target v5e:4x4`:
the runner compiles the jitted step for the slice instead of running it, so
nothing is allocated (the arguments are jax.ShapeDtypeStruct placeholders).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 16
D_MODEL, FFN, LAYERS, BATCH, SEQ = 12288, 49152, 4, 64, 1024
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
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --target v5e:4x4`")
    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(4, 4), ("data", "fsdp"))
    weight_axes = "fsdp" if args.variant == "bad" else ("data", "fsdp")
    weight = NamedSharding(mesh, P(weight_axes, None))
    batch = NamedSharding(mesh, P(("data", "fsdp"), None, None))

    def loss_fn(params, x, y):
        for w_in, w_out in params:
            x = jax.lax.with_sharding_constraint(block(x, w_in, w_out), batch)
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
