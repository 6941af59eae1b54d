"""Healthy: a top-1 routed mixture-of-experts MLP trained with expert parallelism.

8 devices, mesh np.arange(8).reshape(2, 4) with axes ('data', 'expert'): the
batch of tokens is sharded over both axes (8 ways), the experts' weights over
'expert' (8 experts, 2 per device) and replicated over 'data'; the router is
replicated. Each token goes to its top-1 expert with a fixed capacity per
expert (Switch/GShard-style one-hot dispatch and combine tensors), so tokens
must travel to the devices holding their expert and back: one all-to-all over
'expert' (groups {0,1,2,3}, {4,5,6,7}) to dispatch and one to return. The
backward pass has one more, the return's transpose, which sends the output's
cotangent to the experts (the dispatch needs none: neither x nor the one-hot
dispatch tensor is differentiated). MoE dispatch needs every expert reachable
from every token, so these all-to-alls are the pattern, not a mistake.

The program compiles the same train step (jax.grad of a squared-error loss, SGD
update) twice, so the dump holds two modules:

- ``jit_einsum_train_step``: GShard style at jit level. Dispatch and combine are
  einsums computed where the tokens are (batch-sharded); sharding constraints
  move the dispatched tokens from the batch dim to the expert dim ('expert'
  axis) and the experts' output back, and the SPMD partitioner turns each of
  these reshards into an all-to-all.
- ``jit_shard_map_train_step``: the same layer in ``jax.shard_map`` with
  explicit ``jax.lax.all_to_all`` over 'expert'.

Gradients: the expert weights' gradients are all-reduced over 'data' (the
devices that share an expert shard), the router's over all 8 devices; the loss
is a scalar all-reduce.

``--devices`` must be 8 (2 hosts x 4: 'expert' groups stay within a host,
'data' groups {i, i+4} cross hosts).
"""

import argparse
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
BATCH, SEQ, D_MODEL, D_FF, EXPERTS = 16, 32, 128, 256, 8
CAPACITY = 2 * SEQ // EXPERTS  # per expert, per sequence (capacity factor 2)
LEARNING_RATE = 1e-2


def route(x, w_router):
    """Top-1 routing: one-hot dispatch [b, s, e, c] and gate-weighted combine tensors."""
    probs = jax.nn.softmax(jnp.einsum("bsm,me->bse", x, w_router), axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    mask = jax.nn.one_hot(expert, EXPERTS, dtype=x.dtype)               # [b, s, e]
    position = (jnp.cumsum(mask, axis=1) - 1.0) * mask                  # slot in its expert
    mask = mask * (position < CAPACITY)                                 # drop overflow tokens
    dispatch = mask[..., None] * jax.nn.one_hot(position, CAPACITY, dtype=x.dtype)
    gate = jnp.sum(probs * mask, axis=-1)                               # [b, s]
    return dispatch, dispatch * gate[..., None, None]


def experts(tokens, w_in, w_out):
    """Each expert's MLP on its slots: tokens [e, b, c, m] -> [e, b, c, m]."""
    h = jax.nn.relu(jnp.einsum("ebcm,emf->ebcf", tokens, w_in))
    return jnp.einsum("ebcf,efm->ebcm", h, w_out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("healthy",), default="healthy")
    parser.add_argument("--devices", type=int, default=DEVICES, choices=(DEVICES,))
    parser.add_argument("--devices-per-host", type=int)  # unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")

    mesh = Mesh(np.array(jax.devices()[:n]).reshape(2, 4), ("data", "expert"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    tokens = spec(("data", "expert"), None, None)
    params = {
        "router": jax.ShapeDtypeStruct((D_MODEL, EXPERTS), jnp.float32, sharding=spec()),
        "w_in": jax.ShapeDtypeStruct((EXPERTS, D_MODEL, D_FF), jnp.float32,
                                     sharding=spec("expert", None, None)),
        "w_out": jax.ShapeDtypeStruct((EXPERTS, D_FF, D_MODEL), jnp.float32,
                                      sharding=spec("expert", None, None)),
    }
    x = jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), jnp.float32, sharding=tokens)
    y = jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), jnp.float32, sharding=tokens)

    # The dispatched tokens [expert, batch, capacity, d_model], on either side of the all-to-all.
    by_batch = spec(None, ("data", "expert"), None, None)
    by_expert = spec("expert", "data", None, None)

    def einsum_moe(params, x):
        dispatch, combine = route(x, params["router"])
        # Dispatch where the tokens are (each device its own sequences)...
        expert_in = jax.lax.with_sharding_constraint(
            jnp.einsum("bsec,bsm->ebcm", dispatch, x), by_batch)
        # ...then move them to their experts' devices: batch- to expert-sharded (all-to-all).
        expert_in = jax.lax.with_sharding_constraint(expert_in, by_expert)
        # The experts run where their weights are...
        expert_out = jax.lax.with_sharding_constraint(
            experts(expert_in, params["w_in"], params["w_out"]), by_expert)
        # ...and their output goes back to the tokens' devices (all-to-all), combined there.
        expert_out = jax.lax.with_sharding_constraint(expert_out, by_batch)
        return jnp.einsum("bsec,ebcm->bsm", combine, expert_out)

    @partial(jax.shard_map, mesh=mesh,
             in_specs=({"router": P(), "w_in": P("expert"), "w_out": P("expert")},
                       P(("data", "expert"))),
             out_specs=P(("data", "expert")))
    def shard_map_moe(params, x):
        # x: this device's 2 sequences; w_in/w_out: its 2 experts.
        dispatch, combine = route(x, params["router"])
        expert_in = jnp.einsum("bsec,bsm->ebcm", dispatch, x)           # [8 experts, b, c, m]
        expert_in = jax.lax.all_to_all(expert_in, "expert", 0, 1, tiled=True)   # [2, 4b, c, m]
        expert_out = experts(expert_in, params["w_in"], params["w_out"])
        expert_out = jax.lax.all_to_all(expert_out, "expert", 1, 0, tiled=True)  # [8, b, c, m]
        return jnp.einsum("bsec,ebcm->bsm", combine, expert_out)

    def make_train_step(moe):
        def loss_fn(params, x, y):
            return jnp.mean((x + moe(params, x) - y) ** 2)

        def train_step(params, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
            return params, loss

        return train_step

    param_shardings = jax.tree.map(lambda p: p.sharding, params)
    for name, moe in (("einsum_train_step", einsum_moe), ("shard_map_train_step", shard_map_moe)):
        step = make_train_step(moe)
        step.__name__ = name
        jax.jit(step, out_shardings=(param_shardings, spec()), donate_argnums=0).lower(
            params, x, y).compile()


if __name__ == "__main__":
    main()
