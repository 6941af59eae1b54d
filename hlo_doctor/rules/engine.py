"""Run rules over one module: select, call, and turn a crash into a finding."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hlo_doctor.errors import one_line
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.rules.registry import Registry

INTERNAL_ERROR = "internal-error"

__all__ = ["INTERNAL_ERROR", "Skip", "merge_outcomes", "run_rule", "run_rules", "select_rules"]


@dataclass(frozen=True, slots=True)
class Skip:
    """A rule that did not judge a module, and why (shown with ``--verbose``)."""

    rule: str
    module: str
    reason: str


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
    return merge_outcomes([run_rule(ctx, rule) for rule in rules])


def run_rule(ctx: RuleContext, rule: Rule) -> tuple[list[Finding], Skip | None]:
    """One rule on ``ctx``: its findings, or why it could not judge the module."""
    try:
        return list(rule.check(ctx)), None
    except RuleSkipped as skipped:
        return [], Skip(rule.id, ctx.module.key, skipped.reason)
    except Exception as error:  # noqa: BLE001 - one rule's bug must not end the run
        return [crash_finding(rule, ctx, error)], None


def merge_outcomes(outcomes: Iterable[tuple[list[Finding], Skip | None]]) -> tuple[list[Finding], list[Skip]]:
    """The findings (sorted) and skips of rule outcomes given in rule order."""
    findings: list[Finding] = []
    skips: list[Skip] = []
    for produced, skip in outcomes:
        findings.extend(produced)
        if skip is not None:
            skips.append(skip)
    findings.sort(key=lambda f: f.sort_key)
    return findings, skips


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
