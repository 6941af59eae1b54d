"""Healthy: a llama-like decoder whose layers are stacked and run under lax.scan, FSDP.

A 1-D mesh ('fsdp',) of 4 devices. Layer weights carry a leading layer dim
(unsharded) and are sharded over 'fsdp' on their next dim; the scan body
all-gathers one layer's weights per iteration (the all-gathers sit inside the
while loop's body in the partitioned HLO).
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
        if kind == "norm":
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, P(None, "fsdp", None) if stacked else P("fsdp", None))

    activations = {"table": P(), "residual": P("fsdp", None, None),
                   "heads": P("fsdp", None, None, None), "ffn": P("fsdp", None, None)}

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activations[kind]))

    params = llama_model.abstract_params(cfg, sharding_for, stacked=True)
    tokens = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32,
                                  sharding=NamedSharding(mesh, P("fsdp", None)))

    def model(params, tokens):
        return llama_model.forward(params, tokens, cfg, constrain, scan=True)

    jax.jit(model).lower(params, tokens).compile()


if __name__ == "__main__":
    main()
