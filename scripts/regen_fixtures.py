#!/usr/bin/env python
"""Regenerate fixtures/ by running the example gallery through the runner.

Each (example, framework, partitioner, variant) becomes a trimmed dump folder
``fixtures/<example>/<framework>-<partitioner>-<variant>/`` (torch_xla has no
partitioner choice: ``torch_xla-<variant>``) holding the XLA dump and
``hlo_doctor_run.json``. Expected-findings files (``expected*``) and the
hand-written ``NOTES.md`` in those folders are kept.

Examples with GPU targets also get deviceless GPU compiles,
``fixtures/<example>/jax-<target>-<variant>/`` (``jax-h100_2x8-bad``), when the
jax CUDA plugin is installed (``pip install -e .[gpu-target]``); they use JAX's
default partitioner.

    python scripts/regen_fixtures.py                 # everything
    python scripts/regen_fixtures.py --only cross-host-tp --only llama-2d
    python scripts/regen_fixtures.py --list          # what would be generated
    python scripts/regen_fixtures.py --gpu-only      # just the GPU-target fixtures

Rerun it whenever the JAX or torch_xla version changes; see fixtures/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path

from hlo_doctor.examples import EXAMPLES
from hlo_doctor.runner import RunError, run_example

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

SEED = "fsdp-activation-gather"
# Examples that also get a GSPMD fixture (besides Shardy, JAX's default).
# Every bad/fixed rule pair under both JAX partitioners; the healthy models under Shardy.
GSPMD_TOO = {SEED, "cross-host-tp", "transposed-mesh", "non-batch-dim-sharding", "replicated-large-param",
             "reshard-churn", "uneven-padding", "scan-lost-batch"}


def cases() -> list[tuple[str, str, str | None, str]]:
    """(example, framework, partitioner or GPU target, variant) for every fixture."""
    out = []
    for example in EXAMPLES:
        for target in example.targets:
            for variant in example.variants:
                out.append((example.name, "jax", target, variant))
        if example.target_only:
            continue
        for framework in example.frameworks:
            partitioners = [None] if framework == "torch_xla" else (
                ["shardy", "gspmd"] if example.name in GSPMD_TOO else ["shardy"])
            for partitioner in partitioners:
                for variant in example.variants:
                    out.append((example.name, framework, partitioner, variant))
    return out


def is_target(partitioner: str | None) -> bool:
    return partitioner is not None and ":" in partitioner


def fixture_dir(example: str, framework: str, partitioner: str | None, variant: str) -> Path:
    if is_target(partitioner):
        partitioner = partitioner.replace(":", "_")  # h100:2x8 -> h100_2x8
    label = "-".join(p for p in (framework, partitioner, variant) if p)
    return FIXTURES / example / label


# Hand-written files in a fixture folder, kept across a rerun.
KEPT = ("expected*", "NOTES.md")


def _take_expected(target: Path) -> dict[str, bytes]:
    """The expected-findings files and notes in a fixture folder, to put back after the rerun."""
    if not target.is_dir():
        return {}
    return {p.name: p.read_bytes() for pattern in KEPT for p in target.glob(pattern) if p.is_file()}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="EXAMPLE",
                        help="regenerate only this example (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the fixtures and exit")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the deviceless GPU-target fixtures (jax-<target>-<variant>)")
    args = parser.parse_args(argv)

    selected = [c for c in cases() if (not args.only or c[0] in args.only)
                and (not args.gpu_only or is_target(c[2]))]
    if args.list:
        for case in selected:
            print(fixture_dir(*case).relative_to(ROOT))
        return 0

    have_torch_xla = importlib.util.find_spec("torch_xla") is not None
    have_gpu_plugin = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    failures = 0
    for example, framework, partitioner, variant in selected:
        target = fixture_dir(example, framework, partitioner, variant)
        label = target.relative_to(ROOT)
        if framework == "torch_xla" and not have_torch_xla:
            print(f"skip {label}: torch_xla is not installed")
            continue
        if is_target(partitioner) and not have_gpu_plugin:
            print(f"skip {label}: the jax CUDA plugin is not installed (.[gpu-target])")
            continue
        kept = _take_expected(target)
        if target.exists():
            shutil.rmtree(target)
        start = time.monotonic()
        try:
            if is_target(partitioner):
                run_example(example, framework=framework, variant=variant, dump_dir=target,
                            target=partitioner)
            else:
                run_example(example, framework=framework, variant=variant, dump_dir=target,
                            partitioner=partitioner)
        except RunError as error:
            failures += 1
            print(f"FAIL {label}: {error}\n{error.format_tail()}", file=sys.stderr)
            continue
        finally:
            target.mkdir(parents=True, exist_ok=True)
            for name, data in kept.items():
                (target / name).write_bytes(data)
        print(f"wrote {label} ({_size(target) / 1024:.0f} KiB, "
              f"{time.monotonic() - start:.1f} s)")
    print(f"fixtures/: {_size(FIXTURES) / 2**20:.1f} MiB")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
