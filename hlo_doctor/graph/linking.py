"""Link the instructions of two snapshots of one module.

:func:`link_modules` matches instructions of an earlier snapshot ``a`` (e.g.
after propagation) to a later one ``b`` (e.g. after partitioning), and
attributes every unmatched ``b`` instruction (the collectives, slices and
partition ids the partitioner inserts) to the ``a`` instruction(s) it helps
realize. :class:`SnapshotLink` answers both directions:
:meth:`~SnapshotLink.realized_by` (``a`` op -> its ``b`` ops, inserted ones
included) and :meth:`~SnapshotLink.origin_of` (``b`` op -> ``a`` ops).

Method
------
1. Computations: the entry computations are paired; then callee computations
   are paired through matched callers (the i-th called computation of each).
2. Within a pair of computations, in ``b``'s program order:

   * parameters pair by parameter number;
   * an instruction with the same name, opcode and shape dims rank pairs
     directly (before -> after propagation keeps names; the GSPMD
     ``Sharding`` custom-call becomes a ``copy`` there and is matched below);
   * otherwise a candidate must have the same opcode (``custom-call`` may
     pair with ``copy``), element type and rank, and the same metadata ``op_name`` and stack frame
     (or source file:line); among the unmatched candidates the one whose
     operands pair with most of ``b``'s operands (looking through inserted
     instructions) wins, program order breaking ties.
3. Each unmatched ``b`` instruction is attributed to the ``a`` instructions
   with its metadata (op_name and frame) that pair with one of its nearest
   matched users (walking through other inserted instructions); failing
   that, to any ``a`` instruction with its metadata; failing that (no
   metadata, e.g. ``partition-id``), to the origins of its nearest matched
   users.

:func:`match_instructions` is the quick form for naming a few ops (a
rule's findings) without linking whole modules: computations pair as the
entries, else by name (the partitioner's ``NAME_spmd`` first); for each
``a`` op, ``b``'s instruction of the same name and opcode in the paired computation; else,
among the ops of the same opcode and metadata (op_name and frame), the k-th
of ``a`` pairs with the k-th of ``b`` when both have as many, program order
kept. That is step 2's answer when operands do not tell twins apart, which
is how the partitioner leaves the ops it keeps; ops it cannot pair that way
get None.

Limits: the partitioner keeps metadata but renames freely, so two
instructions with the same opcode, op_name and frame and no distinguishing
operands pair in program order, which can swap twins. Inserted instructions
with no metadata and no matched user stay unattributed. Ops the partitioner
rewrites into a different opcode (e.g. a dot into a while loop of windowed
einsums) are attributed as inserted, not matched.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

from hlo_doctor.hlo.attributes import parse_metadata
from hlo_doctor.hlo.ir import Computation, HloModule, Instruction

__all__ = ["SnapshotLink", "TwinRef", "link_modules", "match_instructions", "resolve_twin", "twin_refs"]

NodeKey = tuple[str, str]

_SAME_OPCODE = {("custom-call", "copy"), ("copy", "custom-call")}


@dataclass
class SnapshotLink:
    """The instruction pairing between snapshots ``a`` (earlier) and ``b``."""

    a: HloModule
    b: HloModule
    forward: dict[NodeKey, NodeKey] = field(default_factory=dict)  # matched a -> b
    backward: dict[NodeKey, NodeKey] = field(default_factory=dict)  # matched b -> a
    inserted: dict[NodeKey, tuple[NodeKey, ...]] = field(default_factory=dict)  # b -> a ops
    computations: dict[str, str] = field(default_factory=dict)  # a -> b names

    def matched(self, key: NodeKey) -> NodeKey | None:
        """The ``b`` instruction that is ``a``'s ``key`` (renamed or not)."""
        return self.forward.get(key)

    def realized_by(self, key: NodeKey) -> list[NodeKey]:
        """``b`` ops realizing ``a``'s ``key``: its match first, then inserted ops."""
        out = [self.forward[key]] if key in self.forward else []
        out.extend(b for b, origins in self.inserted.items() if key in origins)
        return out

    def origin_of(self, key: NodeKey) -> tuple[NodeKey, ...]:
        """The ``a`` op(s) a ``b`` op comes from (one when matched)."""
        if key in self.backward:
            return (self.backward[key],)
        return self.inserted.get(key, ())

    def is_inserted(self, key: NodeKey) -> bool:
        return key not in self.backward


def _meta_key(instruction: Instruction) -> tuple | None:
    """What identifies an op's origin: op_name and source location (None: no metadata)."""
    return _meta_key_of(instruction.attribute("metadata"))


