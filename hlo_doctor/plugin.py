"""The public API for rule authors: everything a rule (built-in or plugin) may use.

A plugin imports from here and nowhere else in ``hlo_doctor``; the names in
``__all__`` are the stable rule-author API, versioned by :data:`API_VERSION`
(``MAJOR.MINOR``: the minor number grows when something is added, the major
number when something here changes incompatibly). Everything else in the
package may change in any release. A rule says which API it needs in its
``api_version`` class attribute (``"1"``, ``"1.0"`` or ``">=1.0,<2"``); a
rule whose requirement this hlo-doctor does not meet is skipped at
discovery, with a message naming both versions.

A minimal rule::

    from dataclasses import dataclass

    from hlo_doctor.plugin import Rule, RuleContext, RuleSkipped, Severity, Suggestion

    @dataclass(frozen=True, slots=True)
    class BigAllToAllOptions:
        min_bytes: int = 1 << 20
        \"\"\"Only all-to-alls moving at least this much per device.\"\"\"

    class BigAllToAll(Rule):
        \"\"\"(docstring: What it finds / Why it hurts / Example / Fix / Options)\"\"\"

        id = "big-all-to-all"
        severity = Severity.INFO
        summary = "An all-to-all moves a lot of data per device."
        Options = BigAllToAllOptions
        api_version = ">=1.0,<2"

        def check(self, ctx: RuleContext):
            if ctx.per_device is None:
                raise RuleSkipped("no partitioned module")
            for op in ctx.collectives:
                if op.kind == "all-to-all" and op.bytes_in_per_device >= self.options.min_bytes:
                    yield self.finding(ctx, f"{op.instruction} moves {op.bytes_in_per_device} bytes",
                                       instruction=ctx.instruction(op.computation, op.instruction),
                                       suggestion=Suggestion("Shard the tokens on the expert axis first."))

and its registration, in the plugin's ``pyproject.toml``::

    [project.entry-points."hlo_doctor.rules"]
    big-all-to-all = "my_package.big_all_to_all:BigAllToAll"

What a rule reads, all through its :class:`RuleContext` ``ctx``:

* the module's snapshots, parsed once: ``ctx.sharded`` (global shapes with
  the propagated shardings), ``ctx.per_device`` (partitioned),
  ``ctx.before_optimizations``, ``ctx.after_propagation``, ``ctx.partitioned``,
  ``ctx.after_optimizations``, ``ctx.hlo(Role.X)``;
* facts: ``ctx.num_partitions``, ``ctx.framework`` (``"jax"``/``"torch_xla"``),
  ``ctx.backend``, ``ctx.is_cpu``, ``ctx.devices_per_host``, ``ctx.options``
  (:class:`AnalysisOptions` of the run: hardware profile, devices per host);
* the mesh (:class:`Mesh`, ``ctx.mesh``) and which mesh axes each tensor dim
  of a sharding uses (:func:`dim_axes`); what a sharding means for a value
  (:func:`layout` -> :class:`ShardingLayout`: tiles per dim, shard shape,
  replication, device groups);
* collectives as they run (``ctx.collectives``: :class:`Collective` with
  kind, groups, mesh axes, bytes per device, host crossing), how often each
  computation runs (``ctx.executions``), FLOPs (``ctx.dot_flops``);
* the dataflow graph of the per-device module (``ctx.graph``:
  :class:`DataflowGraph`; :func:`build_graph` builds one for any module);
* the user's source line of an instruction (``ctx.user_source(instr)``,
  :func:`user_frame`), which :meth:`Rule.finding` fills in for you.

The rule's own options are ``self.options`` (an instance of its ``Options``
dataclass, set from ``[tool.hlo-doctor.rules.ID]``). Test a rule with
:mod:`hlo_doctor.testing`; the tutorial is ``docs/writing-rules.md``.
"""

from __future__ import annotations

from hlo_doctor.dump import Dump, DumpModule, Role
from hlo_doctor.graph.collectives import Collective
from hlo_doctor.graph.dataflow import DataflowGraph, build_graph
from hlo_doctor.graph.devices import DeviceMap
from hlo_doctor.graph.mesh import Mesh, dim_axes
from hlo_doctor.graph.sharding import (
    ShardingLayout,
    device_groups,
    layout,
    replication_factor,
    shard_shape,
    tiles_per_dim,
)
from hlo_doctor.graph.source import is_library_file
from hlo_doctor.hlo.ir import (
    Computation,
    HloModule,
    Instruction,
    OpMetadata,
    Shape,
    Sharding,
    ShardingKind,
    SourceLocation,
)
from hlo_doctor.program.suggest import (
    argument_name,
    constraint_code,
    jax_spec,
    parameter_code,
    python_identifier,
    torch_spec,
)
from hlo_doctor.rules.base import (
    Finding,
    NoOptions,
    Rule,
    RuleSkipped,
    Severity,
    SourceRef,
    Suggestion,
)
from hlo_doctor.rules.context import (
    AnalysisOptions,
    RuleContext,
    short_path,
    user_frame,
)
from hlo_doctor.rules.docs import missing_sections, rule_markdown
from hlo_doctor.rules.registry import GROUP
from hlo_doctor.rules.versioning import API_VERSION, satisfies
from hlo_doctor.units import format_bytes

__all__ = [
    "argument_name",
    "format_bytes",
    "python_identifier",
    # versioning and registration
    "API_VERSION",
    "GROUP",
    "satisfies",
    # the rule and what it yields
    "Finding",
    "NoOptions",
    "Rule",
    "RuleSkipped",
    "Severity",
    "SourceRef",
    "Suggestion",
    # what it reads
    "AnalysisOptions",
    "RuleContext",
    "Dump",
    "DumpModule",
    "Role",
    # IR
    "Computation",
    "HloModule",
    "Instruction",
    "OpMetadata",
    "Shape",
    "Sharding",
    "ShardingKind",
    "SourceLocation",
    # sharding semantics and the mesh
    "Mesh",
    "ShardingLayout",
    "device_groups",
    "dim_axes",
    "layout",
    "replication_factor",
    "shard_shape",
    "tiles_per_dim",
    # collectives, devices and dataflow
    "Collective",
    "DataflowGraph",
    "DeviceMap",
    "build_graph",
    # source lines
    "is_library_file",
    "short_path",
    "user_frame",
    # the rule's docs page (from its docstring)
    "missing_sections",
    "rule_markdown",
    # suggestion code in the program's own mesh axis names
    "constraint_code",
    "jax_spec",
    "parameter_code",
    "torch_spec",
]
