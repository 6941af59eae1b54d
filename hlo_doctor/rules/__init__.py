"""The rule engine: rules, findings, discovery and the shared context.

Rule authors (built-in and plugins) import from :mod:`hlo_doctor.plugin`,
the stable, versioned API that re-exports what they need from here::

    from hlo_doctor.plugin import Finding, Rule, RuleContext, RuleSkipped, Severity, Suggestion

A plugin package registers its rule classes in the ``hlo_doctor.rules``
entry-point group::

    [project.entry-points."hlo_doctor.rules"]
    my-rule = "my_package.my_rule:MyRule"
"""

from hlo_doctor.rules.base import (
    Finding,
    NoOptions,
    Rule,
    RuleSkipped,
    Severity,
    SourceRef,
    Suggestion,
)
from hlo_doctor.rules.context import AnalysisOptions, RuleContext
from hlo_doctor.rules.engine import INTERNAL_ERROR, Skip, run_rules, select_rules
from hlo_doctor.rules.registry import GROUP, LoadError, Registry, RuleSpec, discover

__all__ = [
    "GROUP",
    "INTERNAL_ERROR",
    "AnalysisOptions",
    "Finding",
    "LoadError",
    "NoOptions",
    "Registry",
    "Rule",
    "RuleContext",
    "RuleSkipped",
    "RuleSpec",
    "Severity",
    "Skip",
    "SourceRef",
    "Suggestion",
    "discover",
    "run_rules",
    "select_rules",
]
