"""A module's memory per device as the rules and ``hlo-doctor memory`` see it (made once per context).

Joins the memory layer (:mod:`hlo_doctor.memory`) to a :class:`RuleContext`:
which parameters are weights, optimizer state or inputs (the analysis
layer's classes, with optimizer state told from weights by what it feeds),
how an instruction is named for the user (its argument name or op, and its
line of the user's program), and the target's memory (``--hbm``, else the
hardware profile's, else the profile of the hardware the dump was compiled
for).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hlo_doctor.dump import Role
from hlo_doctor.graph.sharding import layout
from hlo_doctor.hlo.ir import HloModule, Instruction
from hlo_doctor.memory import ModuleMemory, Target, module_memory, reaches_only_updates
from hlo_doctor.program.suggest import argument_name
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.semantics.hardware import HardwareProfile, profile_for_dump

__all__ = ["ParameterLayout", "memory_of", "parameter_classes", "parameter_instruction", "parameter_layouts",
           "target_for"]

_CACHE = "_hlo_doctor_memory"


def target_for(ctx: RuleContext, hbm_bytes: int | None = None,
               hardware: HardwareProfile | None = None) -> Target | None:
    """The memory the peak is held against: ``hbm_bytes`` when given, else the hardware profile's
    (the run's ``--hardware``, else the one the dump names); None when nothing says."""
    profile = hardware or ctx.options.hardware or profile_for_dump(ctx.module)
    if hbm_bytes is not None:
        return Target(profile.name if profile is not None and hardware is not None else "custom", hbm_bytes)
    if profile is None or not profile.hbm_bytes:
        return None
    return Target(profile.name, profile.hbm_bytes)


def parameter_classes(ctx: RuleContext) -> dict[int, str]:
    """Entry parameter number -> ``weights``, ``optimizer_state`` or ``inputs``.

    Data and scalars are inputs. Of the weights, a parameter the step updates (state) that reaches
    no matmul, reduction or collective is optimizer state: it only updates itself and its weight.
    """
    params = ctx.semantics.parameters if ctx.per_device is not None else None
    module = ctx.per_device
    if params is None or module is None:
        return {}
    classes: dict[int, str] = {}
    for number in params.data | params.scalars:
        classes[number] = "inputs"
    moments = reaches_only_updates(module, params.weights & params.state)
    for number in params.weights:
        classes[number] = "optimizer_state" if number in moments else "weights"
    return classes


def _describer(ctx: RuleContext):  # noqa: ANN202
    names = ctx.argument_names

    def describe(instruction: Instruction) -> tuple[str, str | None]:
        found, _ = ctx.user_source(instruction)
        source = f"{found.file}:{found.line}" if found is not None else None
        number = instruction.parameter_number if instruction.opcode == "parameter" else None
        if number is not None:
            label = names.get(number) or argument_name(instruction)
            return f"parameter {number} ({label})" if label != instruction.name else f"parameter {number}", source
        return f"{instruction.opcode} {instruction.name}", source

    return describe


def memory_of(ctx: RuleContext, target: Target | None = None) -> ModuleMemory | None:
    """The module's memory at its peak (cached on the context for the rules' own target)."""
    cached = ctx.__dict__.get(_CACHE)
    if cached is not None and target is None:
        return cached[0]
    optimized: HloModule | None = ctx.after_optimizations
    snapshot = ctx.module.snapshot(Role.AFTER_OPTIMIZATIONS)
    path = Path(snapshot.path) if snapshot is not None and optimized is not None else None
    memory = module_memory(
        ctx.module.key, optimized, path, ctx.partitioned or ctx.only_snapshot, parameter_classes(ctx),
        _describer(ctx), target if target is not None else target_for(ctx),
    )
    if target is None:
        ctx.__dict__[_CACHE] = (memory,)
    return memory


@dataclass(frozen=True, slots=True)
class ParameterLayout:
    """An entry parameter's whole size and how many ways its sharding splits it."""

    number: int
    global_bytes: int
    dims: tuple[int, ...]
    shards: int
    tiles: tuple[int, ...]
    replicated_over: tuple[str, ...] | None  # the mesh axes whose devices hold the same shard (None: unknown)
    sharded_over: tuple[str, ...] | None  # the other mesh axes

    @property
    def bytes_per_device(self) -> int:
        return self.global_bytes // max(self.shards, 1)


def parameter_layouts(ctx: RuleContext) -> dict[int, ParameterLayout]:
    """Entry parameter number -> its layout, from the partitioned module's shardings and the
    global shapes; parameters without a sharding or with a tuple shape are left out."""
    module = ctx.per_device
    shapes = ctx.global_parameter_shapes
    if module is None or module.entry is None or shapes is None:
        return {}
    mesh = ctx.mesh
    found: dict[int, ParameterLayout] = {}
    for param in module.entry.parameters():
        number = param.parameter_number
        sharding = param.sharding
        if number is None or number >= len(shapes) or sharding is None or sharding.is_tuple:
            continue
        shape = shapes[number]
        if shape.is_tuple:
            continue
        try:
            lay = layout(sharding, shape, ctx.num_partitions)
        except ValueError:
            continue
        if lay.is_manual:
            continue
        replicated = sharded = None
        if mesh is not None:
            try:
                replicated = mesh.axes_for_groups(lay.device_groups())
            except (ValueError, IndexError):
                replicated = None
            if replicated is not None:
                sharded = tuple(a for a in mesh.axis_names if a not in replicated)
        found[number] = ParameterLayout(number, shape.byte_size, tuple(shape.dims), lay.num_shards,
                                        tuple(lay.tiles_per_dim), replicated, sharded)
    return found


def parameter_instruction(ctx: RuleContext, number: int | None) -> Instruction | None:
    module = ctx.per_device
    if number is None or module is None or module.entry is None:
        return None
    return next((p for p in module.entry.parameters() if p.parameter_number == number), None)
