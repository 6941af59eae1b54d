"""Compare two dumps of the same program (say main and a pull request), module by module.

Modules pair up by name without numeric suffixes (``module_0003.jit_step``
and ``module_0011.jit_step``; ``SyncTensorsGraph.33`` and ``.35``), in order
when a name repeats. For each pair: collectives by kind (executions per step,
bytes per device, bytes that cross hosts), collective bytes by role and on the critical
path (:mod:`hlo_doctor.semantics.critical_path`: operands derived from the
step's data wait on its compute; weight gathers can be prefetched), findings
added and removed (matched as :mod:`hlo_doctor.gate.matching` does: by
fingerprint, then line, then the same op at another line), and entry parameters whose
sharding changed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.dump import Dump, DumpModule, load_dump
from hlo_doctor.findings import Finding, Report
from hlo_doctor.fingerprint import module_family
from hlo_doctor.gate.matching import match_findings
from hlo_doctor.rules._batch import parameter_name
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.semantics.critical_path import ByteAccount


@dataclass(frozen=True, slots=True)
class CollectiveTotals:
    count: int = 0
    bytes_per_device: int = 0
    cross_host_bytes: int = 0


@dataclass(frozen=True, slots=True)
class CollectiveDetail:
    """One collective, described by what it moves rather than by its (renumbered) name.

    ``role`` is the analysis layer's (:mod:`hlo_doctor.semantics.roles`:
    ``weight-gather``, ``gradient-reduce``, ``activation-gather`` ...);
    ``parameters`` names the program arguments it serves (the weights it
    gathers, the weight a gradient is for, the data an activation comes from).
    """

    kind: str
    instruction: str
    operand_shape: str
    result_shape: str
    dimension: int | None
    bytes_per_device: int
    role: str
    parameters: tuple[str, ...]
    can_overlap: bool = False
    """a gather whose operand derives from no data input: prefetchable, off the critical path"""

    @property
    def signature(self) -> tuple:
        return (self.kind, self.role, self.parameters, self.operand_shape, self.result_shape, self.dimension)

    def describe(self) -> str:
        dim = f" dim {self.dimension}" if self.dimension is not None else ""
        source = f" of {', '.join(self.parameters)}" if self.parameters else ""
        overlap = ", can overlap (prefetchable)" if self.can_overlap else ""
        return (f"{self.kind} ({self.role}{source}) {self.operand_shape} -> {self.result_shape}{dim}, "
                f"{self.bytes_per_device} B/device{overlap} [{self.instruction}]")


@dataclass(frozen=True, slots=True)
class ParameterChange:
    number: int
    name: str
    shape: str
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class ModuleDiff:
    name: str
    before: str | None  # module keys; None when the module exists on one side only
    after: str | None
    collectives: Mapping[str, tuple[CollectiveTotals, CollectiveTotals]]
    added: tuple[Finding, ...]
    removed: tuple[Finding, ...]
    parameters: tuple[ParameterChange, ...]
    collectives_removed: tuple[CollectiveDetail, ...] = ()
    collectives_added: tuple[CollectiveDetail, ...] = ()
    accounts: tuple[ByteAccount, ByteAccount] = (ByteAccount(), ByteAccount())
    """bytes by role and on the critical path, before and after"""

    @property
    def bytes_before(self) -> int:
        return sum(b.bytes_per_device for b, _ in self.collectives.values())

    @property
    def bytes_after(self) -> int:
        return sum(a.bytes_per_device for _, a in self.collectives.values())

    @property
    def critical_before(self) -> int:
        return self.accounts[0].critical

    @property
    def critical_after(self) -> int:
        return self.accounts[1].critical

    @property
    def roles(self) -> dict[str, tuple[int, int]]:
        """role -> (bytes per device per step before, after), roles with bytes on either side."""
        before, after = self.accounts[0].by_role, self.accounts[1].by_role
        return {role: (before.get(role, 0), after.get(role, 0))
                for role in (*before, *(r for r in after if r not in before))}


@dataclass(frozen=True, slots=True)
class DumpDiff:
    before: str
    after: str
    modules: tuple[ModuleDiff, ...]
    errors: tuple[str, ...] = field(default=())

    @property
    def bytes_before(self) -> int:
        return sum(m.bytes_before for m in self.modules)

    @property
    def bytes_after(self) -> int:
        return sum(m.bytes_after for m in self.modules)

    @property
    def comm_increase_pct(self) -> float:
        return _increase_pct(self.bytes_before, self.bytes_after)

    @property
    def critical_before(self) -> int:
        """Collective bytes per device per step on the critical path (operands derived from the step's data)."""
        return sum(m.critical_before for m in self.modules)

    @property
    def critical_after(self) -> int:
        return sum(m.critical_after for m in self.modules)

    @property
    def critical_increase_pct(self) -> float:
        return _increase_pct(self.critical_before, self.critical_after)

    @property
    def roles(self) -> dict[str, tuple[int, int]]:
        """role -> (bytes before, after) over all modules."""
        totals: dict[str, tuple[int, int]] = {}
        for module in self.modules:
            for role, (before, after) in module.roles.items():
                old = totals.get(role, (0, 0))
                totals[role] = (old[0] + before, old[1] + after)
        return totals

    @property
    def added(self) -> tuple[Finding, ...]:
        return tuple(f for m in self.modules for f in m.added)

    @property
    def removed(self) -> tuple[Finding, ...]:
        return tuple(f for m in self.modules for f in m.removed)


def _increase_pct(before: int, after: int) -> float:
    if before == 0:
        return 0.0 if after == 0 else float("inf")
    return 100.0 * (after - before) / before


def diff_dumps(before: str, after: str, **options: Any) -> DumpDiff:
    """Analyze both dumps with the same ``options`` (those of ``analyze_dump``) and compare them."""
    # One load per dump: the reports and the comparison share its parsed snapshots.
    before_dump, after_dump = load_dump(before), load_dump(after)
    before_report = analyze_dump(before_dump, **options)
    after_report = analyze_dump(after_dump, **options)
    analysis = AnalysisOptions(devices_per_host=options.get("devices_per_host"))
    modules = []
    for name, old, new in _pair_modules(before_dump, after_dump):
        old_ctx = RuleContext(before_dump, old, analysis) if old is not None else None
        new_ctx = RuleContext(after_dump, new, analysis) if new is not None else None
        old_ops = _collective_details(old_ctx)
        new_ops = _collective_details(new_ctx)
        modules.append(
            ModuleDiff(
                name=name,
                before=old.key if old else None,
                after=new.key if new else None,
                collectives=_collective_diff(_collectives(old_ctx), _collectives(new_ctx)),
                added=_findings_only_in(after_report, before_report, new, old),
                removed=_findings_only_in(before_report, after_report, old, new),
                parameters=_parameter_changes(old, new),
                collectives_removed=_only_in(old_ops, new_ops),
                collectives_added=_only_in(new_ops, old_ops),
                accounts=(_account(old_ctx), _account(new_ctx)),
            )
        )
    errors = tuple(f"{e.path}: {e.message}" for e in (*before_report.errors, *after_report.errors))
    return DumpDiff(before_report.dump, after_report.dump, tuple(modules), errors)


def _pair_modules(
    before: Dump, after: Dump
) -> Iterable[tuple[str, DumpModule | None, DumpModule | None]]:
    families: dict[str, tuple[list[DumpModule], list[DumpModule]]] = defaultdict(lambda: ([], []))
    for module in before.modules:
        families[module_family(module.name)][0].append(module)
    for module in after.modules:
        families[module_family(module.name)][1].append(module)
    for name, (olds, news) in families.items():
        for index in range(max(len(olds), len(news))):
            yield (
                name,
                olds[index] if index < len(olds) else None,
                news[index] if index < len(news) else None,
            )


def _account(ctx: RuleContext | None) -> ByteAccount:
    return ctx.semantics.bytes if ctx is not None else ByteAccount()


def _collectives(ctx: RuleContext | None) -> dict[str, CollectiveTotals]:
    if ctx is None:
        return {}
    totals: dict[str, CollectiveTotals] = {}
    for op in ctx.collectives:
        times = ctx.executions.get(op.computation, 1)
        nbytes = max(op.bytes_in_per_device, op.bytes_out_per_device) * times
        current = totals.get(op.kind, CollectiveTotals())
        totals[op.kind] = CollectiveTotals(
            current.count + times,
            current.bytes_per_device + nbytes,
            current.cross_host_bytes + (nbytes if op.crosses_hosts else 0),
        )
    return totals


def _collective_details(ctx: RuleContext | None) -> list[CollectiveDetail]:
    if ctx is None:
        return []
    hlo = ctx.per_device
    if hlo is None or hlo.entry is None:
        return []
    params = {p.parameter_number: p for p in hlo.entry.parameters()}
    overlapping = {(c.computation, c.instruction) for c in ctx.semantics.bytes.overlappable_gathers}
    details = []
    for role in ctx.semantics.roles:
        facts = role.facts
        op = facts.op
        operand = facts.operands[0] if facts.operands else None
        names = tuple(sorted(parameter_name(ctx, params[n]) for n in role.parameters if n in params))
        result = (op.outer or op.op).shape if (op.outer or op.op) is not None else None
        if result is not None and op.form.value != "sync" and result.is_tuple and result.tuple_shapes:
            result = result.tuple_shapes[-1]
        details.append(
            CollectiveDetail(
                kind=op.kind,
                instruction=op.instruction,
                operand_shape=str(operand.shape) if operand is not None else "?",
                result_shape=str(result) if result is not None else "?",
                dimension=op.dimension,
                bytes_per_device=max(op.bytes_in_per_device, op.bytes_out_per_device),
                role=role.role,
                parameters=names,
                can_overlap=(facts.computation, facts.instruction) in overlapping,
            )
        )
    return details


def _only_in(mine: list[CollectiveDetail], theirs: list[CollectiveDetail]) -> tuple[CollectiveDetail, ...]:
    """``mine`` minus ``theirs``, as multisets of signatures."""
    remaining = [t.signature for t in theirs]
    result = []
    for detail in mine:
        if detail.signature in remaining:
            remaining.remove(detail.signature)
        else:
            result.append(detail)
    return tuple(result)


def _collective_diff(
    before: dict[str, CollectiveTotals], after: dict[str, CollectiveTotals]
) -> dict[str, tuple[CollectiveTotals, CollectiveTotals]]:
    return {
        kind: (before.get(kind, CollectiveTotals()), after.get(kind, CollectiveTotals()))
        for kind in sorted(set(before) | set(after))
    }


def _findings_only_in(
    report: Report, other: Report, module: DumpModule | None, other_module: DumpModule | None
) -> tuple[Finding, ...]:
    """The findings of ``module`` that match none of ``other_module``'s (:func:`match_findings`:
    by fingerprint, else by line, else by the same op at another line: a finding whose line an
    edit above it moved is not new)."""
    if module is None:
        return ()
    mine = [f for f in report.findings if f.module == module.key]
    theirs = [f for f in other.findings if other_module is not None and f.module == other_module.key]
    _, unmatched = match_findings(theirs, mine, {})
    return unmatched


def _parameter_changes(before: DumpModule | None, after: DumpModule | None) -> tuple[ParameterChange, ...]:
    if before is None or after is None:
        return ()
    old_params = _entry_parameters(before)
    new_params = _entry_parameters(after)
    changes = []
    for number in sorted(set(old_params) | set(new_params)):
        old, new = old_params.get(number), new_params.get(number)
        old_sharding = old[2] if old else None
        new_sharding = new[2] if new else None
        if old_sharding != new_sharding:
            name, shape = (new or old)[0], (new or old)[1]  # type: ignore[index]
            changes.append(ParameterChange(number, name, shape, old_sharding, new_sharding))
    return tuple(changes)


def _entry_parameters(module: DumpModule) -> dict[int, tuple[str, str, str | None]]:
    """Entry parameter number -> (name, global shape, sharding) after propagation."""
    snapshot = module.after_propagation() or module.before_optimizations()
    hlo = snapshot.try_module() if snapshot is not None else None
    entry = hlo.entry if hlo is not None else None
    if entry is None:
        return {}
    return {
        p.parameter_number: (p.name, str(p.shape), p.attribute("sharding"))
        for p in entry.parameters()
        if p.parameter_number is not None
    }
