"""Cost per MB of ``analyze`` at three dump sizes, against XLA's C++ parser on the same files.

    python benchmarks/scaling.py --real DUMP [--modules 1,3,8] [--data DIR] [--jobs N]

Each size is a dump folder of N copies of the real module in ``DUMP``
(``make_big_module.py``'s output; the copies are hard links, see
``synthetic.py copies``): compiling one real 1 GB module takes far longer
than the benchmark, and several modules in one folder is what torch_xla
dumps hold. For each size, in fresh child processes: XLA's C++ parser parses
every HLO snapshot of the folder (one file in memory at a time), and
``analyze`` runs every registered rule (``--jobs`` as given, else the
default). Prints seconds and peak RSS per MB of HLO text, the ratio to the
C++ parse-only time, and how far apart the per-MB figures are (the goal:
at most 20%). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from memory import ANALYZE, CPP, child, mib  # noqa: E402 - the sibling script
from synthetic import make_copies  # noqa: E402


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, required=True)
    parser.add_argument("--modules", default="1,3,8")
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    parser.add_argument("--jobs", default="")
    args = parser.parse_args()
    rows = []
    print(f"{'modules':>7s} {'HLO MB':>7s} {'C++ s':>7s} {'analyze s':>9s} {'ratio':>6s} {'s/MB':>7s} "
          f"{'RSS MiB':>8s} {'MiB/MB':>7s} {'workers MiB':>11s}")
    for count in (int(n) for n in args.modules.split(",")):
        folder = make_copies(args.real, args.data / f"copies{count}", count)
        cpp = child(CPP, str(folder))
        ours = child(ANALYZE, str(folder), args.jobs)
        megabytes = cpp["megabytes"]
        rss = mib(ours["self_kib"])
        workers = mib(ours["children_kib"])
        rows.append((megabytes, ours["seconds"] / megabytes, max(rss, workers) / megabytes))
        print(f"{count:7d} {megabytes:7.1f} {cpp['seconds']:7.2f} {ours['seconds']:9.2f} "
              f"{ours['seconds'] / cpp['seconds']:6.2f} {ours['seconds'] / megabytes:7.4f} "
              f"{rss:8.0f} {max(rss, workers) / megabytes:7.3f} {workers:11.0f}", flush=True)
    times = [r[1] for r in rows]
    memory = [r[2] for r in rows]
    print(f"time per MB: {spread(times):.0%} apart ({'within' if spread(times) <= 0.2 else 'over'} 20%)")
    print(f"peak RSS of the biggest process per MB: {spread(memory):.0%} apart "
          f"({'within' if spread(memory) <= 0.2 else 'over'} 20%; bounded by one module's parse, "
          f"it falls as modules are added)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
