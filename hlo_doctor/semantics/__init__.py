"""The analysis layer between the dataflow graph and the rules.

One :class:`ModuleSemantics` per module, cached on the rule context
(``ctx.semantics``), answers what every rule used to work out for itself:

* :attr:`ModuleSemantics.collectives`: every collective in every form, with
  groups, mesh axes, bytes, executions per step, schedule position and
  whether it crosses the slow boundary (:mod:`.collective_model`);
* :attr:`ModuleSemantics.roles`: what each collective is for, from dataflow
  (:mod:`.roles`);
* :attr:`ModuleSemantics.parameters`: weights, data and scalars (:mod:`.parameters`);
* :attr:`ModuleSemantics.batch`: the batch dims of every value
  (:mod:`.batch_dims`), and :attr:`ModuleSemantics.data_parallel_axes`: the
  mesh axes that split the batch or over which gradients are reduced;
* :attr:`ModuleSemantics.bytes`: collective bytes per device per step by role, and
  on the critical path against prefetchable (:mod:`.critical_path`);
* :meth:`ModuleSemantics.cost`: time per collective and per matmul on a
  hardware profile (:mod:`.cost`).

Nothing here reads a name to decide; names only label.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from hlo_doctor.dump import Role
from hlo_doctor.graph.collectives import Collective, find_collectives
from hlo_doctor.graph.dataflow import DataflowGraph, build_graph
from hlo_doctor.graph.mesh import dim_axes
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.semantics.batch_dims import BatchAnalysis, analyze_data_batch
from hlo_doctor.semantics.collective_model import CollectiveFacts, OperandFacts, collective_facts
from hlo_doctor.semantics.cost import CostModel
from hlo_doctor.semantics.critical_path import ByteAccount, CollectiveBytes, account_bytes
from hlo_doctor.semantics.execution import Executions, execution_counts
from hlo_doctor.semantics.parameters import EntryParameters, classify_parameters
from hlo_doctor.semantics.roles import (
    ACTIVATION_ROLES,
    ROLES,
    CollectiveRole,
    OperandRole,
    assign_roles,
    forward_pass,
    loss_nodes,
)
from hlo_doctor.semantics.view import ModuleView

if TYPE_CHECKING:
    from hlo_doctor.semantics.hardware import HardwareProfile

__all__ = [
    "ACTIVATION_ROLES",
    "ROLES",
    "ByteAccount",
    "CollectiveBytes",
    "CollectiveFacts",
    "CollectiveRole",
    "EntryParameters",
    "Executions",
    "ModuleSemantics",
    "OperandFacts",
    "OperandRole",
]


class ModuleSemantics:
    """The analysis layer's facts about one module (per-device snapshot), each made on first use."""

    def __init__(self, view: ModuleView, parameters: EntryParameters | None = None) -> None:
        self.view = view
        self._users: dict[str, dict[str, list[Instruction]]] = {}  # computation -> Computation.users()
        if parameters is not None:  # entry parameters keep their numbers across snapshots
            self.__dict__["parameters"] = parameters

    @cached_property
    def executions(self) -> dict[str, Executions]:
        module = self.view.per_device
        return execution_counts(module) if module is not None else {}

    @cached_property
    def collectives(self) -> tuple[CollectiveFacts, ...]:
        module, graph = self.view.per_device, self.view.graph
        if module is None or graph is None:
            return ()
        return collective_facts(module, graph, self.view.collectives, self.view.device_map, self.executions,
                                self.users)

    def users(self, computation: Computation) -> dict[str, list[Instruction]]:
        """:meth:`~hlo_doctor.hlo.ir.Computation.users` of a per-device computation, made once
        for every analysis and rule that asks."""
        found = self._users.get(computation.name)
        if found is None:
            found = self._users[computation.name] = computation.users()
        return found

    @cached_property
    def parameters(self) -> EntryParameters | None:
        module, graph = self.view.per_device, self.view.graph
        if module is None or graph is None:
            return None
        return classify_parameters(self.view, module, graph)

    @cached_property
    def batch(self) -> BatchAnalysis | None:
        """Batch dims of every value, seeded at dim 0 of every data input (sharded or not)."""
        module, graph, params = self.view.per_device, self.view.graph, self.parameters
        if module is None or graph is None or params is None:
            return None
        return analyze_data_batch(self.view, module, graph, params.data)

    @cached_property
    def forward_nodes(self) -> frozenset[int]:
        """Per-device graph nodes the step's loss derives from: its forward pass (empty without a loss)."""
        graph, params = self.view.graph, self.parameters
        if graph is None or params is None:
            return frozenset()
        return forward_pass(graph, loss_nodes(graph, params))

    @cached_property
    def roles(self) -> tuple[CollectiveRole, ...]:
        graph, params, batch = self.view.graph, self.parameters, self.batch
        if graph is None or params is None or batch is None:
            return ()
        return assign_roles(graph, params, batch, self.collectives)

    @cached_property
    def bytes(self) -> ByteAccount:
        """Collective bytes per device per step by role, on the critical path and prefetchable."""
        graph, params = self.view.graph, self.parameters
        if graph is None or params is None:
            return ByteAccount()
        return account_bytes(graph, params, self.roles)

    @cached_property
    def _roles_by_name(self) -> dict[tuple[str, str], CollectiveRole]:
        return {(r.facts.computation, r.facts.instruction): r for r in self.roles}

    def role_of(self, computation: str, instruction: str) -> CollectiveRole | None:
        """The role of the collective named ``instruction`` (its start op for an async pair)."""
        return self._roles_by_name.get((computation, instruction))

    @cached_property
    def batch_split_axes(self) -> frozenset[str]:
        """Mesh axes that split the batch dim (dim 0) of a data input."""
        mesh, params, module = self.view.mesh, self.parameters, self.view.per_device
        if mesh is None or params is None or module is None or module.entry is None:
            return frozenset()
        found: set[str] = set()
        for param in module.entry.parameters():
            if param.parameter_number not in params.data or param.sharding is None or param.shape.is_tuple:
                continue
            try:
                per_dim = dim_axes(param.sharding, param.shape.rank, mesh)
            except (ValueError, KeyError):
                continue
            if per_dim:
                found.update(a.split(":(")[0] for a in per_dim[0])
        return frozenset(found)

    @cached_property
    def gradient_axes(self) -> frozenset[str]:
        """Mesh axes over which gradients are reduced."""
        found: set[str] = set()
        for role in self.roles:
            if role.role == "gradient-reduce" and role.facts.op.mesh_axes:
                found.update(a.split(":(")[0] for a in role.facts.op.mesh_axes)
        return frozenset(found)

    @cached_property
    def data_parallel_axes(self) -> frozenset[str]:
        """The axes that split the batch or over which gradients are reduced."""
        return self.batch_split_axes | self.gradient_axes

    @cached_property
    def gradient_groups(self) -> frozenset[tuple[tuple[int, ...], ...]]:
        """The device groups of gradient reductions, for modules whose mesh is not known."""
        return frozenset(tuple(sorted(tuple(sorted(g)) for g in r.facts.op.logical_groups))
                         for r in self.roles if r.role == "gradient-reduce")

    def is_data_parallel(self, role: CollectiveRole) -> bool:
        """Whether a collective runs over data-parallel axes only (or the groups of a gradient reduction)."""
        axes = role.facts.op.mesh_axes
        if axes:
            return {a.split(":(")[0] for a in axes} <= self.data_parallel_axes
        groups = tuple(sorted(tuple(sorted(g)) for g in role.facts.op.logical_groups))
        return groups in self.gradient_groups

    def cost(self, hardware: HardwareProfile) -> CostModel:
        """The cost model of this module on ``hardware``."""
        return CostModel(self, hardware)

    @cached_property
    def scheduled(self) -> ModuleSemantics | None:
        """The same analysis over the scheduled after-optimizations module (GPU, TPU), if there is one.

        Overlap is read from its schedule; the partitioned snapshot has none.
        """
        backend = self.view.module.backend or ""
        if backend.startswith("cpu"):
            return None  # the CPU backend runs collectives synchronously: its schedule hides nothing
        snapshot = self.view.module.snapshot(Role.AFTER_OPTIMIZATIONS)
        module = snapshot.try_module() if snapshot is not None else None
        if module is None or (module.attribute("is_scheduled") or "").strip() != "true":
            return None
        if module is self.view.per_device:
            return self
        return ModuleSemantics(_SnapshotView(self.view, module), self.parameters)


class _SnapshotView:
    """A :class:`ModuleView` over another per-device snapshot of the same module."""

    def __init__(self, base: ModuleView, module: HloModule) -> None:
        self.dump = base.dump
        self.module = base.module
        self.options = base.options
        self._base = base
        self.per_device = module
        self.sharded = base.sharded
        self.framework = base.framework
        self.mesh = base.mesh
        self.device_map = base.device_map
        self.num_partitions = base.num_partitions

    @cached_property
    def graph(self) -> DataflowGraph:
        return build_graph(self.per_device)

    @cached_property
    def collectives(self) -> tuple[Collective, ...]:
        return tuple(find_collectives(self.per_device, self.device_map, self.mesh))
