"""``hlo-doctor memory``: each module's peak memory per device, what fills it, and the target's memory."""

from __future__ import annotations

import json
import re
from io import StringIO

import click

from hlo_doctor.cli.common import emit, input_errors_exit_2
from hlo_doctor.dump import load_dump
from hlo_doctor.errors import InputError
from hlo_doctor.memory import SOURCE_LABELS, ModuleMemory
from hlo_doctor.report.memory_svg import memory_page
from hlo_doctor.report.safe import rich_text
from hlo_doctor.rules._memory import memory_of, target_for
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.semantics.hardware import load_profile
from hlo_doctor.units import format_bytes

SCHEMA_VERSION = 1
_SOURCES = SOURCE_LABELS
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """``17179869184``, ``16GiB``, ``80GB``, ``1.5TiB`` -> bytes; ValueError otherwise."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with KB/MB/GB/TB or KiB/MiB/GiB/TiB)")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


class SizeType(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


@click.command("memory")
@click.argument("dump", metavar="DUMP")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True, help="html: one page with each module's peak stacked by class against the target.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write to this file.")
@click.option("--hardware", metavar="NAME",
              help="Hold the peak against this hardware's memory (a bundled profile or a JSON file). "
                   "Default: the hardware the dump was compiled for, when it says.")
@click.option("--hbm", "hbm_bytes", type=SizeType(), default=None,
              help="The device memory to hold the peak against, e.g. 16GiB or 85899345920.")
@click.option("--module", "module_name", default=None, help="Only this module.")
@click.option("--items", "item_count", type=click.IntRange(min=0), default=12, show_default=True,
              help="How many of the largest items the text lists per module (JSON lists all).")
@input_errors_exit_2
def memory_command(dump: str, output_format: str, output: str | None, hardware: str | None,
                   hbm_bytes: int | None, module_name: str | None, item_count: int) -> None:
    """Memory per device at each module's peak: how much, what fills it, against the target.

    The peak comes from XLA's own buffer assignment (or memory-usage report)
    where the dump has it; otherwise it is estimated from live ranges in the
    module's schedule (or dataflow) order, and says so. It is split by class
    (weights, optimizer_state, gradients, activations, gathered_weights,
    collective_buffers, inputs, outputs, temporaries), decided from the
    dataflow, and by item, with each item's parameter or line of your program.

    \b
      hlo-doctor memory ./dump
      hlo-doctor memory ./dump --hardware tpu-v5e
      hlo-doctor memory ./dump --hbm 16GiB --format json
      hlo-doctor memory ./dump --format html -o memory.html
    """
    profile = load_profile(hardware) if hardware else None
    loaded = load_dump(dump)
    modules = [m for m in loaded.modules if module_name in (None, m.name, m.key)]
    if module_name is not None and not modules:
        raise InputError(f"no module {module_name!r} in {dump} (modules: {', '.join(m.name for m in loaded.modules)})")
    memories: list[ModuleMemory] = []
    for dump_module in modules:
        ctx = RuleContext(loaded, dump_module, AnalysisOptions(hardware=profile))
        memory = memory_of(ctx, target_for(ctx, hbm_bytes, profile))
        if memory is not None:
            memories.append(memory)
    if output_format == "json":
        text = json.dumps(memory_document(memories), indent=2) + "\n"
    elif output_format == "html":
        text = memory_page(memories, f"hlo-doctor memory: {dump}")
    else:
        text = render_memory(memories, item_count)
    emit(text, output)


def memory_document(memories: list[ModuleMemory]) -> dict:
    """``hlo-doctor memory --format json``."""
    return {"schema_version": SCHEMA_VERSION, "modules": [m.document() for m in memories]}


def render_memory(memories: list[ModuleMemory], item_count: int = 12) -> str:
    """The text form: per module, the peak and its source, the target, the classes and the largest items."""
    from rich.console import Console
    from rich.table import Table

    buffer = StringIO()
    console = Console(file=buffer, width=160, color_system=None, highlight=False)
    for memory in memories:
        console.print(f"{rich_text(memory.name)}: peak {format_bytes(memory.peak_bytes)} per device "
                      f"({memory.peak_bytes} bytes; {_SOURCES[memory.peak_source]})")
        target = memory.target
        if target is not None:
            headroom = target.headroom(memory.peak_bytes)
            verdict = (f"headroom {format_bytes(headroom)}" if headroom >= 0
                       else f"OVER by {format_bytes(-headroom)}: does not fit")
            console.print(f"  target {rich_text(target.hardware)}: {format_bytes(target.hbm_bytes)} per device, "
                          f"{verdict} ({memory.peak_bytes / target.hbm_bytes:.0%} used)")
        else:
            console.print("  target: unknown (--hardware NAME or --hbm BYTES to compare)")
        for problem in memory.problems:
            console.print(f"  not read: {rich_text(problem)}")
        classes = Table(title="by class", title_justify="left", show_edge=False)
        for column in ("class", "bytes", "share"):
            classes.add_column(column, justify="left" if column == "class" else "right")
        for cls, size in sorted(memory.classes.items(), key=lambda kv: -kv[1]):
            share = size / memory.peak_bytes if memory.peak_bytes else 0.0
            classes.add_row(cls, format_bytes(size), f"{share:.0%}")
        console.print(classes)
        if item_count and memory.items:
            items = Table(title=f"largest items ({min(item_count, len(memory.items))} of {len(memory.items)})",
                          title_justify="left", show_edge=False)
            for column in ("class", "bytes", "item", "source"):
                items.add_column(column, overflow="fold", justify="right" if column == "bytes" else "left")
            for item in memory.items[:item_count]:
                items.add_row(item.cls, format_bytes(item.bytes), rich_text(item.name), rich_text(item.source or "-"))
            console.print(items)
        console.print()
    if not memories:
        console.print("no module with a per-device (partitioned or optimized) snapshot")
    return buffer.getvalue()


# -- the CI gate: --max-memory in `check` and `diff` ------------------------------------------

MAX_MEMORY_HELP = ("Fail (exit 1) when a module's peak memory per device is over LIMIT: a size (16GiB, "
                   "85899345920), 'target' (the memory of the hardware the dump was compiled for, or "
                   "--hardware's)")
MAX_MEMORY_DIFF_HELP = MAX_MEMORY_HELP + ", or a growth over BEFORE's peak in percent (5%)."


def module_peaks(dump: str, hardware: str | None = None) -> list[ModuleMemory]:
    """Each module's memory at its peak (see ``hlo-doctor memory``)."""
    profile = load_profile(hardware) if hardware else None
    loaded = load_dump(dump)
    memories = []
    for dump_module in loaded.modules:
        ctx = RuleContext(loaded, dump_module, AnalysisOptions(hardware=profile))
        memory = memory_of(ctx)
        if memory is not None:
            memories.append(memory)
    return memories


