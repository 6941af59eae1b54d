"""Hugging Face Llama under torch_xla SPMD: the seed's per-parameter strategy vs the expert's fix.

Pattern: every parameter marked on dim 0 of a 1-D mesh over all devices, the
inputs left unmarked. A tiny random-initialised `LlamaForCausalLM` (2 layers,
hidden 64, vocab 256, no downloads) trains one step (forward, loss, backward,
SGD step) on 16 CPU devices, treated as 2 hosts x 8.

- bad: mesh `xs.Mesh(range(16), (16,), ('fsdp',))`, every parameter marked
  `('fsdp', None, ...)` on dim 0, input_ids/labels not marked. HF `Linear`
  weights are `[out, in]`, so dim 0 is the output feature: each projection is
  column-parallel, and in the partitioned HLO every per-device dot has the whole
  batch (16 x 16 = 256 token rows): the batch is replicated over all 16 devices,
  the activations are sharded on their feature dims and all-gathered back for
  every next projection (all 16 devices, across both hosts).
- fixed: the expert's 2-D mesh `(2, 8)` `('replica', 'fsdp')`, the parameters on
  'fsdp' (dim 0), input_ids and labels on `(('replica', 'fsdp'), None)`: every
  device computes 1 of the 16 sequences (16 token rows), weights are all-gathered
  over 'fsdp' (within a host) and gradients all-reduced over all 16.
"""

import argparse

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from transformers import LlamaConfig, LlamaForCausalLM

DEVICES = 16
BATCH, SEQ = 16, 16


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ,
                         tie_word_embeddings=False, attn_implementation="eager")
    return LlamaForCausalLM(config)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)

    xr.use_spmd()
    if xr.global_runtime_device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    device = xm.xla_device()
    model = tiny_llama().to(device)
    input_ids = torch.randint(0, 256, (BATCH, SEQ)).to(device)
    labels = input_ids.clone()

    if args.variant == "bad":
        mesh = xs.Mesh(np.arange(DEVICES), (DEVICES,), ("fsdp",))
        for param in model.parameters():
            xs.mark_sharding(param, mesh, ("fsdp",) + (None,) * (param.dim() - 1))
    else:
        mesh = xs.Mesh(np.arange(DEVICES), (2, DEVICES // 2), ("replica", "fsdp"))
        for param in model.parameters():
            xs.mark_sharding(param, mesh, ("fsdp",) + (None,) * (param.dim() - 1))
        xs.mark_sharding(input_ids, mesh, (("replica", "fsdp"), None))
        xs.mark_sharding(labels, mesh, (("replica", "fsdp"), None))

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(input_ids=input_ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    print(float(loss.detach().cpu()))


if __name__ == "__main__":
    main()
