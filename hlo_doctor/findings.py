"""The findings model: what an analysis produces and every output format renders.

* :class:`Finding`: a frozen, slotted record: rule, severity, module,
  instruction, dump file:line, the user's source line, the message, the
  suggestion and the evidence numbers. Output formats only render findings.
* :class:`Skip`: a rule that did not judge a module, and why.
* :class:`Report`: what :func:`hlo_doctor.analysis.analyze_dump` found, with
  :class:`ModuleSummary` per module and :class:`ReportError` per thing that
  could not be analyzed.

This module imports nothing else of hlo-doctor's but its version and the
picture records (:mod:`hlo_doctor.pictures`): the rules
(:mod:`hlo_doctor.rules`) make these records, the analysis collects them,
and the report formats (:mod:`hlo_doctor.report`) and the CI gate
(:mod:`hlo_doctor.gate`) read them. A report renders from these records alone:
the analysis hands each finding its pictures and each module its inventory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hlo_doctor._version import __version__
from hlo_doctor.pictures import FindingPictures

__all__ = [
    "EDIT_KINDS",
    "DimAxes",
    "Finding",
    "ModuleSummary",
    "Report",
    "ReportError",
    "RuleInfo",
    "Severity",
    "Skip",
    "SourceFile",
    "SourceRef",
    "SourceEdit",
    "Suggestion",
]


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True, slots=True)
class SourceRef:
    """A line of the user's program: the innermost frame outside the frameworks."""

    file: str
    line: int
    function: str | None = None


DimAxes = tuple[str, ...] | None
"""The mesh axes one tensor dim is split over, major first (None: not split)."""


@dataclass(frozen=True, slots=True)
class SourceEdit:
    """The change to the user's program a suggestion amounts to, for ``hlo-doctor fix``.

    Rules say *what* to change in the program's terms; :mod:`hlo_doctor.fix` turns it into a
    source edit (or says why it cannot). ``kind`` is one of :data:`EDIT_KINDS`:

    * ``constrain``: after the statement on ``file``:``line`` that assigns ``target``, constrain
      ``target`` to ``spec`` (``jax.lax.with_sharding_constraint`` / ``xs.mark_sharding``);
      ``details["position"]`` ``"before"`` puts it before the statement that uses ``target``,
      ``"function-start"`` first in the function defined on the line, and ``"in-place"`` rewrites
      the sharding of the constraint of ``target`` that the line itself is.
    * ``axes``: line ``line`` writes the mesh axes ``old_spec[0]`` (a string or a tuple of strings)
      that several specs read as one dim's entry, through the variable ``details["variable"]``;
      write ``spec[0]`` instead.
    * ``respec``: the sharding call on ``file``:``line`` (``mark_sharding``, ``P(...)`` in a
      ``NamedSharding``, ``with_sharding_constraint``, ``device_put``, ``in_shardings``) writes
      ``old_spec`` for ``target``; write ``spec`` instead.
    * ``mesh``: the mesh construction on ``file``:``line``; ``details`` has ``axis_names`` (the
      new order, major first) and/or ``shape``, or ``device_order: "host-major"``.
    * ``logical-rule``: the Flax logical axis rules on ``file``:``line``; ``details`` has
      ``logical`` (the logical axis name) and ``mesh_axes`` (its new mesh axes, major first).
    * ``layout-map-key``: the Keras ``LayoutMap`` assigned on ``file``:``line``; ``details`` has
      ``key`` (a regex that matches ``target``, the variable path) and ``spec``, and, where the
      runner recorded the variables, ``paths``: every variable the key matches (``target`` is the
      first, so the findings of those variables make the same edit).
    * ``with-partitioning``: the initializer on ``file``:``line`` of the NNX parameter ``target``
      gets ``nnx.with_partitioning(init, spec)``.
    * ``shard-output``: the FSDPv2 wrapper on ``file``:``line`` gets a ``shard_output`` that marks
      the output's dim 0 over ``spec[0]``'s axes.
    * ``forward-hook``: before the model call on ``file``:``line`` (``details["model"]``: the model
      variable), register a forward hook that marks the output's dim 0 of the submodule ``target``
      (its path, ``model.layers.*.o_proj`` for every layer) over ``spec[0]``'s axes;
      ``details["module"]`` is its expression (with ``details["each"]`` and ``details["loop"]``: in
      a loop over that list of layers).
    * ``xla-flag``: remove ``details["flag"]`` from ``XLA_FLAGS`` (no source line).

    ``file``/``line`` None: the finding's own source line. ``framework`` is ``jax`` or
    ``torch_xla``; ``mesh`` names the program's mesh variable when it is known.
    """

    kind: str
    framework: str
    target: str | None = None
    spec: tuple[DimAxes, ...] | None = None
    old_spec: tuple[DimAxes, ...] | None = None
    file: str | None = None
    line: int | None = None
    mesh: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)


EDIT_KINDS = ("constrain", "respec", "axes", "mesh", "logical-rule", "layout-map-key", "with-partitioning",
              "shard-output", "forward-hook", "xla-flag")


