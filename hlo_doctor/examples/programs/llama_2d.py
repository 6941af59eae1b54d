"""Healthy: a llama-like decoder on a 2-D (fsdp, tp) mesh, tensor parallelism done right.

Mesh (4, 2) with axes ('fsdp', 'tp') over 8 devices on one host; 'tp' is the
minor axis, so TP groups are neighbouring devices. Megatron layout: wq/wk/wv
and w_gate/w_up are column-sharded over 'tp', wo and w_down row-sharded, all
weights additionally sharded over 'fsdp' on their other dim; heads and the FFN
dim of activations are sharded over 'tp', the batch over 'fsdp'. Expected:
weight all-gathers over 'fsdp', one all-reduce (or reduce-scatter) over 'tp'
after each attention and MLP block.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import llama_model

DEVICES = 8


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("healthy",), default="healthy")
    parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    cfg = llama_model.CONFIG
    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(4, 2), ("fsdp", "tp"))
    weights = {"norm": P(), "in": P("fsdp", "tp"), "out": P("tp", "fsdp"),
               "embed": P("fsdp", None), "unembed": P("fsdp", "tp")}

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, weights[kind])

    activations = {"table": P(), "residual": P("fsdp", None, None),
                   "heads": P("fsdp", None, "tp", None), "ffn": P("fsdp", None, "tp")}

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
