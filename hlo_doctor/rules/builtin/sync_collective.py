"""sync-collective: collectives in a scheduled GPU/TPU program that overlap nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hlo_doctor.findings import SourceEdit
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction
from hlo_doctor.hlo.opcodes import ASYNC_DONE_OPCODES
from hlo_doctor.rules.base import Finding, Rule, RuleSkipped, Severity, Suggestion
from hlo_doctor.rules.context import RuleContext
from hlo_doctor.rules.hardware import HardwareProfile, bundled_profiles, profile_for_dump
from hlo_doctor.semantics.collective_model import collective_kind
from hlo_doctor.semantics.cost import matmul_flops
from hlo_doctor.semantics.execution import backend_config_json
from hlo_doctor.semantics.opclasses import CONTROL_FLOW, HEAVY, HEAVY_CUSTOM_CALL_WORDS, NOT_COMPUTE

# Every overlap-killing debug option: (flag, the value that turns overlap off (None: any
# non-empty value), what it does, the collective kinds it affects (None: every kind)).
_FLAGS: tuple[tuple[str, object, str, frozenset[str] | None], ...] = (
    ("xla_gpu_disable_async_collectives", None, "makes the listed collectives synchronous", None),
    ("xla_gpu_enable_latency_hiding_scheduler", False, "turns the latency-hiding scheduler off", None),
    ("xla_tpu_enable_latency_hiding_scheduler", False, "turns the latency-hiding scheduler off", None),
    ("xla_gpu_enable_async_collectives", False, "makes collectives synchronous", None),
    ("xla_gpu_enable_async_all_reduce", False, "makes all-reduces synchronous", frozenset({"all-reduce"})),
    ("xla_gpu_enable_async_all_gather", False, "makes all-gathers synchronous", frozenset({"all-gather"})),
    ("xla_gpu_enable_async_reduce_scatter", False, "makes reduce-scatters synchronous",
     frozenset({"reduce-scatter"})),
    ("xla_gpu_enable_async_collective_permute", False, "makes collective-permutes synchronous",
     frozenset({"collective-permute"})),
    ("xla_gpu_enable_async_all_to_all", False, "makes all-to-alls synchronous",
     frozenset({"all-to-all", "ragged-all-to-all"})),
)

# --xla_gpu_disable_async_collectives values (DebugOptions.CollectiveOpType), in the order
# they are usually written, and the collectives each one makes synchronous (None: all).
_DISABLE_VALUES: dict[str, frozenset[str] | None] = {
    "allgather": frozenset({"all-gather"}),
    "reducescatter": frozenset({"reduce-scatter"}),
    "allreduce": frozenset({"all-reduce"}),
    "collectivebroadcast": frozenset({"collective-broadcast"}),
    "alltoall": frozenset({"all-to-all"}),
    "collectivepermute": frozenset({"collective-permute"}),
    "raggedalltoall": frozenset({"ragged-all-to-all"}),
    "allcollectives": None,
}



@dataclass(frozen=True, slots=True)
class SyncCollectiveOptions:
    min_independent_ops: int = 1
    """Only flag a collective when at least this many independent compute ops could have overlapped it."""
    min_work_fraction: float = 0.25
    """The independent compute must do at least this fraction of the collective's bytes in work
    (bytes written; a matmul's FLOPs over the device's FLOP per byte of memory bandwidth) to count as enough to hide it."""


@dataclass(frozen=True, slots=True)
class _Flag:
    """An active debug option that turns overlap off."""

    name: str
    text: str  # the value as XLA_FLAGS spells it
    effect: str
    kinds: frozenset[str] | None  # the collectives it affects; None: every one

    @property
    def spelled(self) -> str:
        return f"--{self.name}={self.text}"

    def covers(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


@dataclass(frozen=True, slots=True)
class _Pair:
    """A collective's start/done pair that overlaps nothing, and what could have overlapped it."""

    start: Instruction
    done: Instruction
    kind: str
    is_sync: bool
    window: int  # compute ops scheduled between start and done
    distance: int
    independent: tuple[Instruction, ...]  # compute that neither feeds it nor uses its result
    hideable: tuple[Instruction, ...]  # the part of it that is real work (not constants)
    enough_work: bool  # the independent compute could hide the collective
    work_bytes: float  # the work of the independent compute, in bytes (matmuls: FLOPs over the FLOP per memory byte)
    collective_bytes: int


