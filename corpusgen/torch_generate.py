"""The torch_xla half of ``generate.py`` (``--framework torch_xla``): compile, label, keep or redraw.

Each program runs in a fresh process through ``hlo_doctor.runner.run_script``
(the runner sets torch_xla's CPU devices, ``XLA_HLO_DEBUG=1`` and the dump flags
before torch_xla is imported, records the meshes, sharding calls and module
tree in ``hlo_doctor_run.json``, and trims the dump). The child,
``corpusgen/torch_programs.py``, writes the registry: entry parameter number ->
class, output -> class, and the module of the step. The dump keeps that module
only (an AdamW program compiles a first update before it). Pairs are made as
for JAX: a clean draw, kept clean or as a natural pathology, and its twin with
one mistake injected, kept when the mistake shows in the compiled HLO.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from corpusgen.generate import check_effect, draw_pair, partitioned_text
from corpusgen.hlo_walk import parse_module
from corpusgen.oracle import label_collectives
from corpusgen.torch_oracle import dot_flops, torch_phase
from corpusgen.torch_programs import TorchSpec, device_layout, random_spec

__all__ = ["generate_torch_pair", "relabel_torch"]

CHILD = Path(__file__).with_name("torch_programs.py")
CHILD_TIMEOUT_S = 900
# Program folders are named tx0001a-...: apart from JAX's (0001a-...), in one corpus and in known_disagreements.toml.
PREFIX = "tx"
# The CPU backend's code generation is most of a compile and nothing the analysis reads: made cheap.
FAST_BACKEND = {"xla_backend_optimization_level": "0", "xla_llvm_disable_expensive_passes": "true"}


def _mesh_index_of(spec: TorchSpec) -> list[int]:
    """For each device id (torch_xla's partition id), its row-major index in the mesh."""
    out = [0] * spec.devices
    for index, device in enumerate(device_layout(spec)):
        out[device] = index
    return out


def labels(text: str, spec: TorchSpec, registry: dict[str, Any]) -> list[dict[str, Any]]:
    module = parse_module(text)
    classes: dict[str | int, str] = {int(k): v for k, v in registry["param_classes"].items()}
    labelled = label_collectives(module, classes, registry["output_classes"], spec.devices,
                                 mesh=[(a.name, a.size) for a in spec.axes], device_ids=list(range(spec.devices)),
                                 devices_per_host=spec.devices_per_host, phase=torch_phase,
                                 mesh_index_of=_mesh_index_of(spec))
    return [c.as_json() for c in labelled]


def _keep_module(dump: Path, module: str) -> None:
    """Drop every other module's files (the first update, the small graphs of data placement)."""
    prefix = module + "."
    for path in dump.iterdir():
        if path.is_file() and path.name.startswith("module_") and not path.name.startswith(prefix):
            path.unlink()


def compile_program(spec: TorchSpec, dump: Path) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """Run ``spec`` through the runner into ``dump``: ``(result, partitioned text, collectives)``."""
    from hlo_doctor.runner import RunError, run_script

    with tempfile.TemporaryDirectory(prefix="corpusgen-torch-") as scratch:
        spec_file, registry_file = Path(scratch) / "spec.json", Path(scratch) / "registry.json"
        spec_file.write_text(json.dumps({"spec": spec.as_json(), "device_ids": device_layout(spec)}))
        try:
            run_script(CHILD, ["--spec", str(spec_file), "--registry", str(registry_file)], dump_dir=dump,
                       framework="torch_xla", devices=spec.devices, devices_per_host=spec.devices_per_host,
                       timeout=CHILD_TIMEOUT_S, xla_flags=FAST_BACKEND)
        except RunError as error:
            written = json.loads(registry_file.read_text()) if registry_file.exists() else {}
            problems = "; ".join(written.get("problems", [])) or error.format_tail()[-600:]
            raise RuntimeError(f"torch_xla program failed: {problems}") from None
        registry = json.loads(registry_file.read_text())
    _keep_module(dump, registry["module"])
    text = partitioned_text(dump)
    before = sorted(dump.glob("*before_sharding-propagation*.txt")) or sorted(dump.glob("*before_optimizations.txt"))
    total = dot_flops(parse_module(before[0].read_text()))
    per_device = dot_flops(parse_module(text))
    result = {"registry": registry, "flops_unsharded": total, "flops_per_device": per_device,
              "redundancy": per_device * spec.devices / total if total else 1.0}
    return result, text, labels(text, spec, registry)


def check_torch_effect(spec: TorchSpec, result: dict[str, Any], text: str, collectives: list[dict[str, Any]],
                       twin: list[dict[str, Any]]) -> tuple[bool, str]:
    """As :func:`corpusgen.generate.check_effect`; a replicated weight is found by its parameter number."""
    if spec.injection != "replicated-weight":
        return check_effect(spec, result, text, collectives, twin)  # type: ignore[arg-type]
    registry = result["registry"]
    number = registry["replicated_parameter"]
    weights = [int(n) for n, c in registry["param_classes"].items() if c == "weight"]
    module = parse_module(text)
    lines = {n: p.attributes for n, p in module.parameters(module.entry).items()}
    replicated = number is not None and "devices=" not in lines.get(number, "devices=")
    sharded = [n for n in weights if "devices=" in lines.get(n, "")]
    shows = replicated and bool(sharded)
    return shows, (f"{registry['replicated_weight']} (parameter {number}) replicated in the partitioned module "
                   f"while {len(sharded)} weights are sharded: {shows}")


def _twin(spec: TorchSpec) -> TorchSpec:
    data = spec.as_json()
    data["injection"] = None
    data["notes"] = []
    return TorchSpec.from_json(data)


def generate_torch_pair(args: tuple[int, int, str, str | None]) -> dict[str, Any]:
    """Pair ``index``: a torch_xla program drawn clean, and its twin with a pathology injected
    (:func:`corpusgen.generate.draw_pair`; folders prefixed ``tx``)."""
    index, base_seed, out, forced = args
    return draw_pair(index, base_seed, Path(out), forced, draw=random_spec, twin=_twin, compile=compile_program,
                     effect=check_torch_effect, attempts=4, prefix=PREFIX)


def relabel_torch(folder: Path, truth: dict[str, Any]) -> list[dict[str, Any]]:
    """The oracle's roles for a torch_xla program's dump, from its truth (after an oracle fix)."""
    spec = TorchSpec.from_json(truth["spec"])
    return labels(partitioned_text(folder / "dump"), spec, truth["registry"])
