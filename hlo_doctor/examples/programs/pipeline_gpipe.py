"""Healthy: a GPipe pipeline in shard_map, activations passed between stages with ppermute.

8 devices, mesh np.arange(8).reshape(4, 2) with axes ('stage', 'data'): 4
pipeline stages of 2 devices each (stage s on devices 2s and 2s+1), the batch of
each microbatch sharded over 'data'. Each stage owns one layer (the stacked
weights [4, d, d] are sharded over 'stage'). The schedule is GPipe's: 4
microbatches flow through the 4 stages in 4 + 3 = 7 ticks of a ``lax.scan``;
at every tick each stage applies its layer to what it holds and passes the
result to the next stage with ``jax.lax.ppermute`` over 'stage' (pairs
0->1, 1->2, 2->3 in stage indices: devices 0->2, 2->4, 4->6 and 1->3, 3->5,
5->7; the 2->4 and 3->5 hops cross the host boundary of a 2 x 4 layout, as a
pipeline's stage boundary may). The last stage collects the outputs; the loss
is a psum over both axes.

The train step differentiates the whole pipeline (jax.grad outside the
shard_map) and applies SGD, so the partitioned HLO holds:

- the forward scan (a while loop): one collective-permute per tick, inside the
  loop body, forward along the stages;
- the backward scan (another while loop): the transposed collective-permute,
  backward along the stages, inside its body;
- the loss's scalar all-reduce and, since each stage's weights are replicated
  over 'data', their gradient's all-reduce over 'data' (groups {0,1}, {2,3},
  ...: within a host), once, after the backward loop (the ``pcast`` of w to
  varying over 'data' before the loop puts it there; without it JAX's
  transpose would all-reduce the gradient at every tick inside the loop).
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
STAGES, MICROBATCHES, BATCH, D_MODEL = 4, 4, 16, 256
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

    mesh = Mesh(np.array(jax.devices()[:n]).reshape(STAGES, 2), ("stage", "data"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    weights = jax.ShapeDtypeStruct((STAGES, D_MODEL, D_MODEL), jnp.float32,
                                   sharding=spec("stage", None, None))
    # [microbatch, batch, d_model]: every stage sees all microbatches, only stage 0 reads them.
    x = jax.ShapeDtypeStruct((MICROBATCHES, BATCH, D_MODEL), jnp.float32,
                             sharding=spec(None, "data", None))
    y = jax.ShapeDtypeStruct((MICROBATCHES, BATCH, D_MODEL), jnp.float32,
                             sharding=spec(None, "data", None))
    forward_pairs = [(s, s + 1) for s in range(STAGES - 1)]

    @partial(jax.shard_map, mesh=mesh,
             in_specs=(P("stage"), P(None, "data"), P(None, "data")), out_specs=P())
    def pipeline_loss(w, x, y):
        # w: [1, d, d], this stage's layer; x, y: [microbatch, batch/2, d].
        stage = jax.lax.axis_index("stage")
        # w is replicated over 'data', its uses inside the loop are not: cast it to varying
        # here, once, so that its gradient is summed over 'data' once after the backward
        # loop rather than at every tick inside it.
        w = jax.lax.pcast(w, "data", to="varying")
        ticks = MICROBATCHES + STAGES - 1

        def tick(carry, t):
            held, outputs = carry
            # Stage 0 takes microbatch t; the others what the previous stage sent.
            feed = jax.lax.dynamic_index_in_dim(x, jnp.minimum(t, MICROBATCHES - 1), 0, False)
            inp = jnp.where(stage == 0, feed, held)
            out = jnp.tanh(inp @ w[0])
            # The last stage finishes microbatch t - (STAGES - 1).
            done = t - (STAGES - 1)
            keep = (stage == STAGES - 1) & (done >= 0)
            outputs = jnp.where(
                keep, jax.lax.dynamic_update_index_in_dim(outputs, out, jnp.maximum(done, 0), 0),
                outputs)
            held = jax.lax.ppermute(out, "stage", forward_pairs)
            return (held, outputs), None

        # The carry differs from stage to stage: mark it varying over 'stage' too.
        start = jax.lax.pcast((jnp.zeros_like(x[0]), jnp.zeros_like(x)), "stage", to="varying")
        (_, outputs), _ = jax.lax.scan(tick, start, jnp.arange(ticks))
        local = jnp.where(stage == STAGES - 1, jnp.sum((outputs - y) ** 2), 0.0)
        return jax.lax.psum(local, ("stage", "data")) / (MICROBATCHES * BATCH * D_MODEL)

    def train_step(w, x, y):
        loss, grad = jax.value_and_grad(pipeline_loss)(w, x, y)
        return w - LEARNING_RATE * grad, loss

    jax.jit(train_step, out_shardings=(weights.sharding, spec()), donate_argnums=0).lower(
        weights, x, y).compile()


if __name__ == "__main__":
    main()
