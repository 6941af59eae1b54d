"""FSDPv2 with a data axis, the input marked with the batch axes in the other order.

torch_xla's FSDPv2 wrapper with ``extra_data_axis='data'`` marks every wrapped
module's output ``(('data', 'fsdp'), None)``: the batch over both axes, 'data'
major. The bad variant marks the input ``(('fsdp', 'data'), None)``: the same
split in another device order, so each device holds another device's rows and
the partitioner permutes the input (and its use in the backward pass) into the
outputs' order. The fixed variant marks it ``(('data', 'fsdp'), None)``.
Mesh ('data'=2, 'fsdp'=4) on 8 devices, one training step (forward, loss,
backward, SGD update) of a 3-layer MLP.
"""

import argparse

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

DEVICES = 8


class MLP(torch.nn.Module):
    def __init__(self, wrap):
        super().__init__()
        self.fc1 = wrap(torch.nn.Linear(512, 1024))
        self.fc2 = wrap(torch.nn.Linear(1024, 1024))
        self.fc3 = wrap(torch.nn.Linear(1024, 256))

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)

    xr.use_spmd()
    if xr.global_runtime_device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = xs.Mesh(np.arange(DEVICES), (2, 4), ("data", "fsdp"))
    device = xm.xla_device()

    def wrap(layer):
        return FSDPv2(layer.to(device), mesh=mesh, extra_data_axis="data")

    model = wrap(MLP(wrap))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512).to(device)
    if args.variant == "bad":
        xs.mark_sharding(x, mesh, (("fsdp", "data"), None))  # the batch axes in the other order
    else:
        xs.mark_sharding(x, mesh, (("data", "fsdp"), None))
    target = torch.randn(256, 256).to(device)

    loss = torch.nn.functional.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    print(float(loss.detach().cpu()))


if __name__ == "__main__":
    main()