class SyncCollective(Rule):
    """A collective in a scheduled GPU/TPU program that overlaps no computation.

    **What it finds**

    In the scheduled after-optimizations module of a GPU or TPU program
    (``is_scheduled=true``, e.g. ``*.sm_9.0a_gpu_after_optimizations.txt``):
    collectives made synchronous (``"is_sync":true`` in the backend config
    of a GPU ``*-start``) and ``*-start``/``*-done`` pairs with no compute
    scheduled between them, *when* the same computation has enough
    independent work (compute that neither feeds the collective nor uses
    its result, and is more than constant tables) to hide it: at least
    ``min_work_fraction`` of the bytes the collective moves, counting
    bytes written and a matmul's FLOPs at 300 per byte (about an H100's
    FLOP per HBM byte); a loop always counts. A pair XLA marked ``is_sync``
    itself (no flag) needs a matmul or loop among that work: XLA's scheduler
    made it synchronous on its own cost model, and elementwise and reduce
    fusions beside a small step are no evidence against it. A pair XLA did
    not mark ``is_sync`` (a TPU dump, an older scheduler) is flagged when
    any matmul or loop is independent of it, or the other work is enough. Each collective is reported once,
    by its start instruction (an ``async-start``'s wrapped op is not a
    second collective).

    The message separates two causes. When a debug option turns overlap off
    (``--xla_gpu_disable_async_collectives=...``,
    ``--xla_gpu_enable_latency_hiding_scheduler=false``,
    ``--xla_gpu_enable_async_*=false``) one finding names the flag and every
    start instruction it made synchronous. Without such a flag a synchronous
    pair is XLA's own choice; it is reported only when independent work
    existed, as a schedule (dependency) problem. Not flagged: a collective
    XLA made synchronous because nothing could hide it (the first FSDP
    all-gather of a step, with only constant tables and small loss
    bookkeeping independent of it), and a pair that overlaps a little
    because no more work was left.

    CPU dumps cannot show overlap (the CPU backend runs collectives
    synchronously and does not schedule for latency), so the rule says
    nothing about them; ``--verbose`` reports why.

    **Why it hurts**

    While a synchronous collective runs the device's compute units wait: the
    step time is compute plus communication instead of the larger of the two.

    **Example**

    ```
    %ag-start = (f32[8,256,256], f32[16,256,256]) all-gather-start(%p0), dimensions={0},
        backend_config={"collective_backend_config":{"is_sync":true}}
    %ag-done = f32[16,256,256] all-gather-done(%ag-start)
    %c0 = f32[16,256,256] convolution(%p1, %p2)   // independent: could run between start and done
    ```

    **Fix**

    Leave async collectives and the latency-hiding scheduler on (remove the
    flags), and give the scheduler independent work: compute the next
    layer's all-gather early (FSDP prefetch), or split the computation.

    ```python
    # JAX or torch_xla (GPU), before the backend starts: drop the flag, keep the others
    # (an empty value, --xla_gpu_disable_async_collectives=, is rejected by XLA's flag parser)
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_gpu_disable_async_collectives="))
    # a schedule that leaves a collective exposed: append the scheduler flag (the last value wins)
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_latency_hiding_scheduler=true"
    # in a shell: XLA_FLAGS="$XLA_FLAGS --xla_gpu_enable_latency_hiding_scheduler=true" python train.py
    ```

    **Options**

    * ``min_independent_ops`` (int, default 1): flag a collective only when
      at least this many independent compute ops could have overlapped it.
    * ``min_work_fraction`` (float, default 0.25): the independent work
      (bytes written, matmul FLOPs / 300) must be at least this fraction of
      the bytes the collective moves to count as enough to hide it.
    """

    id = "sync-collective"
    cause_rank = 70
    severity = Severity.WARNING
    reads = frozenset({"per_device"})
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
        platform = ctx.module.platform
        # a GPU flag does nothing on a TPU, and a TPU flag nothing on a GPU: neither is to blame there
        flags = [f for f in _overlap_flags(ctx.debug_options) if _applies(f.name, platform)]
        heavy = _HeavyOps(module, _work_balance(ctx.options.hardware or profile_for_dump(ctx.module)))
        by_flag: list[_Pair] = []
        for computation in module.computations:
            for index, instruction in enumerate(computation.instructions):
                # A collective is judged once, by its start: an async-start's wrapped op
                # (the reduce-scatter inside %async_computation) is not a second collective.
                if not instruction.opcode.endswith("-start"):
                    continue
                kind = collective_kind(instruction, module)
                if kind is None:
                    continue
                pair = self._exposed_pair(computation, index, instruction, kind, heavy)
                if pair is None:
                    continue
                if any(flag.covers(kind) for flag in flags):
                    by_flag.append(pair)
                elif pair.enough_work:
                    yield self._schedule_finding(ctx, pair, platform)
        if any(p.enough_work for p in by_flag):
            yield self._flag_finding(ctx, by_flag, flags)

    def _exposed_pair(self, computation: Computation, index: int, start: Instruction, kind: str,
                      heavy: _HeavyOps) -> _Pair | None:
        """The pair of ``start`` when it overlaps nothing (synchronous, or no compute in between)."""
        order = computation.instructions
        done_index = _done_index(order, index, start)
        if done_index is None:
            return None
        config = backend_config_json(start)
        collective_config = config.get("collective_backend_config") or {}
        is_sync = bool(collective_config.get("is_sync") or config.get("is_sync"))
        window = [i for i in order[index + 1 : done_index] if _is_compute(i)]
        if window and not is_sync:
            return None  # it overlaps something; if only a little, there was no more to do
        independent = _independent_compute(computation, index, done_index)
        hideable = [i for i in independent if not heavy.constant_like(i, computation)]
        work_bytes = sum(heavy.work(i, computation) for i in hideable)
        collective_bytes = _collective_bytes(computation, start, order[done_index])
        # XLA marks a pair is_sync when its own schedule found nothing worth overlapping: believe
        # it unless a matmul or loop independent of it does work comparable to the collective
        # (elementwise and reduce fusions around a small step are not worth second-guessing the
        # scheduler's cost model over). A pair merely left adjacent (no is_sync) is worth any
        # matmul or loop, or enough other work.
        has_heavy = any(heavy.is_heavy(i) for i in hideable)
        comparable = work_bytes >= self.options.min_work_fraction * collective_bytes
        enough = len(hideable) >= self.options.min_independent_ops and (
            (comparable and has_heavy) if is_sync else (comparable or has_heavy))
        return _Pair(start, order[done_index], kind, is_sync, len(window), done_index - index,
                     tuple(independent), tuple(hideable), enough, work_bytes, collective_bytes)

    def _flag_finding(self, ctx: RuleContext, pairs: list[_Pair], flags: list[_Flag]) -> Finding:
        """One finding for every collective the debug options made synchronous."""
        pairs = sorted(pairs, key=lambda p: (p.start.position.line, p.start.name))
        used = [f for f in flags if any(f.covers(p.kind) for p in pairs)]
        spelled = ", ".join(f.spelled for f in used)
        effects = "; ".join(f"{f.spelled} {f.effect}" for f in used)
        names = [p.start.name for p in pairs]
        could = [p for p in pairs if p.enough_work]
        examples = "; ".join(
            f"{p.start.name}: {_examples(p)}" for p in could[:3]
        )
        count = len(pairs)
        message = (
            f"{effects}: {count} collective{'s' if count != 1 else ''} in this module "
            f"({', '.join(names)}) overlap{'s' if count == 1 else ''} no computation, and "
            f"{len(could)} of them had independent work to hide behind ({examples}); "
            f"the flag{'s' if len(used) != 1 else ''}, not the program, {'are' if len(used) != 1 else 'is'} "
            f"to blame: remove {spelled}"
        )
        return self.finding(
            ctx,
            message,
            instruction=pairs[0].start,
            related=tuple(dict.fromkeys(
                [*names[1:], *(p.done.name for p in pairs)])),
            suggestion=_flag_suggestion(used, ctx.framework),
            evidence={
                "cause": "flag",
                "flag": used[0].name,
                "flags": [f.spelled for f in used],
                "sync_starts": names,
                "starts_with_independent_work": [p.start.name for p in could],
                "is_sync": [p.start.name for p in pairs if p.is_sync],
                "independent_compute_ops": {p.start.name: len(p.hideable) for p in pairs},
            },
        )

    def _schedule_finding(self, ctx: RuleContext, pair: _Pair, platform: str | None) -> Finding:
        """A collective XLA's schedule left exposed although independent work existed."""
        head = (f"XLA made {pair.kind} {pair.start.name} synchronous (is_sync)" if pair.is_sync
                else f"{pair.kind} {pair.start.name} .. {pair.done.name} encloses no computation")
        n = len(pair.hideable)
        message = (
            f"{head} although {n} independent op{'s' if n != 1 else ''} ({_examples(pair)}) "
            "could overlap it; no debug option turns overlap off, so the schedule is to blame: "
            "the program's data dependencies as XLA ordered them"
        )
        # XLA's own schedule, made on its cost model for the target, is a hint to look at, not a
        # warning: deviceless H100 compiles of healthy steps leave such pairs (corpusgen, h100:2x8).
        return self.finding(
            ctx,
            message,
            severity=Severity.INFO,
            instruction=pair.start,
            related=(pair.done.name, *(i.name for i in pair.hideable[:5])),
            suggestion=Suggestion(
                summary=("Let the latency-hiding scheduler overlap it: keep async collectives on, and issue the "
                         "collective earlier or give it independent work (e.g. prefetch the next layer's all-gather)."),
                jax=_scheduler_code(platform),
                torch_xla=_scheduler_code(platform),
                no_edit="the schedule XLA chose is to blame, not a line of the program: no edit is safe to make",
            ),
            evidence={
                "cause": "schedule",
                "is_sync": pair.is_sync,
                "ops_in_window": pair.window,
                "independent_compute_ops": n,
                "independent_work_bytes": pair.work_bytes,
                "collective_bytes": pair.collective_bytes,
                "schedule_distance": pair.distance,
            },
        )


