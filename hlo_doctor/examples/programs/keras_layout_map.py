"""Keras 3 ModelParallel on a keras_hub Gemma backbone: a layout map whose keys miss the FFN layers.

Pattern: Keras' distribution API with `KERAS_BACKEND=jax`: a `DeviceMesh((2, 4),
('batch', 'model'))` over 8 devices (2 hosts x 4, 'model' within a host), a
`LayoutMap` of regex keys over the variable paths, and
`ModelParallel(layout_map=..., batch_dim_name='batch')`. A tiny
`keras_hub.models.GemmaBackbone` (2 layers, hidden 512, 8 heads of 64, FFN
1024, vocab 256; random init, no presets) in a `GemmaCausalLM` trains one
batch (`train_on_batch`, SGD) of 8 sequences of 16 tokens.

- fixed (healthy): a Megatron-style layout over 'model' (data parallel over
  'batch'): the embedding on its vocab dim, q/k/v and the output projection on
  their heads dim, `ffw_gating`/`ffw_gating_2` column- and `ffw_linear`
  row-parallel. Each device computes 4 of the 8 sequences; the tensor-parallel
  all-reduces stay inside a host, the gradients are reduced over 'batch'.
  (keras_hub's own `GemmaBackbone.get_layout_map` also shards the hidden dim of
  every kernel over 'batch'; at this size the partitioner then gathers the
  batch instead of the weights, so it is not used here.)
- bad: the FFN keys are the Llama names (`feedforward_gate_dense`, ...), which
  match no Gemma variable. Keras replicates an unmatched variable silently, so
  the six FFN kernels (f32[512,512], 1 MiB each: keras_hub's Gemma halves
  `intermediate_dim`) are replicated on all 8 devices in the train step and
  every device computes the whole FFN of its 4 sequences, while the attention
  kernels (f32[8,512,64], 1 MiB) are sharded 4 ways over 'model'.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

DEVICES = 8
BATCH, SEQ = 8, 16


def layout_map(mesh, variant):
    layout = keras.distribution.LayoutMap(mesh)
    layout["token_embedding/embeddings"] = ("model", None)
    layout["decoder_block.*attention.*(query|key|value).kernel"] = ("model", None, None)
    layout["decoder_block.*attention_output.kernel"] = ("model", None, None)
    if variant == "fixed":
        layout["decoder_block.*ffw_gating.kernel"] = (None, "model")
        layout["decoder_block.*ffw_gating_2.kernel"] = (None, "model")
        layout["decoder_block.*ffw_linear.kernel"] = ("model", None)
    else:
        layout["decoder_block.*feedforward_gate_dense.kernel"] = (None, "model")
        layout["decoder_block.*feedforward_intermediate_dense.kernel"] = (None, "model")
        layout["decoder_block.*feedforward_output_dense.kernel"] = ("model", None)
    return layout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices=keras.distribution.list_devices())
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map(mesh, args.variant), batch_dim_name="batch"))

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=256, num_layers=2, num_query_heads=8,
                                              num_key_value_heads=8, hidden_dim=512, intermediate_dim=1024,
                                              head_dim=64)
    model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.SGD(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    tokens = np.arange(BATCH * SEQ, dtype="int32").reshape(BATCH, SEQ) % 256
    x = {"token_ids": tokens, "padding_mask": np.ones((BATCH, SEQ), "int32")}
    print(model.train_on_batch(x, np.roll(tokens, -1, axis=1)))
    for variable in backbone.weights:
        print(variable.path, variable.shape, variable.value.sharding.spec)


if __name__ == "__main__":
    main()
