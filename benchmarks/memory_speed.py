"""``hlo-doctor memory`` against ``hlo-doctor analyze`` on the same dump, each in a fresh process.

    python benchmarks/memory_speed.py [DUMP] [--repeat 3]

DUMP defaults to ``benchmarks/_data/big`` (``make_big_module.py``; the
130-layer dump: ``make_big_module.py --layers 130``). Prints the best time of
each over ``--repeat`` alternating runs and their ratio: ``memory`` parses
the per-device snapshots and walks the entry once, where ``analyze`` runs
every rule (the memory rules included). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DEFAULT = Path(__file__).parent / "_data" / "big"

MEMORY = r"""
import gc, json, sys, time
from hlo_doctor._gc import paused_gc
from hlo_doctor.dump import load_dump
from hlo_doctor.rules._memory import memory_of
from hlo_doctor.rules.context import RuleContext
start = time.perf_counter()
with paused_gc():
    dump = load_dump(sys.argv[1])
    peaks = [memory_of(RuleContext(dump, m)) for m in dump.modules]
gc.collect(0)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "peaks": [(m.peak_bytes, m.peak_source) for m in peaks if m is not None]}))
"""

ANALYZE = r"""
import gc, json, sys, time
from hlo_doctor.analysis import analyze_dump
start = time.perf_counter()
report = analyze_dump(sys.argv[1])
gc.collect(0)
print(json.dumps({"seconds": time.perf_counter() - start, "findings": len(report.findings)}))
"""


def child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not args.dump.is_dir():
        subprocess.run([sys.executable, str(Path(__file__).parent / "make_big_module.py"), "--out", str(args.dump)],
                       check=True)
    memory, analyze = [], []
    for _ in range(args.repeat):
        memory.append(child(MEMORY, str(args.dump)))
        analyze.append(child(ANALYZE, str(args.dump)))
    best_memory = min(r["seconds"] for r in memory)
    best_analyze = min(r["seconds"] for r in analyze)
    print(f"dump: {args.dump}")
    print(f"hlo-doctor memory   {best_memory:7.2f} s  (best of {args.repeat}; peaks {memory[0]['peaks']})")
    print(f"hlo-doctor analyze  {best_analyze:7.2f} s  (best of {args.repeat}; {analyze[0]['findings']} findings)")
    print(f"ratio (memory / analyze): {best_memory / best_analyze:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
