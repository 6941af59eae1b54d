"""Run rules over one module: select, call, and turn a crash into a finding."""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence

from hlo_doctor.dump import DumpModule
from hlo_doctor.errors import ShardingError, one_line
from hlo_doctor.findings import Skip
from hlo_doctor.fingerprint import with_fingerprint
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.program.terms import in_program_terms
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.rules.registry import Registry

INTERNAL_ERROR = "internal-error"
# A rule stopped by malformed input (a ParseError of a lazily read attribute, at its file:line:col,
# or a sharding or replica groups that cannot be: ShardingError) is not a crash of the rule: it is
# skipped with this reason, and the analysis reports the error once as the module's.
BAD_INPUT = "malformed input: "
BAD_INPUT_ERRORS = (ParseError, ShardingError)

__all__ = ["BAD_INPUT", "BAD_INPUT_ERRORS", "INTERNAL_ERROR", "Skip", "bad_input_of", "fold_same_fix", "fold_symptoms",
           "merge_outcomes", "run_rule", "run_rules", "select_rules", "symptom_kinds"]

SymptomKinds = Callable[[], Mapping[str, tuple[str, int]]]
"""Lazily: a per-device collective's name -> (its kind of symptom, wire bytes per device per step)."""

# A collective's role (hlo_doctor.semantics.roles) as the first word of its kind of symptom.
_ROLE_WORDS = {"activation-gather": "activation", "activation-reduce": "partial-sum", "weight-gather": "weight",
               "gradient-reduce": "gradient", "scalar-reduce": "scalar", "index-gather": "index",
               "expert-dispatch": "expert-dispatch", "pipeline-send": "pipeline", "reshard": "reshard"}


