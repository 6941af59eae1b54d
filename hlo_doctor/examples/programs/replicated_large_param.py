"""FSDP model whose largest weight is left replicated.

A 1-D mesh ('fsdp',) of 4 devices. The two MLP weights are sharded over 'fsdp'
but the unembedding matrix, the largest parameter (512 x 8192, 4x either MLP
weight), is left replicated in the bad variant: every device holds all of it,
and it is never all-gathered because it never needed to be. The fixed variant
shards it like the others, adding one all-gather for it.
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

    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("fsdp",))
    batch = NamedSharding(mesh, P("fsdp", None))
    fsdp = NamedSharding(mesh, P("fsdp", None))
    unembed_sharding = fsdp if args.variant == "fixed" else NamedSharding(mesh, P())

    x = jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=batch)
    w_in = jax.ShapeDtypeStruct((512, 2048), jnp.float32, sharding=fsdp)
    w_out = jax.ShapeDtypeStruct((2048, 512), jnp.float32, sharding=fsdp)
    unembed = jax.ShapeDtypeStruct((512, 8192), jnp.float32, sharding=unembed_sharding)

    def model(x, w_in, w_out, unembed):
        h = x + jax.nn.gelu(x @ w_in) @ w_out
        h = jax.lax.with_sharding_constraint(h, batch)
        return h @ unembed

    jax.jit(model, out_shardings=batch).lower(x, w_in, w_out, unembed).compile()


if __name__ == "__main__":
    main()