@dataclass(frozen=True, slots=True)
class Suggestion:
    """What to do: a one-line summary and code for each framework (None: no code).

    ``edits``: the same as changes to the program (:class:`SourceEdit`), empty when the rule
    cannot say; ``no_edit``: why no safe edit can be made, when the rule knows.
    """

    summary: str
    jax: str | None = None
    torch_xla: str | None = None
    edits: tuple[SourceEdit, ...] = ()
    no_edit: str | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found in one module.

    ``instruction`` is the name in the after-partitioning snapshot where one
    exists (else in the snapshot named by ``file``); ``related`` names the
    other instructions involved, in any snapshot. ``file``/``line`` point
    into the dump; ``source`` at the user's program (None when the dump has
    no location). ``evidence`` holds the numbers behind the message.
    """

    rule: str
    severity: Severity
    module: str
    message: str
    instruction: str | None = None
    related: tuple[str, ...] = ()
    file: str | None = None
    line: int | None = None
    source: SourceRef | None = None
    suggestion: Suggestion | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    # Stable across recompiles (see hlo_doctor.fingerprint); op_name for ignore-ops.
    fingerprint: str = field(default="", compare=False)
    op_name: str | None = field(default=None, compare=False)
    # The user's line and what identifies the op beyond its name (op_name | opcode | shape |
    # sharding), as Rule.finding saw them; the engine turns it into ``fingerprint`` once the
    # rule has run. None: a finding made directly, fingerprinted from its message.
    signature: str | None = field(default=None, compare=False, repr=False)
    # What the HTML report draws of it, made by the analysis while the module was loaded (None: not made).
    pictures: FindingPictures | None = field(default=None, compare=False, repr=False)

    @property
    def sort_key(self) -> tuple:
        return (self.module, self.file or "", self.line or 0, self.rule, self.instruction or "")


@dataclass(frozen=True, slots=True)
class Skip:
    """A rule that did not judge a module, and why (shown with ``--verbose``)."""

    rule: str
    module: str
    reason: str


@dataclass(frozen=True, slots=True)
class RuleInfo:
    """What a report says of a rule that ran: its id, one-line summary, default severity and
    documentation (its docstring), for the formats that describe rules (SARIF)."""

    id: str
    summary: str
    severity: Severity
    doc: str = ""


@dataclass(frozen=True, slots=True)
class ReportError:
    """Something that could not be analyzed: a file, a module or a plugin; one line."""

    path: str
    message: str
    module: str | None = None


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A program file the dump names, and where it was found on this machine (see
    :mod:`hlo_doctor.program.locate`)."""

    recorded: str
    """the path as the dump records it"""
    local: str | None
    """the file read here, or None"""
    how: str
    """found: ``recorded``, ``path-map``, ``suffix`` (the recorded path's tail below the dump's
    folder, its parents or the project), ``gallery``; not: ``missing``, ``outside`` (outside the
    allowed folders), ``too-big``"""


@dataclass(frozen=True, slots=True)
class ModuleSummary:
    id: int | None
    name: str
    key: str
    partitioner: str
    num_partitions: int | None
    snapshots: tuple[str, ...]
    errors: tuple[str, ...] = ()
    collectives: Mapping[str, tuple[int, int]] = field(default_factory=dict, hash=False)
    """kind -> (count, bytes of data per device per step)"""
    framework: str | None = None
    """``jax``, ``torch_xla`` or None when the dump does not say"""
    inventory: tuple[Mapping[str, Any], ...] | None = field(default=None, hash=False, compare=False)
    """the communication inventory (``hlo-doctor collectives``' rows, keys
    :data:`hlo_doctor.pictures.INVENTORY_KEYS`); None without a per-device snapshot"""
    memory: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    """the memory per device at the module's peak, as a module of ``hlo-doctor memory --format json``
    (its largest items only); None without a per-device snapshot, or when the analysis made no drawings"""


@dataclass
class Report:
    """What :func:`~hlo_doctor.analysis.analyze_dump` found. Formats in :mod:`hlo_doctor.report` render it."""

    dump: str
    modules: tuple[ModuleSummary, ...]
    findings: tuple[Finding, ...]
    errors: tuple[ReportError, ...] = ()
    skipped: tuple[Skip, ...] = ()
    rules: tuple[str, ...] = ()
    hardware: str | None = None
    tool_version: str = __version__
    verbose: bool = False
    devices_per_host: int | None = None
    program: str | None = None
    """the runner's program (the script it ran), when the dump has its record"""
    baselined: tuple[Finding, ...] | None = None
    """findings a baseline accepted, left out of ``findings`` (None: no baseline was applied)"""
    rule_info: tuple[RuleInfo, ...] = ()
    """the rules that ran, described (the ids of ``rules`` that the registry knew)"""
    drawings: bool = False
    """whether the analysis made what the HTML report draws (findings' pictures, modules' inventories)"""
    sources: tuple[SourceFile, ...] = ()
    """the user's program files the dump names, found here or not (library files left out)"""

    def __str__(self) -> str:
        """One line per finding and a count; :func:`hlo_doctor.report.render` gives the full reports."""
        lines = []
        for finding in self.findings:
            where = f"{finding.file}:{finding.line}" if finding.file and finding.line else finding.module
            lines.append(f"{where}: {finding.severity.value} {finding.rule} {finding.message}")
        count = len(self.findings)
        lines.append(f"{count} finding{'s' if count != 1 else ''} in {self.dump}")
        return "\n".join(lines)
