"""Which examples exist, which frameworks and variants each has, and how many devices it needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hlo_doctor.errors import ConfigurationError

PROGRAMS = Path(__file__).parent / "programs"
PAIR = ("bad", "fixed")
HEALTHY = ("healthy",)


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    description: str
    variants: tuple[str, ...]
    devices: int
    devices_per_host: int | None = None
    # framework -> script file name under programs/
    scripts: dict[str, str] = field(default_factory=dict)
    reference: str | None = None
    # GPU/TPU targets it compiles for deviceless (`--target`), the first is the default;
    # the script gets `--devices N` (and `--devices-per-host H`) for the target's shape.
    targets: tuple[str, ...] = ()
    # Only meaningful on a GPU target: a run without --target uses targets[0].
    target_only: bool = False
    # variant -> extra XLA flags for that variant's compile ({"xla_name": "value"}).
    variant_xla_flags: dict[str, dict[str, str]] = field(default_factory=dict)
    # The pyproject extra its third-party libraries come from (transformers, flax, keras), if any.
    extra: str | None = None

    @property
    def frameworks(self) -> tuple[str, ...]:
        return tuple(self.scripts)

    def script(self, framework: str) -> Path:
        try:
            return PROGRAMS / self.scripts[framework]
        except KeyError:
            raise ConfigurationError(
                f"example {self.name!r} has no {framework} version "
                f"(it has: {', '.join(self.frameworks)})"
            ) from None


def _jax(stem: str) -> dict[str, str]:
    return {"jax": f"{stem}.py"}


EXAMPLES: tuple[Example, ...] = (
    Example(
        "fsdp-activation-gather",
        "FSDP MLP where propagation follows the weights and all-gathers the activations",
        PAIR, devices=4,
        scripts={"jax": "fsdp_activation_gather.py",
                 "torch_xla": "fsdp_activation_gather_torch_xla.py"},
        reference="https://github.com/pytorch/xla/issues/6778",
        # the issue's own hardware (2 hosts of 8 A100s), then two small TPU slices
        targets=("a100:2x8", "v5e:4x4", "v4:2x2x1"),
    ),
    Example(
        "non-batch-dim-sharding",
        "data-parallel MLP whose hidden activation is constrained to shard its feature dim",
        PAIR, devices=4, scripts={"jax": "non_batch_dim_sharding.py",
                                  "torch_xla": "non_batch_dim_sharding_torch_xla.py"},
    ),
    Example(
        "cross-host-tp",
        "tensor-parallel MLP whose TP groups span two hosts of 4 devices (fixed: TP within a host)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("cross_host_tp"),
        # on TPU: one v5e slice (TP across hosts rides ICI: fine), and two slices where the
        # bad mesh puts 'tp' across the slices (DCN) and the fixed one puts 'dp' there
        targets=("h100:2x8", "v5e:4x4", "v5e:4x4x2slices"),
    ),
    Example(
        "sync-collective",
        "FSDP llama train step on 2x8 H100s compiled with async collectives disabled "
        "(fixed: XLA's default async collectives)",
        PAIR, devices=16, devices_per_host=8, scripts=_jax("sync_collective"),
        targets=("h100:2x8",), target_only=True,
        variant_xla_flags={"bad": {
            "xla_gpu_disable_async_collectives": "allgather,reducescatter,allreduce"}},
    ),
    Example(
        "tpu-v4-llama",
        "the seed's TPU v4 job: 2-layer llama train step on 128 chips (32 hosts), mesh "
        "(32 data, 4 model), activations bf16[8,767,4096] split 4 ways (fixed: 128-way FSDP)",
        PAIR, devices=128, scripts=_jax("tpu_v4_llama"),
        targets=("v4:4x4x8",), target_only=True,
    ),
    Example(
        "transposed-mesh",
        "TP MLP on mesh reshape(2,4).T: partition ids {0,1} run on devices {0,4}, across hosts of 4",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("transposed_mesh"),
    ),
    Example(
        "replicated-large-param",
        "FSDP model whose largest weight (the unembedding) is left replicated",
        PAIR, devices=4, scripts=_jax("replicated_large_param"),
    ),
    Example(
        "reshard-churn",
        "sharding constraints that alternate batch and feature sharding layer by layer",
        PAIR, devices=4, scripts=_jax("reshard_churn"),
    ),
    Example(
        "constraint-chain",
        "a training step whose constraints move one activation through four layouts in a row (rows, sequence, "
        "features, sequence), through a helper the program calls from each line",
        PAIR, devices=4, scripts={"jax": "constraint_chain.py", "torch_xla": "constraint_chain_torch_xla.py"},
    ),
    Example(
        "uneven-padding",
        "vocabulary of 50257 sharded 8 ways, padded on every shard (fixed: 50304)",
        PAIR, devices=8, scripts=_jax("uneven_padding"),
    ),
    Example(
        "replicated-batch",
        "2-D mesh ('data', 'fsdp') whose tokens are split over 'fsdp' only: the 'data' axis repeats the work",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("replicated_batch"),
        reference="https://github.com/pytorch/xla/issues/6778",
    ),
    Example(
        "replicated-batch-regrouped",
        "tokens split over ('data', 'fsdp'), each layer's output constrained to 'fsdp' alone: "
        "after the first layer the 'data' axis repeats the work",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("replicated_batch_regrouped"),
    ),
    Example(
        "llama-fsdp",
        "healthy: llama-like decoder, parameters and batch sharded over one FSDP axis",
        HEALTHY, devices=4, scripts=_jax("llama_fsdp"),
    ),
    Example(
        "fsdpv2-torch-xla",
        "healthy: the seed's MLP trained with torch_xla's FSDPv2 wrapper (the report's recommended fix)",
        HEALTHY, devices=4, scripts={"torch_xla": "fsdpv2_torch_xla.py"},
        reference="https://github.com/pytorch/xla/issues/6778",
    ),
    Example(
        "llama-2d",
        "healthy: llama-like decoder on a (fsdp=4, tp=2) mesh, Megatron-style tensor parallelism",
        HEALTHY, devices=8, devices_per_host=8, scripts=_jax("llama_2d"),
    ),
    Example(
        "llama-scan",
        "healthy: llama-like decoder with stacked layers under lax.scan, FSDP",
        HEALTHY, devices=4, scripts=_jax("llama_scan"),
    ),
    Example(
        "train-step",
        "healthy: FSDP training step (value_and_grad + SGD), gradient reduce-scatters",
        HEALTHY, devices=4, scripts=_jax("train_step"),
    ),
    Example(
        "moe-expert-parallel",
        "healthy: top-1 MoE MLP train step, experts sharded over 'expert', tokens dispatched "
        "with all-to-all (GShard einsums at jit level and shard_map all_to_all)",
        HEALTHY, devices=8, devices_per_host=4, scripts=_jax("moe_expert_parallel"),
    ),
    Example(
        "shard-map-megatron",
        "healthy: two Megatron MLP blocks in shard_map, explicit psum over 'model', "
        "data-parallel train step",
        HEALTHY, devices=8, devices_per_host=4, scripts=_jax("shard_map_megatron"),
    ),
    Example(
        "pipeline-gpipe",
        "healthy: GPipe pipeline in shard_map, ppermute between 4 stages, microbatches in a scan",
        HEALTHY, devices=8, devices_per_host=4, scripts=_jax("pipeline_gpipe"),
    ),
    Example(
        "scan-lost-batch",
        "FSDP MLP layers under lax.scan whose body all-gathers the activation "
        "(fixed: the carried activation constrained to the batch sharding)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("scan_lost_batch"),
    ),
    Example(
        "embedding-lost-batch",
        "FSDP step whose embedding table is sharded on d_model: the lookup follows the table and drops "
        "the batch from 'fsdp' (fixed: the lookup's result constrained to the tokens' batch sharding)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("embedding_lost_batch"),
    ),
    Example(
        "scan-carry-features",
        "FSDP eval step under lax.scan on ('replica', 'dp'): the carry takes the weights' d_model split over 'dp' "
        "and keeps the batch over 'replica' only, so the body all-reduces partial sums over 'dp' (fixed: the body "
        "constrains the carry to the tokens' batch sharding)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("scan_carry_features"),
    ),
    Example(
        "input-device-order",
        "FSDP step on ('data', 'fsdp') whose input lists the batch axes as ('fsdp', 'data') while the layers' "
        "outputs (FSDPv2's shard_output with extra_data_axis; JAX's constraints) list ('data', 'fsdp'): the "
        "partitioner permutes the input into their device order (fixed: the input written in that order)",
        PAIR, devices=8, devices_per_host=4,
        scripts={"jax": "input_device_order.py", "torch_xla": "input_device_order_torch_xla.py"},
    ),
    # --- memory per device (`hlo-doctor memory`) ---
    Example(
        "device-memory",
        "FSDP + AdamW step of 4 MLP blocks, 4.8 B parameters on a TPU v5e 4x4 (16 GiB chips), mesh "
        "('data', 'fsdp') = (4, 4): weights and moments sharded over 'fsdp' only do not fit "
        "(fixed: sharded over both axes)",
        PAIR, devices=16, scripts=_jax("device_memory"),
        targets=("v5e:4x4",), target_only=True,
    ),
    Example(
        "replicated-adamw-state",
        "FSDP llama train step whose AdamW moments are replicated on every device while the "
        "weights are sharded (fixed: the moments sharded like their weights)",
        PAIR, devices=4, scripts=_jax("replicated_adamw_state"),
    ),
    Example(
        "zero1-adamw-state",
        "pure data-parallel AdamW step on 8 devices whose weights and moments are replicated "
        "(fixed: the moments sharded over 'data', ZeRO-1)",
        PAIR, devices=8, scripts=_jax("zero1_adamw_state"),
    ),
    Example(
        "fsdp-gathered-weights",
        "FSDP + AdamW step of 6 bf16 MLP blocks on 2x8 H100s that keeps every layer's gathered "
        "weights from the forward for the backward (fixed: jax.checkpoint with nothing_saveable "
        "gathers them again)",
        PAIR, devices=16, devices_per_host=8, scripts=_jax("fsdp_gathered_weights"),
        targets=("h100:2x8",), target_only=True,
    ),
    # --- third-party libraries (the `third-party` extra) ---
    Example(
        "hf-1d-params-torch-xla",
        "Hugging Face LlamaForCausalLM train step under torch_xla, every parameter on dim 0 of a "
        "1-D mesh over 16 devices, inputs unmarked (fixed: mesh (2, 8) ('replica', 'fsdp'), "
        "inputs on both axes)",
        PAIR, devices=16, devices_per_host=8, scripts={"torch_xla": "hf_1d_params_torch_xla.py"},
        reference="https://github.com/pytorch/xla/issues/6778", extra="third-party",
    ),
    Example(
        "hf-fsdpv2-torch-xla",
        "Hugging Face LlamaForCausalLM train step under torch_xla FSDPv2 on a (2, 8) "
        "('replica', 'fsdp') mesh with the default shard_output: 'replica' computes the same "
        "tokens (fixed: a custom shard_output over both axes)",
        PAIR, devices=16, devices_per_host=8, scripts={"torch_xla": "hf_fsdpv2_torch_xla.py"},
        reference="https://github.com/pytorch/xla/issues/6778", extra="third-party",
    ),
    Example(
        "flax-linen-rules",
        "Flax linen train step whose logical axis rules put ('embed', 'data') before "
        "('batch', 'data'): activations shard on the feature dim (fixed: the batch rule first)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("flax_linen_rules"), extra="third-party",
    ),
    Example(
        "flax-nnx-partitioning",
        "Flax NNX FSDP train step whose largest layer (the unembedding) has no "
        "nnx.with_partitioning and is left replicated (fixed: every kernel partitioned)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("flax_nnx_partitioning"), extra="third-party",
    ),
    Example(
        "keras-layout-map",
        "Keras 3 ModelParallel on a tiny keras_hub Gemma backbone whose LayoutMap keys miss the "
        "FFN kernels, which Keras replicates silently (fixed: keys that match)",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("keras_layout_map"), extra="third-party",
    ),
    Example(
        "keras-model-axis-across-hosts",
        "Keras 3 ModelParallel on a tiny keras_hub Gemma backbone, DeviceMesh((4, 2), ('model', "
        "'batch')): the model axis spans 2 hosts of 4 (fixed: DeviceMesh((2, 4), ('batch', 'model')))",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("keras_model_axis_across_hosts"), extra="third-party",
    ),
    Example(
        "equinox-filter-shard",
        "Equinox FSDP MLP (per-example eqx.nn.Linear under vmap) whose hidden activations "
        "eqx.filter_shard puts on P(None, 'data'), a feature dim (fixed: P('data', None))",
        PAIR, devices=8, devices_per_host=4, scripts=_jax("equinox_filter_shard"), extra="third-party",
    ),
)

_BY_NAME = {example.name: example for example in EXAMPLES}


def get_example(name: str) -> Example:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigurationError(
            f"no example named {name!r}; known: {', '.join(sorted(_BY_NAME))}"
        ) from None


_PROGRAMS_PART = "/hlo_doctor/examples/programs/"


def local_program_file(recorded: str) -> Path | None:
    """The file at ``recorded`` (a path in a dump's metadata or run record) on this machine.

    A fixture made by the runner from a gallery program records the absolute path of the
    checkout that made it; on another checkout that path is this package's own copy of the
    program (same file name under ``hlo_doctor/examples/programs/``). Any other path is
    itself, when it exists. None: not here.
    """
    path = Path(recorded)
    if _is_file(path):
        return path
    marker = recorded.replace("\\", "/").rfind(_PROGRAMS_PART)
    if marker >= 0:
        local = PROGRAMS / recorded[marker + len(_PROGRAMS_PART):]
        # Only a file of the gallery itself: a recorded ``programs/../../x`` does not lead out.
        if _is_file(local) and _inside(local, PROGRAMS):
            return local
    return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError, RuntimeError):
        return False


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a path the system cannot look at (a component over 255
    bytes, a NUL byte): a dump's recorded paths are arbitrary text."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False
