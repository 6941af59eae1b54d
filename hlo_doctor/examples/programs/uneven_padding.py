"""A vocabulary dim that does not divide by the shard count.

Tied-embedding logits on a 1-D mesh ('model',) of 8 devices: the logits are
constrained to shard the vocabulary over 'model' (vocab-parallel cross
entropy). The bad variant uses GPT-2's vocabulary of 50257, which is not
divisible by 8: each shard holds 6283 columns (50264 in all, 7 of them padding)
and the partitioned program pads, slices and masks the padding around the
sharded ops. The fixed variant pads the vocabulary to 50304 (a multiple of 64,
as nanoGPT does), which divides evenly.

JAX refuses uneven shardings on jit arguments, so the uneven dim appears on an
intermediate here; torch_xla and GSPMD pad arguments too.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICES = 8


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    vocab = 50257 if args.variant == "bad" else 50304
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("model",))
    replicated = NamedSharding(mesh, P())
    vocab_sharded = NamedSharding(mesh, P(None, "model"))

    x = jax.ShapeDtypeStruct((32, 256), jnp.float32, sharding=replicated)
    embedding = jax.ShapeDtypeStruct((vocab, 256), jnp.float32, sharding=replicated)
    targets = jax.ShapeDtypeStruct((32,), jnp.int32, sharding=replicated)

    def loss(x, embedding, targets):
        logits = jax.lax.with_sharding_constraint(x @ embedding.T, vocab_sharded)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.take_along_axis(logp, targets[:, None], axis=-1).mean()

    jax.jit(loss).lower(x, embedding, targets).compile()


if __name__ == "__main__":
    main()
