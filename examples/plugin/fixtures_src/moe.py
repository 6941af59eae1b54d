"""A mixture-of-experts layer whose expert weights miss the 'expert' mesh axis.

A 2-D mesh ('data', 'expert') of 2 x 4 devices and 8 experts. Tokens are
batch-sharded over both axes; a top-1 router dispatches them to the experts
(dense one-hot dispatch, no capacity), the dispatched tokens are constrained
to P('expert', None, None) so each device group runs its own experts, and the
outputs are combined back per token.

The bad variant shards the expert weights the way dense tensor-parallel
weights are sharded: ``w_in`` [E, d, f] over 'expert' on its hidden dim f,
and ``w_out`` [E, f, d] not at all (replicated). Every device then holds a
slice of every expert (or every expert whole), and the per-expert matmuls
need collectives around them. The fixed variant shards both on the leading
experts dim, P('expert', None, None): each device holds its 2 experts.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
EXPERTS, TOKENS, D_MODEL, D_FF = 8, 256, 256, 512


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(2, 4), ("data", "expert"))
    tokens = NamedSharding(mesh, P(("data", "expert"), None))
    per_expert = NamedSharding(mesh, P("expert", None, None))
    if args.variant == "fixed":
        w_in_sharding = w_out_sharding = per_expert
    else:
        w_in_sharding = NamedSharding(mesh, P(None, None, "expert"))  # like a dense TP weight
        w_out_sharding = NamedSharding(mesh, P())                     # forgotten: replicated

    x = jax.ShapeDtypeStruct((TOKENS, D_MODEL), jnp.float32, sharding=tokens)
    w_router = jax.ShapeDtypeStruct((D_MODEL, EXPERTS), jnp.float32, sharding=NamedSharding(mesh, P()))
    w_in = jax.ShapeDtypeStruct((EXPERTS, D_MODEL, D_FF), jnp.float32, sharding=w_in_sharding)
    w_out = jax.ShapeDtypeStruct((EXPERTS, D_FF, D_MODEL), jnp.float32, sharding=w_out_sharding)

    def moe(x, w_router, w_in, w_out):
        probs = jax.nn.softmax(x @ w_router, axis=-1)
        choice = jnp.argmax(probs, axis=-1)
        dispatch = jax.nn.one_hot(choice, EXPERTS, dtype=x.dtype)           # [T, E]
        gate = jnp.max(probs, axis=-1, keepdims=True)                        # [T, 1]
        xe = jnp.einsum("te,td->etd", dispatch, x)                           # [E, T, d]
        xe = jax.lax.with_sharding_constraint(xe, per_expert)
        h = jax.nn.gelu(jnp.einsum("etd,edf->etf", xe, w_in))
        ye = jnp.einsum("etf,efd->etd", h, w_out)
        ye = jax.lax.with_sharding_constraint(ye, per_expert)
        return jnp.einsum("etd,te->td", ye, dispatch * gate)

    jax.jit(moe, out_shardings=tokens).lower(x, w_router, w_in, w_out).compile()


if __name__ == "__main__":
    main()
