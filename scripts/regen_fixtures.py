#!/usr/bin/env python
"""Regenerate fixtures/ by running the example gallery through the runner.

Each (example, framework, partitioner, variant) becomes a trimmed dump folder
``fixtures/<example>/<framework>-<partitioner>-<variant>/`` (torch_xla has no
partitioner choice: ``torch_xla-<variant>``) holding the XLA dump and
``hlo_doctor_run.json``. Expected-findings files (``expected*``, ``EXPECTED.md``) and the
hand-written ``NOTES.md`` in those folders are kept.

Examples with GPU targets also get deviceless GPU compiles,
``fixtures/<example>/jax-<target>-<variant>/`` (``jax-h100_2x8-bad``), when the
jax CUDA plugin is installed (``pip install -e .[gpu-target]``); they use JAX's
default partitioner.

    python scripts/regen_fixtures.py                 # everything
    python scripts/regen_fixtures.py --only cross-host-tp --only llama-2d
    python scripts/regen_fixtures.py --list          # what would be generated
    python scripts/regen_fixtures.py --gpu-only      # just the GPU-target fixtures
    python scripts/regen_fixtures.py --tpu-only --python /path/to/venv-with-libtpu/bin/python
    python scripts/regen_fixtures.py --old-jax /work/venvs/jax0435/bin/python

Examples with TPU targets (``v5e:4x4``, ``v4:4x4x8``, ``v5e:4x4x2slices``) get
``fixtures/<example>/jax-<target>-<variant>/`` when libtpu is importable by the
Python that runs them (``--python``; ``pip install -e .[tpu-target]``).
``--old-jax PYTHON`` compiles the version-drift pairs (``OLD_JAX_PAIRS``) with
another JAX installed under PYTHON, into ``jax<VERSION>-<partitioner>-<variant>``
(``jax0.4.35-gspmd-bad``); their expected findings are those of the 0.10.2 twin
wherever the dump holds the same information.

Rerun it whenever the JAX or torch_xla version changes; see fixtures/README.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from hlo_doctor.examples import EXAMPLES, get_example
from hlo_doctor.runner import RunError, run_example
from hlo_doctor.runner.extras import EXTRAS

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

SEED = "fsdp-activation-gather"
# Pairs compiled again with older JAX releases (version drift), with that release's
# default partitioner (GSPMD in 0.4.35, Shardy in 0.7.2).
OLD_JAX_PAIRS = (SEED, "cross-host-tp")
# ... and with a non-default partitioner: jax 0.4.35's experimental Shardy, whose partitioned
# module labels the seed's parameter 0 "b2" (before_optimizations: "x").
OLD_JAX_EXTRA = {"0.4.35": ("shardy", (SEED,))}
# Examples that also get a GSPMD fixture (besides Shardy, JAX's default).
# Every bad/fixed rule pair under both JAX partitioners; the healthy models under Shardy.
GSPMD_TOO = {SEED, "replicated-batch", "replicated-batch-regrouped", "cross-host-tp", "transposed-mesh",
             "non-batch-dim-sharding", "replicated-large-param", "reshard-churn", "uneven-padding", "scan-lost-batch",
             "constraint-chain", "embedding-lost-batch", "input-device-order",
             "scan-carry-features"}


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


def is_tpu_target(partitioner: str | None) -> bool:
    from hlo_doctor.runner.tpu_targets import is_tpu_target_name

    return is_target(partitioner) and is_tpu_target_name(partitioner)


def _python_has(python: str, module: str) -> bool:
    import subprocess

    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def _python_jax(python: str) -> tuple[str, str]:
    """(jax version, its default partitioner) of another interpreter."""
    import subprocess

    code = ("import jax; print(jax.__version__); "
            "print('shardy' if jax.config.jax_use_shardy_partitioner else 'gspmd')")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    version, partitioner = out.stdout.split()
    return version, partitioner


def fixture_dir(example: str, framework: str, partitioner: str | None, variant: str) -> Path:
    if is_target(partitioner):
        partitioner = partitioner.replace(":", "_")  # h100:2x8 -> h100_2x8
    label = "-".join(p for p in (framework, partitioner, variant) if p)
    return FIXTURES / example / label


# Hand-written files in a fixture folder, kept across a rerun: expected findings and roles,
# EXPECTED.md (what the rules must say) and NOTES.md (hand labels of the collectives).
KEPT = ("expected*", "EXPECTED.md", "NOTES.md")


def _trim_tpu_fixture(target: Path) -> None:
    """TPU dumps hold a dozen more pass snapshots than the four hlo-doctor reads (before
    optimizations, propagated, partitioned, optimized): a fixture keeps those four."""
    from hlo_doctor.dump.folder import Role, role_of
    from hlo_doctor.dump.names import FileKind, parse_file_name

    for path in target.glob("module_*.txt"):
        name = parse_file_name(path.name)
        if name is not None and name.kind is FileKind.PASS and role_of(name) is Role.OTHER:
            path.unlink()


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
    parser.add_argument("--tpu-only", action="store_true",
                        help="only the deviceless TPU-target fixtures (jax-<target>-<variant>)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs the programs (one with libtpu for TPU targets)")
    parser.add_argument("--old-jax", metavar="PYTHON",
                        help="compile OLD_JAX_PAIRS with the JAX installed under PYTHON instead")
    args = parser.parse_args(argv)

    if args.old_jax:
        return _regen_old_jax(args.old_jax, args.only)
    selected = [c for c in cases() if (not args.only or c[0] in args.only)
                and (not args.gpu_only or (is_target(c[2]) and not is_tpu_target(c[2])))
                and (not args.tpu_only or is_tpu_target(c[2]))]
    if args.list:
        for case in selected:
            print(fixture_dir(*case).relative_to(ROOT))
        return 0

    python = args.python
    have_torch_xla = _python_has(python, "torch_xla")
    have_gpu_plugin = _python_has(python, "jax_plugins.xla_cuda12")
    have_libtpu = _python_has(python, "libtpu")
    have_third_party = all(_python_has(python, m) for m in EXTRAS["third-party"])
    failures = 0
    for example, framework, partitioner, variant in selected:
        target = fixture_dir(example, framework, partitioner, variant)
        label = target.relative_to(ROOT)
        if framework == "torch_xla" and not have_torch_xla:
            print(f"skip {label}: torch_xla is not installed")
            continue
        if get_example(example).extra == "third-party" and not have_third_party:
            print(f"skip {label}: the third-party extra is not installed for {python} (.[third-party])")
            continue
        if is_tpu_target(partitioner) and not have_libtpu:
            print(f"skip {label}: libtpu is not installed for {python} (.[tpu-target])")
            continue
        if is_target(partitioner) and not is_tpu_target(partitioner) and not have_gpu_plugin:
            print(f"skip {label}: the jax CUDA plugin is not installed (.[gpu-target])")
            continue
        kept = _take_expected(target)
        if target.exists():
            shutil.rmtree(target)
        start = time.monotonic()
        try:
            if is_target(partitioner):
                run_example(example, framework=framework, variant=variant, dump_dir=target,
                            target=partitioner, python=python)
                if is_tpu_target(partitioner):
                    _trim_tpu_fixture(target)
            else:
                run_example(example, framework=framework, variant=variant, dump_dir=target,
                            partitioner=partitioner, python=python)
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


def _regen_old_jax(python: str, only: list[str] | None) -> int:
    """The version-drift fixtures: OLD_JAX_PAIRS compiled by another JAX release."""
    version, default = _python_jax(python)
    runs = [(example, default, None) for example in OLD_JAX_PAIRS]
    if version in OLD_JAX_EXTRA:
        extra, examples = OLD_JAX_EXTRA[version]
        runs += [(example, extra, extra) for example in examples]
    failures = 0
    for example, partitioner, chosen in runs:
        if only and example not in only:
            continue
        for variant in ("bad", "fixed"):
            target = FIXTURES / example / f"jax{version}-{partitioner}-{variant}"
            label = target.relative_to(ROOT)
            kept = _take_expected(target)
            if target.exists():
                shutil.rmtree(target)
            start = time.monotonic()
            try:
                run_example(example, framework="jax", variant=variant, dump_dir=target, python=python,
                            partitioner=chosen)
            except RunError as error:
                failures += 1
                print(f"FAIL {label}: {error}\n{error.format_tail()}", file=sys.stderr)
                continue
            finally:
                target.mkdir(parents=True, exist_ok=True)
                for name, data in kept.items():
                    (target / name).write_bytes(data)
            print(f"wrote {label} ({_size(target) / 1024:.0f} KiB, {time.monotonic() - start:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
