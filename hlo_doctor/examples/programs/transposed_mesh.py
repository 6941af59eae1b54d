"""Tensor-parallel MLP on a transposed device mesh: logical ids are not device ids.

8 devices on 2 hosts of 4 (devices 0-3 and 4-7). The bad variant builds the
mesh as np.array(jax.devices()).reshape(2, 4).T with axes ('dp', 'tp'), so the
mesh row ['dp'=i] holds devices (i, i+4). JAX compiles with the device
assignment [0, 4, 1, 5, 2, 6, 3, 7] (the mesh's devices, flattened), and the
HLO names partitions, not devices: the TP all-reduce's replica groups are
{0,1}, {2,3}, ... in partition ids, which run on devices {0,4}, {1,5}, ...:
every TP group spans both hosts although its ids look adjacent. The fixed
variant uses reshape(4, 2): the same partition ids, now devices {0,1}, {2,3}.
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

    devices = np.array(jax.devices()[:DEVICES])
    if args.variant == "bad":
        mesh = Mesh(devices.reshape(2, 4).T, ("dp", "tp"))
    else:
        mesh = Mesh(devices.reshape(4, 2), ("dp", "tp"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    x = jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=spec("dp", None))
    w1 = jax.ShapeDtypeStruct((512, 2048), jnp.float32, sharding=spec(None, "tp"))
    w2 = jax.ShapeDtypeStruct((2048, 512), jnp.float32, sharding=spec("tp", None))

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    jax.jit(mlp, out_shardings=spec("dp", None)).lower(x, w1, w2).compile()


if __name__ == "__main__":
    main()
