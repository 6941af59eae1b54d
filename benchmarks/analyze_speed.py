"""Whole analysis against XLA's C++ parser on the same dump.

    python benchmarks/analyze_speed.py [DUMP]

DUMP defaults to ``benchmarks/_data/big`` (made by ``make_big_module.py``:
an unrolled llama-like train step; with the default 48 layers its HLO
snapshots add up to 12.2 MB).
In one fresh child process, ``analyze_dump`` runs every registered rule
over every snapshot it needs, as ``hlo-doctor analyze`` does (by default,
on a dump of one module, the rules that read only the after-propagation
snapshot run in a second process, see ``hlo_doctor/rules/parallel.py``; the
modules of a dump of several run in worker processes, see
``hlo_doctor/rules/module_workers.py``), and again in one process
(``--jobs 1``), and again with what ``--format html`` adds (each module's
communication inventory and memory picture, which parses the
after-optimizations snapshot and XLA's memory files); in another, XLA's C++ parser
(``jaxlib._hlo.hlo_module_from_text``) only parses every HLO snapshot of
the folder (in one thread). Prints the times, the ratios, and with
``--per-rule`` each rule's time alone. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DEFAULT = Path(__file__).parent / "_data" / "big"

ANALYZE = r"""
import gc, json, sys, time
from hlo_doctor.analysis import analyze_dump
select = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else None
jobs = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
drawings = len(sys.argv) > 4 and sys.argv[4] == "html"
start = time.perf_counter()
report = analyze_dump(sys.argv[1], select=select, jobs=jobs, drawings=drawings)
gc.collect(0)  # the young-generation scan owed since the analysis paused the GC: part of its cost
print(json.dumps({"seconds": time.perf_counter() - start, "findings": len(report.findings),
                  "errors": len(report.errors)}))
"""

CPP = r"""
import json, sys, time
from pathlib import Path
from jaxlib import _hlo
files = [p for p in sorted(Path(sys.argv[1]).glob("*.txt"))
         if "buffer-assignment" not in p.name and "memory-usage" not in p.name and "live-range" not in p.name]
texts = [p.read_text() for p in files]
start = time.perf_counter()
for text in texts:
    _hlo.hlo_module_from_text(text)
print(json.dumps({"seconds": time.perf_counter() - start, "files": len(files),
                  "megabytes": sum(len(t) for t in texts) / 1e6}))
"""


def child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--per-rule", action="store_true", help="also time each rule alone")
    args = parser.parse_args()
    if not args.dump.is_dir():
        subprocess.run([sys.executable, str(Path(__file__).parent / "make_big_module.py"), "--out", str(args.dump)],
                       check=True)
    cpp = child(CPP, str(args.dump))
    ours = child(ANALYZE, str(args.dump), "")
    serial = child(ANALYZE, str(args.dump), "", "1")
    html = child(ANALYZE, str(args.dump), "", "", "html")
    print(f"dump: {args.dump} ({cpp['files']} HLO snapshots, {cpp['megabytes']:.1f} MB)")
    print(f"XLA C++ parser, parse only              {cpp['seconds']:7.2f} s")
    print(f"hlo-doctor analyze (all rules)          {ours['seconds']:7.2f} s  ({ours['findings']} findings)")
    print(f"hlo-doctor analyze --jobs 1 (all rules) {serial['seconds']:7.2f} s  ({serial['findings']} findings)")
    print(f"hlo-doctor analyze --format html        {html['seconds']:7.2f} s  ({html['findings']} findings)")
    print(f"ratio (analysis / C++ parse, <=1 is the target): {ours['seconds'] / cpp['seconds']:.2f}"
          f"  (--jobs 1: {serial['seconds'] / cpp['seconds']:.2f}; html: {html['seconds'] / cpp['seconds']:.2f})")
    if args.per_rule:
        from hlo_doctor.rules import discover

        for rule_id in discover().ids():
            alone = child(ANALYZE, str(args.dump), rule_id)
            print(f"  {rule_id:28s} {alone['seconds']:7.2f} s alone (parsing included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
