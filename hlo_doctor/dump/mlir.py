"""What hlo-doctor needs from a dump's ``module.mlir`` (StableHLO as JAX lowered it).

Not an MLIR parser: a bracket-aware scan that finds

* the Shardy meshes, ``sdy.mesh @mesh = <["x"=4, "y"=2]>`` (and ``device_ids=[...]``),
  also in their attribute form ``#sdy.mesh<[...]>``;
* the module's ``mhlo.num_partitions`` / ``mhlo.num_replicas``;
* the entry function's (``@main``) arguments and results with their sharding
  text (``sdy.sharding`` under Shardy, ``mhlo.sharding`` under GSPMD), the
  argument's ``loc("name")`` and the result's ``jax.result_info``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_MESH = re.compile(
    r"(?:sdy\.mesh\s+@(?P<name>[\w.$-]+)\s*=\s*|(?P<attr>\w+)\s*=\s*#sdy\.mesh)"
    r"<\s*\[(?P<axes>[^\]]*)\]\s*(?:,\s*device_ids\s*=\s*\[(?P<ids>[^\]]*)\])?\s*>"
)
_AXIS = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"\s*=\s*(\d+)')
_MODULE_ATTR = re.compile(r"mhlo\.(num_partitions|num_replicas)\s*=\s*(\d+)")
_MODULE_NAME = re.compile(r"^\s*module\s+@([\w.$-]+|\"[^\"]*\")", re.M)
_FUNC = re.compile(r"func\.func\s+(?:(?:public|private|nested)\s+)?@(?P<name>[\w.$-]+)\s*\(")
_LOC_NAME = re.compile(r'loc\(\s*"([^"\\]*(?:\\.[^"\\]*)*)"\s*\)\s*$')

_OPEN = {"(": ")", "[": "]", "{": "}", "<": ">"}


@dataclass(frozen=True, slots=True)
class SdyMesh:
    """A Shardy mesh: named axes in major-to-minor order, and optional device ids."""

    name: str
    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None
    text: str = ""

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def num_devices(self) -> int:
        count = 1
        for _, size in self.axes:
            count *= size
        return count

    def __str__(self) -> str:
        axes = ", ".join(f'"{n}"={s}' for n, s in self.axes)
        ids = f", device_ids=[{', '.join(map(str, self.device_ids))}]" if self.device_ids else ""
        return f"@{self.name} = <[{axes}]{ids}>"


@dataclass(frozen=True, slots=True)
class MlirValue:
    """One argument or result of the entry function."""

    index: int
    type: str  # e.g. "tensor<16x32xf32>"
    sharding: str | None = None  # the sdy.sharding text or the mhlo.sharding string's content
    sharding_dialect: str | None = None  # "sdy" | "mhlo" | None
    name: str | None = None  # argument: loc("x"); result: jax.result_info
    attributes: tuple[tuple[str, str], ...] = ()

    def attribute(self, key: str) -> str | None:
        for name, value in self.attributes:
            if name == key:
                return value
        return None


@dataclass(frozen=True, slots=True)
class MlirInfo:
    module_name: str | None
    num_partitions: int | None
    num_replicas: int | None
    meshes: tuple[SdyMesh, ...]
    function: str | None
    arguments: tuple[MlirValue, ...]
    results: tuple[MlirValue, ...]
    uses_sdy: bool  # any sdy.* construct in the text
    uses_mhlo_sharding: bool

    def mesh(self, name: str = "mesh") -> SdyMesh | None:
        for mesh in self.meshes:
            if mesh.name == name:
                return mesh
        return None


def parse_meshes(text: str) -> tuple[SdyMesh, ...]:
    """Every distinct Shardy mesh definition in ``text`` (MLIR or HLO frontend attributes)."""
    meshes: list[SdyMesh] = []
    seen: set[tuple[str, tuple[tuple[str, int], ...], tuple[int, ...] | None]] = set()
    for match in _MESH.finditer(text):
        name = match["name"] or match["attr"]
        axes = tuple((_unquote(n), int(s)) for n, s in _AXIS.findall(match["axes"]))
        ids = None
        if match["ids"] is not None and match["ids"].strip():
            ids = tuple(int(x) for x in re.findall(r"-?\d+", match["ids"]))
        key = (name, axes, ids)
        if key not in seen:
            seen.add(key)
            meshes.append(SdyMesh(name, axes, ids, match.group()))
    return tuple(meshes)


def declarations(text: str) -> str:
    """The module's text before its first function: where ``sdy.mesh`` ops are declared."""
    first_function = text.find("func.func")
    return text if first_function < 0 else text[:first_function]


def read_declarations(path: str | os.PathLike[str], chunk: int = 1 << 16) -> str:
    """:func:`declarations` of the file at ``path``, reading no further than the first function."""
    pieces: list[bytes] = []
    with open(path, "rb") as handle:
        while True:
            piece = handle.read(chunk)
            if not piece:
                break
            pieces.append(piece)
            # the marker may straddle two chunks: look at the tail of the previous one too
            if b"func.func" in (pieces[-2][-16:] if len(pieces) > 1 else b"") + piece:
                break
    return declarations(b"".join(pieces).decode("utf-8", "replace"))


