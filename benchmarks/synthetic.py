"""Synthetic HLO modules for the memory and scaling benchmarks, and multi-module dumps of real ones.

    python benchmarks/synthetic.py simple OUT_DIR --megabytes 300
    python benchmarks/synthetic.py copies REAL_DUMP OUT_DIR --modules 4

``simple``: one module of one computation of simple elementwise instructions,
printed as XLA prints a JAX module after propagation (``%name = shape
opcode(operands), metadata={op_name=... source_file=... source_line=...}``; about 130
bytes a line, like the real dumps' lines), with an f32 parameter every 64
instructions and a sharding on each parameter.

``copies``: a dump folder of N modules made from the one real module of
``REAL_DUMP`` (``make_big_module.py``'s output): every file of it is
hard-linked under ``module_0000`` ... ``module_{N-1}`` (no bytes copied).
Several modules in one folder is what torch_xla dumps hold (one
``SyncTensorsGraph`` per distinct step graph); here they are copies of one.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

OPS = ("add", "multiply", "subtract", "maximum", "divide", "minimum")
SHAPE = "f32[16,128,256]{2,1,0}"


def write_simple_module(path: Path, megabytes: float) -> int:
    """Write the ``simple`` module of about ``megabytes`` MB to ``path``; returns its size in bytes."""
    target = int(megabytes * 1e6)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        out.write("HloModule jit_simple, entry_computation_layout={()->f32[16,128,256]{2,1,0}}, "
                  "num_partitions=8\n\nENTRY %main.1 {\n")
        out.write(f'  %p.0 = {SHAPE} parameter(0), sharding={{devices=[4,2,1]<=[8]}}, '
                  'metadata={op_name="x"}\n')
        written, n, params, last, chunk, ends = 0, 0, 1, "p.0", [], []
        while written < target:
            n += 1
            if n % 64 == 0:  # a new chain from a new parameter (a weight and its update)
                ends.append(last)
                line = (f'  %p.{params} = {SHAPE} parameter({params}), sharding={{devices=[4,2,1]<=[8]}}, '
                        f'metadata={{op_name="w{params}"}}\n')
                last = f"p.{params}"
                params += 1
            else:
                line = ""
            op = OPS[n % len(OPS)]
            name = f"{op}.{n}"
            line += (f"  %{name} = {SHAPE} {op}(%{last}, %p.{params - 1}), "
                     f'metadata={{op_name="jit(simple)/{op}" source_file="model.py" '
                     f'source_line={n % 97 + 1}}}\n')
            last = name
            chunk.append(line)
            written += len(line)
            if len(chunk) >= 4096:
                out.write("".join(chunk))
                chunk.clear()
        ends.append(last)
        shape = "(" + ", ".join([SHAPE] * len(ends)) + ")"
        chunk.append(f"  ROOT %result = {shape} tuple(" + ", ".join("%" + e for e in ends) + ")\n}\n\n")
        out.write("".join(chunk))
    # The entry layout names every parameter, as XLA prints it.
    return path.stat().st_size


def fix_layout(path: Path) -> None:
    """Rewrite the header's entry_computation_layout with every parameter (the file is rewritten once)."""
    text = path.read_text()
    params = len(re.findall(r" parameter\(\d+\)", text))
    results = text[text.rindex(" tuple(") :].count("%")
    layout = "{(" + ", ".join([SHAPE] * params) + ")->(" + ", ".join([SHAPE] * results) + ")}"
    text = text.replace("entry_computation_layout={()->f32[16,128,256]{2,1,0}}",
                        f"entry_computation_layout={layout}", 1)
    path.write_text(text)


def _simple_path(folder: Path) -> Path:
    return folder / "module_0000.jit_simple.0000.spmd-partitioner.after_shardy-xla.before_spmd-partitioning.txt"


def make_simple_dump(folder: Path, megabytes: float) -> Path:
    """A dump folder holding one ``simple`` module as its after-propagation snapshot.

    Written by a child process: ``fix_layout`` holds the text twice, and on Linux a process
    started later inherits its parent's peak RSS (``ru_maxrss`` survives fork and exec), so a
    benchmark that wrote the file itself would report that peak for every child it measures.
    """
    if not _simple_path(folder).is_file():
        subprocess.run([sys.executable, __file__, "simple", str(folder), "--megabytes", str(megabytes)],
                       check=True, stdout=subprocess.DEVNULL)
    return folder


def write_simple_dump(folder: Path, megabytes: float) -> Path:
    """:func:`make_simple_dump`'s work, in this process."""
    path = _simple_path(folder)
    if not path.is_file():
        write_simple_module(path, megabytes)
        fix_layout(path)
    return folder


def make_copies(real: Path, folder: Path, modules: int) -> Path:
    """``modules`` hard-linked copies of ``real``'s module_0000 in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = [p for p in real.iterdir() if p.name.startswith("module_0000.")]
    for number in range(modules):
        prefix = f"module_{number:04d}."
        for source in sources:
            target = folder / (prefix + source.name[len("module_0000."):])
            if target.exists():
                continue
            if source.is_dir():
                target.mkdir()
                for inner in source.iterdir():
                    os.link(inner, target / inner.name)
            else:
                os.link(source, target)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    simple = sub.add_parser("simple")
    simple.add_argument("out", type=Path)
    simple.add_argument("--megabytes", type=float, default=300)
    copies = sub.add_parser("copies")
    copies.add_argument("real", type=Path)
    copies.add_argument("out", type=Path)
    copies.add_argument("--modules", type=int, default=4)
    args = parser.parse_args()
    if args.what == "simple":
        print(write_simple_dump(args.out, args.megabytes))
    else:
        print(make_copies(args.real, args.out, args.modules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
