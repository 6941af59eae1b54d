"""``hlo_doctor_run.json``: what the runner knows about a dump that XLA does not write.

Schema (version 1)::

    {"schema_version": 1,
     "command": ["python", "train.py", ...],
     "framework": "jax" | "torch_xla",
     "versions": {"python": ..., "hlo_doctor": ..., "jax": ..., "jaxlib": ...,
                  "torch": ..., "torch_xla": ..., "numpy": ...},  # those installed/imported
     "partitioner": "shardy" | "gspmd" | null,
     "device_count": int | null,
     "devices_per_host": int | null,
     "meshes": [{"axis_names": [...], "shape": [...], "device_ids": [...],
                 "kind": "Mesh" | "HybridMesh", "stack": [...]}],
     "sharding_calls": [{"function": "mark_sharding" | "with_sharding_constraint", "spec": ...,
                         "mesh_axis_names": [...], "shape": [...], "stack": [...], "count": n}],
     "module_calls": [{"module_class": ..., "file": ..., "line": ..., "count": n,
                       "stack": [...]}],
     # the modules the user's code calls directly (torch): submodule and parameter paths
     "module_trees": [{"module_class": ..., "modules": [{"path": "model.layers.0.self_attn.o_proj",
                       "class": ...}], "parameters": [{"path": ..., "shape": [...], "dtype": ...}],
                       "stack": [...]}],
     # Keras 3's distribution API: DeviceMesh, LayoutMap keys, the key each variable matched;
     # the state of each jitted step of the JAX trainer: HLO's "state[g][i]" is
     # groups[g].variables[i] of the entry whose function the module traces
     "keras": {"meshes": [{"axis_names": [...], "shape": [...], "devices": [...], "stack": [...]}],
               "layouts": [{"key": ..., "axes": [...], "stack": [...]}],
               "variables": [{"path": ..., "matched_key": KEY | null, "axes": [...] | null}],
               "states": [{"function": "train_step" | "test_step" | "predict_step" | null,
                           "groups": [{"name": "trainable_variables", "variables": [{"path":
                           "decoder_block_0/ffw_gating/kernel", "shape": [...], "dtype": "float32"}]},
                           ...], "stack": [...]}]},
     # Flax linen: the logical axis rules set (nn.logical_axis_rules, nn.set_logical_axis_rules)
     "flax_logical_rules": [{"function": ..., "rules": [["batch", "data"], ...], "stack": [...]}],
     # Flax NNX: per nnx.jit function, each graph argument's state paths; HLO's
     # "model.states[0][i]" is leaves[i] of the argument named "model"
     "nnx_jit_calls": [{"function": ..., "arguments": [{"name": "model", "leaves": [{"index": i,
                        "path": "blocks/0/w_in/kernel", "type": "Param", "shape": [...]}]}],
                        "stack": [...]}],
     "example": {"name": ..., "variant": ...} | null,
     "script": {"path": ..., "sha256": ...} | null,   # the program that was run
     "instrumentation_errors": [{"where": ..., "error": ...}],  # the hook failing, not the script
     # only with --target (deviceless GPU compiles):
     "target": {"name": "h100", "config": PATH, "config_path": PATH, "hosts": 2,
                "devices_per_host": 8, "device_count": 16, "platform": "cuda",
                "topology": "1x2x8", "device_kind": "NVIDIA H100 80GB HBM3"},
     #   a TPU target instead: {"name": "v4", "platform": "tpu", "topology_name": "v4:4x4x8",
     #   "num_slices": 1, "chips_per_slice": 128, "hosts": 32, "devices_per_host": 4,
     #   "device_count": 128, "cores_per_chip": 2, "one_device_per_chip": true, "device_kind": "TPU v4"}
     "devices": [{"id": 0, "process_index": 0, "kind": ...,
                  "slice_index": 0, "coords": [0, 0, 0], "core_on_chip": 0}, ...],  # TPU adds the last three
     "hosts": [{"process_index": 0, "device_ids": [0, ..., 7]}, ...],
     "compiles": [{"function": ..., "device_ids": [...]}],  # each jit call compiled
     "device_assignments": {"module_0001.jit_f": [0, 1, ...]}}  # from *config.pbtxt

Stacks list user frames only, innermost first: ``{"file", "line", "function"}``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from hlo_doctor.dump.options import CompileOptions
from hlo_doctor.dump.textproto import TextprotoError, parse_textproto

SCHEMA_VERSION = 1
SIDECAR_NAME = "hlo_doctor_run.json"
_VERSIONED = {"jax": ("jax", "jaxlib"), "torch_xla": ("torch", "torch_xla")}


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines the child wrote; a torn last line (a crash mid-write) is skipped."""
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def installed_versions(framework: str) -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in ("hlo-doctor", *_VERSIONED.get(framework, ())):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name.replace("-", "_")] = metadata.version(name)
    return versions


def _unique_meshes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    meshes: dict[tuple, dict[str, Any]] = {}
    for event in events:
        if event.get("event") != "mesh":
            continue
        key = (tuple(event["axis_names"]), tuple(event["shape"]), tuple(event["device_ids"]))
        if key not in meshes:
            meshes[key] = {
                "axis_names": event["axis_names"],
                "shape": event["shape"],
                "device_ids": event["device_ids"],
                "kind": event.get("kind"),
                "stack": event.get("stack", []),
            }
    return list(meshes.values())


def _strip(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "event"}


