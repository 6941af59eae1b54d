"""FSDP llama train step on 2 hosts of 8 H100s, with and without async collectives.

Written as an ordinary training script: a mesh over jax.devices(), parameters
put on it with jax.device_put, a jitted train step called in a loop. Run it
through `hlo-doctor run --example sync-collective --variant bad` (or
`--target h100:2x8 -- python sync_collective.py`): the runner compiles each
jitted call for the GPU cluster instead of running it.

The bad variant is compiled with
--xla_gpu_disable_async_collectives=allgather,reducescatter,allreduce (the
registry passes the flag): every all-gather, reduce-scatter and all-reduce
becomes a start/done pair marked "is_sync":true with nothing scheduled between
them, so no communication overlaps compute. The fixed variant keeps XLA's
default: async collectives placed by the latency-hiding scheduler.
"""

import argparse

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import llama_model

DEVICES = 16
LEARNING_RATE = 1e-2
STEPS = 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--devices-per-host", type=int)  # set by --target; unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --target h100:2x8`")

    cfg = dict(llama_model.CONFIG, batch=n, layers=1)
    mesh = Mesh(np.array(jax.devices()[:n]), ("fsdp",))

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, P() if kind == "norm" else P("fsdp", None))

    activations = {"table": P(), "residual": P("fsdp", None, None),
                   "heads": P("fsdp", None, None, None), "ffn": P("fsdp", None, None)}

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activations[kind]))

    shapes = llama_model.abstract_params(cfg, sharding_for)
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: jax.device_put(rng.normal(0, 0.02, s.shape).astype(np.float32), s.sharding),
        shapes)
    batch = NamedSharding(mesh, P("fsdp", None))
    tokens = jax.device_put(rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"]),
                                         dtype=np.int32), batch)
    targets = jax.device_put(np.roll(np.asarray(rng.integers(0, cfg["vocab"], (
        cfg["batch"], cfg["seq"]), dtype=np.int32)), 1, axis=1), batch)

    @jax.jit
    def train_step(params, tokens, targets):
        loss, grads = jax.value_and_grad(llama_model.loss_fn)(
            params, tokens, targets, cfg, constrain)
        params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return params, loss

    for step in range(STEPS):
        params, loss = train_step(params, tokens, targets)
        print(f"step {step}: loss {loss.shape} {loss.dtype}")


if __name__ == "__main__":
    main()
