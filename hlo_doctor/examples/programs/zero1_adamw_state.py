"""A pure data-parallel AdamW train step whose optimizer state is replicated on every device.

Data parallelism over 'data' on 8 devices: the weights of a small MLP are
replicated, each device takes an eighth of the batch, and the gradients are
all-reduced. The AdamW moments are replicated too, so every device keeps both
moments of every weight whole and repeats the same update eight times. That is
plain data parallelism, a choice, not a mistake; but the moments could be
sharded over 'data' (ZeRO-1): each device updates only its slice of the
weights from the same reduced gradients, and the updated weights are gathered
once a step. The fixed variant shards the moments over 'data' on their first
dimension and keeps the weights replicated.

Run it through `hlo-doctor run --example zero1-adamw-state`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
D_IN, HIDDEN, D_OUT = 256, 1024, 256
LEARNING_RATE, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.95, 1e-8, 0.1


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def adamw(params, grads, mu, nu, step):
    mu = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, mu, grads)
    nu = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, nu, grads)
    scale = jnp.sqrt(1 - BETA2 ** step) / (1 - BETA1 ** step)
    params = jax.tree.map(
        lambda p, m, v: p - LEARNING_RATE * (scale * m / (jnp.sqrt(v) + EPS) + WEIGHT_DECAY * p),
        params, mu, nu)
    return params, mu, nu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES)
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")
    mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
    replicated = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("data", None))

    rng = np.random.default_rng(0)
    shapes = {"w1": (D_IN, HIDDEN), "w2": (HIDDEN, D_OUT)}
    params = {k: jax.device_put(rng.normal(0, 0.02, s).astype(np.float32), replicated) for k, s in shapes.items()}
    if args.variant == "bad":
        moment_sharding = {k: replicated for k in shapes}
    else:
        moment_sharding = {k: NamedSharding(mesh, P("data", None)) for k in shapes}
    mu = {k: jax.device_put(np.zeros(s, np.float32), moment_sharding[k]) for k, s in shapes.items()}
    nu = {k: jax.device_put(np.zeros(s, np.float32), moment_sharding[k]) for k, s in shapes.items()}
    x = jax.device_put(rng.normal(size=(8 * n, D_IN)).astype(np.float32), batch)
    y = jax.device_put(rng.normal(size=(8 * n, D_OUT)).astype(np.float32), batch)

    def train_step(params, mu, nu, x, y, step):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, mu, nu = adamw(params, grads, mu, nu, step)
        # the weights stay replicated, the moments keep the sharding they were made with
        params = jax.lax.with_sharding_constraint(params, replicated)
        mu = jax.lax.with_sharding_constraint(mu, moment_sharding)
        nu = jax.lax.with_sharding_constraint(nu, moment_sharding)
        return params, mu, nu, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    params, mu, nu, loss = step_fn(params, mu, nu, x, y, jnp.float32(1))
    print(f"loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
