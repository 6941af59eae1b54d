"""Instructions executed per ``analyze`` of one module, counted by valgrind, against XLA's C++ parser.

    python benchmarks/instructions.py DUMP [TREE ...]

Wall-clock time on a shared VM moves by a third from one minute to the next, more than most
single speed-ups are worth; the count of instructions a run executes does not move (the hash
seed is fixed). For each source ``TREE`` (a checkout of this repository; default: this one) it
counts, under ``valgrind --tool=callgrind``, the instructions of a process that imports the
tree's ``hlo_doctor`` and runs ``analyze_dump(DUMP, jobs=1)`` once and three times: the
difference halved is one analysis (the imports, the first run's warm-up and the interpreter's
start fall out). It counts XLA's C++ parse of the dump's HLO snapshots the same way, and prints
each tree's count, its ratio to the first tree's and to the C++ parse. Each count takes about
as long as 50 runs. Not a test: it needs valgrind, and numbers depend on the Python build.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ANALYZE = r"""
import gc, sys
sys.path.insert(0, sys.argv[1])
from hlo_doctor.analysis import analyze_dump
for _ in range(int(sys.argv[3])):
    analyze_dump(sys.argv[2], jobs=1)
    gc.collect(0)
"""

CPP = r"""
import sys
from pathlib import Path
from jaxlib import _hlo
files = [p for p in sorted(Path(sys.argv[2]).glob("*.txt"))
         if "buffer-assignment" not in p.name and "memory-usage" not in p.name and "live-range" not in p.name]
texts = [p.read_text() for p in files]
for _ in range(int(sys.argv[3])):
    for text in texts:
        _hlo.hlo_module_from_text(text)
"""

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def count(code: str, tree: str, dump: str, runs: int) -> int:
    """Instructions of one process running ``code`` ``runs`` times."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, "-c", code, tree, dump, str(runs)],
                         capture_output=True, text=True, check=True, env=env)
    found = _COLLECTED.search(out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_run(code: str, tree: str, dump: str) -> int:
    return (count(code, tree, dump, 3) - count(code, tree, dump, 1)) // 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", type=Path, help="a dump folder of one module (make_big_module.py's output)")
    parser.add_argument("trees", nargs="*", type=Path, help="checkouts of this repository (default: this one)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed")
    trees = [str(t.resolve()) for t in args.trees] or [str(Path(__file__).resolve().parents[1])]
    dump = str(args.dump.resolve())
    cpp = per_run(CPP, trees[0], dump)
    print(f"{'C++ parse':>40s} {cpp / 1e6:10.0f} M instructions")
    first = None
    for tree in trees:
        ours = per_run(ANALYZE, tree, dump)
        first = first or ours
        print(f"{tree:>40s} {ours / 1e6:10.0f} M instructions   x{ours / first:.3f} of the first   "
              f"{ours / cpp:.2f} of the C++ parse", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
