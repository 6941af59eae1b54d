"""Flax NNX FSDP with `nnx.with_partitioning`: every layer annotated vs the largest one left out.

Pattern: a tiny decoder-like NNX model (embedding 512 x 256, 2 MLP blocks
256 -> 1024 -> 256 (1 MiB kernels), an unembedding `nnx.Linear(256, 2048)`), each initializer
wrapped in `nnx.with_partitioning(init, ('fsdp', None))` (or `(None, 'fsdp')`),
built sharded under `jax.set_mesh` inside `nnx.jit`, then one train step
(`nnx.jit`, `nnx.value_and_grad`, `nnx.Optimizer` with optax SGD) on a 1-D mesh
('fsdp',) of 8 devices (2 hosts x 4), the batch sharded P('fsdp').

- fixed (healthy FSDP): every kernel carries partitioning metadata; each is
  sharded over 'fsdp', all-gathered for its dot, and its gradient reduced over
  'fsdp'; the activations stay batch-sharded (2 of 16 sequences per device).
- bad: the unembedding `nnx.Linear(256, 2048)` (f32[256,2048], 2 MiB, the
  largest weight) is built without `nnx.with_partitioning`, so NNX leaves it
  replicated on all 8 devices: it is the one unsharded parameter of the train
  step (and its gradient is all-reduced whole), while the smaller kernels are
  sharded 8 ways.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
BATCH, SEQ, VOCAB, EMBED, MLP, OUT = 16, 16, 512, 256, 1024, 2048


class Block(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.w_in = nnx.Linear(EMBED, MLP, use_bias=False, rngs=rngs,
                               kernel_init=nnx.with_partitioning(init, ("fsdp", None)))
        self.w_out = nnx.Linear(MLP, EMBED, use_bias=False, rngs=rngs,
                                kernel_init=nnx.with_partitioning(init, (None, "fsdp")))

    def __call__(self, x):
        return x + self.w_out(jax.nn.relu(self.w_in(x)))


class Model(nnx.Module):
    def __init__(self, partition_unembed, rngs):
        self.embed = nnx.Embed(VOCAB, EMBED, rngs=rngs,
                               embedding_init=nnx.with_partitioning(nnx.initializers.normal(0.02), ("fsdp", None)))
        self.blocks = nnx.List([Block(rngs) for _ in range(2)])
        init = nnx.initializers.lecun_normal()
        if partition_unembed:
            self.unembed = nnx.Linear(EMBED, OUT, use_bias=False, rngs=rngs,
                                      kernel_init=nnx.with_partitioning(init, ("fsdp", None)))
        else:
            self.unembed = nnx.Linear(EMBED, OUT, use_bias=False, rngs=rngs, kernel_init=init)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("fsdp",))

    @nnx.jit
    def create_sharded_model():
        model = Model(args.variant == "fixed", rngs=nnx.Rngs(0))
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        return model

    @nnx.jit
    def train_step(model, optimizer, tokens, targets):
        def loss_fn(model):
            logits = model(tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    with jax.set_mesh(mesh):
        model = create_sharded_model()
        optimizer = nnx.Optimizer(model, optax.sgd(1e-2), wrt=nnx.Param)
        batch = NamedSharding(mesh, P("fsdp", None))
        tokens = jax.device_put(jnp.arange(BATCH * SEQ, dtype=jnp.int32).reshape(BATCH, SEQ) % VOCAB, batch)
        targets = jax.device_put(jnp.ones((BATCH, SEQ), jnp.int32), batch)
        loss = train_step(model, optimizer, tokens, targets)
    print(float(loss), model.unembed.kernel[...].sharding.spec)


if __name__ == "__main__":
    main()
