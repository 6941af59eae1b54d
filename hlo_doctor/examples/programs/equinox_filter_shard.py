"""Equinox FSDP with `eqx.filter_shard`: the hidden activations constrained on the batch vs on a feature dim.

Pattern: an Equinox MLP (`eqx.nn.Linear` 256 -> 512 -> 512 -> 256, each applied per
example under `jax.vmap`, so the dot is `w @ x` and the batch ends up last in its
product), FSDP over a 1-D mesh ('data',) of 8 devices (2 hosts x 4): the kernels
sharded on dim 0 with `eqx.filter_shard` after each update, the batch of 2048 sharded
P('data', None). One train step under `eqx.filter_jit(donate="all")` (the model and
the batch donated): loss, `eqx.filter_value_and_grad`, SGD.

- fixed (healthy FSDP): each hidden activation is constrained to `batch_sharding`
  (P('data', None)); every kernel is all-gathered for its dot and its gradient
  reduce-scattered over 'data', the activations stay batch-sharded.
- bad: the hidden activations are constrained to `feature_sharding`
  (P(None, 'data')), which splits the 512 features and leaves the batch whole on
  every device: the partitioner gathers the batch into each layer (activation
  all-gathers, forward and backward) instead of gathering the weights, and each
  device's matmul covers every row of the batch.
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
BATCH, FEATURES, HIDDEN = 2048, 256, 512


class MLP(eqx.Module):
    layers: list

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.layers = [eqx.nn.Linear(FEATURES, HIDDEN, key=k1), eqx.nn.Linear(HIDDEN, HIDDEN, key=k2),
                       eqx.nn.Linear(HIDDEN, FEATURES, key=k3)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("data",))
    batch_sharding = NamedSharding(mesh, P("data", None))
    feature_sharding = NamedSharding(mesh, P(None, "data"))
    hidden_sharding = feature_sharding if args.variant == "bad" else batch_sharding

    def shard_weights(model):
        def placement(leaf):
            return NamedSharding(mesh, P("data", None) if leaf.ndim == 2 else P())

        return eqx.filter_shard(model, jax.tree_util.tree_map(placement, model))

    def forward(model, x):
        for layer in model.layers[:-1]:
            h = jax.nn.relu(jax.vmap(layer)(x))
            x = eqx.filter_shard(h, hidden_sharding)
        return jax.vmap(model.layers[-1])(x)

    @eqx.filter_jit(donate="all")
    def train_step(model, x, y):
        def loss_fn(model):
            return jnp.mean((forward(model, x) - y) ** 2)

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        model = jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, model, grads)
        return shard_weights(model), loss

    model = shard_weights(MLP(jax.random.key(0)))
    x = jax.device_put(jnp.ones((BATCH, FEATURES)), batch_sharding)
    y = jax.device_put(jnp.ones((BATCH, FEATURES)), batch_sharding)
    model, loss = train_step(model, x, y)
    print(float(loss), model.layers[0].weight.sharding.spec)


if __name__ == "__main__":
    main()
