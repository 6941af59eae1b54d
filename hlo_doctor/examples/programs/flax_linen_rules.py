"""Flax linen logical axis rules: the batch rule first (FSDP) vs the 'embed' rule first.

Pattern: a tiny decoder-like model (embedding 512 x 128, 2 MLP blocks 128 -> 512
-> 128, unembedding) whose parameters carry logical axes
(`nn.with_logical_partitioning`) and whose activations are constrained with
`nn.with_logical_constraint(x, ('batch', 'length', 'embed'))`; the logical axes
map to the mesh through `nn.logical_axis_rules`. One train step (loss, grad,
optax SGD update) under `jax.jit`, on a 1-D mesh ('data',) of 8 devices
(2 hosts x 4), with `jax.set_mesh` so the constraints take effect.

- fixed (healthy): rules `[('batch', 'data'), ('embed', 'data'), ...]`. Rule
  order is a priority per array: an activation `('batch', 'length', 'embed')`
  gets 'data' on 'batch' first, so 'embed' stays replicated; the weights have no
  'batch' axis, so 'embed' shards them over 'data' (FSDP). In the HLO every dot
  has 2 of the 16 sequences (32 token rows), weights are all-gathered, gradients
  reduced.
- bad: the same rules with `('embed', 'data')` before `('batch', 'data')`. Now
  the activations take 'data' on 'embed' and the batch is replicated: the
  constrained activations are sharded on the feature dim (f32[16,16,16] per
  device instead of f32[2,16,128]), every device computes all 256 token rows of
  the MLP, and the embedding output is resharded from the tokens' batch sharding.
"""

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

DEVICES = 8
BATCH, SEQ, VOCAB, EMBED, MLP = 16, 16, 512, 128, 512

HEALTHY_RULES = [("batch", "data"), ("embed", "data"), ("mlp", None), ("vocab", None), ("length", None)]
BAD_RULES = [("embed", "data"), ("batch", "data"), ("mlp", None), ("vocab", None), ("length", None)]


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        w_in = self.param("w_in", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
                          (EMBED, MLP))
        w_out = self.param("w_out", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")),
                           (MLP, EMBED))
        h = nn.relu(x @ w_in)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        out = x + h @ w_out
        return nn.with_logical_constraint(out, ("batch", "length", "embed"))


class Model(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        table = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
                           (VOCAB, EMBED))
        x = jnp.take(table, tokens, axis=0)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        for i in range(2):
            x = Block(name=f"block_{i}")(x)
        unembed = self.param("unembed", nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "vocab")),
                             (EMBED, VOCAB))
        return x @ unembed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    rules = BAD_RULES if args.variant == "bad" else HEALTHY_RULES
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("data",))
    model = Model()
    optimizer = optax.sgd(1e-2)
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32)

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))
        param_sharding = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
        values = jax.tree.map(lambda box: box.value, abstract, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), values, param_sharding)
        batch_spec = nn.logical_to_mesh_axes(("batch", "length"), rules)
        tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32, sharding=NamedSharding(mesh, batch_spec))

        def train_step(params, tokens):
            def loss_fn(params):
                logits = model.apply({"params": params}, tokens)
                return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, _ = optimizer.update(grads, optimizer.init(params), params)
            return optax.apply_updates(params, updates), loss

        jax.jit(train_step, donate_argnums=0).lower(params["params"], tokens).compile()
    print("tokens", batch_spec, "embed activations", nn.logical_to_mesh_axes(("batch", "length", "embed"), rules))


if __name__ == "__main__":
    main()
