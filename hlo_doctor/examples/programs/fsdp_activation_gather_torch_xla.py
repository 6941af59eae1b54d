"""FSDP MLP whose activations get all-gathered: the PyTorch/XLA report (pytorch/xla#6778).

Two nn.Linear layers, weights sharded ('fsdp', None) on a (4, 1) mesh with axes
('fsdp', 'replica'); the input batch sharded (('fsdp', 'replica'), None). The
partitioner follows the weights and all-gathers the activations. The fixed
variant marks the hidden activation batch-sharded after the first layer.
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
        self.fc1 = torch.nn.Linear(1280, 960)
        self.fc2 = torch.nn.Linear(960, 128)
        self.fixed = fixed
        self.mesh = mesh

    def forward(self, x):
        h = self.fc1(x)
        if self.fixed:
            xs.mark_sharding(h, self.mesh, (("fsdp", "replica"), None))
        return self.fc2(h)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)

    xr.use_spmd()
    if xr.global_runtime_device_count() < DEVICES:
        raise SystemExit(
            f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = xs.Mesh(np.arange(DEVICES), (4, 1), ("fsdp", "replica"))

    device = xm.xla_device()
    model = MLP(args.variant == "fixed", mesh).to(device)
    xs.mark_sharding(model.fc1.weight, mesh, ("fsdp", None))
    xs.mark_sharding(model.fc2.weight, mesh, ("fsdp", None))
    x = torch.randn(160, 1280).to(device)
    xs.mark_sharding(x, mesh, (("fsdp", "replica"), None))

    y = model(x)
    torch_xla.sync()
    print(tuple(y.shape))


if __name__ == "__main__":
    main()
