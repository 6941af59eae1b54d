"""Run ``hlo-doctor fix --verify`` on every bad gallery program and print a table of the outcomes.

    python scripts/verify_gallery.py [--python PY] [--only NAME ...] [--json OUT]

Each example with a ``bad`` variant runs as ``hlo-doctor fix --verify --devices N
[--devices-per-host H | --target T] -- PY programs/<script> --variant bad``, with the device
count, host size and default target the gallery registry gives it, for each of its frameworks
(JAX, torch_xla). ``--python``: the interpreter that runs the programs (one with the
``third-party`` extra for the hf-/flax-/keras- examples; those are reported as skipped when it
lacks their libraries). A variant's XLA flags from the registry are set in ``XLA_FLAGS``, as a
user's shell would set them. Not a test: it compiles every program twice or more (minutes).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

from hlo_doctor.examples.registry import EXAMPLES


def _has(python: str, module: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec(module) is not None
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


_EXTRA_MODULES = {"third-party": ("transformers", "flax", "keras")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--only", nargs="*", default=())
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)
    rows = []
    for example in EXAMPLES:
        if "bad" not in example.variants or (args.only and example.name not in args.only):
            continue
        for framework in example.frameworks:
            command = [sys.executable, "-m", "hlo_doctor.cli", "fix", "--verify", "--format", "json"]
            if example.targets:
                command += ["--target", example.targets[0]] if example.target_only else ["--devices",
                                                                                           str(example.devices)]
            else:
                command += ["--devices", str(example.devices)]
            if example.devices_per_host and "--target" not in command:
                command += ["--devices-per-host", str(example.devices_per_host)]
            command += ["--", args.python, str(example.script(framework)), "--variant", "bad"]
            needed = _EXTRA_MODULES.get(example.extra or "", ())
            if framework == "torch_xla" and not _has(args.python, "torch_xla"):
                needed = ("torch_xla",)
            missing = [m for m in needed if not _has(args.python, m)]
            if missing:
                rows.append({"example": example.name, "framework": framework, "outcome": "skipped",
                             "detail": f"{', '.join(missing)} not installed for {args.python}"})
                continue
            env = dict(os.environ)
            flags = example.variant_xla_flags.get("bad") or {}
            if flags:  # the registry's flags for the variant: set in the environment, as a user's shell would
                env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", "")] + [f"--{k}={v}" for k, v in flags.items()]).strip()
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            seconds = time.perf_counter() - start
            row = {"example": example.name, "framework": framework, "exit_code": done.returncode,
                   "seconds": round(seconds, 1)}
            try:
                document = json.loads(done.stdout)
            except json.JSONDecodeError:
                row.update(outcome="error", detail=(done.stderr.strip().splitlines() or [""])[-1])
                rows.append(row)
                continue
            gone = sum(t["status"] == "gone" for t in document["targeted"])
            row.update(
                outcome="verified" if document["ok"] else "not verified",
                edits=len(document["edits"]), gone=f"{gone}/{len(document['targeted'])}",
                new=len(document["new_findings"]),
                refused="; ".join(r["reason"] for r in document["refused"])[:160],
                problems="; ".join(document["problems"])[:160],
                critical=(document["bytes_per_device"]["before"]["critical_path"],
                          (document["bytes_per_device"].get("after") or {}).get("critical_path")))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{'example':34} {'framework':9} {'outcome':13} {'gone':5} {'new':3}  detail")
    for row in rows:
        detail = row.get("refused") or row.get("problems") or row.get("detail") or ""
        print(f"{row['example']:34} {row['framework']:9} {row['outcome']:13} {row.get('gone', ''):5} "
              f"{row.get('new', ''):3}  {detail}")
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
