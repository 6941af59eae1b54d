"""FSDP training step whose input lists the batch axes in another order than its constraints.

8 devices on 2 hosts of 4, mesh ('data'=2, 'fsdp'=4). A 3-layer MLP with
every weight sharded over 'fsdp' on its input features (FSDP), the hidden
activations constrained to P(('data', 'fsdp'), None): the batch over both
axes, 'data' major. The bad variant places the input batch P(('fsdp',
'data'), None): the same split in another device order, so each device holds
another device's rows and the partitioner permutes the input (and its use in
the backward pass) into the constraints' order. The fixed variant places it
P(('data', 'fsdp'), None).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
SIZES = (512, 1024, 1024, 256)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices-per-host", type=int)  # recorded by the runner; unused
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(2, 4), ("data", "fsdp"))
    rows = NamedSharding(mesh, P(("data", "fsdp"), None))
    # bad: the batch axes in the other order
    input_rows = NamedSharding(mesh, P(("fsdp", "data"), None) if args.variant == "bad" else P(("data", "fsdp"), None))

    weights = [jax.ShapeDtypeStruct((a, b), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", None)))
               for a, b in zip(SIZES, SIZES[1:])]
    x = jax.ShapeDtypeStruct((256, SIZES[0]), jnp.float32, sharding=input_rows)
    y = jax.ShapeDtypeStruct((256, SIZES[-1]), jnp.float32, sharding=input_rows)

    def loss_fn(weights, x, y):
        h = x
        for i, w in enumerate(weights):
            h = h @ w
            if i < len(weights) - 1:
                h = jax.lax.with_sharding_constraint(jax.nn.relu(h), rows)
        return jnp.mean((h - y) ** 2)

    def train_step(weights, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(weights, x, y)
        return loss, [w - 1e-3 * g for w, g in zip(weights, grads)]

    jax.jit(train_step, donate_argnums=0).lower(weights, x, y).compile()


if __name__ == "__main__":
    main()
