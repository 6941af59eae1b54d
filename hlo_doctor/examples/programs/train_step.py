"""Healthy: one FSDP training step of the llama-like decoder (value_and_grad + SGD).

A 1-D mesh ('fsdp',) of 4 devices, parameters sharded over 'fsdp' on their
first dim and the updated parameters returned with the same sharding. Expected:
weight all-gathers in the forward and backward passes, and gradients reduced
across the batch with reduce-scatters (or all-reduces) back to the parameter
sharding.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import llama_model

DEVICES = 4
LEARNING_RATE = 1e-2


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
    batch = NamedSharding(mesh, P("fsdp", None))
    tokens = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32, sharding=batch)
    targets = jax.ShapeDtypeStruct((cfg["batch"], cfg["seq"]), jnp.int32, sharding=batch)

    def train_step(params, tokens, targets):
        loss, grads = jax.value_and_grad(llama_model.loss_fn)(
            params, tokens, targets, cfg, constrain)
        params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return params, loss

    param_shardings = jax.tree.map(lambda p: p.sharding, params)
    step = jax.jit(train_step, out_shardings=(param_shardings, NamedSharding(mesh, P())),
                   donate_argnums=0)
    step.lower(params, tokens, targets).compile()


if __name__ == "__main__":
    main()
