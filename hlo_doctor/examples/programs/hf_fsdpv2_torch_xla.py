"""Hugging Face Llama under torch_xla FSDPv2 on a 2-D mesh: the default shard_output vs a custom one.

Pattern: `SpmdFullyShardedDataParallel` on a mesh (2, 8) ('replica', 'fsdp')
(2 hosts x 8 devices), each decoder layer wrapped, then the model. A tiny random-initialised
`LlamaForCausalLM` (2 layers, hidden 64, vocab 256, no downloads) trains one step
(forward, loss, backward, SGD step) on 16 CPU devices.

- bad: the decoder layers use FSDPv2's default shard_output (`('fsdp', None,
  None)` on the hidden states); the model's is the one Hugging Face's Trainer
  uses for `CausalLMOutputWithPast` (the logits on `('fsdp', None, None)`); the
  inputs on `('fsdp', None)`, as the Trainer's FSDPv2 loader does. Every
  output is sharded over 'fsdp' only: the 16 sequences are split 8 ways, and the
  two devices along 'replica' (one on each host) compute the same 2 sequences
  (32 token rows per device, where 16 would do).
- fixed: a custom shard_output over the combined axes, `(('replica', 'fsdp'),
  None, None)`, on every wrapper, and the inputs on `(('replica', 'fsdp'), None)`: every device
  computes its own sequence (16 token rows).
In both, FSDPv2 shards every parameter over 'fsdp' on its largest dim (so each
is replicated over 'replica'), all-gathers it over 'fsdp' for its layer, and the
gradients are all-reduced.
"""

import argparse

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

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
    mesh = xs.Mesh(np.arange(DEVICES), (2, DEVICES // 2), ("replica", "fsdp"))
    batch_axes = "fsdp" if args.variant == "bad" else ("replica", "fsdp")

    def shard_output(output, mesh):
        real_output = output.logits if isinstance(output, CausalLMOutputWithPast) else output
        if isinstance(real_output, tuple):
            real_output = real_output[0]
        xs.mark_sharding(real_output, mesh, (batch_axes, None, None))

    device = xm.xla_device()
    model = tiny_llama().to(device)
    layer_output = None if args.variant == "bad" else shard_output  # None: FSDPv2's default
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = FSDPv2(layer, mesh=mesh, shard_output=layer_output)
    model = FSDPv2(model, mesh=mesh, shard_output=shard_output)
    input_ids = torch.randint(0, 256, (BATCH, SEQ)).to(device)
    labels = input_ids.clone()
    xs.mark_sharding(input_ids, mesh, (batch_axes, None))
    xs.mark_sharding(labels, mesh, (batch_axes, None))

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss = model(input_ids=input_ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    print(float(loss.detach().cpu()))


if __name__ == "__main__":
    main()
