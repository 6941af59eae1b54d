"""Tensor-parallel MLP whose TP groups cross a host boundary.

8 devices on 2 hosts of 4 (devices 0-3 and 4-7). Megatron MLP: w1 column-sharded
and w2 row-sharded over 'tp', batch over 'dp', one all-reduce over 'tp' per MLP.
The bad variant builds the mesh as np.arange(8).reshape(2, 4) with axes
('tp', 'dp'): 'tp' is the major axis, so its groups are {0,4}, {1,5}, {2,6},
{3,7} and every TP all-reduce crosses hosts. The fixed variant uses
reshape(4, 2) with axes ('dp', 'tp'): TP groups {0,1}, {2,3}, ... stay in a host.

`--devices N` generalizes it (bad: reshape(2, N/2) as ('tp', 'dp'); fixed:
reshape(N/2, 2) as ('dp', 'tp')); on 2 hosts of 8 H100s:
`hlo-doctor run --example cross-host-tp --target h100:2x8` (TP groups {i, i+8}).
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
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--devices-per-host", type=int)  # set by --target; unused
    args = parser.parse_args(argv)
    n = args.devices
    if jax.device_count() < n:
        raise SystemExit(f"needs {n} devices; run it through `hlo-doctor run --devices {n}`")

    devices = np.array(jax.devices()[:n])
    if args.variant == "bad":
        mesh = Mesh(devices.reshape(2, n // 2), ("tp", "dp"))
    else:
        mesh = Mesh(devices.reshape(n // 2, 2), ("dp", "tp"))

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
