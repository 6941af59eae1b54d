"""sync-collective: collectives in a scheduled GPU/TPU program that overlap nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.rules._analyses import backend_config_json, collective_kind
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext

# Ops that do no work a collective could hide behind.
_NOT_COMPUTE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "add-dependency",
    "opt-barrier", "partition-id", "replica-id", "domain", "copy-start", "copy-done",
    "send", "send-done", "recv", "recv-done", "get-dimension-size", "iota",
    # layout and data movement, usually fused into their users: too little work to hide a collective
    "broadcast", "reshape", "convert", "bitcast-convert", "slice", "transpose", "copy", "pad", "concatenate",
})
_DONE = ("all-gather-done", "all-reduce-done", "collective-permute-done", "async-done", "async-update")

# flag -> (the value that turns overlap off, what it does)
_FLAGS: tuple[tuple[str, object, str], ...] = (
    ("xla_gpu_disable_async_collectives", None, "makes the listed collectives synchronous"),
    ("xla_gpu_enable_latency_hiding_scheduler", False, "turns the latency-hiding scheduler off"),
    ("xla_tpu_enable_latency_hiding_scheduler", False, "turns the latency-hiding scheduler off"),
    ("xla_gpu_enable_async_collectives", False, "makes collectives synchronous"),
    ("xla_gpu_enable_async_all_reduce", False, "makes all-reduces synchronous"),
    ("xla_gpu_enable_async_all_gather", False, "makes all-gathers synchronous"),
    ("xla_gpu_enable_async_reduce_scatter", False, "makes reduce-scatters synchronous"),
    ("xla_gpu_enable_async_collective_permute", False, "makes collective-permutes synchronous"),
    ("xla_gpu_enable_async_all_to_all", False, "makes all-to-alls synchronous"),
)


@dataclass(frozen=True, slots=True)
class SyncCollectiveOptions:
    min_independent_ops: int = 1
    """Only flag a collective when at least this many independent compute ops could have overlapped it."""


class SyncCollective(Rule):
    """A collective in a scheduled GPU/TPU program that overlaps no computation.

    **What it finds**

    In the scheduled after-optimizations module of a GPU or TPU program
    (``is_scheduled=true``): a collective made synchronous
    (``"is_sync":true`` in the backend config of a GPU ``*-start``), or a
    ``*-start``/``*-done`` pair with no compute scheduled between them,
    *when* the same computation has compute that neither feeds the
    collective nor uses its result, so it could have run in between. A collective that nothing could hide (every other op
    feeds it or uses its result) is not flagged. Debug options that turn
    asynchronous collectives or the latency-hiding scheduler off are
    reported too (``--xla_gpu_disable_async_collectives``,
    ``--xla_gpu_enable_latency_hiding_scheduler=false``), and the message
    says whether a flag or the schedule is to blame.

    CPU dumps cannot show overlap (the CPU backend runs collectives
    synchronously and does not schedule for latency), so the rule says
    nothing about them; ``--verbose`` reports why.

    **Why it hurts**

    While a synchronous collective runs the device's compute units wait: the
    step time is compute plus communication instead of the larger of the two.

    **Example**

    ```
    %ag-start = (f32[8,256,256], f32[16,256,256]) all-gather-start(%color_operand.1), dimensions={0}
    %ag-done = f32[16,256,256] all-gather-done(%ag-start)
    %c0 = f32[16,256,256] convolution(%p0, %p1)   // independent: could run between start and done
    ```

    **Fix**

    Leave async collectives and the latency-hiding scheduler on (remove the
    flags), and give the scheduler independent work: compute the next
    layer's all-gather early (FSDP prefetch), or split the computation.

    ```python
    # JAX (GPU): drop --xla_gpu_disable_async_collectives from XLA_FLAGS and keep
    os.environ["XLA_FLAGS"] += " --xla_gpu_enable_latency_hiding_scheduler=true"
    # torch_xla (GPU): the same XLA_FLAGS apply
    os.environ["XLA_FLAGS"] = "--xla_gpu_enable_latency_hiding_scheduler=true"
    ```

    **Options**

    * ``min_independent_ops`` (int, default 1): flag a collective only when
      at least this many independent compute ops could have overlapped it.
    """

    id = "sync-collective"
    severity = Severity.WARNING
    summary = "A collective in a scheduled GPU/TPU program overlaps no computation."
    Options = SyncCollectiveOptions

    def check(self, ctx: RuleContext) -> Iterator[Finding]:
        if ctx.is_cpu:
            raise RuleSkipped(
                "CPU dump: the CPU backend runs collectives synchronously and does not schedule for "
                "latency, so overlap cannot be judged; analyze a GPU or TPU dump"
            )
        module = ctx.after_optimizations or ctx.only_snapshot
        if module is None:
            raise RuleSkipped("no after-optimizations snapshot")
        if (module.attribute("is_scheduled") or "").lower() != "true":
            raise RuleSkipped("the after-optimizations module is not scheduled (is_scheduled=true missing)")
        flags = _overlap_flags(ctx.debug_options)
        first_collective: Instruction | None = None
        for computation in module.computations:
            for index, instruction in enumerate(computation.instructions):
                kind = collective_kind(instruction, module)
                if kind is None:
                    continue
                if first_collective is None:
                    first_collective = instruction
                if not (instruction.opcode.endswith("-start")):
                    continue
                finding = self._check_pair(ctx, module, computation, index, instruction, kind, flags)
                if finding is not None:
                    yield finding
        if first_collective is not None:
            for flag, value, effect in flags:
                yield self.finding(
                    ctx,
                    f"debug option --{flag}={_flag_text(value)} {effect}: collectives in this module cannot "
                    "overlap computation",
                    instruction=first_collective,
                    suggestion=_flag_suggestion(flag),
                    evidence={"flag": flag},
                )

    def _check_pair(self, ctx, module: HloModule, computation: Computation, index: int,
                    start: Instruction, kind: str, flags) -> Finding | None:
        order = computation.instructions
        done_index = _done_index(order, index, start)
        if done_index is None:
            return None
        config = backend_config_json(start)
        collective_config = config.get("collective_backend_config") or {}
        is_sync = bool(collective_config.get("is_sync") or config.get("is_sync"))
        window = [i for i in order[index + 1 : done_index] if _is_compute(i)]
        if window and not is_sync:
            return None
        independent = _independent_compute(computation, index, done_index)
        if len(independent) < self.options.min_independent_ops:
            return None  # nothing could hide it: the data dependencies, not the schedule
        done = order[done_index]
        examples = ", ".join(i.name for i in independent[:3])
        if flags:
            cause = "flag"
            why = "; " + ", ".join(f"--{f}={_flag_text(v)}" for f, v, _ in flags) + " turns overlap off"
        else:
            cause = "schedule"
            why = ""
        head = (f"{kind} {start.name} is synchronous (is_sync)" if is_sync
                else f"{kind} {start.name} .. {done.name} encloses no computation")
        message = (
            f"{head} although {len(independent)} independent op{'s' if len(independent) != 1 else ''} "
            f"({examples}) could overlap it{why}"
        )
        return self.finding(
            ctx,
            message,
            instruction=start,
            related=(done.name, *(i.name for i in independent[:5])),
            suggestion=_flag_suggestion(flags[0][0]) if flags else Suggestion(
                summary=("Let the latency-hiding scheduler overlap it: keep async collectives on, and issue the "
                         "collective earlier or give it independent work (e.g. prefetch the next layer's all-gather)."),
                jax='os.environ["XLA_FLAGS"] = "--xla_gpu_enable_latency_hiding_scheduler=true"',
                torch_xla='os.environ["XLA_FLAGS"] = "--xla_gpu_enable_latency_hiding_scheduler=true"',
            ),
            evidence={
                "cause": cause,
                "is_sync": is_sync,
                "ops_in_window": len(window),
                "independent_compute_ops": len(independent),
                "schedule_distance": done_index - index,
            },
        )


def _overlap_flags(options: dict[str, object]) -> list[tuple[str, object, str]]:
    found = []
    for flag, off_value, effect in _FLAGS:
        if flag not in options:
            continue
        value = options[flag]
        if off_value is None:
            if value not in (None, "", [], False, 0):
                found.append((flag, value, effect))
        elif value == off_value or str(value).lower() == str(off_value).lower():
            found.append((flag, value, effect))
    return found


def _flag_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _flag_suggestion(flag: str) -> Suggestion:
    if flag == "xla_gpu_disable_async_collectives":
        code = 'os.environ["XLA_FLAGS"] = "--xla_gpu_disable_async_collectives="  # empty: all async'
    else:
        code = f'os.environ["XLA_FLAGS"] = "--{flag}=true"'
    return Suggestion(summary=f"Remove --{flag} from XLA_FLAGS so collectives run asynchronously and overlap compute.",
                      jax=code, torch_xla=code)


def _done_index(order: tuple[Instruction, ...], index: int, start: Instruction) -> int | None:
    """The index of the op that ends ``start`` (following async-update chains)."""
    current = start.name
    for j in range(index + 1, len(order)):
        candidate = order[j]
        if current in candidate.operands and candidate.opcode in _DONE:
            if candidate.opcode == "async-update":
                current = candidate.name
                continue
            return j
    return None


def _is_compute(instruction: Instruction) -> bool:
    opcode = instruction.opcode
    if opcode in _NOT_COMPUTE or opcode.endswith(("-start", "-done")) or opcode == "async-update":
        return False
    return collective_kind(instruction) is None


def _independent_compute(computation: Computation, start_index: int, done_index: int) -> list[Instruction]:
    """Compute ops that neither feed the collective nor use its result."""
    order = computation.instructions
    start, done = order[start_index], order[done_index]
    by_name = computation.by_name or {i.name: i for i in order}
    ancestors: set[str] = set()
    stack = list(start.operands)
    while stack:
        name = stack.pop()
        if name in ancestors:
            continue
        ancestors.add(name)
        node = by_name.get(name)
        if node is not None:
            stack.extend(node.operands)
    descendants = {start.name, done.name}
    for instruction in order[start_index + 1 :]:
        if descendants.intersection(instruction.operands):
            descendants.add(instruction.name)
    return [
        i for i in order
        if _is_compute(i) and i.name not in ancestors and i.name not in descendants
    ]
