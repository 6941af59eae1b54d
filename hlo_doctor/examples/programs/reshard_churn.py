"""Sharding constraints that flip the activation layout every layer.

A 1-D mesh ('x',) of 4 devices and a stack of 4 residual layers with replicated
weights. The bad variant constrains each layer's output alternately to
P('x', None) and P(None, 'x'), so the partitioner reshards back and forth
(all-to-all) between every pair of layers. The fixed variant keeps P('x', None)
throughout and needs no communication at all.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 4
LAYERS = 4


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
    rows = NamedSharding(mesh, P("x", None))
    cols = NamedSharding(mesh, P(None, "x"))
    layouts = [rows, cols] if args.variant == "bad" else [rows]

    x = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=rows)
    ws = [jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=NamedSharding(mesh, P()))
          for _ in range(LAYERS)]

    def stack(x, *ws):
        for i, w in enumerate(ws):
            x = x + jnp.tanh(x @ w)
            x = jax.lax.with_sharding_constraint(x, layouts[i % len(layouts)])
        return x

    jax.jit(stack, out_shardings=rows).lower(x, *ws).compile()


if __name__ == "__main__":
    main()