def _unique_sharding_calls(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per distinct call (a training loop repeats them), with a count."""
    calls: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("event") != "sharding_call":
            continue
        call = _strip(event)
        key = json.dumps(call, sort_keys=True)
        if key in calls:
            calls[key]["count"] += 1
        else:
            calls[key] = {**call, "count": 1}
    return list(calls.values())


def infer_partitioner(dump_dir: Path, framework: str) -> str | None:
    """Shardy leaves a ``shardy/`` folder or ``after_shardy`` snapshots; GSPMD does not."""
    if framework == "torch_xla":
        return "gspmd"
    if (dump_dir / "shardy").is_dir() or any(dump_dir.glob("*shardy*")):
        return "shardy"
    if any(dump_dir.glob("*spmd-partitioning*")):
        return "gspmd"
    return None


def read_device_assignments(dump_dir: Path) -> dict[str, list[int]]:
    """``module_NNNN.NAME`` -> device of each logical id, from the dump's ``*config.pbtxt``."""

    found: dict[str, list[int]] = {}
    for path in sorted(dump_dir.glob("*config.pbtxt")):
        if path.name.endswith("gpu_target_config.pbtxt"):
            continue
        key = path.name.removesuffix(".config.pbtxt")  # module_NNNN.NAME
        try:
            message = parse_textproto(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, TextprotoError):
            continue
        assignment = CompileOptions.from_message(message, str(path)).device_assignment
        if assignment is not None:
            found[key] = list(assignment.device_ids)
    return found


def _target_fields(target: Any, events: list[dict[str, Any]],
                   dump_dir: Path | None) -> dict[str, Any]:
    devices_event = next((e for e in reversed(events) if e.get("event") == "target_devices"), {})
    devices = devices_event.get("devices") or [
        {"id": d, "process_index": d // target.devices_per_host}
        for d in range(target.device_count)
    ]
    hosts: dict[int, list[int]] = {}
    for device in devices:
        hosts.setdefault(int(device["process_index"]), []).append(int(device["id"]))
    entry = target.to_json()
    kinds = {d.get("kind") for d in devices if d.get("kind")}
    if len(kinds) == 1:
        entry["device_kind"] = kinds.pop()
    return {
        "target": entry,
        "devices": devices,
        "hosts": [{"process_index": p, "device_ids": ids} for p, ids in sorted(hosts.items())],
        "compiles": [_strip(e) for e in events if e.get("event") == "target_compile"],
        "device_assignments": read_device_assignments(dump_dir) if dump_dir else {},
    }


def build_sidecar(
    *,
    command: list[str],
    framework: str,
    partitioner: str | None,
    devices: int | None,
    devices_per_host: int | None,
    events: list[dict[str, Any]],
    example: dict[str, str] | None = None,
    target: Any = None,
    dump_dir: Path | None = None,
    script: Path | None = None,
) -> dict[str, Any]:
    """``target`` (a :class:`~hlo_doctor.runner.targets.Target`) adds the target fields;
    ``script`` records the program's path and sha256 (so a dump can be matched to its source)."""
    process = next((e for e in reversed(events) if e.get("event") == "process"), {})
    versions = installed_versions(framework)
    versions.update(process.get("versions", {}))
    if target is not None:
        devices = target.device_count
        devices_per_host = devices_per_host or target.devices_per_host
    sidecar = {
        "schema_version": SCHEMA_VERSION,
        "command": list(command),
        "framework": framework,
        "versions": versions,
        "partitioner": partitioner,
        "device_count": devices if devices is not None else process.get("device_count"),
        "devices_per_host": devices_per_host,
        "meshes": _unique_meshes(events),
        "sharding_calls": _unique_sharding_calls(events),
        "module_calls": [_strip(e) for e in events if e.get("event") == "module_call"],
        "module_trees": [_strip(e) for e in events if e.get("event") == "module_tree"],
        "flax_logical_rules": _unique(events, "flax_logical_rules"),
        "nnx_jit_calls": [_strip(e) for e in events if e.get("event") == "nnx_jit_call"],
        "example": example,
        "script": _script_record(script),
        "instrumentation_errors": [
            _strip(e) for e in events if e.get("event") == "instrumentation_error"
        ],
    }
    keras = {"meshes": _unique(events, "keras_mesh"), "layouts": _unique(events, "keras_layout"),
             "variables": _unique(events, "keras_variable_layout"), "states": _unique(events, "keras_state")}
    if any(keras.values()):
        sidecar["keras"] = keras
    if target is not None:
        sidecar.update(_target_fields(target, events, dump_dir))
    return sidecar


def _unique(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events of one kind, each distinct one once, in order."""
    seen: dict[str, dict[str, Any]] = {}
    for event in events:
        if event.get("event") == kind:
            entry = _strip(event)
            seen.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(seen.values())


def _script_record(script: Path | None) -> dict[str, str] | None:
    if script is None:
        return None
    try:
        digest = hashlib.sha256(script.read_bytes()).hexdigest()
    except OSError:
        return {"path": str(script), "sha256": None}
    return {"path": str(script), "sha256": digest}


def write_sidecar(dump_dir: Path, sidecar: dict[str, Any]) -> Path:
    path = dump_dir / SIDECAR_NAME
    path.write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
    return path


def read_sidecar(dump_dir: str | Path) -> dict[str, Any] | None:
    path = Path(dump_dir) / SIDECAR_NAME
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