@lru_cache(maxsize=65536)
def _meta_key_of(text: str | None) -> tuple | None:
    """:func:`_meta_key` by the metadata text: ops of one origin repeat it."""
    if text is None:
        return None
    metadata = parse_metadata(text)
    if metadata.op_name or metadata.stack_frame_id or metadata.source_file:
        return (metadata.op_name, metadata.stack_frame_id, metadata.source_file, metadata.source_line)
    return None


def link_modules(a: HloModule, b: HloModule) -> SnapshotLink:
    """Pair the instructions of snapshot ``a`` with those of the later ``b``."""
    link = SnapshotLink(a, b)
    a_comps = {c.name: c for c in a.computations}
    b_comps = {c.name: c for c in b.computations}
    if a.entry is None or b.entry is None:
        return link
    queue = [(a.entry, b.entry)]
    seen: set[str] = set()
    while queue:
        ca, cb = queue.pop(0)
        if cb.name in seen:
            continue
        seen.add(cb.name)
        link.computations[ca.name] = cb.name
        _link_computation(link, ca, cb)
        for ib in cb.instructions:
            partner = link.backward.get((cb.name, ib.name))
            if partner is None:
                continue
            ia = ca.get(partner[1])
            if ia is None:
                continue
            called_b = ib.called_computations if ib.raw_attributes else ()
            called_a = ia.called_computations if ia.raw_attributes else ()
            for na, nb in zip(called_a, called_b, strict=False):
                if na in a_comps and nb in b_comps and nb not in seen:
                    queue.append((a_comps[na], b_comps[nb]))
    _attribute_inserted(link)
    return link


@dataclass(frozen=True, slots=True)
class TwinRef:
    """Where an op of snapshot ``a`` stands, enough to find it in ``b`` without ``a``
    (see :func:`match_instructions`): picklable, for a worker process to hand over."""

    computation: str
    is_entry: bool
    name: str
    opcode: str
    meta: tuple | None
    index: int  # among a's ops of this opcode and metadata in the computation, program order
    count: int


def match_instructions(a: HloModule, b: HloModule, keys: list[NodeKey]) -> dict[NodeKey, NodeKey | None]:
    """``b``'s instruction for each of ``a``'s ``keys`` by the quick method (see the module docstring)."""
    found: dict[NodeKey, NodeKey | None] = {}
    for key, ref in twin_refs(a, keys).items():
        found[key] = resolve_twin(b, ref) if ref is not None else None
    return found


def twin_refs(a: HloModule, keys: list[NodeKey]) -> dict[NodeKey, TwinRef | None]:
    """Each key's :class:`TwinRef` in ``a`` (None for a key ``a`` does not have)."""
    return {key: _twin_ref(a, key) for key in keys}


def _twin_ref(a: HloModule, key: NodeKey) -> TwinRef | None:
    ca = a.computation(key[0])
    ia = ca.get(key[1]) if ca is not None else None
    if ca is None or ia is None:
        return None
    meta = _meta_key(ia)
    twins = [i for i in ca.instructions if i.opcode == ia.opcode and _meta_key(i) == meta] if meta else [ia]
    is_entry = a.entry is not None and ca.name == a.entry.name
    return TwinRef(ca.name, is_entry, ia.name, ia.opcode, meta, twins.index(ia), len(twins))


def resolve_twin(b: HloModule, ref: TwinRef) -> NodeKey | None:
    """The instruction of ``b`` that ``ref`` pairs with, or None."""
    if ref.is_entry:
        cb = b.entry
    else:  # the SPMD partitioner names a partitioned computation NAME_spmd
        cb = b.computation(ref.computation + "_spmd") or b.computation(ref.computation)
    if cb is None:
        return None
    same = cb.get(ref.name)
    if same is not None and same.opcode == ref.opcode:
        return (cb.name, same.name)
    if ref.meta is None:
        return None
    twins = [i for i in cb.instructions if i.opcode == ref.opcode and _meta_key(i) == ref.meta]
    if len(twins) != ref.count:
        return None
    return (cb.name, twins[ref.index].name)


