"""Rule discovery through the ``hlo_doctor.rules`` entry-point group.

Built-in rules register in hlo-doctor's own ``pyproject.toml`` exactly as a
plugin does in its own. Discovery is deterministic: the built-in entry points
first, then the plugins', each sorted by entry-point name and value, so a
plugin can never shadow a built-in rule. Every problem is recorded as a
:class:`LoadError` in :attr:`Registry.errors` and the entry point is
skipped: a plugin that fails to import, an object that is not a
:class:`~hlo_doctor.rules.base.Rule` subclass or lacks metadata, a rule
whose ``api_version`` does not accept this hlo-doctor's
:data:`~hlo_doctor.rules.versioning.API_VERSION`, and a second rule with an
id already taken (the first one registered keeps it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points

from hlo_doctor.errors import one_line
from hlo_doctor.rules.base import Rule, Severity
from hlo_doctor.rules.versioning import api_version_problem

GROUP = "hlo_doctor.rules"
BUILTIN_PREFIX = "hlo_doctor.rules.builtin."
_ID = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")

__all__ = ["GROUP", "LoadError", "Registry", "RuleSpec", "discover"]


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """A discovered rule class and where it came from."""

    rule: type[Rule]
    origin: str  # "builtin" or "plugin NAME==VERSION"
    entry_point: str

    @property
    def id(self) -> str:
        return self.rule.id

    @property
    def is_builtin(self) -> bool:
        return self.origin == "builtin"

    @property
    def distribution(self) -> str | None:
        """The plugin's distribution name (None for a built-in rule)."""
        if self.is_builtin:
            return None
        return self.origin.removeprefix("plugin ").split("==", 1)[0]

    @property
    def version(self) -> str | None:
        """The plugin distribution's version, when known."""
        _, sep, version = self.origin.partition("==")
        return version if sep else None


@dataclass(frozen=True, slots=True)
class LoadError:
    """An entry point that could not be used; one line."""

    entry_point: str
    origin: str
    message: str


@dataclass
class Registry:
    rules: dict[str, RuleSpec] = field(default_factory=dict)
    errors: list[LoadError] = field(default_factory=list)

    def ids(self) -> list[str]:
        return sorted(self.rules)

    def get(self, rule_id: str) -> RuleSpec | None:
        return self.rules.get(rule_id)

    def builtin_ids(self) -> list[str]:
        """The ids of the built-in rules, sorted."""
        return [rule_id for rule_id in self.ids() if self.rules[rule_id].is_builtin]

    def add(self, rule: type[Rule], origin: str = "builtin", entry_point: str = "") -> LoadError | None:
        """Register ``rule``; returns (and records) the error when it is not usable."""
        problem = _check(rule)
        if problem is None:
            problem = api_version_problem(rule)
        if problem is None and rule.id in self.rules:
            taken = self.rules[rule.id]
            by = f"{taken.entry_point} ({taken.origin})" if taken.entry_point else taken.origin
            problem = f"rule id '{rule.id}' is already registered by {by}"
        if problem is not None:
            error = LoadError(entry_point or getattr(rule, "__name__", "?"), origin, problem)
            self.errors.append(error)
            return error
        self.rules[rule.id] = RuleSpec(rule, origin, entry_point)
        return None


def _check(rule: object) -> str | None:
    if not isinstance(rule, type) or not issubclass(rule, Rule):
        return f"{rule!r} is not a subclass of hlo_doctor.rules.Rule"
    if not isinstance(rule.id, str) or not _ID.match(rule.id):
        return f"{rule.__name__} has no valid id (lower-case words joined by '-'): {rule.id!r}"
    if not isinstance(rule.severity, Severity):
        return f"{rule.__name__}.severity must be a Severity, not {rule.severity!r}"
    if not rule.summary:
        return f"{rule.__name__} has no summary"
    return None


def _origin(entry_point: EntryPoint) -> str:
    if entry_point.value.startswith(BUILTIN_PREFIX):
        return "builtin"
    dist = getattr(entry_point, "dist", None)
    if dist is not None:
        return f"plugin {dist.metadata['Name']}=={dist.version}"
    return f"plugin {entry_point.value.split(':', 1)[0]}"


def discover(group: str = GROUP) -> Registry:
    """Load every rule registered in ``group``: built-ins first, each part sorted by entry-point name, value."""
    registry = Registry()
    points = sorted(
        entry_points(group=group),
        key=lambda ep: (not ep.value.startswith(BUILTIN_PREFIX), ep.name, ep.value),
    )
    seen_values: set[tuple[str, str]] = set()
    for point in points:
        if (point.name, point.value) in seen_values:  # the same distribution found twice on sys.path
            continue
        seen_values.add((point.name, point.value))
        origin = _origin(point)
        try:
            loaded = point.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not stop the others
            registry.errors.append(
                LoadError(point.name, origin, f"failed to load {point.value}: {type(error).__name__}: "
                                              f"{one_line(str(error), 200)}")
            )
            continue
        registry.add(loaded, origin, f"{point.name} = {point.value}")
    return registry
