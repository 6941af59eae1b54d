"""What a rule is, what it reads and what it yields.

* :class:`Rule`: one check. Metadata are plain class attributes (``id``,
  ``severity``, ``summary``); per-rule options are a dataclass named in
  ``Options``; :meth:`Rule.check` is pure: it reads a :class:`RuleContext`
  and yields :class:`Finding` records.
* :class:`Finding` (defined in :mod:`hlo_doctor.findings`, re-exported
  here): a frozen, slotted record: rule, severity, module, instruction, dump
  file:line, the user's source line, the message, the suggestion and the
  evidence numbers. Output formats only render findings.
* :class:`RuleContext` (in :mod:`hlo_doctor.rules.context`): one module of a
  dump, with the analyses rules share built lazily and cached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hlo_doctor.findings import Finding, Severity, SourceRef, Suggestion
from hlo_doctor.fingerprint import finding_signature

if TYPE_CHECKING:
    from hlo_doctor.hlo.ir import Instruction
    from hlo_doctor.rules.context import RuleContext

__all__ = [
    "Finding",
    "NoOptions",
    "Rule",
    "RuleSkipped",
    "Severity",
    "SourceRef",
    "Suggestion",
]


class RuleSkipped(Exception):
    """Raised by a check that cannot judge this module; the reason is reported (``-v``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NoOptions:
    """A rule without options."""


class Rule:
    """Base class of every rule (built-in or plugin).

    Subclasses set ``id`` (stable, kebab-case, names the pattern found),
    ``severity``, ``summary`` (one line), optionally ``Options`` (a frozen
    dataclass of typed option fields with defaults) and ``api_version``
    (the rule-plugin API they need, e.g. ``">=1.0,<2"``; see
    :mod:`hlo_doctor.rules.versioning`), write their docstring to the
    template *What it finds / Why it hurts / Example / Fix / Options*, and
    implement :meth:`check`. The options of a run are ``self.options``.
    """

    id: ClassVar[str] = ""
    severity: ClassVar[Severity] = Severity.WARNING
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    api_version: ClassVar[str | None] = None
    # Which snapshots the rule reads: "sharded" (global shapes and propagated shardings:
    # after propagation / before optimizations) and/or "per_device" (after partitioning /
    # after optimizations). None: unknown. Rules that read only "sharded" may run in a
    # worker process beside the others (see hlo_doctor.rules.parallel); the answer never
    # changes what a rule may read, only where it runs.
    reads: ClassVar[frozenset[str] | None] = None
    # How close to a root cause the rule's findings are (lower: closer). When two rules report
    # the same op, the finding of the lower rank stays and the other is folded into its
    # ``related`` (see hlo_doctor.rules.engine.fold_symptoms): one root cause, one finding.
    cause_rank: ClassVar[int] = 100

    def __init__(self, options: Any = None, **overrides: Any) -> None:
        if options is None:
            options = self.Options(**overrides)
        elif overrides:
            options = dataclasses.replace(options, **overrides)
        self.options = options

    def check(self, ctx: RuleContext) -> Iterator[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers for subclasses ------------------------------------------
    def finding(
        self,
        ctx: RuleContext,
        message: str,
        *,
        instruction: Instruction | None = None,
        name: str | None = None,
        related: tuple[str, ...] | list[str] = (),
        suggestion: Suggestion | None = None,
        evidence: Mapping[str, Any] | None = None,
        severity: Severity | None = None,
        source_from: Instruction | None = None,
    ) -> Finding:
        """A finding of this rule in ``ctx``'s module, located at ``instruction``.

        The dump file:line and the user's source come from ``instruction``
        (or ``source_from`` when given). A torch_xla location made only of
        library frames is noted in the message.
        """
        file = line = None
        source = None
        where = source_from or instruction
        if instruction is not None:
            file = instruction.origin.path
            line = instruction.position.line
        evidence = dict(evidence or {})
        if where is not None:
            source, library_only = ctx.user_source(where)
            if source is None and library_only:
                message += " (the dump records only library frames for this op, no line of your code)"
            helper = ctx.helper_source(where, source)
            if helper is not None:  # the op's own line, in a helper of the user's: its caller's is reported
                evidence.setdefault("helper_line", f"{helper.file}:{helper.line}"
                                    + (f" ({helper.function})" if helper.function else ""))
        metadata = instruction.metadata if instruction is not None else None
        return Finding(
            rule=self.id,
            severity=severity or self.severity,
            module=ctx.module.key,
            message=message,
            instruction=name or (instruction.name if instruction is not None else None),
            related=tuple(related),
            file=file,
            line=line,
            source=source,
            suggestion=suggestion,
            evidence=evidence,
            signature=finding_signature(source, instruction, name),  # the engine makes the fingerprint
            op_name=metadata.op_name if metadata is not None else None,
        )

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls.Options)) if dataclasses.is_dataclass(cls.Options) else []
