"""Interpreters for the attribute values that carry sharding meaning.

Each function takes the raw text after ``key=`` as the HLO printer writes it
and returns a frozen IR value. They raise only :class:`ParseError`, with
offsets relative to the given text, and they are cached per distinct text:
a big module repeats the same few shardings thousands of times.

The grammar follows XLA's ``hlo_parser.cc`` (``ParseSharding``,
``ParseSingleSharding``, ``ParseMesh``, ``ParseCollectiveDeviceListBase``,
``ParseMetadata``). Where XLA silently accepts nonsense (a device list
shorter than the tile grid, an iota larger than it), we reject it: shardings
are where the meaning matters.

A named (v3, Shardy) sharding keeps its mesh form in :attr:`Sharding.named`
and is also lowered to the equivalent tile assignment, as XLA's
``V3ToV2Sharding`` does, so later stages read one representation.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir import (
    AxisRef,
    IotaDevices,
    MeshAxis,
    NamedMesh,
    OpMetadata,
    ReplicaGroups,
    Sharding,
    ShardingKind,
    SubgroupType,
    TileAssignment,
    split_mesh_axes,
    transpose_devices,
)

__all__ = [
    "parse_int_list",
    "parse_int_lists",
    "parse_metadata",
    "parse_replica_groups",
    "parse_sharding",
]

_CACHE_SIZE = 8192

# Whitespace and /* comments */ (the printer writes /*index=5*/ in tuples).
_SPACE = re.compile(r"(?:\s+|/\*.*?\*/)*", re.S)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?\d+")
_INT_LIST = re.compile(r"[+-]?\d+(?:(?:\s|/\*.*?\*/)*,(?:\s|/\*.*?\*/)*[+-]?\d+)*", re.S)
_DQ_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
_SQ_STRING = re.compile(r"'((?:[^'\\]|\\.)*)'", re.S)
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|.)", re.S)
_SIMPLE_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "?": "?",
}
# Fast paths for the common exact spellings.
_FAST_INT_LIST = re.compile(r"\{\s*([+-]?\d+(?:\s*,\s*[+-]?\d+)*)?\s*\}")
_FAST_INT_LISTS = re.compile(
    r"\{\s*(?:\{\s*(?:[+-]?\d+(?:\s*,\s*[+-]?\d+)*)?\s*\}(?:\s*,\s*\{\s*(?:[+-]?\d+(?:\s*,\s*[+-]?\d+)*)?\s*\})*)?\s*\}"
)
_INNER_LIST = re.compile(r"\{([^{}]*)\}")
_BARE_VALUE = re.compile(r"[^\s,{}\[\]()]+")
_BRACKET_OR_QUOTE = re.compile(r'[{}\[\]()"]')

_KIND_WORDS = {
    "replicated": ShardingKind.REPLICATED,
    "manual": ShardingKind.MANUAL,
    "maximal": ShardingKind.MAXIMAL,
    "unknown": ShardingKind.UNKNOWN,
    "unreduced": ShardingKind.UNREDUCED,
}
_SUBGROUP_WORDS = {t.value: t for t in SubgroupType}
_METADATA_INT_KEYS = frozenset(
    {"source_line", "source_end_line", "source_column", "source_end_column", "stack_frame_id"}
)


def _unescape(raw: str) -> str:
    """C-style unescaping, as absl::CUnescape does for HLO strings."""
    if "\\" not in raw:
        return raw

    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code[0] == "x" and len(code) > 1:
            return chr(int(code[1:], 16))
        if code[0] in "01234567":
            return chr(int(code, 8))
        return _SIMPLE_ESCAPES.get(code, code)

    return _ESCAPE.sub(replace, raw)


class _Cursor:
    """A position in an attribute text, with the primitive matchers."""

    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -- errors -----------------------------------------------------------

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError.at(self.text, self.pos if pos is None else pos, message)

    def describe(self) -> str:
        """What sits at the cursor, for error messages."""
        self.skip()
        if self.pos >= len(self.text):
            return "end of text"
        return repr(self.text[self.pos : self.pos + 12])

    # -- primitives -------------------------------------------------------

    def skip(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos : self.pos + 1]

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def eat(self, punct: str) -> bool:
        self.skip()
        if self.text.startswith(punct, self.pos):
            self.pos += len(punct)
            return True
        return False

    def expect(self, punct: str, context: str) -> None:
        if not self.eat(punct):
            raise self.error(f"expected '{punct}' {context}, found {self.describe()}")

    def parse_optional_word(self) -> str | None:
        self.skip()
        match = _WORD.match(self.text, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        return match.group()

    def peek_word(self) -> str | None:
        self.skip()
        match = _WORD.match(self.text, self.pos)
        return match.group() if match else None

    def parse_int(self, what: str) -> int:
        self.skip()
        match = _INT.match(self.text, self.pos)
        if match is None:
            raise self.error(f"expected an integer {what}, found {self.describe()}")
        self.pos = match.end()
        return int(match.group())

    def parse_optional_int_list(self) -> tuple[int, ...] | None:
        """``1,2,3`` (no brackets); None when no integer is here."""
        self.skip()
        match = _INT_LIST.match(self.text, self.pos)
        if match is None:
            return None
        self.pos = match.end()
        body = match.group()
        if "/*" in body:
            body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        return tuple(int(v) for v in body.split(","))

    def parse_int_list(self, what: str) -> tuple[int, ...]:
        values = self.parse_optional_int_list()
        if values is None:
            raise self.error(f"expected a list of integers {what}, found {self.describe()}")
        return values

    def parse_bracketed_ints(self, what: str, *, allow_empty: bool = False) -> tuple[int, ...]:
        """``[1,2,3]``."""
        self.expect("[", f"to start {what}")
        values = self.parse_optional_int_list()
        if values is None:
            if not allow_empty:
                raise self.error(f"expected a non-empty list of integers in {what}")
            values = ()
        self.expect("]", f"to end {what}")
        return values

    def parse_string(self, what: str) -> str:
        """A double-quoted string, unescaped."""
        self.skip()
        match = _DQ_STRING.match(self.text, self.pos)
        if match is None:
            raise self.error(f"expected a quoted string {what}, found {self.describe()}")
        self.pos = match.end()
        return _unescape(match.group(1))

    def parse_quoted_name(self, what: str) -> str:
        """A single- (or double-) quoted axis name, unescaped."""
        self.skip()
        match = _SQ_STRING.match(self.text, self.pos) or _DQ_STRING.match(self.text, self.pos)
        if match is None:
            raise self.error(f"expected a quoted {what}, found {self.describe()}")
        self.pos = match.end()
        return _unescape(match.group(1))

    def skip_balanced(self) -> None:
        """Skip one value: a quoted string, a balanced {...}/[...]/(...) or a bare token."""
        self.skip()
        text, start = self.text, self.pos
        if start >= len(text):
            raise self.error("expected a value, found end of text")
        first = text[start]
        if first == '"':
            self.parse_string("value")
            return
        if first not in "{[(":
            match = _BARE_VALUE.match(text, start)
            if match is None:
                raise self.error(f"expected a value, found {self.describe()}")
            self.pos = match.end()
            return
        depth = 0
        pos = start
        while True:
            match = _BRACKET_OR_QUOTE.search(text, pos)
            if match is None:
                raise self.error(f"unbalanced '{first}'", start)
            char = match.group()
            if char == '"':
                self.pos = match.start()
                self.parse_string("value")
                pos = self.pos
                continue
            depth += 1 if char in "{[(" else -1
            pos = match.end()
            if depth == 0:
                self.pos = pos
                return

    def expect_end(self, what: str) -> None:
        if not self.at_end():
            raise self.error(f"unexpected text after {what}: {self.describe()}")


# --------------------------------------------------------------------------
# Integer lists


@lru_cache(maxsize=_CACHE_SIZE)
def parse_int_list(text: str) -> tuple[int, ...]:
    """``{0,1}`` or ``{}`` as a tuple of ints."""
    match = _FAST_INT_LIST.fullmatch(text.strip())
    if match is not None:
        body = match.group(1)
        return tuple(int(v) for v in body.split(",")) if body else ()
    cursor = _Cursor(text)
    values = _parse_braced_ints(cursor)
    cursor.expect_end("the list")
    return values


@lru_cache(maxsize=_CACHE_SIZE)
def parse_int_lists(text: str) -> tuple[tuple[int, ...], ...]:
    """``{{0,1},{1,2}}`` or ``{}`` as a tuple of int tuples."""
    stripped = text.strip()
    if _FAST_INT_LISTS.fullmatch(stripped):
        inner = stripped[1:-1]
        return tuple(
            tuple(int(v) for v in body.split(",")) if body.strip() else ()
            for body in _INNER_LIST.findall(inner)
        )
    cursor = _Cursor(text)
    cursor.expect("{", "to start a list of lists")
    lists: list[tuple[int, ...]] = []
    if not cursor.eat("}"):
        while True:
            lists.append(_parse_braced_ints(cursor))
            if cursor.eat("}"):
                break
            cursor.expect(",", "between lists")
    cursor.expect_end("the list of lists")
    return tuple(lists)


def _parse_braced_ints(cursor: _Cursor) -> tuple[int, ...]:
    cursor.expect("{", "to start a list of integers")
    values = cursor.parse_optional_int_list() or ()
    cursor.expect("}", "to end a list of integers")
    return values


# --------------------------------------------------------------------------
# Metadata


@lru_cache(maxsize=_CACHE_SIZE)
def parse_metadata(text: str) -> OpMetadata:
    """``{op_type="dot" op_name="..." source_file="..." source_line=12 ...}``."""
    cursor = _Cursor(text)
    metadata = _parse_metadata_at(cursor)
    cursor.expect_end("metadata")
    return metadata


def _parse_metadata_at(cursor: _Cursor) -> OpMetadata:
    start = cursor.pos
    cursor.expect("{", "to start metadata")
    fields: dict[str, object] = {}
    while not cursor.eat("}"):
        if cursor.at_end():
            raise cursor.error("expected '}' to end metadata, found end of text")
        cursor.eat(",")
        key_pos = cursor.pos
        key = cursor.parse_optional_word()
        if key is None:
            raise cursor.error(f"expected a metadata attribute name, found {cursor.describe()}")
        cursor.expect("=", f"after metadata attribute {key}")
        if key in ("op_type", "op_name", "source_file"):
            fields[key] = cursor.parse_string(f"for {key}")
        elif key in _METADATA_INT_KEYS:
            value = cursor.parse_int(f"for {key}")
            if key != "source_end_column":
                fields[key] = value
        else:
            cursor.skip_balanced()  # kept in .text only
        if cursor.pos == key_pos:  # pragma: no cover - defensive
            raise cursor.error("metadata parser made no progress")
    return OpMetadata(
        op_type=fields.get("op_type"),  # type: ignore[arg-type]
        op_name=fields.get("op_name"),  # type: ignore[arg-type]
        source_file=fields.get("source_file"),  # type: ignore[arg-type]
        source_line=fields.get("source_line"),  # type: ignore[arg-type]
        source_end_line=fields.get("source_end_line"),  # type: ignore[arg-type]
        source_column=fields.get("source_column"),  # type: ignore[arg-type]
        stack_frame_id=fields.get("stack_frame_id"),  # type: ignore[arg-type]
        text=cursor.text[start : cursor.pos],
    )


def _parse_metadata_list(cursor: _Cursor) -> tuple[OpMetadata, ...]:
    """``{op_name="a"}`` or ``{{op_name="b"}, {op_name="c"}}`` (or ``{}``)."""
    save = cursor.pos
    cursor.expect("{", "to start metadata")
    if cursor.peek() == "{":
        entries = [_parse_metadata_at(cursor)]
        while cursor.eat(","):
            entries.append(_parse_metadata_at(cursor))
        cursor.expect("}", "to end the metadata list")
        return tuple(entries)
    if cursor.eat("}"):
        return ()
    cursor.pos = save
    return (_parse_metadata_at(cursor),)


# --------------------------------------------------------------------------
# Shardings


@lru_cache(maxsize=_CACHE_SIZE)
def parse_sharding(text: str) -> Sharding:
    """Any ``sharding={...}`` value: replicated, maximal, tiled, tuple or named."""
    cursor = _Cursor(text)
    cursor.expect("{", "to start sharding")
    if cursor.peek() in ("{", "}"):
        elements: list[Sharding] = []
        if not cursor.eat("}"):
            while True:
                cursor.skip()
                element_start = cursor.pos
                cursor.expect("{", "to start a tuple element sharding")
                element = _parse_single_sharding(cursor)
                elements.append(_with_text(element, text[element_start : cursor.pos]))
                if cursor.eat("}"):
                    break
                cursor.expect(",", "between tuple element shardings")
        cursor.expect_end("the sharding")
        return Sharding(ShardingKind.TUPLE, tuple_elements=tuple(elements), text=text)
    sharding = _parse_single_sharding(cursor)
    cursor.expect_end("the sharding")
    return _with_text(sharding, text)


def _with_text(sharding: Sharding, text: str) -> Sharding:
    return Sharding(
        sharding.kind,
        tile_assignment=sharding.tile_assignment,
        last_tile_dim_replicate=sharding.last_tile_dim_replicate,
        last_tile_dims=sharding.last_tile_dims,
        maximal_device=sharding.maximal_device,
        tuple_elements=sharding.tuple_elements,
        shard_group=sharding.shard_group,
        metadata=sharding.metadata,
        named=sharding.named,
        text=text,
    )


def _parse_single_sharding(cursor: _Cursor) -> Sharding:
    """The body of one ``{...}`` after its '{', up to and including its '}'."""
    start = cursor.pos
    word = cursor.peek_word()
    if word in ("mesh", "maximal_mesh"):
        return _parse_named_sharding(cursor)

    kinds: list[tuple[ShardingKind, int]] = []
    device: int | None = None
    dims: tuple[int, ...] | None = None
    explicit: tuple[int, ...] | None = None
    iota: IotaDevices | None = None
    replicate_last = False
    subgroups: tuple[SubgroupType, ...] = ()
    subgroups_pos = -1
    shard_group: tuple[str, int] | None = None
    metadata: tuple[OpMetadata, ...] = ()

    while not cursor.eat("}"):
        if cursor.at_end():
            raise cursor.error("expected '}' to end sharding, found end of text")
        pos = cursor.pos
        word = cursor.parse_optional_word()
        if word is None:
            raise cursor.error(f"unexpected {cursor.describe()} in sharding")
        if cursor.eat("="):
            if word == "device":
                device = cursor.parse_int("after device=")
            elif word == "devices":
                if dims is not None:
                    raise cursor.error("devices= given twice", pos)
                dims, explicit, iota = _parse_tile_assignment(cursor)
            elif word == "metadata":
                metadata += _parse_metadata_list(cursor)
            elif word == "last_tile_dims":
                subgroups_pos = pos
                subgroups = _parse_subgroup_types(cursor)
            else:
                raise cursor.error(
                    f"unknown sharding attribute '{word}=': expected device=, devices=, "
                    "metadata= or last_tile_dims=",
                    pos,
                )
        elif word in _KIND_WORDS:
            kinds.append((_KIND_WORDS[word], pos))
        elif word == "last_tile_dim_replicate":
            replicate_last = True
        elif word in ("shard_as", "shard_like"):
            shard_group = (word, cursor.parse_int(f"after {word}"))
        else:
            raise cursor.error(f"unexpected '{word}' in sharding", pos)

    if len({kind for kind, _ in kinds}) > 1:
        raise cursor.error(
            "conflicting sharding kinds: " + " and ".join(k.value for k, _ in kinds), kinds[1][1]
        )
    kind = kinds[0][0] if kinds else ShardingKind.TILED
    if kind is ShardingKind.MAXIMAL:
        if device is None or dims is not None:
            raise cursor.error("maximal shardings must have exactly one device= assigned", start)
        return Sharding(kind, maximal_device=device, shard_group=shard_group, metadata=metadata)
    if device is not None:
        raise cursor.error("device= is only valid in a maximal sharding", start)
    if kind is not ShardingKind.TILED:
        if dims is not None:
            raise cursor.error(f"{kind.value} shardings must not have devices assigned", start)
        return Sharding(kind, shard_group=shard_group, metadata=metadata)
    if dims is None:
        raise cursor.error("expected a sharding kind or devices=[...] in sharding", start)
    if replicate_last and subgroups:
        raise cursor.error(
            "last_tile_dim_replicate and last_tile_dims= cannot both be given", subgroups_pos
        )
    if len(subgroups) + replicate_last > len(dims):
        raise cursor.error(
            f"{len(subgroups) + replicate_last} subgroup dims but the tile grid has "
            f"only {len(dims)} dims",
            start,
        )
    return Sharding(
        ShardingKind.TILED,
        tile_assignment=TileAssignment(dims, explicit, iota),
        last_tile_dim_replicate=replicate_last,
        last_tile_dims=subgroups,
        shard_group=shard_group,
        metadata=metadata,
    )


def _parse_tile_assignment(
    cursor: _Cursor,
) -> tuple[tuple[int, ...], tuple[int, ...] | None, IotaDevices | None]:
    """``[2,2]0,1,2,3`` or ``[2,2]<=[4]`` or ``[2,2]<=[2,2]T(1,0)``."""
    dims_pos = cursor.pos
    dims = cursor.parse_bracketed_ints("the tile assignment dims")
    if any(d < 0 for d in dims):
        raise cursor.error("tile assignment dims must not be negative", dims_pos)
    count = math.prod(dims)
    if cursor.eat("<="):
        iota_pos = cursor.pos
        iota = _parse_iota(cursor, "the iota reshape dims", require_transpose=True)
        if math.prod(iota.reshape_dims) != count:
            raise cursor.error(
                f"iota has {math.prod(iota.reshape_dims)} devices but the tile grid "
                f"{list(dims)} has {count} tiles",
                iota_pos,
            )
        return dims, None, iota
    list_pos = cursor.pos
    devices = cursor.parse_int_list("after devices=[...]: device ids or <=[...]")
    if len(devices) != count:
        raise cursor.error(
            f"{len(devices)} device ids given but the tile grid {list(dims)} has {count} tiles",
            list_pos,
        )
    if count <= 1:
        raise cursor.error("non-maximal shardings must have more than one device assigned", list_pos)
    return dims, devices, None


def _parse_iota(cursor: _Cursor, what: str, *, require_transpose: bool) -> IotaDevices:
    """``[4,2]T(1,0)`` (the part after ``<=``)."""
    reshape = cursor.parse_bracketed_ints(what)
    if any(d < 0 for d in reshape):
        raise cursor.error(f"{what} must not be negative")
    perm: tuple[int, ...] | None = None
    if cursor.peek() == "T" and cursor.peek_word() == "T":
        cursor.parse_optional_word()
        cursor.expect("(", "after T to start the iota transpose")
        perm_pos = cursor.pos
        perm = cursor.parse_int_list("in the iota transpose")
        cursor.expect(")", "to end the iota transpose")
        if sorted(perm) != list(range(len(reshape))):
            raise cursor.error(
                f"iota transpose {list(perm)} is not a permutation of the "
                f"{len(reshape)} reshape dims",
                perm_pos,
            )
        if perm == tuple(range(len(reshape))):
            perm = None
    elif require_transpose and len(reshape) > 1:
        raise cursor.error("expected 'T(' after a multi-dimensional iota reshape")
    return IotaDevices(reshape, perm)


def _parse_subgroup_types(cursor: _Cursor) -> tuple[SubgroupType, ...]:
    cursor.expect("{", "to start last_tile_dims")
    types: list[SubgroupType] = []
    if cursor.eat("}"):
        return ()
    while True:
        pos = cursor.pos
        word = cursor.parse_optional_word()
        if word not in _SUBGROUP_WORDS:
            raise cursor.error(
                "expected replicated, manual, maximal or unreduced in last_tile_dims", pos
            )
        types.append(_SUBGROUP_WORDS[word])
        if cursor.eat("}"):
            return tuple(types)
        cursor.expect(",", "between last_tile_dims entries")


# -- named (v3) shardings ---------------------------------------------------


def _parse_mesh(cursor: _Cursor) -> NamedMesh:
    """``mesh['a'=2,'b'=4]`` [``, device_ids=(...)``] or ``maximal_mesh[device_id=N]``."""
    pos = cursor.pos
    word = cursor.parse_optional_word()
    if word == "maximal_mesh":
        cursor.expect("[", "after maximal_mesh")
        if cursor.parse_optional_word() != "device_id" or not cursor.eat("="):
            raise cursor.error("expected device_id= in maximal_mesh")
        device = cursor.parse_int("after device_id=")
        cursor.expect("]", "to end maximal_mesh")
        return NamedMesh((), (), maximal_device=device)
    if word != "mesh":
        raise cursor.error("expected 'mesh' or 'maximal_mesh'", pos)
    cursor.expect("[", "after mesh")
    axes: list[MeshAxis] = []
    if not cursor.eat("]"):
        while True:
            name_pos = cursor.pos
            name = cursor.parse_quoted_name("mesh axis name")
            cursor.expect("=", "after a mesh axis name")
            size = cursor.parse_int("mesh axis size")
            if size < 1:
                raise cursor.error(f"mesh axis '{name}' must have a positive size", name_pos)
            if any(axis.name == name for axis in axes):
                raise cursor.error(f"mesh axis '{name}' is defined twice", name_pos)
            axes.append(MeshAxis(name, size))
            if cursor.eat("]"):
                break
            cursor.expect(",", "between mesh axes")
    mesh = NamedMesh(tuple(axes), ())
    save = cursor.pos
    if axes and cursor.eat(",") and cursor.peek_word() == "device_ids":
        cursor.parse_optional_word()
        cursor.expect("=", "after device_ids")
        cursor.expect("(", "to start device_ids")
        ids_pos = cursor.pos
        count = mesh.num_devices
        if cursor.peek() == "[":
            iota = _parse_iota(cursor, "the device_ids iota", require_transpose=True)
            cursor.expect(")", "to end device_ids")
            if math.prod(iota.reshape_dims) != count:
                raise cursor.error(
                    f"device_ids iota has {math.prod(iota.reshape_dims)} devices but the "
                    f"mesh has {count}",
                    ids_pos,
                )
            return NamedMesh(mesh.axes, (), device_iota=iota)
        ids = cursor.parse_optional_int_list() or ()
        cursor.expect(")", "to end device_ids")
        if len(ids) != count:
            raise cursor.error(
                f"{len(ids)} device_ids given but the mesh has {count} devices", ids_pos
            )
        return NamedMesh(mesh.axes, (), device_ids=ids)
    cursor.pos = save
    return mesh


def _parse_axis_ref(cursor: _Cursor, mesh: NamedMesh) -> AxisRef:
    """``'a'`` or ``'a':(2)4``; an axis may also be named by its index, ``'0'``."""
    pos = cursor.pos
    name = cursor.parse_quoted_name("mesh axis name")
    names = [axis.name for axis in mesh.axes]
    if name not in names:
        if name.isdigit() and int(name) < len(names):
            name = names[int(name)]
        else:
            raise cursor.error(f"unknown mesh axis '{name}'", pos)
    if not cursor.eat(":"):
        return AxisRef(name)
    cursor.expect("(", "before the sub-axis pre-size")
    pre_size = cursor.parse_int("sub-axis pre-size")
    cursor.expect(")", "after the sub-axis pre-size")
    size = cursor.parse_int("sub-axis size")
    full = mesh.axes[names.index(name)].size
    if pre_size < 1 or size < 1 or full % (pre_size * size):
        raise cursor.error(f"sub-axis '{name}':({pre_size}){size} does not divide '{name}'={full}", pos)
    return AxisRef(name, pre_size, size)


def _parse_axis_ref_set(cursor: _Cursor, mesh: NamedMesh, *, allow_open: bool) -> tuple[tuple[AxisRef, ...], bool]:
    """``{'a', 'b':(1)2, ?}``: the refs and whether the set is open (``?``)."""
    cursor.expect("{", "to start a list of mesh axes")
    refs: list[AxisRef] = []
    is_open = False
    if cursor.eat("}"):
        return (), False
    while True:
        if allow_open and cursor.eat("?"):
            is_open = True
            cursor.expect("}", "after '?' (it must come last)")
            return tuple(refs), is_open
        refs.append(_parse_axis_ref(cursor, mesh))
        if cursor.eat("}"):
            return tuple(refs), is_open
        cursor.expect(",", "between mesh axes")


def _parse_named_sharding(cursor: _Cursor) -> Sharding:
    start = cursor.pos
    mesh = _parse_mesh(cursor)
    metadata: tuple[OpMetadata, ...] = ()
    if mesh.maximal_device is not None:
        if cursor.eat(","):
            if cursor.parse_optional_word() != "metadata" or not cursor.eat("="):
                raise cursor.error("expected metadata= after maximal_mesh[...]")
            metadata = _parse_metadata_list(cursor)
        cursor.expect("}", "to end the sharding")
        return Sharding(ShardingKind.MAXIMAL, maximal_device=mesh.maximal_device,
                        metadata=metadata, named=mesh)

    all_axes = tuple(AxisRef(axis.name) for axis in mesh.axes)
    dim_refs: list[tuple[AxisRef, ...]] = []
    open_dims: list[bool] = []
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    manual: tuple[AxisRef, ...] = ()
    reduction: str | None = None

    cursor.eat(",")
    word = cursor.peek_word()
    if word in ("replicated", "unreduced", "manual") and not _followed_by_equal(cursor):
        # The fully replicated / unreduced / manual spellings.
        cursor.parse_optional_word()
        if word == "unreduced":
            unreduced = all_axes
        elif word == "manual":
            manual = all_axes
        if cursor.eat(","):
            if cursor.parse_optional_word() != "metadata" or not cursor.eat("="):
                raise cursor.error(f"expected metadata= after '{word}'")
            metadata = _parse_metadata_list(cursor)
        cursor.expect("}", "to end the sharding")
    else:
        if cursor.peek() == "[":
            cursor.expect("[", "to start the dimension shardings")
            if not cursor.eat("]"):
                while True:
                    refs, is_open = _parse_axis_ref_set(cursor, mesh, allow_open=True)
                    dim_refs.append(refs)
                    open_dims.append(is_open)
                    if cursor.eat("]"):
                        break
                    cursor.expect(",", "between dimension shardings")
            first = False
        else:
            first = True  # newer XLA: attributes without a dimension list
        while not cursor.eat("}"):
            if not first:
                cursor.expect(",", "before the next named sharding attribute")
            first = False
            cursor.skip()
            pos = cursor.pos
            name = cursor.parse_optional_word()
            if name is None or not cursor.eat("="):
                raise cursor.error(
                    "expected replicated=, unreduced=, manual= or metadata= in named sharding",
                    pos,
                )
            if name == "metadata":
                metadata += _parse_metadata_list(cursor)
                continue
            if name == "unreduced" and cursor.peek_word() is not None:
                reduction = cursor.parse_optional_word()
                if cursor.peek() != "{":
                    unreduced = all_axes
                    continue
            if name not in ("replicated", "unreduced", "manual"):
                raise cursor.error(
                    f"unknown named sharding attribute '{name}=': expected replicated=, "
                    "unreduced=, manual= or metadata=",
                    pos,
                )
            refs, _ = _parse_axis_ref_set(cursor, mesh, allow_open=False)
            if name == "replicated":
                replicated += refs
            elif name == "unreduced":
                unreduced += refs
            else:
                manual += refs

    named = NamedMesh(
        mesh.axes,
        tuple(tuple(ref.name for ref in refs) for refs in dim_refs),
        replicated_axes=tuple(ref.name for ref in replicated),
        unreduced_axes=tuple(ref.name for ref in unreduced),
        device_ids=mesh.device_ids,
        manual_axes=tuple(ref.name for ref in manual),
        dim_refs=tuple(dim_refs),
        replicated_refs=replicated,
        unreduced_refs=unreduced,
        manual_refs=manual,
        open_dims=tuple(open_dims),
        device_iota=mesh.device_iota,
        unreduced_reduction=reduction,
    )
    try:
        return _lower_named(named, metadata)
    except ValueError as error:
        raise cursor.error(str(error), start) from None


def _followed_by_equal(cursor: _Cursor) -> bool:
    save = cursor.pos
    cursor.parse_optional_word()
    result = cursor.peek() == "="
    cursor.pos = save
    return result


def _lower_named(named: NamedMesh, metadata: tuple[OpMetadata, ...]) -> Sharding:
    """The tile assignment equal to a named sharding (XLA's V3ToV2Sharding).

    The mesh is split into the factors the refs need. The tile grid is the
    dimension shardings (their factors in the order written), then the
    manual, unreduced and replicated subgroups (factors in mesh order); every
    factor that no ref names is replicated. Subgroups of size 1 are dropped.
    """
    groups = [*named.dim_refs, named.manual_refs, named.unreduced_refs, named.replicated_refs]
    flat = tuple(ref for refs in groups for ref in refs)
    sizes, covered = split_mesh_axes(named.axes, flat)
    by_ref = iter(covered)
    dim_factors = [[f for _ in refs for f in next(by_ref)] for refs in named.dim_refs]
    manual = sorted(f for _ in named.manual_refs for f in next(by_ref))
    unreduced = sorted(f for _ in named.unreduced_refs for f in next(by_ref))
    used = {f for factors in covered for f in factors}
    replicated = sorted(set(range(len(sizes))) - used | {f for _ in named.replicated_refs for f in next(by_ref)})

    tile_dims = [math.prod(sizes[f] for f in factors) for factors in dim_factors]
    perm = [f for factors in dim_factors for f in factors]
    subgroups: list[SubgroupType] = []
    for kind, factors in (
        (SubgroupType.MANUAL, manual),
        (SubgroupType.UNREDUCED, unreduced),
        (SubgroupType.REPLICATED, replicated),
    ):
        size = math.prod(sizes[f] for f in factors)
        perm += factors
        if size > 1:  # a subgroup of one device is no subgroup (XLA drops it)
            tile_dims.append(size)
            subgroups.append(kind)

    data_tiles = math.prod(tile_dims[: len(dim_factors)])
    if data_tiles == 1 and len(set(subgroups)) <= 1:
        only = subgroups[0] if subgroups else SubgroupType.REPLICATED
        kind = {
            SubgroupType.REPLICATED: ShardingKind.REPLICATED,
            SubgroupType.MANUAL: ShardingKind.MANUAL,
            SubgroupType.UNREDUCED: ShardingKind.UNREDUCED,
        }[only]
        return Sharding(kind, metadata=metadata, named=named)

    if named.device_ids is None and named.device_iota is None:
        identity = tuple(range(len(sizes)))
        iota = IotaDevices(sizes, None if tuple(perm) == identity else tuple(perm))
        assignment = TileAssignment(tuple(tile_dims), iota=iota)
    else:
        devices = transpose_devices(named.devices(), sizes, tuple(perm))
        assignment = TileAssignment(tuple(tile_dims), explicit=devices)
    replicate_last = subgroups == [SubgroupType.REPLICATED]
    return Sharding(
        ShardingKind.TILED,
        tile_assignment=assignment,
        last_tile_dim_replicate=replicate_last,
        last_tile_dims=() if replicate_last else tuple(subgroups),
        metadata=metadata,
        named=named,
    )


# --------------------------------------------------------------------------
# Replica groups


@lru_cache(maxsize=_CACHE_SIZE)
def parse_replica_groups(text: str) -> ReplicaGroups:
    """``{{0,1},{2,3}}``, ``[2,4]<=[8]``/``[4,2]<=[2,4]T(1,0)`` or ``mesh[...] {'a'}``."""
    cursor = _Cursor(text)
    first = cursor.peek()
    if first == "{":
        return ReplicaGroups(explicit=parse_int_lists(text), text=text)
    if first == "[":
        shape_pos = cursor.pos
        shape = cursor.parse_bracketed_ints("the replica group shape")
        if len(shape) != 2:
            raise cursor.error(
                "iota replica groups need [num_groups,group_size], "
                f"got {len(shape)} dims",
                shape_pos,
            )
        cursor.expect("<=", "after the replica group shape")
        iota_pos = cursor.pos
        iota = _parse_iota(cursor, "the iota reshape dims", require_transpose=True)
        if math.prod(iota.reshape_dims) != shape[0] * shape[1]:
            raise cursor.error(
                f"iota has {math.prod(iota.reshape_dims)} devices but "
                f"[{shape[0]},{shape[1]}] needs {shape[0] * shape[1]}",
                iota_pos,
            )
        cursor.expect_end("the replica groups")
        return ReplicaGroups(iota_shape=(shape[0], shape[1]), iota=iota, text=text)
    if cursor.peek_word() in ("mesh", "maximal_mesh"):
        mesh = _parse_mesh(cursor)
        refs_pos = cursor.pos
        refs, _ = _parse_axis_ref_set(cursor, mesh, allow_open=False)
        cursor.expect_end("the replica groups")
        try:
            split_mesh_axes(mesh.axes, refs)
        except ValueError as error:
            raise cursor.error(str(error), refs_pos) from None
        group_size = math.prod(
            ref.size if ref.size is not None else _axis_size(mesh, ref.name) for ref in refs
        )
        if group_size <= 1:
            raise cursor.error(
                f"mesh replica groups need more than one device per group, got {group_size}",
                refs_pos,
            )
        return ReplicaGroups(
            mesh_axes=mesh.axes,
            mesh_selected=tuple(ref.name for ref in refs),
            text=text,
            mesh=mesh,
            mesh_refs=refs,
        )
    raise cursor.error(f"expected replica groups ({{...}}, [...]<=[...] or mesh[...]), found {cursor.describe()}")


def _axis_size(mesh: NamedMesh, name: str) -> int:
    return next(axis.size for axis in mesh.axes if axis.name == name)
