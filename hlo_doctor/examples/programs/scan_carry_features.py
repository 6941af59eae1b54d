"""FSDP eval step under lax.scan whose carry takes the weights' d_model split instead of the batch.

8 devices on 2 hosts of 4, mesh ('replica'=4, 'dp'=2). An MLP stack scanned
over its layers (the residual stream is the carry); every weight sharded over
'dp' on d_model (FSDP), the tokens over ('replica', 'dp'). bad: nothing pins
the carry, and propagation takes its layout from the body's weights: the batch
over 'replica' only and d_model over 'dp', so each device holds twice its rows
and every matmul contracts the split d_model as partial sums all-reduced over
'dp' (no weight is gathered). fixed: the body constrains the carry to the
tokens' batch sharding, so the weights are all-gathered over 'dp' instead.
Both variants constrain the tied head's logits to the batch (the table is
split on its vocab over 'dp').
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8
LAYERS, BATCH, SEQ, D, F, VOCAB = 4, 64, 64, 256, 1024, 2048


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices-per-host", type=int)  # recorded by the runner; unused
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(4, 2), ("replica", "dp"))

    def placed(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    params = {
        "embed": placed((VOCAB, D), P("dp", None)),
        "w_in": placed((LAYERS, D, F), P(None, "dp", None)),
        "w_out": placed((LAYERS, F, D), P(None, None, "dp")),
    }
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32, sharding=NamedSharding(mesh, P(("replica", "dp"), None)))

    def layer(h, weights):
        if args.variant == "fixed":
            h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(("replica", "dp"), None, None)))
        w_in, w_out = weights
        return h + jax.nn.gelu(h @ w_in) @ w_out, None

    def eval_step(params, tokens):
        h = params["embed"][tokens]
        h, _ = jax.lax.scan(layer, h, (params["w_in"], params["w_out"]))
        rows = NamedSharding(mesh, P(("replica", "dp"), None, None))
        logits = jax.lax.with_sharding_constraint(h @ params["embed"].T, rows)
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1))

    jax.jit(eval_step).lower(params, tokens).compile()


if __name__ == "__main__":
    main()
