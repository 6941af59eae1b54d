"""Graph build time against parse time on the big module.

    python benchmarks/graph_build.py [FILE]

FILE defaults to the biggest ``*after_spmd-partitioning*.txt`` under
``benchmarks/_data/big`` (made by ``make_big_module.py``). Prints the best
of ``--repeat`` runs of the parse, of :func:`build_graph`, their ratio, and
the one-off cost of the entry-parameter bitsets. Not a test: numbers depend
on the machine.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from hlo_doctor.graph.dataflow import build_graph
from hlo_doctor.hlo import parse_module

DATA = Path(__file__).parent / "_data" / "big"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = Path(args.file) if args.file else max(
        DATA.glob("*after_spmd-partitioning*.txt"), key=lambda p: p.stat().st_size
    )
    text = path.read_text(encoding="utf-8")
    parse = build = float("inf")
    for _ in range(args.repeat):
        # Each pauses the cyclic GC; the young-generation scan that resuming it
        # brings is part of its cost, so each timing ends with that scan.
        start = time.perf_counter()
        module = parse_module(text, path=str(path))
        gc.collect(0)
        parse = min(parse, time.perf_counter() - start)
        start = time.perf_counter()
        graph = build_graph(module)
        gc.collect(0)
        build = min(build, time.perf_counter() - start)
    start = time.perf_counter()
    entry = module.entry
    graph.entry_parameters((entry.name, entry.root.name))
    bitsets = time.perf_counter() - start
    print(f"file          {path.name} ({len(text) / 1e6:.1f} MB)")
    print(f"nodes/edges   {graph.nx.number_of_nodes()} / {graph.nx.number_of_edges()}")
    print(f"parse         {parse:.3f} s")
    print(f"graph build   {build:.3f} s")
    print(f"ratio         {build / parse:.2f}")
    print(f"param bitsets {bitsets:.3f} s (first query, once per graph)")


if __name__ == "__main__":
    main()
