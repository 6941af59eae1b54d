"""Rule classes that fake plugins register in tests/test_plugins.py (through fake entry points)."""

from __future__ import annotations

from dataclasses import dataclass

from hlo_doctor.plugin import Rule, Severity


class CrashingRule(Rule):
    """Raises on every module."""

    id = "crashing-plugin-rule"
    severity = Severity.ERROR
    summary = "Always raises."
    api_version = "1"

    def check(self, ctx):
        raise KeyError("no such instruction")
        yield  # pragma: no cover


class HelloRule(Rule):
    """One info finding per module."""

    id = "hello-plugin-rule"
    severity = Severity.INFO
    summary = "Says hello once per module."
    api_version = ">=1.0,<2"

    def check(self, ctx):
        yield self.finding(ctx, f"hello from {ctx.module.name}")


class FirstDuplicate(Rule):
    """Takes an id another plugin takes too."""

    id = "duplicate-rule"
    severity = Severity.INFO
    summary = "The first rule with this id."

    def check(self, ctx):
        return iter(())


class SecondDuplicate(FirstDuplicate):
    """The same id again."""

    summary = "The second rule with this id."


class ShadowsBuiltin(FirstDuplicate):
    """Takes a built-in rule's id."""

    id = "uneven-sharding-padding"
    summary = "Tries to replace a built-in rule."


class NeedsApi2(HelloRule):
    """Written for a later plugin API."""

    id = "needs-api-two"
    api_version = ">=2.0"


class BadApiVersion(HelloRule):
    """An api_version that is not a requirement."""

    id = "bad-api-version"
    api_version = "one point oh"


@dataclass(frozen=True, slots=True)
class ThresholdOptions:
    threshold: int = 1
    """A number the message repeats."""
    tags: tuple[str, ...] = ()
    """Words the message repeats."""


class OptionRule(Rule):
    """Reports its options."""

    id = "option-plugin-rule"
    severity = Severity.INFO
    summary = "Reports its options once per module."
    Options = ThresholdOptions
    api_version = "1.0"

    def check(self, ctx):
        yield self.finding(ctx, f"threshold={self.options.threshold} tags={','.join(self.options.tags)}")
