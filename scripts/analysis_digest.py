"""A digest of everything ``analyze`` works out, per dump: run it before and after a change that
must not change results (a speed-up), and compare.

    python scripts/analysis_digest.py OUT [DUMP ...]

For every dump under ``fixtures/`` (and each ``DUMP`` given, e.g. a ``benchmarks/make_big_module.py``
output), at the dump's own host layout, on one host and on two hosts (``--devices-per-host``
the module's partitions, and half of them), it records:

* the JSON report of ``analyze_dump`` with every rule (findings, messages, fixes, evidence);
* per module, the collectives inventory (role, phase, parameters, axes, bytes, reason of each),
  the entry parameters' classes, the data-parallel axes, the bytes by role, and the batch dims
  of every value of the partitioned graph;
* the batch inputs and the batch dims of every value of the after-propagation graph, as
  ``non-batch-dim-sharding`` computes them.

It writes one JSON file per dump into ``OUT`` and prints one line per dump, ``sha256 path``:
``diff`` two runs' outputs, then the JSON files of a dump that differs. Not a test: it reads
whatever the fixtures are today.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import load_dump
from hlo_doctor.graph.dataflow import DataflowGraph, build_graph
from hlo_doctor.report.json import report_to_dict
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.semantics.batch_dims import BatchAnalysis, analyze_batch
from hlo_doctor.semantics.inventory import module_rows

ROOT = Path(__file__).resolve().parents[1]


def fixture_dumps() -> list[Path]:
    """The fixture dumps, as paths from the repository root (so that two checkouts agree)."""
    return sorted({path.parent for path in Path("fixtures").glob("**/*.txt")})


def batch_dims(graph: DataflowGraph, analysis: BatchAnalysis) -> list[tuple[str, list[tuple[int, int]]]]:
    keys = graph.keys
    found = ((keys[node], analysis.batch_dims(keys[node])) for node in range(len(graph)))
    return sorted((str(key), sorted(dims.items())) for key, dims in found if dims)


def module_facts(dump: Path, devices_per_host: int | None) -> list[dict[str, Any]]:
    loaded = load_dump(dump)
    facts = []
    for module in loaded.modules:
        ctx = RuleContext(loaded, module, AnalysisOptions(devices_per_host=devices_per_host))
        record: dict[str, Any] = {"module": module.key}
        if ctx.per_device is not None and ctx.graph is not None:
            semantics = ctx.semantics
            record["collectives"] = [row.as_json() for row in module_rows(semantics)]
            record["parameters"] = repr(semantics.parameters)
            record["data_parallel_axes"] = sorted(semantics.data_parallel_axes)
            record["bytes"] = repr(semantics.bytes)
            if semantics.batch is not None:
                record["batch_inputs"] = sorted(semantics.batch.batch_inputs)
                record["batch_dims"] = batch_dims(ctx.graph, semantics.batch)
        sharded = ctx.after_propagation
        if sharded is not None and sharded.entry is not None:
            graph = build_graph(sharded)
            analysis = analyze_batch(ctx, sharded, graph, per_device=False)
            record["sharded_batch_inputs"] = sorted(analysis.batch_inputs)
            record["sharded_batch_dims"] = batch_dims(graph, analysis)
        facts.append(record)
    return facts


def digest(dump: Path) -> dict[str, Any]:
    modules = load_dump(dump).modules
    partitions = max((module.num_partitions or 1 for module in modules), default=1)
    entry: dict[str, Any] = {}
    for hosts, devices_per_host in (("own", None), ("1", partitions), ("2", max(1, partitions // 2))):
        report = report_to_dict(analyze_dump(dump, jobs=1, devices_per_host=devices_per_host))
        report.pop("dump", None)
        entry[f"report, hosts {hosts}"] = report
        entry[f"facts, hosts {hosts}"] = module_facts(dump, devices_per_host)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="a folder for one JSON file per dump")
    parser.add_argument("dumps", type=Path, nargs="*", help="more dumps besides the fixtures")
    args = parser.parse_args()
    out = args.out.resolve()
    extra = [dump.resolve() for dump in args.dumps]
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)  # the reports name the fixtures' files from here
    for dump in [*fixture_dumps(), *extra]:
        text = json.dumps(digest(dump), sort_keys=True, default=str, indent=1)
        (out / f"{str(dump).strip('/').replace('/', '_')}.json").write_text(text)
        print(hashlib.sha256(text.encode()).hexdigest()[:16], dump, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
