"""Data-parallel MLP whose hidden activation is marked to shard its feature dim (torch_xla).

A 1-D mesh ('data',) of 4 devices; the batch of x is marked over 'data' and the
weights are left replicated, so the whole MLP should run without communication.
The bad variant marks the hidden activation (None, 'data'): the batch is
replicated and the feature dim sharded. Propagation keeps the first layer
batch-sharded and turns the mark into a reshard (an all-to-all); the second
layer contracts the sharded features and sums partial products across the
devices. The fixed variant marks it (('data',), None): batch-sharded, as it
arrives.
"""

import argparse

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

DEVICES = 4


class MLP(torch.nn.Module):
    def __init__(self, fixed: bool, mesh):
        super().__init__()
        self.fc1 = torch.nn.Linear(512, 1024)
        self.fc2 = torch.nn.Linear(1024, 512)
        self.fixed = fixed
        self.mesh = mesh

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc1(x))
        if self.fixed:
            xs.mark_sharding(h, self.mesh, ("data", None))
        else:
            xs.mark_sharding(h, self.mesh, (None, "data"))
        return self.fc2(h)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)

    xr.use_spmd()
    if xr.global_runtime_device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = xs.Mesh(np.arange(DEVICES), (DEVICES,), ("data",))

    device = xm.xla_device()
    model = MLP(args.variant == "fixed", mesh).to(device)
    x = torch.randn(256, 512).to(device)
    xs.mark_sharding(x, mesh, ("data", None))

    y = model(x)
    torch_xla.sync()
    print(tuple(y.shape))


if __name__ == "__main__":
    main()
