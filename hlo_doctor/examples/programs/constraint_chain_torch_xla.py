"""A training step whose sharding marks move one activation through four layouts in a row (torch_xla).

A 1-D mesh ('data',) of 4 devices, a batch marked over 'data' and replicated
weights: a data-parallel step that needs no activation traffic in its forward
pass. The bad variant marks the first layer's output four times in a row,
through the program's own helper ``constrain`` (a mark on each new value, as
torch_xla takes one mark per tensor): rows (the batch), then the sequence,
then the features, then the sequence again. Each new layout is a reshard with
only elementwise ops between. The fixed variant marks the rows on every line.
"""

import argparse

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

DEVICES = 4
BATCH, SEQ, HIDDEN, FFN = 16, 64, 256, 1024


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(HIDDEN, FFN)
        self.fc2 = torch.nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Model(torch.nn.Module):
    def __init__(self, bad: bool, mesh):
        super().__init__()
        self.first = Block()
        self.second = Block()
        self.bad = bad
        self.mesh = mesh

    def constrain(self, x, *spec):
        xs.mark_sharding(x, self.mesh, spec)
        return x

    def forward(self, x):
        rows = ("data", None, None)
        h = self.first(x)
        h = self.constrain(torch.tanh(h), "data", None, None)
        h = self.constrain(h * 0.5, None, "data", None) if self.bad else self.constrain(h * 0.5, *rows)
        h = self.constrain(h + 1.0, None, None, "data") if self.bad else self.constrain(h + 1.0, *rows)
        h = self.constrain(h * 2.0, None, "data", None) if self.bad else self.constrain(h * 2.0, *rows)
        return self.second(h)


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
    model = Model(args.variant == "bad", mesh).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, SEQ, HIDDEN).to(device)
    y = torch.randn(BATCH, SEQ, HIDDEN).to(device)
    xs.mark_sharding(x, mesh, ("data", None, None))
    xs.mark_sharding(y, mesh, ("data", None, None))

    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    print(float(loss.cpu()))


if __name__ == "__main__":
    main()
