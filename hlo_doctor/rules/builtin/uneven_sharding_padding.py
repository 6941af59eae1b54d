"""uneven-sharding-padding: a dimension that does not divide by its shard count."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from math import gcd

from hlo_doctor.graph.sharding import layouts
from hlo_doctor.hlo.ir import Computation, Instruction, ShardingKind, attribute_of_each
from hlo_doctor.program.suggest import constraint_code, round_up, with_user_variable
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext


@dataclass(frozen=True, slots=True)
class UnevenShardingPaddingOptions:
    min_bytes: int = 64 * 1024
    """Ignore values smaller than this many bytes (scalars, small vectors)."""
    round_to: int = 64
    """The suggested size is a multiple of this and of the shard count."""


class UnevenShardingPadding(Rule):
    """A tensor dimension is sharded over a number of devices that does not divide it.

    **What it finds**

    A value whose propagated sharding splits dimension *d* of size *N* into
    *k* shards with ``N % k != 0``. XLA gives every device ``ceil(N / k)``
    elements, so the partitioned program pads the value to ``k * ceil(N / k)``
    (``pad`` + ``dynamic-slice``) and masks the padding wherever it could
    change a result (``iota``/``compare``/``select`` before reductions,
    softmax, gathers). One finding per distinct (size, shard count) in a
    module, at the partitioned ``pad`` (or mask) that handles it.

    **Why it hurts**

    The padding itself is usually small (the *wasted fraction* in the
    evidence), but the pads, masks and selects are extra full-size passes
    over the tensor, the last device computes on garbage, and an argument
    that is padded must be re-laid out on every step. Vocabulary sizes
    (GPT-2's 50257) are the classic case.

    **Example**

    ```
    %sharding_constraint.0 = f32[32,50257] copy(%dot_general.0), sharding={devices=[1,8]<=[8]}
    ...after partitioning:
    %pad = f32[50264,256] pad(%param.2, %constant.28), padding=0_7x0_0
    %compare = pred[32,6283] compare(%add.10, %broadcast.1), direction=LT   // iota < 50257
    %select = f32[32,6283] select(%compare, %sharding_constraint.2, %broadcast.2)
    ```

    **Fix**

    Make the size divisible by the shard count (pad the vocabulary to a
    multiple of 64, as nanoGPT does: 50257 -> 50304), or shard the dimension
    over a mesh axis whose size divides it.

    ```python
    # JAX
    vocab = 50304  # was 50257; divisible by the 8 devices of 'model'
    logits = jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, P(None, 'model')))
    # torch_xla
    xs.mark_sharding(logits, mesh, (None, 'model'))
    ```

    **Options**

    * ``min_bytes`` (int, default 65536): ignore values smaller than this.
    * ``round_to`` (int, default 64): the suggested size is a multiple of
      this and of the shard count.
    """

    id = "uneven-sharding-padding"
    cause_rank = 40
    severity = Severity.WARNING
    reads = frozenset({"sharded"})
    summary = "A sharded dimension is not divisible by its shard count, so XLA pads and masks it."
    Options = UnevenShardingPaddingOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        module = ctx.after_propagation or ctx.before_optimizations
        if module is None:
            raise RuleSkipped("no snapshot with propagated shardings (after propagation or before optimizations)")
        if ctx.num_partitions <= 1:
            return
        # (size, shards) -> [(instruction, dim, bytes, tiles per dim)]
        uneven: dict[tuple[int, int], list[tuple[Instruction, int, int, tuple[int, ...]]]] = {}
        # Thousands of values share a few shapes and (sharding, shape) pairs: judge each once. A
        # shape is known by its object (the parser makes one per shape text, alive while the
        # module is): hashing a shape's fields for every value costs more than the judging.
        judged: dict[tuple[str, int], tuple[tuple[int, int, int, int, tuple[int, ...]], ...]] = {}
        too_small: dict[int, bool] = {}  # shape -> whether it is under min_bytes (every leaf is)
        min_bytes = self.options.min_bytes
        values = []
        for computation in module.computations:
            for instruction in computation.instructions:
                shape = instruction.shape
                small = too_small.get(id(shape))
                if small is None:
                    small = too_small[id(shape)] = shape.byte_size < min_bytes
                if not small:  # the sharding of a small one is not even read
                    values.append(instruction)
        for instruction, text in zip(values, attribute_of_each(values, "sharding"), strict=True):
            if text is None:
                continue
            shape = instruction.shape
            key = (text, id(shape))
            found = judged.get(key)
            if found is None:
                found = judged[key] = self._uneven_dims(instruction, ctx.num_partitions)
            for dim, size, tiles, nbytes, tiles_per_dim in found:
                uneven.setdefault((size, tiles), []).append((instruction, dim, nbytes, tiles_per_dim))
        for (size, shards), values in sorted(uneven.items()):
            # the partitioned snapshot only for the evidence of a finding (it may be another process's)
            yield with_user_variable(self._finding(ctx, size, shards, values, ctx.partitioned), "x")

    def _uneven_dims(self, instruction: Instruction, num_partitions: int) -> tuple[tuple[int, int, int, int, tuple[int, ...]], ...]:
        """(dim, size, shards, leaf bytes, tiles per dim) of every padded dim of the value's leaves."""
        sharding = instruction.sharding
        if sharding is None or sharding.kind not in (ShardingKind.TILED, ShardingKind.TUPLE):
            return ()
        try:
            leaves = layouts(sharding, instruction.shape, num_partitions)
        except ValueError:
            return ()
        found = []
        for leaf in leaves:
            if leaf.shape.byte_size < self.options.min_bytes:
                continue
            for dim, (size, tiles, pad) in enumerate(zip(leaf.shape.dims, leaf.tiles_per_dim, leaf.padding)):
                if pad > 0 and tiles > 1:
                    found.append((dim, size, tiles, leaf.shape.byte_size, leaf.tiles_per_dim))
        return tuple(found)

    def _finding(self, ctx, size, shards, values, per_device) -> Finding:
        shard = -(-size // shards)
        padded = shard * shards
        pads: list[Instruction] = []
        masks: list[Instruction] = []
        selects: list[Instruction] = []
        if per_device is not None:
            for computation, instruction in per_device.instructions():
                if instruction.opcode == "pad" and _pads(instruction, computation, size, padded):
                    pads.append(instruction)
                elif instruction.opcode == "compare" and shard in instruction.shape.dims and _masks(
                    instruction, computation, size
                ):
                    masks.append(instruction)
            mask_names = {m.name for m in masks}
            for _, instruction in per_device.instructions():
                if instruction.opcode == "select" and mask_names.intersection(instruction.operands):
                    selects.append(instruction)
        largest = max(values, key=lambda v: v[2])
        representative, dim, nbytes, tiles = largest
        anchor = (pads or masks or [representative])[0]
        source_from = anchor
        if ctx.user_source(anchor)[0] is None:
            for candidate in [*pads, *masks, *(v[0] for v in values)]:
                if ctx.user_source(candidate)[0] is not None:
                    source_from = candidate
                    break
        axes = ctx.mesh.axes_for(shards) if ctx.mesh is not None else None
        suggested = round_up(size, _lcm(shards, self.options.round_to))
        spec = [None] * len(tiles)
        for i, count in enumerate(tiles):
            if count > 1:
                named = ctx.mesh.axes_for(count) if ctx.mesh is not None else None
                spec[i] = tuple(named) if named else (f"<axis of size {count}>",)
        jax_code, torch_code = constraint_code(spec)
        axis_text = f" ('{'/'.join(axes)}')" if axes else ""
        wasted = (padded - size) / padded
        message = (
            f"dimension {dim} of size {size} is split into {shards} shards{axis_text}, which does not divide it: "
            f"each device holds {shard}, {padded - size} padding elements in all"
        )
        if pads or masks:
            message += f"; the partitioned program pads it ({len(pads)} pad) and masks it ({len(masks)} compare, {len(selects)} select)"
        message += f" across {len(values)} value{'s' if len(values) != 1 else ''}"
        related = [i.name for i in masks[:3]] + [i.name for i in selects[:3]] + [v[0].name for v in values[:5]]
        return self.finding(
            ctx,
            message,
            instruction=anchor,
            related=tuple(dict.fromkeys(n for n in related if n != anchor.name)),
            source_from=source_from,
            suggestion=Suggestion(
                summary=(
                    f"Make the size divisible by {shards}: {size} -> {suggested} (a multiple of "
                    f"{_lcm(shards, self.options.round_to)}), or shard it over a mesh axis whose size divides {size}."
                ),
                jax=f"# size {suggested} instead of {size}\n{jax_code}",
                torch_xla=f"# size {suggested} instead of {size}\n{torch_code}",
                no_edit=(f"the size {size} is a model dimension (a config value such as the vocabulary): "
                         "padding it changes the model, so it is yours to make"),
            ),
            evidence={
                "dim_size": size,
                "shards": shards,
                "shard_size": shard,
                "padded_size": padded,
                "padding_elements": padded - size,
                "wasted_fraction": wasted,
                "largest_value_bytes": nbytes,
                "uneven_values": len(values),
                "pad_ops": len(pads),
                "mask_ops": len(masks),
                "select_ops": len(selects),
                "suggested_size": suggested,
            },
        )


def _lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b) if a and b else max(a, b)


def _pads(instruction: Instruction, computation: Computation, size: int, padded: int) -> bool:
    operand = computation.get(instruction.operands[0]) if instruction.operands else None
    if operand is None or operand.shape.rank != instruction.shape.rank:
        return False
    return any(a == size and b == padded for a, b in zip(operand.shape.dims, instruction.shape.dims))


def _masks(instruction: Instruction, computation: Computation, size: int) -> bool:
    """A compare against the constant ``size`` (directly or broadcast): the padding mask."""
    wanted = str(size)
    for name in instruction.operands:
        operand = computation.get(name)
        for _ in range(3):
            if operand is None:
                break
            if operand.opcode == "constant":
                if (operand.literal or "").strip().strip("{}").strip() == wanted:
                    return True
                break
            if operand.opcode in ("broadcast", "reshape", "convert", "bitcast") and operand.operands:
                operand = computation.get(operand.operands[0])
            else:
                break
    return False