def memory_limit_failures(limit: str, after: list[ModuleMemory], before: list[ModuleMemory] | None = None) -> list[str]:
    """Why ``after`` breaks ``limit`` (one line per module); [] when it does not.

    ``limit``: a size, ``target``, or (with ``before``) a percentage the peak may grow by.
    """
    text = limit.strip()
    failures = []
    if text.endswith("%"):
        if before is None:
            raise InputError(f"--max-memory {limit}: a percentage needs a dump to compare with (hlo-doctor diff)")
        try:
            pct = float(text[:-1])
        except ValueError:
            raise InputError(f"--max-memory {limit}: not a percentage") from None
        earlier = {m.name.split(".", 1)[-1]: m for m in before}
        for memory in after:
            old = earlier.get(memory.name.split(".", 1)[-1])
            if old is None or old.peak_bytes <= 0:
                continue
            grew = (memory.peak_bytes - old.peak_bytes) / old.peak_bytes * 100
            if grew > pct:
                failures.append(f"{memory.name}: peak memory per device grew {grew:.1f}% "
                                f"({format_bytes(old.peak_bytes)} -> {format_bytes(memory.peak_bytes)}; limit {pct:g}%)")
        return failures
    if text.lower() == "target":
        unknown = [m.name for m in after if m.target is None]
        if unknown:
            raise InputError(f"--max-memory target: the target's memory is unknown for {', '.join(unknown[:3])} "
                             "(--hardware NAME, or a size: --max-memory 16GiB)")
        for memory in after:
            if memory.target is not None and memory.peak_bytes > memory.target.hbm_bytes:
                failures.append(f"{memory.name}: peak memory per device {format_bytes(memory.peak_bytes)} is over "
                                f"the {memory.target.hardware}'s {format_bytes(memory.target.hbm_bytes)}")
        return failures
    try:
        size = parse_size(text)
    except ValueError as error:
        raise InputError(f"--max-memory: {error}") from None
    for memory in after:
        if memory.peak_bytes > size:
            failures.append(f"{memory.name}: peak memory per device {format_bytes(memory.peak_bytes)} is over "
                            f"the limit {format_bytes(size)}")
    return failures
