"""FSDP MLP whose activations get all-gathered (pytorch/xla#6778, in JAX).

Mesh (4, 1) with axes ('fsdp', 'replica'). The batch of x is sharded over both
axes and both weights over 'fsdp' on their output dim. With nothing pinning the
hidden activation, propagation follows the weight sharding: the partitioned HLO
all-gathers x over the batch (dim 0) and the hidden activation over its feature
dim (dim 1). The fixed variant constrains the activation back to batch sharding,
which leaves only the weight all-gathers FSDP expects.

`--devices N` scales it to a mesh (N, 1) with a batch of 40 * N; the issue's
own hardware is 2 hosts of 8 A100s:
`hlo-doctor run --example fsdp-activation-gather --target a100:2x8`.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 4


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--devices-per-host", type=int)  # set by --target; unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")

    mesh = Mesh(np.array(jax.devices()[:n]).reshape(n, 1), ("fsdp", "replica"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    batch = spec(("fsdp", "replica"), None)
    x = jax.ShapeDtypeStruct((40 * n, 1280), jnp.float32, sharding=batch)
    w1 = jax.ShapeDtypeStruct((960, 1280), jnp.float32, sharding=spec("fsdp", None))
    b1 = jax.ShapeDtypeStruct((960,), jnp.float32, sharding=spec())
    w2 = jax.ShapeDtypeStruct((128, 960), jnp.float32, sharding=spec("fsdp", None))
    b2 = jax.ShapeDtypeStruct((128,), jnp.float32, sharding=spec())

    def mlp(x, w1, b1, w2, b2):
        h = x @ w1.T + b1
        if args.variant == "fixed":
            h = jax.lax.with_sharding_constraint(h, batch)
        return h @ w2.T + b2

    jax.jit(mlp).lower(x, w1, b1, w2, b2).compile()


if __name__ == "__main__":
    main()