def select_rules(
    registry: Registry,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[str]:
    """The ids to run: ``select`` (all when empty) minus ``ignore``; unknown ids raise KeyError."""
    select = list(select or ())
    ignore = list(ignore or ())
    for rule_id in select + ignore:
        if rule_id not in registry.rules:
            raise KeyError(rule_id)
    chosen = select or registry.ids()
    return sorted(set(chosen) - set(ignore))


def run_rules(ctx: RuleContext, rules: Sequence[Rule]) -> tuple[list[Finding], list[Skip]]:
    """Every rule on ``ctx``; a rule that raises becomes an ``internal-error`` finding."""
    return merge_outcomes([run_rule(ctx, rule) for rule in rules], cause_ranks(rules), collective_names(ctx),
                          symptom_kinds(ctx))


def run_rule(ctx: RuleContext, rule: Rule) -> tuple[list[Finding], Skip | None]:
    """One rule on ``ctx``: its findings (fingerprinted), or why it could not judge the module."""
    try:
        name = ctx.module.name
        return [with_fingerprint(in_terms(ctx, finding), name) for finding in rule.check(ctx)], None
    except RuleSkipped as skipped:
        return [], Skip(rule.id, ctx.module.key, skipped.reason)
    except BAD_INPUT_ERRORS as error:  # the module's text, not the rule: reported once, as the input's error
        return [], Skip(rule.id, ctx.module.key, BAD_INPUT + one_line(str(located(error, ctx.module)), 400))
    except Exception as error:  # noqa: BLE001 - one rule's bug must not end the run
        return [crash_finding(rule, ctx, error)], None


def in_terms(ctx: RuleContext, finding: Finding) -> Finding:
    """``finding``'s fix code with the program's own names, placeholders where the program cannot
    tell them (:func:`hlo_doctor.program.terms.in_program_terms`)."""
    if finding.suggestion is None or not (finding.suggestion.jax or finding.suggestion.torch_xla):
        return finding
    mesh = ctx.mesh
    positional = mesh.axis_names if mesh is not None and mesh.is_inferred else ()
    return in_program_terms(finding, ctx.program_files, positional, ctx.framework)


def cause_ranks(rules: Iterable[Rule]) -> dict[str, int]:
    """Rule id -> its ``cause_rank``."""
    return {rule.id: rule.cause_rank for rule in rules}


def collective_names(ctx: RuleContext) -> Callable[[], frozenset[str]]:
    """The names of the module's per-device collectives, read only when two rules found something
    (none when the module's collectives cannot be read: that is reported as the input's error)."""

    def names() -> frozenset[str]:
        try:
            return frozenset(c.instruction for c in ctx.collectives) | frozenset(
                c.done for c in ctx.collectives if c.done)
        except BAD_INPUT_ERRORS:
            return frozenset()

    return names


def located(error: Exception, module: DumpModule) -> Exception:
    """A ParseError of an attribute value read on its own (``<string>:1:col``) moved to where that
    value is in one of ``module``'s files, when it is found there; any other error as it is."""
    if not isinstance(error, ParseError) or error.path is not None or error.line != 1 or not error.source_line:
        return error
    for snapshot in module.snapshots:
        try:
            text = snapshot.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        at = text.find(error.source_line)
        if at != -1:
            return ParseError.at(text, at + error.col - 1, error.message, path=str(snapshot.path))
    return error


def bad_input_of(skips: Iterable[Skip]) -> list[str]:
    """The distinct errors of the module's input that stopped rules (see :data:`BAD_INPUT`), in order."""
    return list(dict.fromkeys(s.reason[len(BAD_INPUT):] for s in skips if s.reason.startswith(BAD_INPUT)))


def symptom_kinds(ctx: RuleContext) -> SymptomKinds:
    """What each per-device collective is as a symptom, read only when a finding has symptoms:
    its role and kind (``activation all-gather``, ``partial-sum all-reduce``), ``cross-host``
    (``cross-slice`` on TPU) when its groups cross the slow link, and its wire bytes per step."""

    def kinds() -> dict[str, tuple[str, int]]:
        try:
            return described() if ctx.per_device is not None else {}
        except Exception:  # noqa: BLE001 - the symptoms are then told by rule; the analysis reports the failure
            return {}

    def described() -> dict[str, tuple[str, int]]:
        slow = "cross-slice" if ctx.device_map.platform == "tpu" else "cross-host"
        found: dict[str, tuple[str, int]] = {}
        for role in ctx.semantics.roles:
            facts = role.facts
            kind = f"{_ROLE_WORDS.get(role.role, role.role)} {facts.kind}"
            if facts.crosses_slow_boundary:
                kind = f"{slow} {kind}"
            for name in (facts.instruction, facts.op.done):
                if name:
                    found.setdefault(name, (kind, facts.wire_bytes_per_step))
        return found

    return kinds


def merge_outcomes(
    outcomes: Iterable[tuple[list[Finding], Skip | None]],
    ranks: Mapping[str, int] | None = None,
    collectives: Callable[[], frozenset[str]] | None = None,
    kinds: SymptomKinds | None = None,
) -> tuple[list[Finding], list[Skip]]:
    """The findings (symptoms folded into their causes, sorted) and skips of rule outcomes in rule order.

    ``kinds`` (:func:`symptom_kinds`) adds each symptom's ``kind`` and ``wire_bytes_per_step``
    when its op is a collective."""
    findings: list[Finding] = []
    skips: list[Skip] = []
    for produced, skip in outcomes:
        findings.extend(produced)
        if skip is not None:
            skips.append(skip)
    findings = fold_same_fix(findings)
    if len({f.rule for f in findings}) > 1:
        names = collectives() if collectives is not None else frozenset()
        while True:  # a fold can make another: a symptom's related ops join its cause's
            folded = fold_symptoms(findings, ranks or {}, names)
            if len(folded) == len(findings):
                break
            findings = folded
        if kinds is not None and any(f.evidence.get("symptoms") for f in findings):
            known = kinds()
            findings = [_with_symptom_kinds(f, known) if f.evidence.get("symptoms") else f for f in findings]
    findings.sort(key=lambda f: f.sort_key)
    return findings, skips


def _with_symptom_kinds(finding: Finding, known: Mapping[str, tuple[str, int]]) -> Finding:
    symptoms = []
    for symptom in finding.evidence["symptoms"]:
        kind, wire = known.get(symptom.get("instruction") or "", (None, None))
        symptoms.append({**symptom, "kind": kind, "wire_bytes_per_step": wire})
    return dataclasses.replace(finding, evidence={**finding.evidence, "symptoms": symptoms})


def fold_same_fix(findings: list[Finding]) -> list[Finding]:
    """One fix, one finding: findings of one rule in one module whose suggestions make the same
    edits to the program (the same rules list, the same LayoutMap keys, the same constraint on
    the same line) share their cause. The first is kept; the others' ops join its ``related``
    and ``evidence["same_fix"]`` lists them (op, line, message)."""
    kept: list[Finding] = []
    index: dict[tuple, int] = {}
    for finding in findings:
        key = _fix_key(finding)
        if key is None or key not in index:
            if key is not None:
                index[key] = len(kept)
            kept.append(finding)
            continue
        first = kept[index[key]]
        related = list(first.related)
        for name in (finding.instruction, *finding.related):
            if name and name not in related and name != first.instruction:
                related.append(name)
        same = [*first.evidence.get("same_fix", ()),
                {"instruction": finding.instruction, "source_line": finding.source.line if finding.source else None,
                 "message": finding.message, "wire_bytes_per_device": finding.evidence.get("wire_bytes_per_device")}]
        count = len(same) + 1
        message = first.message.split(_SAME_FIX)[0] + f"{_SAME_FIX}{count - 1} more op{'s' if count > 2 else ''} " \
            f"({', '.join(str(s['instruction']) for s in same[:6])}{', ...' if len(same) > 6 else ''}) have " \
            "the same cause and the same fix)"
        kept[index[key]] = dataclasses.replace(first, related=tuple(related), message=message,
                                               evidence={**first.evidence, "same_fix": same})
    return kept


_SAME_FIX = " (and "


def _fix_key(finding: Finding) -> tuple | None:
    suggestion = finding.suggestion
    if suggestion is None or not suggestion.edits:
        return None
    source = finding.source
    if any(not (e.file or source) for e in suggestion.edits if e.kind not in ("xla-flag",)):
        return None  # an edit with no place in the program is no fix to compare
    edits = tuple(
        (e.kind, e.framework, e.target, e.spec, e.old_spec, e.file or (source.file if source else None),
         e.line or (source.line if source else None), tuple(sorted((k, repr(v)) for k, v in e.details.items())))
        for e in suggestion.edits)
    return (finding.module, finding.rule, edits)


def fold_symptoms(
    findings: list[Finding], ranks: Mapping[str, int], collectives: frozenset[str] = frozenset()
) -> list[Finding]:
    """One root cause, one finding: fold each finding that another rule's finding explains.

    Findings are taken in order of their rule's ``cause_rank`` (closest to a root cause
    first). A later finding of the same module is a symptom of a kept finding of another
    rule when its op or related ops include the kept finding's op (or an op folded into it
    for the same fix), when its op is among
    the kept finding's related ops (names in the per-device snapshot: those of its
    collectives, ``collectives``), or when both name one of those collectives (the same
    traffic, explained twice). It
    is dropped, and its op and related ops join the kept finding's ``related``, with the
    symptom's rule and message under ``evidence["symptoms"]``. The kept finding's message
    stays its cause; the reports summarise the symptoms.
    """
    order = sorted(range(len(findings)), key=lambda i: (ranks.get(findings[i].rule, 100), i))
    kept: list[Finding] = []
    for index in order:
        finding = findings[index]
        names = {finding.instruction, *finding.related} - {None}
        shared = names & collectives
        cause = next((k for k, other in enumerate(kept) if other.rule != finding.rule
                      and other.module == finding.module and (
                          names & _own_ops(other)
                          or shared & {other.instruction, *other.related}
                          or (finding.instruction in other.related and _names_collectives(other, collectives)))),
                     None)
        if cause is None or finding.rule == INTERNAL_ERROR:
            kept.append(finding)
            continue
        other = kept[cause]
        related = list(other.related)
        for name in (finding.instruction, *finding.related):
            if name and name not in related and name != other.instruction:
                related.append(name)
        # a symptom that stands for several ops with one fix (fold_same_fix) is each of them
        symptoms = [*other.evidence.get("symptoms", ()),
                    {"rule": finding.rule, "instruction": finding.instruction, "message": finding.message,
                     "wire_bytes_per_device": finding.evidence.get("wire_bytes_per_device")},
                    *({"rule": finding.rule, "instruction": same.get("instruction"), "message": same.get("message"),
                       "wire_bytes_per_device": same.get("wire_bytes_per_device")}
                      for same in finding.evidence.get("same_fix", ()) if isinstance(same, Mapping))]
        kept[cause] = dataclasses.replace(other, related=tuple(related),
                                          evidence={**other.evidence, "symptoms": symptoms})
    return kept


def _own_ops(finding: Finding) -> set[str]:
    """The finding's op and the ops folded into it for the same fix (:func:`fold_same_fix`)."""
    same = finding.evidence.get("same_fix", ())
    return {name for name in (finding.instruction, *(s.get("instruction") for s in same if isinstance(s, Mapping)))
            if isinstance(name, str)}


def _names_collectives(finding: Finding, collectives: frozenset[str]) -> bool:
    """Whether a finding's related ops are per-device names (it names one of the module's collectives)."""
    return bool(collectives & {finding.instruction, *finding.related})


def crash_finding(rule: Rule, ctx: RuleContext, error: BaseException) -> Finding:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return Finding(
        rule=INTERNAL_ERROR,
        severity=Severity.ERROR,
        module=ctx.module.key,
        message=(
            f"rule {rule.id} crashed{where}: {type(error).__name__}: {one_line(str(error), 300)}; "
            "its findings for this module are missing (please report this)"
        ),
        evidence={"rule": rule.id},
    )
