"""FSDP MLP layers under lax.scan whose body loses the batch sharding (pytorch/xla#6778, scanned).

8 devices, a 1-D mesh ('fsdp',). The seed example's FSDP MLP
(fsdp_activation_gather.py) repeated LAYERS times: the layers' weights are
stacked ([layer, out, in], torch's layout) and sharded over 'fsdp' on their
output dim, the batch of x over 'fsdp', and ``lax.scan`` runs one layer per
iteration with the activation as the carry (x <- relu(x @ w1.T) @ w2.T).

bad: nothing pins the activation inside the scan body, so propagation follows
the weights: the body's first dot is sharded on its output feature dim, so the
carried activation is all-gathered over 'fsdp' on its batch dim (every device
multiplies the whole batch) and the feature-sharded hidden activation is
resharded back to the batch with an all-to-all before the second dot, all
inside the while loop's body, so once per layer (LAYERS times a step). fixed: ``jax.lax.with_sharding_constraint`` puts
the hidden and the carried activation back on the batch sharding inside the
body; only the weights are all-gathered (FSDP's own collectives).

This is Shardy's propagation (JAX's default). Under GSPMD
(JAX_USE_SHARDY_PARTITIONER=0) the bad variant keeps the carry batch-sharded
and compiles to the same collectives as the fixed one: two weight all-gathers
per iteration.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
LAYERS, BATCH, D_MODEL, D_HIDDEN = 4, 256, 512, 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES, choices=(DEVICES,))
    parser.add_argument("--devices-per-host", type=int)  # unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")

    mesh = Mesh(np.array(jax.devices()[:n]), ("fsdp",))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    batch = spec("fsdp", None)
    x = jax.ShapeDtypeStruct((BATCH, D_MODEL), jnp.float32, sharding=batch)
    w1 = jax.ShapeDtypeStruct((LAYERS, D_HIDDEN, D_MODEL), jnp.float32,
                              sharding=spec(None, "fsdp", None))
    w2 = jax.ShapeDtypeStruct((LAYERS, D_MODEL, D_HIDDEN), jnp.float32,
                              sharding=spec(None, "fsdp", None))

    def layer(x, w):
        w1, w2 = w
        h = jax.nn.relu(x @ w1.T)
        if args.variant == "fixed":
            h = jax.lax.with_sharding_constraint(h, batch)
        x = h @ w2.T
        if args.variant == "fixed":
            x = jax.lax.with_sharding_constraint(x, batch)
        return x, None

    def model(x, w1, w2):
        x, _ = jax.lax.scan(layer, x, (w1, w2))
        return x

    jax.jit(model).lower(x, w1, w2).compile()


if __name__ == "__main__":
    main()