def parse_mlir_info(text: str) -> MlirInfo:
    """Scan a ``module.mlir`` text. Never raises on odd input; missing parts are None/empty."""
    attrs = dict(_MODULE_ATTR.findall(text[:4096] if len(text) > 4096 else text))
    name_match = _MODULE_NAME.search(text)
    func_name, arguments, results = _entry_signature(text)
    return MlirInfo(
        module_name=_unquote(name_match.group(1)) if name_match else None,
        num_partitions=int(attrs["num_partitions"]) if "num_partitions" in attrs else None,
        num_replicas=int(attrs["num_replicas"]) if "num_replicas" in attrs else None,
        meshes=parse_meshes(declarations(text)),
        function=func_name,
        arguments=arguments,
        results=results,
        uses_sdy="sdy." in text,
        uses_mhlo_sharding="mhlo.sharding" in text,
    )


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _entry_signature(text: str) -> tuple[str | None, tuple[MlirValue, ...], tuple[MlirValue, ...]]:
    functions = list(_FUNC.finditer(text))
    if not functions:
        return None, (), ()
    chosen = next((f for f in functions if f["name"] == "main"), None)
    if chosen is None:
        chosen = next((f for f in functions if "public" in f.group()), functions[0])
    start = chosen.end()
    end = _matching(text, start - 1)
    if end is None:
        return chosen["name"], (), ()
    arguments = tuple(
        _value(i, piece, argument=True) for i, piece in enumerate(_split_top(text[start:end]))
    )
    rest = text[end + 1 :]
    arrow = re.match(r"\s*->\s*", rest)
    results: tuple[MlirValue, ...] = ()
    if arrow is not None:
        pos = end + 1 + arrow.end()
        if text.startswith("(", pos):
            close = _matching(text, pos)
            if close is not None:
                results = tuple(
                    _value(i, piece, argument=False)
                    for i, piece in enumerate(_split_top(text[pos + 1 : close]))
                )
        else:
            stop = _scan_until(text, pos, "{")
            piece = text[pos:stop].strip()
            if piece:
                results = (_value(0, piece, argument=False),)
    return chosen["name"], arguments, results


def _matching(text: str, open_pos: int) -> int | None:
    """Index of the bracket closing the one at ``open_pos``; strings and ``->`` skipped."""
    stack: list[str] = []
    i = open_pos
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i = _skip_string(text, i)
            continue
        if ch == "-" and text.startswith("->", i):
            i += 2
            continue
        if ch in _OPEN:
            stack.append(_OPEN[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return i
        elif ch in ")]}" and stack:
            return None
        i += 1
    return None


def _skip_string(text: str, i: int) -> int:
    j = i + 1
    n = len(text)
    while j < n:
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return j + 1
        j += 1
    return n


def _scan_until(text: str, pos: int, stop: str) -> int:
    """Position of the first top-level ``stop`` character at or after ``pos``."""
    depth = 0
    i = pos
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i = _skip_string(text, i)
            continue
        if ch == "-" and text.startswith("->", i):
            i += 2
            continue
        if depth == 0 and ch == stop:
            return i
        if ch in _OPEN:
            depth += 1
        elif ch in ")]}>" and depth:
            depth -= 1
        i += 1
    return n


def _split_top(text: str, sep: str = ",") -> list[str]:
    pieces: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i = _skip_string(text, i)
            continue
        if ch == "-" and text.startswith("->", i):
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in ")]}>" and depth:
            depth -= 1
        elif ch == sep and depth == 0:
            pieces.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return [p for p in pieces if p]


def _value(index: int, piece: str, *, argument: bool) -> MlirValue:
    loc_name = None
    loc = _LOC_NAME.search(piece)
    if loc is not None:
        loc_name = _unquote('"' + loc.group(1) + '"')
        piece = piece[: loc.start()].rstrip()
    elif (bare := re.search(r"\s+loc\([^()]*\)\s*$", piece)) is not None:
        piece = piece[: bare.start()].rstrip()
    if argument:
        colon = _scan_until(piece, 0, ":")
        piece = piece[colon + 1 :].strip() if colon < len(piece) else piece
    brace = _scan_until(piece, 0, "{")
    type_text = piece[:brace].strip()
    attributes: list[tuple[str, str]] = []
    if brace < len(piece):
        close = _matching(piece, brace)
        body = piece[brace + 1 : close if close is not None else len(piece)]
        for item in _split_top(body):
            key, eq, value = item.partition("=")
            attributes.append((key.strip(), value.strip() if eq else ""))
    sharding = dialect = None
    for key, value in attributes:
        if key == "sdy.sharding":
            sharding, dialect = value, "sdy"
        elif key == "mhlo.sharding" and sharding is None:
            sharding, dialect = _unquote(value), "mhlo"
    name = loc_name if argument else None
    if not argument:
        info = dict(attributes).get("jax.result_info")
        name = _unquote(info) if info is not None else None
    return MlirValue(index, type_text, sharding, dialect, name, tuple(attributes))
