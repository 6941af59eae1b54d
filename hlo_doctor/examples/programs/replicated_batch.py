"""A 2-D mesh whose batch is split over one axis only: the other axis repeats the work.

8 devices on 2 hosts of 4, mesh ('data'=2, 'fsdp'=4). A llama-like decoder
with every weight sharded over 'fsdp' (FSDP) and the tokens sharded over
'fsdp' only (P('fsdp', None)): the devices along 'data' (one on each host)
hold the same tokens, so every matmul runs twice, once per 'data' row of the
mesh, while the program still gathers the weights over 'fsdp'. The fixed
variant shards the tokens and the residual stream over both axes,
P(('data', 'fsdp'), None), so each device computes 1/8 of the batch.
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
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    parser.add_argument("--devices-per-host", type=int)  # recorded by the runner; unused
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")

    cfg = dict(llama_model.CONFIG, batch=16)
    mesh = Mesh(np.array(jax.devices()[:DEVICES]).reshape(2, 4), ("data", "fsdp"))
    batch = "fsdp" if args.variant == "bad" else ("data", "fsdp")

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, P() if kind == "norm" else P("fsdp", None))

    activations = {"table": P(), "residual": P(batch, None, None),
                   "heads": P(batch, None, None, None), "ffn": P(batch, None, None)}

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activations[kind]))

    params = llama_model.abstract_params(cfg, sharding_for)
    tokens = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32, sharding=NamedSharding(mesh, P(batch, None)))

    def model(params, tokens):
        return llama_model.forward(params, tokens, cfg, constrain)

    jax.jit(model).lower(params, tokens).compile()


if __name__ == "__main__":
    main()
