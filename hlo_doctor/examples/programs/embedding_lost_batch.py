"""FSDP train step whose embedding lookup follows the table's sharding and drops the batch from 'fsdp'.

8 devices, a mesh ('data'=2, 'fsdp'=4). The tokens are split over both axes
on their batch dim; every weight is sharded over 'fsdp' on its model dim (the
embedding table [vocab, d_model] on d_model, the stacked MLP weights on
d_model, the RMSNorm scales too), and ``lax.scan`` runs the layers with the
activation as the carry.

bad: nothing pins the lookup's result, so propagation follows the table:
``embed[tokens]`` comes out split over 'data' on its batch dim and over
'fsdp' on d_model. From there on each device holds 4x its share of the rows,
the matmuls contract the split d_model as partial sums all-reduced over
'fsdp', and the norms reduce over 'fsdp' too: activations move over an axis
that splits the batch at the input, and no weight is gathered.

fixed: ``jax.lax.with_sharding_constraint`` keeps the lookup's result on the
batch sharding of the tokens; the partitioner gathers the weights over 'fsdp'
instead (FSDP's own collectives) and the carry stays batch-sharded 8 ways.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
LAYERS, BATCH, SEQ, D_MODEL, D_FF, VOCAB = 2, 16, 16, 512, 1024, 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES, choices=(DEVICES,))
    parser.add_argument("--devices-per-host", type=int)  # unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")

    mesh = Mesh(np.array(jax.devices()[:n]).reshape(2, 4), ("data", "fsdp"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32, sharding=spec(("data", "fsdp"), None))
    params = {
        "embed": jax.ShapeDtypeStruct((VOCAB, D_MODEL), jnp.float32, sharding=spec(None, "fsdp")),
        "w_in": jax.ShapeDtypeStruct((LAYERS, D_MODEL, D_FF), jnp.float32, sharding=spec(None, "fsdp", None)),
        "w_out": jax.ShapeDtypeStruct((LAYERS, D_FF, D_MODEL), jnp.float32, sharding=spec(None, None, "fsdp")),
        "scale": jax.ShapeDtypeStruct((LAYERS, D_MODEL), jnp.float32, sharding=spec(None, "fsdp")),
    }

    def layer(x, p):
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * p["scale"]
        h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", y, p["w_in"]))
        x = x + jnp.einsum("bsf,fd->bsd", h, p["w_out"])
        return x, None

    def loss(params, tokens):
        x = params["embed"][tokens]
        if args.variant == "fixed":
            x = jax.lax.with_sharding_constraint(x, spec(("data", "fsdp"), None, None))
        layers = {k: params[k] for k in ("w_in", "w_out", "scale")}
        x, _ = jax.lax.scan(layer, x, layers)
        return jnp.mean(x ** 2)

    def train_step(params, tokens):
        grads = jax.grad(loss)(params, tokens)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    jax.jit(train_step).lower(params, tokens).compile()


if __name__ == "__main__":
    main()
