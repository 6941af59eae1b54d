"""Data-parallel MLP whose hidden activation is sharded on its feature dim.

A 1-D mesh ('data',) of 4 devices; the batch of x is sharded over 'data' and the
weights are replicated, so the whole MLP should run without communication. The
bad variant constrains the hidden activation to P(None, 'data'): the batch is
replicated and the feature dim sharded, which costs an all-to-all into the
constraint and a cross-device reduction for the second matmul (it contracts the
sharded dim). The fixed variant keeps the activation batch-sharded.
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
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("data",))
    batch = NamedSharding(mesh, P("data", None))
    replicated = NamedSharding(mesh, P())
    hidden = batch if args.variant == "fixed" else NamedSharding(mesh, P(None, "data"))

    x = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=batch)
    w1 = jax.ShapeDtypeStruct((512, 1024), jnp.float32, sharding=replicated)
    w2 = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=replicated)

    def mlp(x, w1, w2):
        h = jax.nn.gelu(x @ w1)
        h = jax.lax.with_sharding_constraint(h, hidden)
        return h @ w2

    jax.jit(mlp, out_shardings=batch).lower(x, w1, w2).compile()


if __name__ == "__main__":
    main()
