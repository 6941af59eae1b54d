"""A training step whose sharding constraints move one activation through four layouts in a row.

A 1-D mesh ('data',) of 4 devices, a batch split over 'data' and replicated
weights: a data-parallel step that needs no activation traffic at all. The bad
variant constrains the first layer's output four times in a row, through the
program's own helper ``constrain``: rows (the batch), then the sequence, then
the features, then the sequence again. Each new layout is an all-to-all with
nothing computed between, and JAX constrains the gradient alike, so the
backward pass reshards back through the same lines. The fixed variant writes
the layout the first constraint asks for (the batch split) on every line.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 4
BATCH, SEQ, HIDDEN, FFN = 16, 64, 256, 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("data",))
    rows = NamedSharding(mesh, P("data", None, None))
    replicated = NamedSharding(mesh, P())
    bad = args.variant == "bad"

    def constrain(x, *spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))

    def layer(x, w_in, w_out):
        return x + jnp.tanh(x @ w_in) @ w_out

    def loss_fn(params, x, y):
        (w_in0, w_out0), (w_in1, w_out1) = params
        h = layer(x, w_in0, w_out0)
        h = constrain(h, "data", None, None)
        h = constrain(h, None, "data", None) if bad else constrain(h, "data", None, None)
        h = constrain(h, None, None, "data") if bad else constrain(h, "data", None, None)
        h = constrain(h, None, "data", None) if bad else constrain(h, "data", None, None)
        h = layer(h, w_in1, w_out1)
        return jnp.mean(jnp.square(h - y))

    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, jax.tree.map(lambda w, g: w - 1e-3 * g, params, grads)

    weight = (jax.ShapeDtypeStruct((HIDDEN, FFN), jnp.float32, sharding=replicated),
              jax.ShapeDtypeStruct((FFN, HIDDEN), jnp.float32, sharding=replicated))
    params = (weight, weight)
    x = jax.ShapeDtypeStruct((BATCH, SEQ, HIDDEN), jnp.float32, sharding=rows)
    y = jax.ShapeDtypeStruct((BATCH, SEQ, HIDDEN), jnp.float32, sharding=rows)
    jax.jit(train_step).lower(params, x, y).compile()


if __name__ == "__main__":
    main()
