"""Keras 3 ModelParallel on a keras_hub Gemma backbone: a DeviceMesh whose model axis spans hosts.

Pattern: Keras' distribution API with `KERAS_BACKEND=jax` on 8 devices (2 hosts
x 4: devices 0-3 and 4-7), a Megatron-style `LayoutMap` over 'model' (the
embedding on its vocab dim, q/k/v/output projections on their heads dim, the FFN
column- then row-parallel), and
`ModelParallel(layout_map=..., batch_dim_name='batch')`. A tiny
`keras_hub.models.GemmaBackbone` (2 layers, hidden 512, 8 heads of 64, FFN
1024, vocab 256; random init, no presets) in a `GemmaCausalLM` trains one
batch (`train_on_batch`, SGD) of 8 sequences of 16 tokens.

- bad: `DeviceMesh((4, 2), ('model', 'batch'))`: the first (major) mesh axis
  is 'model', so a 'model' group is devices {0, 2, 4, 6} (or {1, 3, 5, 7}),
  two on each host: every tensor-parallel collective of the attention and FFN
  (the activation all-reduces and gathers over 'model') crosses the hosts.
- fixed: `DeviceMesh((2, 4), ('batch', 'model'))`: a 'model' group is one host
  ({0, 1, 2, 3} or {4, 5, 6, 7}); only the 'batch' (data-parallel) gradient
  reduction crosses the hosts.
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


def layout_map(mesh):
    layout = keras.distribution.LayoutMap(mesh)
    layout["token_embedding/embeddings"] = ("model", None)
    layout["decoder_block.*attention.*(query|key|value).kernel"] = ("model", None, None)
    layout["decoder_block.*attention_output.kernel"] = ("model", None, None)
    layout["decoder_block.*ffw_gating.kernel"] = (None, "model")
    layout["decoder_block.*ffw_gating_2.kernel"] = (None, "model")
    layout["decoder_block.*ffw_linear.kernel"] = ("model", None)
    return layout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("bad", "fixed"), default="bad")
    args = parser.parse_args(argv)
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices; run it through `hlo-doctor run --devices {DEVICES}`")
    devices = keras.distribution.list_devices()
    if args.variant == "bad":
        mesh = keras.distribution.DeviceMesh((4, 2), ("model", "batch"), devices=devices)
    else:
        mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices=devices)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch"))

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
