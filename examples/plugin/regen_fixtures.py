#!/usr/bin/env python
"""Regenerate tests/cases/moe/{bad,fixed}/ from fixtures_src/moe.py with hlo-doctor's runner.

    python examples/plugin/regen_fixtures.py

Each case folder is replaced, except its expected_findings.json. Rerun it when
the jax/jaxlib version changes and review the expected findings.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hlo_doctor.runner import run_script

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "fixtures_src" / "moe.py"
CASES = HERE / "tests" / "cases" / "moe"


def main() -> None:
    for variant in ("bad", "fixed"):
        target = CASES / variant
        expected = target / "expected_findings.json"
        kept = expected.read_bytes() if expected.is_file() else None
        shutil.rmtree(target, ignore_errors=True)
        result = run_script(SCRIPT, ["--variant", variant], dump_dir=target, framework="jax", devices=8)
        if kept is not None:
            expected.write_bytes(kept)
        print(f"{variant}: {result.dump_dir} ({result.trim.bytes_kept / 1e6:.1f} MB kept)")


if __name__ == "__main__":
    main()
