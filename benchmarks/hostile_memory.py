"""Peak memory per input MB of ``analyze`` on hostile dumps, against XLA's C++ parser (issue 30).

    python benchmarks/hostile_memory.py [--megabytes 20] [--cases long-name,huge-attribute,huge-iota]

Each case is the real fixture ``fixtures/fsdp-activation-gather/jax-shardy-bad``
copied to a scratch folder and mutated:

* ``long-name``: the ``op_name`` of the dot (``jit(mlp)/dot_general``) made
  ``--megabytes`` MB long in the snapshot after propagation (the one the
  rules read names from);
* ``huge-attribute``: a ``frontend_attributes`` value of ``--megabytes`` MB on
  the dot of that snapshot (an attribute hlo-doctor keeps as raw text);
* ``huge-iota``: ``replica_groups=[1000000000,4]<=[4000000000]`` on an
  all-gather and ``sharding={devices=[4000000000,1]<=[4000000000]}`` on a
  parameter (bytes of input; rejected with file:line:col, it must cost nothing).

Each measurement runs ``hlo-doctor analyze --format text`` (and ``--format
json``, which keeps whole names), output to ``/dev/null``, in a fresh child
process; peak RSS is the
child's ``ru_maxrss``. *MiB/MB* is that peak over the dump's size in MB (the
issue's measure: at most 10); *added/MB* is (peak - the peak on the unmutated
fixture) / (the MB the mutation added), the cost of the hostile bytes
themselves. The huge-iota dump is bytes, not megabytes: there the peak must
stay within 16 MiB of the unmutated fixture's. XLA's C++ parser
(``jaxlib._hlo.hlo_module_from_text``) parses each snapshot of the same dump in
turn, in the same way, for the ratio. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"
TARGET_PER_MB = 10.0

ANALYZE = r"""
import io, json, os, resource, sys, time
from hlo_doctor.cli import main
sys.argv = ["hlo-doctor", "analyze", sys.argv[1], "--format", sys.argv[2], "--jobs", "1"]
real_stdout, sys.stdout = sys.stdout, open(os.devnull, "w")  # what a user's terminal or pipe reads
sys.stderr = io.StringIO()
start = time.perf_counter()
code, traceback = 0, False
try:
    main()
except SystemExit as exit:
    code = exit.code if isinstance(exit.code, int) else 1
except BaseException:
    code, traceback = 1, True
print(json.dumps({"seconds": time.perf_counter() - start, "exit": code, "traceback": traceback,
                  "stderr": sys.stderr.getvalue()[-300:],
                  "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), file=real_stdout)
"""

CPP = r"""
import json, resource, sys, time
from pathlib import Path
from jaxlib import _hlo
start = time.perf_counter()
failed = 0
for path in sorted(Path(sys.argv[1]).glob("*.txt")):
    text = path.read_text()
    try:
        module = _hlo.hlo_module_from_text(text)
        del module
    except Exception:
        failed += 1
    del text
print(json.dumps({"seconds": time.perf_counter() - start, "failed": failed,
                  "self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


MEMORY_CAP = 6 << 30  # a child past this fails (MemoryError) instead of taking the machine's memory


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=1800,
                         preexec_fn=_capped)
    lines = out.stdout.strip().splitlines()
    if not lines:
        return {"self_kib": 0, "seconds": 0.0, "error": out.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(lines[-1])


def dump_megabytes(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def make_case(case: str, folder: Path, megabytes: float) -> Path:
    shutil.copytree(SEED, folder)
    size = int(megabytes * 1e6)
    for snapshot in sorted(folder.glob("*.txt")):
        text = snapshot.read_text()
        if case in ("long-name", "huge-attribute") and "before_spmd-partitioning" not in snapshot.name:
            continue
        if case == "long-name":
            name = "jit(mlp)/" + ("layer_" * (size // 6 + 1))[:size]
            text = text.replace('op_name="jit(mlp)/dot_general"', f'op_name="{name}"', 1)
        elif case == "huge-attribute":
            attribute = f', frontend_attributes={{hostile="{"x" * size}"}}'
            text = re.sub(r"( dot\([^\n]*?)(, metadata=)", lambda m, a=attribute: m.group(1) + a + m.group(2),
                          text, count=1)
        elif case == "huge-iota":
            text = re.sub(r"replica_groups=mesh\[[^\]]*\] \{[^}]*\}", "replica_groups=[1000000000,4]<=[4000000000]",
                          text, count=1)
            text = re.sub(r"(parameter\(0\)), sharding=\{[^}]*\}",
                          r"\1, sharding={devices=[4000000000,1]<=[4000000000]}", text, count=1)
        else:
            raise SystemExit(f"unknown case {case}")
        snapshot.write_text(text)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=20.0, help="size of the long name / attribute")
    parser.add_argument("--cases", default="long-name,huge-attribute,huge-iota")
    parser.add_argument("--formats", default="text,json")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="hlo-doctor-hostile-"))
    try:
        base_mb = dump_megabytes(SEED)
        baseline = {fmt: child(ANALYZE, str(SEED), fmt)["self_kib"] / 1024 for fmt in args.formats.split(",")}
        cpp_base = child(CPP, str(SEED))["self_kib"] / 1024
        print(f"fixture: {base_mb:.2f} MB; peak RSS ours {baseline} MiB, C++ parse {cpp_base:.0f} MiB")
        print(f"{'case':15s} {'fmt':5s} {'input MB':>8s} {'exit':>4s} {'peak MiB':>8s} {'MiB/MB':>7s} "
              f"{'added/MB':>8s} {'C++ MiB':>7s} {'C++/MB':>6s} {'ours/C++':>8s} {'seconds':>7s}  "
              f"met (<= {TARGET_PER_MB:g} MiB per MB)")
        for case in args.cases.split(","):
            folder = make_case(case, scratch / case, args.megabytes)
            size = dump_megabytes(folder)
            added = size - base_mb
            cpp = child(CPP, str(folder))
            cpp_mib = cpp["self_kib"] / 1024
            for fmt in args.formats.split(","):
                ours = child(ANALYZE, str(folder), fmt)
                peak = ours["self_kib"] / 1024
                if added >= 1:  # a big input: its cost per MB
                    per_mb, added_per_mb = f"{peak / size:7.1f}", f"{(peak - baseline[fmt]) / added:8.1f}"
                    cpp_per_mb = f"{cpp_mib / size:6.1f}"
                    met = peak / size <= TARGET_PER_MB
                else:  # bytes of input (an iota): it must cost nothing beyond the fixture's own analysis
                    per_mb, added_per_mb, cpp_per_mb = f"{'-':>7s}", f"{'-':>8s}", f"{'-':>6s}"
                    met = peak - baseline[fmt] < 16
                verdict = "no (traceback)" if ours.get("traceback") else "no (failed)" if not peak else \
                    "yes" if met else "no"
                ratio = f"{peak / cpp_mib:8.2f}" if cpp_mib else f"{'-':>8s}"
                print(f"{case:15s} {fmt:5s} {size:8.2f} {ours.get('exit', '?'):>4} {peak:8.0f} {per_mb} "
                      f"{added_per_mb} {cpp_mib:7.0f} {cpp_per_mb} {ratio} {ours['seconds']:7.1f}  {verdict}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
