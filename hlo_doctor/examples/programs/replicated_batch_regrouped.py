"""A batch split over both mesh axes, then regrouped off one of them by the layers' output constraint.

8 devices on 2 hosts of 4, mesh ('data'=2, 'fsdp'=4). A llama-like decoder
(2 layers) with every weight sharded over 'fsdp' (FSDP) and the tokens split
over both axes, P(('data', 'fsdp'), None); the embeddings are pinned to the
same split, so the first layer runs on 2 of the 16 rows per device. Like
torch_xla FSDPv2's default ``shard_output``, the program then constrains each
layer's output, and writes that spec with 'fsdp' alone, P('fsdp', None, None):
from the first layer's output on, the two devices along 'data' (one on each
host) hold the same 4 rows, so every matmul after it runs twice, once per
'data' row of the mesh. The fixed variant constrains the layers' outputs over
both axes, P(('data', 'fsdp'), None, None), like the tokens.
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
    layer_output = P("fsdp", None, None) if args.variant == "bad" else P(("data", "fsdp"), None, None)

    def sharding_for(kind, stacked):
        return NamedSharding(mesh, P() if kind == "norm" else P("fsdp", None))

    def within_layer(x, kind):
        return x  # only the layers' outputs are constrained (as FSDPv2's shard_output does)

    params = llama_model.abstract_params(cfg, sharding_for)
    tokens = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32,
                                  sharding=NamedSharding(mesh, P(("data", "fsdp"), None)))

    def model(params, tokens):
        table = jax.lax.with_sharding_constraint(params["embed"], NamedSharding(mesh, P()))
        embedded = NamedSharding(mesh, P(("data", "fsdp"), None, None))  # the tokens' split
        x = jax.lax.with_sharding_constraint(table[tokens], embedded)
        for p in params["layers"]:
            x = llama_model.block(x, p, cfg, within_layer)
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, layer_output))
        return llama_model.rms_norm(x, params["final_norm"]) @ params["unembed"]

    jax.jit(model).lower(params, tokens).compile()


if __name__ == "__main__":
    main()
