"""Cost per MB of ``analyze`` at three dump sizes, against XLA's C++ parser on the same files.

    python benchmarks/scaling.py --real DUMP [--modules 8,25,82] [--data DIR] [--jobs N] [--repeat K]
    python benchmarks/scaling.py --simple 100,300,1000 [--data DIR] [--repeat K]

``--real``: each size is a dump folder of N copies of the real module in
``DUMP`` (``make_big_module.py``'s output; the copies are hard links, see
``synthetic.py copies``): compiling one real 1 GB module takes far longer
than the benchmark, and several modules in one folder is what torch_xla
dumps hold. ``analyze`` runs with ``--jobs`` as given, else the default (the
modules go to worker processes).

``--simple``: each size is one module of that many MB of simple
instructions (``synthetic.py simple``), analysed with ``--jobs 1``: the cost
of one module as it grows, where the copies measure a dump as it gains
modules.

For each size, in fresh child processes: XLA's C++ parser parses every HLO
snapshot of the folder (one file in memory at a time), and ``analyze`` runs
every registered rule. Prints seconds and peak RSS per MB of HLO text, the
ratio to the C++ parse-only time, and how far apart the per-MB figures are
(the goal: at most 20%). With ``--repeat K`` each size is measured K times,
the C++ parse and ``analyze`` in turn, and the medians are printed (the
ratio: the median of the K pairs' ratios, with their range): a machine whose
speed drifts moves both sides of a pair alike. Not a test: numbers depend on
the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).parent))
from memory import ANALYZE, CPP, child, mib  # noqa: E402 - the sibling script
from synthetic import make_copies, make_simple_dump  # noqa: E402


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1


def measure(folders: list[tuple[str, Path]], jobs: str, repeat: int = 1) -> None:
    """One table row per (label, dump folder), then the spread of the per-MB figures."""
    rows = []
    print(f"{'size':>12s} {'HLO MB':>7s} {'C++ s':>7s} {'analyze s':>9s} {'ratio':>6s} {'range':>11s} "
          f"{'s/MB':>7s} {'RSS MiB':>8s} {'MiB/MB':>7s} {'workers MiB':>11s}")
    for label, folder in folders:
        pairs = [(child(CPP, str(folder)), child(ANALYZE, str(folder), jobs)) for _ in range(repeat)]
        megabytes = pairs[0][0]["megabytes"]
        cpp_seconds = median(cpp["seconds"] for cpp, _ in pairs)
        seconds = median(ours["seconds"] for _, ours in pairs)
        ratios = sorted(ours["seconds"] / cpp["seconds"] for cpp, ours in pairs)
        rss = max(mib(ours["self_kib"]) for _, ours in pairs)
        workers = max(mib(ours["children_kib"]) for _, ours in pairs)
        rows.append((megabytes, seconds / megabytes, max(rss, workers) / megabytes))
        span = f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if repeat > 1 else "-"
        print(f"{label:>12s} {megabytes:7.1f} {cpp_seconds:7.2f} {seconds:9.2f} "
              f"{median(ratios):6.2f} {span:>11s} {seconds / megabytes:7.4f} "
              f"{rss:8.0f} {max(rss, workers) / megabytes:7.3f} {workers:11.0f}", flush=True)
    times = [r[1] for r in rows]
    memory = [r[2] for r in rows]
    print(f"time per MB: {spread(times):.0%} apart ({'within' if spread(times) <= 0.2 else 'over'} 20%)")
    print(f"peak RSS of the biggest process per MB: {spread(memory):.0%} apart "
          f"({'within' if spread(memory) <= 0.2 else 'over'} 20%)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, help="a make_big_module.py dump, copied --modules times")
    parser.add_argument("--modules", default="8,25,82")
    parser.add_argument("--simple", default="", help="MB of each one-module size, e.g. 100,300,1000")
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    parser.add_argument("--jobs", default="")
    parser.add_argument("--repeat", type=int, default=1, help="measure each size this many times (medians)")
    args = parser.parse_args()
    if args.real is None and not args.simple:
        parser.error("give --real DUMP, --simple SIZES or both")
    if args.real is not None:
        print(f"copies of {args.real} (jobs: {args.jobs or 'default'}); RSS per MB falls as modules are added, "
              "since each process holds one module")
        measure([(f"{n} modules", make_copies(args.real, args.data / f"copies{n}", n))
                 for n in (int(n) for n in args.modules.split(","))], args.jobs, args.repeat)
    if args.simple:
        print("one module of simple instructions (jobs: 1)")
        measure([(f"{n} MB", make_simple_dump(args.data / f"simple{n}", float(n)))
                 for n in args.simple.split(",")], "1", args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
