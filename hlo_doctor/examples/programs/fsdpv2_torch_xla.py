"""Healthy: the seed's MLP trained with torch_xla's FSDPv2 (SpmdFullyShardedDataParallel).

This is what the PyTorch/XLA engineers recommended in pytorch/xla#6778: FSDPv2
on a mesh with an 'fsdp' axis, each layer wrapped (as an auto-wrap policy
does for decoder layers) with its output sharded on the batch. Every weight
is sharded over 'fsdp' and all-gathered for its layer; the activations (and
their gradients) stay batch-sharded. One training step (forward, loss,
backward, SGD update) on 4 CPU devices.
"""

import argparse

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

DEVICES = 4


class MLP(torch.nn.Module):
    def __init__(self, wrap):
        super().__init__()
        self.fc1 = wrap(torch.nn.Linear(1280, 960))
        self.fc2 = wrap(torch.nn.Linear(960, 128))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("healthy",), default="healthy")
    parser.parse_args(argv)

    xr.use_spmd()
    if xr.global_runtime_device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = xs.Mesh(np.arange(DEVICES), (DEVICES, 1), ("fsdp", "model"))

    def shard_output(output, mesh):
        xs.mark_sharding(output, mesh, ("fsdp", None))

    device = xm.xla_device()

    def wrap(layer):
        return FSDPv2(layer.to(device), mesh=mesh, shard_output=shard_output)

    model = wrap(MLP(wrap))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(160, 1280).to(device)
    xs.mark_sharding(x, mesh, ("fsdp", None))
    target = torch.randn(160, 128).to(device)

    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    print(float(loss.detach().cpu()))


if __name__ == "__main__":
    main()
