"""An FSDP llama train step whose AdamW moments are left replicated while the weights are sharded.

The weights are sharded over 'fsdp' on 4 devices, but the optimizer state
was made whole (as when `optax.adamw(...).init(params)` runs before the
weights are sharded, or the state is put on the mesh with `P()`): every
device keeps both moments of every weight whole, twice the memory of the
whole model, while it keeps only a quarter of the weights. The fixed
variant gives the moments their weight's sharding (ZeRO: the optimizer state
sharded like the parameters it updates).

Run it through `hlo-doctor run --example replicated-adamw-state`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import llama_model

DEVICES = 4
LEARNING_RATE, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.95, 1e-8, 0.1


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
    cfg = dict(llama_model.CONFIG, batch=2 * n)
    mesh = Mesh(np.array(jax.devices()[:n]), ("fsdp",))

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, P() if kind == "norm" else P("fsdp", None))

    activations = {"table": P(), "residual": P("fsdp", None, None),
                   "heads": P("fsdp", None, None, None), "ffn": P("fsdp", None, None)}

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activations[kind]))

    shapes = llama_model.abstract_params(cfg, sharding_for)
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: jax.device_put(rng.normal(0, 0.02, s.shape).astype(np.float32), s.sharding), shapes)
    if args.variant == "bad":
        moment_sharding = jax.tree.map(lambda s: NamedSharding(mesh, P()), shapes)
    else:
        moment_sharding = jax.tree.map(lambda s: s.sharding, shapes)
    mu = jax.tree.map(lambda s, sh: jax.device_put(np.zeros(s.shape, np.float32), sh), shapes, moment_sharding)
    nu = jax.tree.map(lambda s, sh: jax.device_put(np.zeros(s.shape, np.float32), sh), shapes, moment_sharding)
    batch = NamedSharding(mesh, P("fsdp", None))
    tokens = jax.device_put(rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), dtype=np.int32), batch)
    targets = jax.device_put(np.roll(np.asarray(tokens), 1, axis=1), batch)

    def train_step(params, mu, nu, tokens, targets, step):
        loss, grads = jax.value_and_grad(llama_model.loss_fn)(params, tokens, targets, cfg, constrain)
        params, mu, nu = adamw(params, grads, mu, nu, step)
        # the moments keep the sharding they were made with
        mu = jax.lax.with_sharding_constraint(mu, moment_sharding)
        nu = jax.lax.with_sharding_constraint(nu, moment_sharding)
        return params, mu, nu, loss

    step_fn = jax.jit(train_step, donate_argnums=(0, 1, 2))
    params, mu, nu, loss = step_fn(params, mu, nu, tokens, targets, jnp.float32(1))
    print(f"loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
