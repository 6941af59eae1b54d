"""Healthy: two Megatron MLP blocks written in shard_map, trained data-parallel.

8 devices, mesh np.arange(8).reshape(2, 4) with axes ('data', 'model'). Each
block is Megatron's tensor-parallel MLP written by hand in ``jax.shard_map``:
w_in column-sharded and w_out row-sharded over 'model', so each device computes
a slice of the hidden features and an explicit ``jax.lax.psum`` over 'model'
sums the partial outputs (groups {0,1,2,3}, {4,5,6,7}: within a host of 4).
The batch is sharded over 'data'; the weights are replicated over it.

The train step takes jax.grad of a squared-error loss outside the shard_map
and applies SGD. In the partitioned HLO:

- forward: one all-reduce over 'model' per block (the psum);
- backward: the gradient w.r.t. the first block's output, which feeds the
  second block's column-sharded matmul on every 'model' device, is all-reduced
  over 'model' (Megatron's "f" operator); the input x is not differentiated,
  so the first block has none;
- gradients: each weight's gradient all-reduced over 'data' (groups {0,4},
  {1,5}, {2,6}, {3,7}: across hosts, as data parallelism is); the loss is a
  scalar all-reduce.
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
BATCH, D_MODEL, D_FF, BLOCKS = 32, 256, 1024, 2
LEARNING_RATE = 1e-2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("healthy",), default="healthy")
    parser.add_argument("--devices", type=int, default=DEVICES, choices=(DEVICES,))
    parser.add_argument("--devices-per-host", type=int)  # unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")

    mesh = Mesh(np.array(jax.devices()[:n]).reshape(2, 4), ("data", "model"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    block_specs = {"w_in": P(None, "model"), "w_out": P("model", None)}
    params = [
        {"w_in": jax.ShapeDtypeStruct((D_MODEL, D_FF), jnp.float32, sharding=spec(None, "model")),
         "w_out": jax.ShapeDtypeStruct((D_FF, D_MODEL), jnp.float32, sharding=spec("model", None))}
        for _ in range(BLOCKS)
    ]
    x = jax.ShapeDtypeStruct((BATCH, D_MODEL), jnp.float32, sharding=spec("data", None))
    y = jax.ShapeDtypeStruct((BATCH, D_MODEL), jnp.float32, sharding=spec("data", None))

    @partial(jax.shard_map, mesh=mesh, in_specs=(block_specs, P("data", None)),
             out_specs=P("data", None))
    def megatron_mlp(p, x):
        # x: [batch/2, d_model], whole on every 'model' device; p: this device's hidden slice.
        h = jax.nn.relu(x @ p["w_in"])                  # [batch/2, d_ff/4]
        return jax.lax.psum(h @ p["w_out"], "model")    # partial sums -> [batch/2, d_model]

    def loss_fn(params, x, y):
        for p in params:
            x = x + megatron_mlp(p, x)
        return jnp.mean((x - y) ** 2)

    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return params, loss

    param_shardings = jax.tree.map(lambda p: p.sharding, params)
    jax.jit(train_step, out_shardings=(param_shardings, spec()), donate_argnums=0).lower(
        params, x, y).compile()


if __name__ == "__main__":
    main()