def _link_computation(link: SnapshotLink, ca: Computation, cb: Computation) -> None:
    # Candidates are grouped by what must agree: opcode (a custom-call may
    # become a copy), metadata, element type and rank, each group in program order.
    groups: dict[tuple, list[Instruction]] = defaultdict(list)
    a_params = {}
    position = {ia.name: n for n, ia in enumerate(ca.instructions)}
    # (operand name, group) -> users of that operand in that group
    users_in_a: dict[tuple[str, tuple], list[Instruction]] = defaultdict(list)
    for ia in ca.instructions:
        if ia.opcode == "parameter":
            a_params[ia.parameter_number] = ia
        meta = _meta_key(ia)
        keys = [(ia.opcode, meta, ia.shape.element_type, ia.shape.rank)]
        if ia.opcode == "custom-call":
            keys.append(("copy", meta, ia.shape.element_type, ia.shape.rank))
        for key in keys:
            groups[key].append(ia)
            for operand in ia.operands:
                users_in_a[(operand, key)].append(ia)
    first_unused: dict[tuple, int] = defaultdict(int)  # per group: index of its first unused candidate
    users_start: dict[tuple, int] = defaultdict(int)  # per (operand, group): same, in users_in_a
    used: set[str] = set()

    def nearest_matched(name: str, depth: int = 0) -> set[str]:
        key = (cb.name, name)
        if key in link.backward:
            return {link.backward[key][1]}
        if depth > 8:
            return set()
        ib = cb.get(name)
        out: set[str] = set()
        if ib is not None:
            for operand in ib.operands:
                out |= nearest_matched(operand, depth + 1)
        return out

    for ib in cb.instructions:
        chosen: Instruction | None = None
        if ib.opcode == "parameter":
            chosen = a_params.get(ib.parameter_number)
        if chosen is None:
            same = ca.get(ib.name)
            if same is not None and same.name not in used and same.opcode == ib.opcode:
                chosen = same
        meta = _meta_key(ib) if chosen is None else None
        if chosen is None and meta is not None:  # no metadata: inserted (constants, partition-id ...)
            group_key = (ib.opcode, meta, ib.shape.element_type, ib.shape.rank)
            wanted: set[str] = set()
            for operand in ib.operands:
                wanted |= nearest_matched(operand)
            # Candidates that use one of the matched operands, most shared operands first,
            # then program order; without any, the first unused one of the group.
            sharing: dict[str, int] = defaultdict(int)
            for name in wanted:
                # The first few unused users in program order are enough: an
                # operand shared by thousands of ops (a constant) must not make
                # this quadratic.
                users = users_in_a.get((name, group_key), ())
                start = users_start[(name, group_key)]
                while start < len(users) and users[start].name in used:
                    start += 1
                users_start[(name, group_key)] = start
                taken = 0
                for c in users[start:]:
                    if c.name not in used:
                        sharing[c.name] += 1
                        taken += 1
                        if taken == _USERS_CONSIDERED:
                            break
            if sharing:
                chosen = ca.get(min(sharing, key=lambda n: (-sharing[n], position[n])))
            else:
                group = groups.get(group_key, [])
                start = first_unused[group_key]
                while start < len(group) and group[start].name in used:
                    start += 1
                first_unused[group_key] = start
                candidate = group[start] if start < len(group) else None
                if candidate is not None and ib.operands and wanted and ib.opcode in _INSERTED_OPCODES:
                    # Same metadata but none of the operands agree: e.g. an
                    # inserted all-gather next to its dot. Keep it inserted.
                    candidate = None
                chosen = candidate
        if chosen is not None:
            used.add(chosen.name)
            link.forward[(ca.name, chosen.name)] = (cb.name, ib.name)
            link.backward[(cb.name, ib.name)] = (ca.name, chosen.name)


_USERS_CONSIDERED = 8

_INSERTED_OPCODES = frozenset(
    {
        "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
        "dynamic-slice", "dynamic-update-slice", "pad", "slice", "partition-id", "constant",
        "select", "reshape", "transpose", "copy", "concatenate",
    }
)


def _attribute_inserted(link: SnapshotLink) -> None:
    a_by_meta: dict[tuple[str, tuple], list[NodeKey]] = defaultdict(list)
    b_to_a_comp = {v: k for k, v in link.computations.items()}
    for computation in link.a.computations:
        for ia in computation.instructions:
            key = _meta_key(ia)
            if key is not None:
                a_by_meta[(computation.name, key)].append((computation.name, ia.name))
    for cb in link.b.computations:
        users: dict[str, list[str]] = defaultdict(list)
        for ib in cb.instructions:
            for operand in ib.operands:
                users[operand].append(ib.name)
        ca_name = b_to_a_comp.get(cb.name)

        def matched_users(name: str, users: dict[str, list[str]] = users, cb: Computation = cb) -> set[NodeKey]:
            out: set[NodeKey] = set()
            seen = {name}
            frontier = [name]
            while frontier and not out:
                nxt = []
                for n in frontier:
                    for u in users.get(n, ()):
                        if u in seen:
                            continue
                        seen.add(u)
                        if (cb.name, u) in link.backward:
                            out.add(link.backward[(cb.name, u)])
                        else:
                            nxt.append(u)
                frontier = nxt
            return out

        for ib in cb.instructions:
            key = (cb.name, ib.name)
            if key in link.backward:
                continue
            meta = _meta_key(ib)
            near = matched_users(ib.name)
            origins: tuple[NodeKey, ...] = ()
            if meta is not None and ca_name is not None:
                same = a_by_meta.get((ca_name, meta), [])
                origins = tuple(k for k in same if k in near) or tuple(same)
            if not origins:
                origins = tuple(sorted(near))
            link.inserted[key] = origins