def _examples(pair: _Pair) -> str:
    return ", ".join(i.name for i in pair.hideable[:3]) + (", ..." if len(pair.hideable) > 3 else "")


def _overlap_flags(options: dict[str, object]) -> list[_Flag]:
    found = []
    for name, off_value, effect, kinds in _FLAGS:
        if name not in options:
            continue
        value = options[name]
        if off_value is None:
            if value in (None, "", [], False, 0):
                continue
            values = _enum_values(value)
            if not values:
                continue
            covered: set[str] = set()
            for v in values:
                listed = _DISABLE_VALUES.get(v, frozenset())
                if listed is None:
                    covered = None  # type: ignore[assignment]
                    break
                covered |= listed
            found.append(_Flag(name, ",".join(values), effect,
                               None if covered is None else frozenset(covered)))
        elif value == off_value or str(value).lower() == str(off_value).lower():
            found.append(_Flag(name, _flag_text(value), effect, kinds))
    return found


def _enum_values(value: object) -> list[str]:
    """``[ALLGATHER, ALLREDUCE]`` or ``"allgather,allreduce"`` -> lower case, in the usual order."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names = {str(v).strip().lower() for v in items if str(v).strip() and str(v).strip().upper() != "NOOP"}
    known = [v for v in _DISABLE_VALUES if v in names]
    return known + sorted(names - set(known))


def _flag_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


# The schedule fix adds a flag to XLA_FLAGS, keeping the others (a flag's last value wins).
_APPEND = ('os.environ["{env}"] = os.environ.get("{env}", "") + " {flags}"\n'
           '# in a shell: {env}="${env} {flags}" python train.py')
# The latency-hiding scheduler's flag on each platform, and where it goes: libtpu reads its
# flags from LIBTPU_INIT_ARGS.
_SCHEDULER_FLAGS = {"gpu": ("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=true"),
                    "tpu": ("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=true")}


def _applies(flag: str, platform: str | None) -> bool:
    """Whether debug option ``flag`` acts on ``platform`` (when the dump says which)."""
    if platform == "tpu":
        return not flag.startswith("xla_gpu_")
    if platform == "gpu":
        return not flag.startswith("xla_tpu_")
    return True


def _scheduler_code(platform: str | None) -> str:
    """The line that turns the latency-hiding scheduler on: the platform's own, or, when the dump
    does not say which, each under a comment naming it."""
    if platform in _SCHEDULER_FLAGS:
        env, flag = _SCHEDULER_FLAGS[platform]
        return _APPEND.format(env=env, flags=flag)
    return "\n".join(f"# on {name.upper()}:\n" + _APPEND.format(env=env, flags=flag)
                     for name, (env, flag) in _SCHEDULER_FLAGS.items())


def _flag_suggestion(flags: list[_Flag], framework: str | None) -> Suggestion:
    spelled = " ".join(f.spelled for f in flags)
    names = tuple(f"--{f.name}" for f in flags)
    # Removing the flags restores XLA's default (async collectives); an empty list value such as
    # --xla_gpu_disable_async_collectives= is not a value XLA's flag parser accepts.
    prefixes = names[0] + "=" if len(names) == 1 else "(" + ", ".join(f'"{n}="' for n in names) + ")"
    quoted = f'"{prefixes}"' if len(names) == 1 else prefixes
    code = ('# before JAX / torch_xla starts its backend (at the top of the program):\n'
            'os.environ["XLA_FLAGS"] = " ".join(\n'
            f'    f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith({quoted}))\n'
            f"# in a shell: remove {spelled} from XLA_FLAGS")
    edits = tuple(SourceEdit("xla-flag", framework, details={"flag": f"--{f.name}", "spelled": f.spelled})
                  for f in flags) if framework in ("jax", "torch_xla") else ()
    return Suggestion(summary=f"Remove {spelled} from XLA_FLAGS so collectives run asynchronously and overlap "
                              "compute.",
                      jax=code, torch_xla=code, edits=edits)


def _done_index(order: tuple[Instruction, ...], index: int, start: Instruction) -> int | None:
    """The index of the op that ends ``start`` (following async-update chains)."""
    current = start.name
    for j in range(index + 1, len(order)):
        candidate = order[j]
        if current in candidate.operands and candidate.opcode in ASYNC_DONE_OPCODES:
            if candidate.opcode == "async-update":
                current = candidate.name
                continue
            return j
    return None


def _is_compute(instruction: Instruction) -> bool:
    opcode = instruction.opcode
    if opcode in NOT_COMPUTE or opcode.endswith(("-start", "-done")) or opcode == "async-update":
        return False
    return collective_kind(instruction) is None


def _collective_bytes(computation: Computation, start: Instruction, done: Instruction) -> int:
    """The data a collective moves: the larger of its operands and its result."""
    operands = 0
    for name in start.operands:
        operand = computation.get(name)
        if operand is not None:
            operands += operand.shape.byte_size
    return max(operands, done.shape.byte_size)


class _HeavyOps:
    """Which ops are heavy (matmuls, loops, ...) and which only compute constants."""

    def __init__(self, module: HloModule, flops_per_byte: float) -> None:
        self.module = module
        self.flops_per_byte = flops_per_byte
        self._heavy_computation: dict[str, bool] = {}
        self._constant: dict[tuple[str, str], bool] = {}
        self._flops: dict[str, float] = {}

    def is_heavy(self, instruction: Instruction) -> bool:
        opcode = instruction.opcode
        if opcode in HEAVY:
            return True
        if opcode == "custom-call":
            target = (instruction.attribute("custom_call_target") or "").lower()
            return any(word in target for word in HEAVY_CUSTOM_CALL_WORDS)
        if opcode == "fusion":
            return any(self._computation_heavy(name) for name in instruction.called_computations)
        return False

    def work(self, instruction: Instruction, computation: Computation) -> float:
        """The op's work as bytes written; a matmul's FLOPs count at 300 per byte; loops: unbounded."""
        opcode = instruction.opcode
        if opcode in CONTROL_FLOW:
            return float("inf")
        written = float(instruction.shape.byte_size)
        if opcode in ("dot", "convolution"):
            return max(written, matmul_flops(instruction, computation) / self.flops_per_byte)
        if opcode == "custom-call" and self.is_heavy(instruction):
            return max(written, matmul_flops(instruction, computation) / self.flops_per_byte)
        if opcode == "fusion":
            flops = sum(self._computation_flops(name) for name in instruction.called_computations)
            return max(written, flops / self.flops_per_byte)
        return written

    def _computation_flops(self, name: str) -> float:
        known = self._flops.get(name)
        if known is not None:
            return known
        self._flops[name] = 0.0
        computation = self.module.computation(name)
        total = 0.0
        for inner in computation.instructions if computation is not None else ():
            if inner.opcode in ("dot", "convolution") or (inner.opcode == "custom-call" and self.is_heavy(inner)):
                total += matmul_flops(inner, computation)
            elif inner.opcode == "fusion":
                total += sum(self._computation_flops(n) for n in inner.called_computations)
        self._flops[name] = total
        return total

    def _computation_heavy(self, name: str) -> bool:
        known = self._heavy_computation.get(name)
        if known is not None:
            return known
        self._heavy_computation[name] = False  # cycles: not heavy
        computation = self.module.computation(name)
        result = computation is not None and any(self.is_heavy(i) for i in computation.instructions)
        self._heavy_computation[name] = result
        return result

    def constant_like(self, instruction: Instruction, computation: Computation) -> bool:
        """Computed from constants and iotas only (a RoPE table, a zero broadcast): no real work."""
        key = (computation.name, instruction.name)
        known = self._constant.get(key)
        if known is not None:
            return known
        self._constant[key] = False
        if instruction.opcode == "parameter" or self.is_heavy(instruction):
            result = False
        elif instruction.opcode in ("constant", "iota"):
            result = True
        elif instruction.opcode == "fusion" or not instruction.called_computations:
            result = all(
                (operand := computation.get(name)) is not None and self.constant_like(operand, computation)
                for name in instruction.operands
            )
        else:
            result = False
        self._constant[key] = result
        return result


def _work_balance(hardware: HardwareProfile | None) -> float:
    """FLOPs worth one byte of memory traffic on ``hardware`` (H100's when the device is not known)."""
    profile = hardware or bundled_profiles()["h100"]
    memory = profile.memory_bandwidth or bundled_profiles()["h100"].memory_bandwidth or 1.0
    return profile.peak_bf16_flops / memory


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
