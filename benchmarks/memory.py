"""Peak memory of ``analyze`` against XLA's C++ parser, on the issue's two memory benchmarks.

    python benchmarks/memory.py --real DUMP [--data DIR] [--cases llama4,simple300]

``llama4``: a dump of four modules, each a copy of the real train step in
``DUMP`` (``make_big_module.py --layers 520 --fast-backend`` writes its three
pre-optimization snapshots, 72.7 MB, within a minute or two; its CPU backend
compile takes far longer and may be stopped then; see ``synthetic.py copies``). ``simple300``: one module of
about 300 MB of simple instructions (``synthetic.py simple``).

Each measurement runs in a fresh child process; peak RSS is the child's
``ru_maxrss``. ``analyze`` runs every registered rule, as ``hlo-doctor
analyze`` does, once with ``--jobs 1`` (one process) and once with the
default jobs (worker processes: the peak of the biggest process is shown,
and the sum of all of them, which the processes may hold at once, is at most
jobs x that). XLA's C++ parser (``jaxlib._hlo.hlo_module_from_text``) parses
each HLO snapshot of the dump in turn, one file in memory at a time (the
buffer-assignment, memory-usage and live-range reports are not HLO modules:
neither side reads them). Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import make_copies, make_simple_dump  # noqa: E402 - the sibling script

TARGETS_MIB = {"llama4": 512, "simple300": 1536}
BEFORE = {"llama4": "1019 MiB", "simple300": "3.27 GB"}  # the "today"

ANALYZE = r"""
import gc, json, resource, sys, time
from hlo_doctor.analysis import analyze_dump
jobs = int(sys.argv[2]) if sys.argv[2] else None
start = time.perf_counter()
report = analyze_dump(sys.argv[1], jobs=jobs)
gc.collect(0)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "findings": len(report.findings), "errors": len(report.errors),
                  "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

CPP = r"""
import json, resource, sys, time
from pathlib import Path
from jaxlib import _hlo
files = [p for p in sorted(Path(sys.argv[1]).glob("*.txt"))
         if "buffer-assignment" not in p.name and "memory-usage" not in p.name and "live-range" not in p.name]
seconds = megabytes = 0.0
for path in files:
    text = path.read_text()
    megabytes += len(text) / 1e6
    start = time.perf_counter()
    module = _hlo.hlo_module_from_text(text)
    seconds += time.perf_counter() - start
    del module, text
print(json.dumps({"seconds": seconds, "files": len(files), "megabytes": megabytes,
                  "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(kib: int) -> float:
    return kib / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, help="a make_big_module.py dump (needed for llama4)")
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "_data")
    parser.add_argument("--cases", default="llama4,simple300")
    args = parser.parse_args()
    print(f"{'case':10s} {'HLO MB':>7s} {'ours -j1':>10s} {'ours -jN':>16s} {'C++ parse':>10s} "
          f"{'target':>9s}  {'met':3s}  analyze -j1 / C++ time")
    for case in args.cases.split(","):
        if case == "llama4":
            if args.real is None:
                parser.error("llama4 needs --real DUMP (make_big_module.py --layers 520 --out DUMP)")
            folder = make_copies(args.real, args.data / "llama4", 4)
        elif case == "simple300":
            folder = make_simple_dump(args.data / "simple300", 300)
        else:
            parser.error(f"unknown case {case}")
        cpp = child(CPP, str(folder))
        serial = child(ANALYZE, str(folder), "1")
        ours = mib(serial["self_kib"])
        if len({p.name.split(".", 1)[0] for p in folder.glob("module_*.txt")}) > 1:
            parallel = child(ANALYZE, str(folder), "")
            biggest = f"{mib(max(parallel['self_kib'], parallel['children_kib'])):6.0f} MiB/proc"
        else:  # one module: the default jobs would split its rules, not its parse
            biggest = f"{'-':>6s} MiB/proc"
        target = TARGETS_MIB[case]
        print(f"{case:10s} {cpp['megabytes']:7.1f} {ours:6.0f} MiB {biggest} {mib(cpp['self_kib']):6.0f} MiB "
              f"{target:5d} MiB  {'yes' if ours <= target else 'no':3s}  "
              f"{serial['seconds']:.1f} s / {cpp['seconds']:.1f} s = {serial['seconds'] / cpp['seconds']:.2f}"
              f"  (the issue's today: {BEFORE[case]}; {serial['findings']} findings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
