"""Parse speed and peak memory: hlo-doctor's parser against XLA's C++ parser.

    python benchmarks/parse_speed.py [FILE]

FILE defaults to the biggest after-partitioning module that
``make_big_module.py`` writes (made on first use). Each parser runs in its own
fresh child process, so the peak RSS of one does not hide the other's; each
child reads the file, parses it ``--repeat`` times and reports its best time
and its peak RSS above the interpreter's baseline.

Prints MB/s for both parsers and the ratios (ours / C++). Not a test: numbers
depend on the machine, so nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).parent / "_data" / "big"

CHILD = r"""
import gc, json, resource, sys, time
path, which, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
if which == "ours":
    from hlo_doctor.hlo import parse_module as parse
else:
    from jaxlib import _hlo
    parse = _hlo.hlo_module_from_text
text = open(path, encoding="utf-8").read()
gc.collect()
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
best = float("inf")
for _ in range(repeat):
    start = time.perf_counter()
    module = parse(text)
    # The parser pauses the cyclic GC; the young-generation scan that resuming it
    # brings (at the next allocation) is part of the cost of parsing: count it.
    gc.collect(0)
    best = min(best, time.perf_counter() - start)
    del module
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": best, "peak_kb": peak, "baseline_kb": baseline}))
"""


def default_file() -> Path:
    candidates = sorted(DATA.glob("*after_spmd-partitioning*.txt"), key=lambda p: p.stat().st_size)
    if not candidates or candidates[-1].stat().st_size < 20e6:
        subprocess.run(
            [sys.executable, str(Path(__file__).parent / "make_big_module.py"), "--out", str(DATA)],
            check=True,
        )
        candidates = sorted(DATA.glob("*after_spmd-partitioning*.txt"), key=lambda p: p.stat().st_size)
    return candidates[-1]


def measure(path: Path, which: str, repeat: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), which, str(repeat)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = args.file or default_file()
    size_mb = path.stat().st_size / 1e6
    print(f"file: {path.name} ({size_mb:.1f} MB)")
    results = {}
    for which in ("cpp", "ours"):
        r = measure(path, which, args.repeat)
        results[which] = r
        label = "XLA C++ (jaxlib _hlo)" if which == "cpp" else "hlo-doctor parse_module"
        print(
            f"{label:26s} {r['seconds']:7.3f} s  {size_mb / r['seconds']:6.1f} MB/s  "
            f"peak RSS {r['peak_kb'] / 1024:7.1f} MiB (+{(r['peak_kb'] - r['baseline_kb']) / 1024:.1f} MiB over baseline)"
        )
    speed_ratio = results["cpp"]["seconds"] / results["ours"]["seconds"]
    rss_ratio = results["ours"]["peak_kb"] / results["cpp"]["peak_kb"]
    print(f"speed ratio (ours/C++, >1 means faster): {speed_ratio:.2f}")
    print(f"peak RSS ratio (ours/C++, <=1 means no more memory): {rss_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
