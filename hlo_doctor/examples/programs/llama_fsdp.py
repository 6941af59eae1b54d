"""Healthy: a llama-like decoder with fully sharded data parallelism (FSDP).

A 1-D mesh ('fsdp',) of 4 devices. Every weight matrix is sharded over 'fsdp'
on its first dim, norms are replicated, the batch is sharded over 'fsdp' and
the residual stream is constrained to stay batch-sharded. Expected in the
partitioned HLO: one all-gather per weight, no activation collectives.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import llama_model

DEVICES = 4


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("healthy",), default="healthy")
    parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    cfg = llama_model.CONFIG
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("fsdp",))

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, P() if kind == "norm" else P("fsdp", None))

    activations = {"table": P(), "residual": P("fsdp", None, None),
                   "heads": P("fsdp", None, None, None), "ffn": P("fsdp", None, None)}

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activations[kind]))

    params = llama_model.abstract_params(cfg, sharding_for)
    tokens = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32,
                                  sharding=NamedSharding(mesh, P("fsdp", None)))

    def model(params, tokens):
        return llama_model.forward(params, tokens, cfg, constrain)

    jax.jit(model).lower(params, tokens).compile()


if __name__ == "__main__":
    main()
