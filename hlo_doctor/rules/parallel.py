"""Run one module's rules in two processes when that is faster.

A big module's two main snapshots, after propagation (global shapes and the
shardings the compiler chose) and after partitioning (per-device shapes and
the collectives it inserted), each take about as long to parse as XLA's C++
parser needs, and most rules read only one of them. Rules say which in
``reads`` (see :class:`~hlo_doctor.rules.base.Rule`). With ``jobs >= 2`` on a
system with ``os.fork``, and a module whose snapshots add up to at least
``PARALLEL_MIN_BYTES``, the rules that read only the global-shape snapshot
(``reads = {"sharded"}``) run in a forked worker while this process runs
the others: each process parses only what its rules read.

The worker sends back, pickled through a pipe, each rule's findings or skip,
the parse failures it met and the module errors it found. A rule there that
names an op after partitioning (:meth:`RuleContext.partitioned_names`) gets
a placeholder, which this process resolves from its own parse. A worker
that dies or sends nothing has its rules run here instead. Either way the
report is the same as a serial run's (tested on every fixture).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from hlo_doctor.dump.folder import DumpError
from hlo_doctor.rules._forked import can_fork, fork_child, loads
from hlo_doctor.rules.base import Finding, Rule
from hlo_doctor.rules.context import PENDING_NAME, RuleContext
from hlo_doctor.rules.engine import Skip, cause_ranks, collective_names, merge_outcomes, run_rule, symptom_kinds

__all__ = ["PARALLEL_MIN_BYTES", "PENDING_NAME", "can_fork", "default_jobs", "run_module_rules"]

PARALLEL_MIN_BYTES = 8 * 1024 * 1024
"""Below this much HLO text per module, forking costs more than it saves."""

WORKER_READS = frozenset({"sharded"})

Outcome = tuple[list[Finding], Skip | None]


DEFAULT_MAX_JOBS = 4
"""The default caps the processes at this many: each worker holds one module's parse."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask on Linux, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """The usable cores, at most ``DEFAULT_MAX_JOBS``, when this process can fork; else 1."""
    return min(usable_cores(), DEFAULT_MAX_JOBS) if can_fork() else 1


def run_module_rules(
    ctx: RuleContext, rules: Sequence[Rule], *, jobs: int = 1, min_bytes: int | None = None
) -> tuple[list[Finding], list[Skip]]:
    """:func:`~hlo_doctor.rules.engine.run_rules`, split over two processes when worth it
    (``jobs >= 2`` and ``min_bytes`` of HLO text in the module; default ``PARALLEL_MIN_BYTES``)."""
    min_bytes = PARALLEL_MIN_BYTES if min_bytes is None else min_bytes
    in_worker = [i for i, rule in enumerate(rules) if getattr(rule, "reads", None) == WORKER_READS]
    here = [i for i, rule in enumerate(rules) if getattr(rule, "reads", None) != WORKER_READS]
    snapshots = ctx.module.snapshots
    if (
        jobs < 2
        or not can_fork()
        or not in_worker
        or not here
        or sum(s.size or 0 for s in snapshots) < min_bytes
        or any(s.parsed for s in snapshots)  # already in memory: nothing to share out
    ):
        return merge_outcomes((run_rule(ctx, rule) for rule in rules), cause_ranks(rules), collective_names(ctx),
                              symptom_kinds(ctx))
    worker = _Worker(ctx, [rules[i] for i in in_worker])
    try:
        outcomes: dict[int, Outcome] = {i: run_rule(ctx, rules[i]) for i in here}
        result = worker.result()
    finally:
        worker.stop()
    if result is None:  # the worker failed: its rules run here
        outcomes.update({i: run_rule(ctx, rules[i]) for i in in_worker})
    else:
        outcomes.update(zip(in_worker, _adopt(ctx, result), strict=False))
    return merge_outcomes((outcomes[i] for i in range(len(rules))), cause_ranks(rules), collective_names(ctx),
                          symptom_kinds(ctx))


@dataclass
class _WorkerResult:
    outcomes: list[Outcome]
    pending_names: dict[str, tuple]
    parse_failures: list[tuple[int, str]]  # (snapshot index, one-line error)
    module_errors: list[DumpError]


class _Worker:
    """A forked process running some rules on the same module."""

    def __init__(self, ctx: RuleContext, rules: list[Rule]) -> None:
        self._read_end, self.pid = fork_child(lambda: _worker_result(ctx, rules))
        self._done = False

    def result(self) -> _WorkerResult | None:
        with os.fdopen(self._read_end, "rb") as pipe:
            self._read_end = -1
            data = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self._done = True
        result = loads(data) if status == 0 and data else None  # None: run the rules here
        return result if isinstance(result, _WorkerResult) else None

    def stop(self) -> None:
        if self._read_end >= 0:  # never read (this process was interrupted)
            os.close(self._read_end)
            self._read_end = -1
        if not self._done:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self._done = True


def _worker_result(ctx: RuleContext, rules: list[Rule]) -> _WorkerResult:  # pragma: no cover - child
    ctx.pending_names = {}
    outcomes = [run_rule(ctx, rule) for rule in rules]
    failures = [(i, s.error) for i, s in enumerate(ctx.module.snapshots) if s.error is not None]
    return _WorkerResult(outcomes, ctx.pending_names, failures, list(ctx.module.errors_found))


def _adopt(ctx: RuleContext, result: _WorkerResult) -> list[Outcome]:
    """The worker's outcomes, with what it learnt about the dump recorded here."""
    module = ctx.module
    for index, message in result.parse_failures:
        module.snapshots[index].adopt_failure(message)
    for error in result.module_errors:
        module.add_error(error)
    if not result.pending_names:
        return result.outcomes
    refs = {key: ref for key, ref in result.pending_names.values()}
    names = ctx.resolve_names(refs)
    resolved = {token: names.get(key, key[1]) for token, (key, _) in result.pending_names.items()}
    pattern = re.compile(re.escape(PENDING_NAME) + r"\d+")

    def fill(text: str) -> str:
        return pattern.sub(lambda m: resolved.get(m.group(), m.group()), text) if PENDING_NAME in text else text

    def filled(finding: Finding) -> Finding:
        return dataclasses.replace(
            finding,
            instruction=fill(finding.instruction) if finding.instruction is not None else None,
            message=fill(finding.message),
            related=tuple(fill(name) for name in finding.related),
            evidence={k: fill(v) if isinstance(v, str) else v for k, v in finding.evidence.items()},
        )

    return [([filled(f) for f in findings], skip) for findings, skip in result.outcomes]
