"""The rule-plugin API version, and whether a rule's requirement accepts it.

hlo-doctor's rule-author API (:mod:`hlo_doctor.plugin`) has a version of its
own, ``MAJOR.MINOR``, independent of the package version: the minor number
grows when something is added, the major number when something a plugin
may use changes or goes away. A rule declares what it needs in its
``api_version`` class attribute, either as a bare version or as a
comma-separated list of comparisons::

    api_version = "1"            # any 1.x
    api_version = "1.2"          # 1.2 or a later 1.x (it uses something added in 1.2)
    api_version = ">=1.0,<2"     # the same, written out; also ==, !=, <=, >, ~=

A rule without ``api_version`` (None) is loaded by every version. A rule
whose requirement does not accept :data:`API_VERSION` is skipped by
discovery with a message saying both versions.
"""

from __future__ import annotations

import re

from hlo_doctor._version import __version__
from hlo_doctor.errors import ConfigurationError

API_VERSION = "1.2"  # 1.1: Rule.reads; 1.2: RuleContext.semantics, Rule.cause_rank
"""The version of the rule-author API this hlo-doctor provides."""

__all__ = ["API_VERSION", "api_version_problem", "parse_requirement", "satisfies"]

_VERSION = re.compile(r"^\d+(?:\.\d+)*$")
_CLAUSE = re.compile(r"^\s*(~=|==|!=|<=|>=|<|>)?\s*(\S+?)\s*$")


def _parse_version(text: str) -> tuple[int, ...]:
    if not _VERSION.match(text):
        raise ConfigurationError(f"{text!r} is not a version (digits separated by dots, like 1 or 1.0)")
    return tuple(int(part) for part in text.split("."))


def _pad(version: tuple[int, ...], length: int) -> tuple[int, ...]:
    return version + (0,) * (length - len(version))


def parse_requirement(requirement: str) -> list[tuple[str, tuple[int, ...]]]:
    """``">=1.0,<2"`` -> ``[(">=", (1, 0)), ("<", (2,))]``; a bare version is ``("", version)``.

    Raises ValueError for text that is not a requirement.
    """
    if not isinstance(requirement, str) or not requirement.strip():
        raise ConfigurationError(f"{requirement!r} is not a version requirement")
    clauses = []
    for part in requirement.split(","):
        match = _CLAUSE.match(part)
        if match is None:
            raise ConfigurationError(f"{part.strip()!r} is not a version comparison")
        operator, version = match.group(1) or "", match.group(2)
        parsed = _parse_version(version)
        if operator == "~=" and len(parsed) < 2:
            raise ConfigurationError(f"'~={version}' needs at least MAJOR.MINOR")
        clauses.append((operator, parsed))
    if any(op == "" for op, _ in clauses) and len(clauses) > 1:
        raise ConfigurationError(f"{requirement!r}: a bare version cannot be combined with comparisons")
    return clauses


def _accepts(operator: str, wanted: tuple[int, ...], have: tuple[int, ...]) -> bool:
    length = max(len(wanted), len(have))
    a, b = _pad(have, length), _pad(wanted, length)
    if operator == "":  # same major, at least the version named
        return have[0] == wanted[0] and a >= b
    if operator == "~=":  # compatible release: >= wanted, same prefix but the last part
        return a >= b and have[: len(wanted) - 1] == wanted[:-1]
    return {
        "==": a == b, "!=": a != b, "<=": a <= b, ">=": a >= b, "<": a < b, ">": a > b,
    }[operator]


def satisfies(requirement: str, version: str = API_VERSION) -> bool:
    """Whether ``version`` meets ``requirement`` (raises ValueError for a malformed requirement)."""
    have = _parse_version(version)
    return all(_accepts(op, wanted, have) for op, wanted in parse_requirement(requirement))


def api_version_problem(rule: type) -> str | None:
    """Why ``rule``'s ``api_version`` rules out this hlo-doctor, or None when it is compatible."""
    requirement = getattr(rule, "api_version", None)
    name = getattr(rule, "__name__", "?")
    if requirement is None:
        return None
    try:
        ok = satisfies(requirement)
    except ValueError as error:
        return f"{name}.api_version is not a valid requirement: {error}"
    if ok:
        return None

    return (
        f"{name} needs rule-plugin API {requirement!r}, but hlo-doctor {__version__} provides API {API_VERSION}; "
        f"install a version of the plugin written for API {API_VERSION.split('.')[0]}.x, "
        "or an hlo-doctor that provides the API it needs"
    )
