"""Generate real compiled SPMD programs with their truth: ``python corpusgen/generate.py --n N --seed S --out DIR``.

Each program is drawn from its own seed (:mod:`corpusgen.programs`), compiled
by JAX on CPU virtual devices with XLA's dump flags (a plain dump, as a user
makes with ``XLA_FLAGS`` alone: no runner record), and kept only when its
pathology shows in the compiled HLO (or, for a clean program, when the same
checks find nothing). Each kept program is a folder::

    DIR/NNNN-<pathology|clean>/dump/        the XLA dump (trimmed as the runner trims)
    DIR/NNNN-<pathology|clean>/truth.json   the spec, registry, checks and the oracle's roles

Programs compile in parallel, one process per core (``--jobs``). With
``--framework torch_xla`` the programs are ``nn.Module`` steps under torch_xla
SPMD, each run in a fresh process through the runner (:mod:`corpusgen.torch_generate`).

With ``--target h100:2x8`` or ``--target v5e:4x4`` (the runner's deviceless targets, which
need the ``gpu-target`` / ``tpu-target`` extras) every program is drawn for the target's 16
devices and hosts and compiled deviceless for it, as a user compiles with
``jax.experimental.topologies`` and ``XLA_FLAGS``: the dump is the scheduled GPU module (async
collectives) or the TPU one (its own pass names, windowed einsums, chip-grid hosts). The mesh is
laid over the target's devices host by host, so position ``p`` of the layout is on host
``p // devices_per_host`` (on a TPU a host is a block of the chip grid, not a run of ids).
Deviceless compiles report no FLOPs, so the redundancy check compiles the same program on 16 CPU
devices too (same propagation and partitioner); the truth says so (``flops.source``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusgen.hlo_walk import parse_module
from corpusgen.oracle import (
    MATMUL_REPEAT_FLOOR,
    NATURAL,
    label_collectives,
    matmul_redundancy,
    natural_rules,
    reorder_rules,
    stray_traffic,
)
from corpusgen.programs import PATHOLOGIES, ProgramSpec, build, device_layout, ffn_size, random_spec
from hlo_doctor.runner.targets import parse_target, target_devices
from hlo_doctor.runner.trim import trim_dump

MAX_DEVICES = 16
# Deviceless targets of 16 devices: two hosts of 8 H100s, and a v5e 4x4 slice (four hosts of 2x2 chips).
TARGETS = ("h100:2x8", "v5e:4x4")
DUMP_PASSES = "spmd|propagation"
# A clean program's redundant work must stay under this (per-device FLOPs x devices / unsharded FLOPs).
CLEAN_MAX_RATIO = 1.35
TRUTH_SCHEMA = 1
# The CPU backend's code generation is most of a compile and nothing the analysis reads: made cheap.
FAST_BACKEND = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


_SCRATCH: list[Path] = []
_TARGET: list[str] = []  # the deviceless target of this worker, if any


def _init_worker(out: str, target: str | None = None) -> None:
    """Set up a compiling process: CPU devices, and XLA_FLAGS dumping to a scratch folder of its own.

    The dump flags go through ``XLA_FLAGS``, as a user sets them, so the dump is a plain one with
    everything XLA writes then (``module_NNNN.NAME/compile_options.textproto`` included); each
    compile's files are then moved from the scratch folder to the program's own.
    """
    scratch = Path(out) / f".scratch-{os.getpid()}"
    _remove(scratch)
    scratch.mkdir(parents=True)
    _SCRATCH[:] = [scratch]
    _TARGET[:] = [target] if target else []
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count={MAX_DEVICES} "
                               f"--xla_dump_to={scratch} --xla_dump_hlo_pass_re={DUMP_PASSES}").strip()


def _compile(spec: ProgramSpec, dump: Path | None) -> dict[str, Any]:
    """Compile ``spec`` (for this worker's target, if any), moving the dump's files into ``dump``."""
    import jax

    if _TARGET:
        result = _compile_cpu(spec, None)  # the FLOPs: a deviceless compile reports none
        fn, args, registry = build(spec, target_layout(_TARGET[0])[: spec.devices])
        with _collect(dump):
            jax.jit(fn).lower(*args).compile()
        if dump is not None:
            trim_dump(dump)
        return {**result, "registry": registry, "flops_source": "cpu"}
    return _compile_cpu(spec, dump)


def _compile_cpu(spec: ProgramSpec, dump: Path | None) -> dict[str, Any]:
    import jax

    fn, args, registry = build(spec, jax.devices()[: spec.devices])
    lowered = jax.jit(fn).lower(*args)
    total = float(lowered.cost_analysis()["flops"])
    with _collect(dump):
        compiled = lowered.compile(compiler_options=dict(FAST_BACKEND))
    per_device = float(compiled.cost_analysis()["flops"])
    return {"registry": registry, "flops_unsharded": total, "flops_per_device": per_device,
            "redundancy": per_device * spec.devices / total if total else 1.0, "flops_source": "compile"}


@contextlib.contextmanager
def _collect(dump: Path | None) -> Iterator[None]:
    """Move the files XLA dumps inside the block from the scratch folder to ``dump`` (None: drop them)."""
    scratch = _SCRATCH[0]
    before = set(os.listdir(scratch))
    yield
    for name in sorted(set(os.listdir(scratch)) - before):
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (scratch / name).rename(dump / name)
        else:
            _remove(scratch / name) if (scratch / name).is_dir() else (scratch / name).unlink()


def target_layout(target: str) -> list[Any]:
    """The deviceless devices of ``target``, host by host (then by id): position ``p`` is on host
    ``p // devices_per_host``."""
    devices = target_devices(target)
    return sorted(devices, key=lambda d: (int(d.process_index), int(d.id)))


def target_hosts(target: str) -> tuple[int, int]:
    """``(devices, hosts)`` of a deviceless target."""
    parsed = parse_target(target)
    return parsed.device_count, parsed.device_count // parsed.devices_per_host


def partitioned_text(dump: Path) -> str:
    files = sorted(dump.glob("*after_spmd-partitioning*.txt")) or sorted(dump.glob("*after_tpu-spmd-partitioning*.txt"))
    if not files:
        raise RuntimeError(f"no partitioned module in {dump}")
    return files[0].read_text()


def _labels(text: str, spec: ProgramSpec, registry: dict[str, Any]) -> list[dict[str, Any]]:
    module = parse_module(text)
    labelled = label_collectives(module, registry["param_classes"], registry["output_classes"], spec.devices,
                                 registry.get("scopes"), mesh=[(a.name, a.size) for a in spec.axes],
                                 device_ids=device_layout(spec), devices_per_host=spec.devices_per_host)
    return [c.as_json() for c in labelled]


def _roles(collectives: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in collectives:
        out[c["role"]] = out.get(c["role"], 0) + 1
    return out


def _twin(spec: ProgramSpec) -> ProgramSpec:
    twin = ProgramSpec(**{**spec.__dict__, "axes": list(spec.axes), "physical": list(spec.physical),
                          "dense": list(spec.dense), "notes": []})
    twin.injection = None
    return twin


def _remove(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def batch_axis_traffic(spec: ProgramSpec, collectives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Activation collectives over any axis but the tensor axis: traffic the layout did not ask for."""
    return stray_traffic({a.name for a in spec.axes if a.role == "tensor"}, collectives)



def judge_clean(spec: ProgramSpec, result: dict[str, Any], collectives: list[dict[str, Any]],
                matmuls: float | None = None) -> tuple[str | None, str]:
    """A program drawn clean: None when it is, else the natural pathology XLA gave it, with the evidence
    (``matmuls``: :func:`~corpusgen.oracle.matmul_redundancy`, when the FLOPs are XLA's cost analysis')."""
    ratio = result["redundancy"]
    if ratio > CLEAN_MAX_RATIO and (matmuls is None or matmuls >= MATMUL_REPEAT_FLOOR):
        return "natural-redundant-compute", f"{ratio:.2f}x the unsharded FLOPs per device share"
    stray = batch_axis_traffic(spec, collectives)
    if stray:
        c = stray[0]
        return "natural-batch-traffic", (f"activations move over batch axes: {c['instruction']} ({c['role']} over "
                                         f"{c['axes']}) and {len(stray) - 1} more")
    tensor = sorted(a.name for a in spec.axes if a.role == "tensor")
    return None, f"redundancy {ratio:.2f}x; activation collectives only over the tensor axes {tensor}"


def check_effect(spec: ProgramSpec, result: dict[str, Any], text: str, collectives: list[dict[str, Any]],
                 twin: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether the injected pathology shows in the compiled HLO (``twin``: the clean twin's collectives)."""
    ratio = result["redundancy"]
    roles, before = _roles(collectives), _roles(twin)
    kind = spec.injection
    if kind == "replicated-batch-input":
        return ratio >= 1.5, f"redundancy {ratio:.2f}x (batch not split over {spec.injection_axis})"
    if kind == "replicated-batch-mid":
        return ratio >= 1.2, f"redundancy {ratio:.2f}x (batch regrouped off {spec.injection_axis} mid-graph)"
    if kind == "feature-dim-constraint":
        moved, was = len(batch_axis_traffic(spec, collectives)), len(batch_axis_traffic(spec, twin))
        return moved > was, f"activation collectives over batch axes: {was} in the clean twin, {moved} here"
    if kind == "conflicting-constraints":
        return roles.get("reshard", 0) >= before.get("reshard", 0) + 2, (
            f"reshards: {before.get('reshard', 0)} in the clean twin, {roles.get('reshard', 0)} here")
    if kind == "replicated-weight":
        path = "params" + "".join(f"[{p}]" if p.isdigit() else f"['{p}']" for p in spec.injection_axis.split("/"))
        escaped = path.replace("'", "\\'")
        lines = [ln for ln in text.splitlines() if f'op_name="{escaped}"' in ln and "parameter(" in ln]
        replicated = bool(lines) and "devices=" not in lines[0]
        return replicated, f"{path} replicated in the partitioned module: {replicated}"
    if kind == "cross-host-tensor":
        tp = next(a.size for a in spec.axes if a.role == "tensor")
        crossing = [c for c in collectives if c["role"] in ("activation-reduce", "activation-gather")
                    and c["crosses_hosts"]]
        return bool(crossing), (f"{len(crossing)} tensor-parallel collectives over an axis of {tp} whose groups "
                                f"cross the {spec.hosts} hosts")
    if kind == "uneven-dim":
        tp = next(a.size for a in spec.axes if a.role == "tensor")
        ffn = ffn_size(spec)
        piece = -(-ffn // tp)
        found = re.search(rf"\[(?:\d+,)*{piece}(?:,\d+)*\]", text) is not None
        return found, f"ffn {ffn} over {tp} shards: per-device {piece} (padded to {piece * tp}) present: {found}"
    raise ValueError(kind)


def _compile_labelled(spec: ProgramSpec, dump: Path) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    result = _compile(spec, dump)
    text = partitioned_text(dump)
    return result, text, _labels(text, spec, result["registry"])


def _write(folder: Path, spec: ProgramSpec, result: dict[str, Any], collectives: list[dict[str, Any]],
           pathology: str | None, evidence: str, rejected: list[str], twin: str | None) -> None:
    _trim(folder / "dump")
    if pathology in NATURAL:
        expected, expected_any = [], natural_rules(pathology, {a.name: a.role for a in spec.axes}, collectives)
    else:
        expected, expected_any = ([PATHOLOGIES[pathology]] if pathology else []), []
    # What the recipe also does, by design: the weights of a dim that does not divide its shard
    # count cannot be sharded on it (JAX refuses such an argument), so they stay replicated.
    allowed = ["replicated-large-parameter"] if pathology == "uneven-dim" else []
    # The conflicting chain splits the activation's batch, sequence and hidden dims over the batch
    # axes in turn: a dim they do not divide is padded, by design of the recipe.
    shards = 1
    for axis in spec.axes_with("data", "fsdp"):
        shards *= axis.size
    if pathology == "conflicting-constraints" and any(size % shards for size in (spec.seq, spec.hidden)):
        allowed.append("uneven-sharding-padding")
    allowed += [r for r in reorder_rules(collectives) if r not in allowed and r not in expected]
    truth = {
        "schema_version": TRUTH_SCHEMA,
        "framework": getattr(spec, "framework", "jax"),
        "target": _TARGET[0] if _TARGET else None,
        "spec": spec.as_json(),
        "devices_per_host": spec.devices_per_host,
        # what a user would pass to ``analyze``: a TPU dump's topology says where its hosts are
        "analyze_devices_per_host": None if _TARGET and parse_target(_TARGET[0]).platform == "tpu"
        else spec.devices_per_host,
        "axis_roles": {a.name: a.role for a in spec.axes},
        "registry": result["registry"],
        "pathology": pathology,
        "expected_rules": expected,
        "expected_any": expected_any,
        "allowed_rules": allowed,
        "effect": evidence,
        "twin": twin,
        "flops": {k: result[k] for k in ("flops_unsharded", "flops_per_device", "redundancy")}
        | {"source": result.get("flops_source", "compile")},
        "collectives": collectives,
        "rejected": rejected,
    }
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def generate_pair(args: tuple[int, int, str, str | None]) -> dict[str, Any]:
    """Pair ``index`` of JAX programs (see :func:`draw_pair`), for this worker's target if any."""
    index, base_seed, out, forced = args
    draw: Callable[..., Any] = random_spec
    prefix = ""
    if _TARGET:
        devices, hosts = target_hosts(_TARGET[0])
        # On a TPU slice ICI joins every chip, its hosts too: a tensor axis across hosts is no
        # mistake there (the slow link is between slices), so that pathology is not drawn.
        exclude = ("cross-host-tensor",) if parse_target(_TARGET[0]).platform == "tpu" else ()
        draw = functools.partial(random_spec, devices=devices, hosts=hosts, exclude=exclude)
        prefix = _TARGET[0].split(":")[0] + "-"
    return draw_pair(index, base_seed, Path(out), forced, draw=draw, twin=_twin, compile=_compile_labelled,
                     effect=check_effect, attempts=5, prefix=prefix)


def draw_pair(index: int, base_seed: int, out_dir: Path, forced: str | None, *, draw: Callable[..., Any],
              twin: Callable[..., Any], compile: Callable[..., Any], effect: Callable[..., Any], attempts: int,
              prefix: str = "") -> dict[str, Any]:
    """Pair ``index``: a program drawn clean, and its twin with a pathology injected.

    The clean draw is compiled first. If XLA gave it a pathology of its own it is kept as a
    natural one and a new spec is drawn for the injection; otherwise it is kept clean, and the
    injected twin (same spec, one change) is compiled and kept when its effect shows.
    ``draw(seed, injection)`` makes a spec, ``twin(spec)`` its clean twin, ``compile(spec, dump)``
    gives ``(result, partitioned text, collectives)`` and ``effect`` is :func:`check_effect`'s kind.
    """
    started = time.monotonic()
    kept: list[str] = []
    rejected: list[str] = []
    for attempt in range(attempts):
        seed = base_seed * 1_000_003 + index * 101 + attempt
        spec = draw(seed, forced or "any")
        clean = twin(spec)
        folder = out_dir / f"{prefix}{index:04d}{chr(ord('a') + len(kept))}"
        _remove(folder)
        try:
            result, _, collectives = compile(clean, folder / "dump")
        except Exception as error:  # noqa: BLE001 - a spec the framework rejects is redrawn, and said so
            rejected.append(f"seed {seed} (clean draw): {type(error).__name__}: {str(error)[:300]}")
            _remove(folder)
            continue
        natural, evidence = judge_clean(clean, result, collectives, matmul_redundancy(folder / "dump", clean.devices))
        named = folder.with_name(f"{folder.name}-{natural or 'clean'}")
        _remove(named)
        folder.rename(named)
        _write(named, clean, result, collectives, natural, evidence, rejected, None)
        kept.append(named.name)
        if natural is not None:
            continue
        inj = out_dir / f"{prefix}{index:04d}{chr(ord('a') + len(kept))}-{spec.injection}"
        _remove(inj)
        try:
            result_i, text_i, collectives_i = compile(spec, inj / "dump")
            shows, evidence_i = effect(spec, result_i, text_i, collectives_i, collectives)
        except Exception as error:  # noqa: BLE001
            shows, evidence_i = False, f"{type(error).__name__}: {str(error)[:300]}"
        if not shows:
            rejected.append(f"seed {seed} ({spec.injection}): {evidence_i}")
            _remove(inj)
            continue
        _write(inj, spec, result_i, collectives_i, spec.injection, evidence_i, rejected, named.name)
        kept.append(inj.name)
        break
    return {"names": kept, "seconds": time.monotonic() - started, "rejected": rejected}


def _trim(dump: Path) -> None:
    """Drop what the analysis never reads (LLVM IR, object files, buffer reports), as the runner does."""
    for path in dump.rglob("*"):
        if path.is_file() and (path.suffix in (".ll", ".o") or "buffer-assignment" in path.name
                               or "live-range" in path.name or "memory-usage" in path.name
                               or path.name.endswith(".ir-no-opt.ll")):
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, required=True,
                        help="how many programs (drawn in pairs: a clean draw and its injected twin)")
    parser.add_argument("--seed", type=int, default=0, help="the corpus seed")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--start", type=int, default=0, help="first program index")
    parser.add_argument("--only", choices=list(PATHOLOGIES), help="inject only this pathology")
    parser.add_argument("--framework", choices=("jax", "torch_xla"), default="jax",
                        help="torch_xla: nn.Module programs under torch_xla SPMD (corpusgen/torch_generate.py)")
    parser.add_argument("--target", choices=TARGETS,
                        help="compile deviceless for this 16-device GPU or TPU target (JAX only)")
    options = parser.parse_args(argv)
    if options.target and options.framework != "jax":
        parser.error("--target compiles JAX programs only")
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = -(-options.n // 2)
    work = [(i, options.seed, str(out), options.only) for i in range(options.start, options.start + pairs)]
    started = time.monotonic()
    kept = 0
    context = multiprocessing.get_context("spawn")
    if options.framework == "torch_xla":
        # Each torch_xla program runs in a fresh process of the runner's; the pool's workers only wait on them.
        from corpusgen.torch_generate import generate_torch_pair

        pair, initializer, initargs = generate_torch_pair, None, ()
    else:
        pair, initializer, initargs = generate_pair, _init_worker, (str(out), options.target)
    with context.Pool(options.jobs, initializer=initializer, initargs=initargs, maxtasksperchild=25) as pool:
        for summary in pool.imap_unordered(pair, work):
            kept += len(summary["names"])
            print(f"{' '.join(summary['names']) or 'nothing kept'}  {summary['seconds']:.1f}s"
                  + (f"  ({len(summary['rejected'])} redrawn)" if summary["rejected"] else ""), flush=True)
    elapsed = time.monotonic() - started
    for scratch in out.glob(".scratch-*"):
        _remove(scratch)
    print(f"generated {kept} programs ({len(work)} pairs) in {elapsed:.0f}s: "
          f"{kept / elapsed * 60:.1f} programs per minute on {options.jobs} processes")
    return 0 if kept >= options.n else 1


if __name__ == "__main__":
    sys.exit(main())
