"""What the analysis layer reads of a module: a structural type, so it needs no rule code.

:class:`~hlo_doctor.rules.context.RuleContext` satisfies it; so does any
object with these attributes (a test double, another front end).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hlo_doctor.dump import Dump, DumpModule
    from hlo_doctor.graph.collectives import Collective
    from hlo_doctor.graph.dataflow import DataflowGraph
    from hlo_doctor.graph.devices import DeviceMap
    from hlo_doctor.graph.mesh import Mesh
    from hlo_doctor.hlo.ir import HloModule

__all__ = ["ModuleView"]


class ModuleView(Protocol):
    """One module of a dump, its snapshots and the graph-level facts about it."""

    dump: Dump
    module: DumpModule
    options: Any

    @property
    def framework(self) -> str | None: ...

    @property
    def sharded(self) -> HloModule | None: ...

    @property
    def per_device(self) -> HloModule | None: ...

    @property
    def graph(self) -> DataflowGraph | None: ...

    @property
    def mesh(self) -> Mesh | None: ...

    @property
    def device_map(self) -> DeviceMap: ...

    @property
    def collectives(self) -> tuple[Collective, ...]: ...

    @property
    def num_partitions(self) -> int: ...
