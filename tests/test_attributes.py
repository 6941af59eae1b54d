"""Tests for hlo_doctor.hlo.attributes: shardings, replica groups, metadata, int lists.

The strings in the unit tests are hand-written for this file (modelled on
what XLA prints). The corpus tests read ../shared/corpus/xla-hlo in place and
skip when it is absent; its data is never copied into this repository.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_doctor.hlo.attributes import (
    parse_int_list,
    parse_int_lists,
    parse_metadata,
    parse_replica_groups,
    parse_sharding,
)
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.ir import AxisRef, IotaDevices, MeshAxis, ShardingKind, SubgroupType

# --------------------------------------------------------------------------
# Shardings: hand-written strings


def test_simple_kinds() -> None:
    assert parse_sharding("{replicated}").kind is ShardingKind.REPLICATED
    assert parse_sharding("{manual}").kind is ShardingKind.MANUAL
    assert parse_sharding("{unknown}").kind is ShardingKind.UNKNOWN
    assert parse_sharding("{unreduced}").kind is ShardingKind.UNREDUCED
    maximal = parse_sharding("{maximal device=3}")
    assert maximal.kind is ShardingKind.MAXIMAL
    assert maximal.maximal_device == 3
    assert parse_sharding("{maximal device=-1}").maximal_device == -1


def test_text_is_kept() -> None:
    text = "{ devices=[16,1,2]<=[32]}"
    sharding = parse_sharding(text)
    assert sharding.text == text
    assert str(sharding) == text


def test_explicit_tile_assignment() -> None:
    sharding = parse_sharding("{devices=[2,2]0,2,1,3}")
    assert sharding.kind is ShardingKind.TILED
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.dims == (2, 2)
    assert sharding.tile_assignment.explicit == (0, 2, 1, 3)
    assert sharding.tile_assignment.device_ids() == (0, 2, 1, 3)
    assert sharding.data_tile_dims == (2, 2)


def test_iota_tile_assignment() -> None:
    sharding = parse_sharding("{devices=[2,2]<=[4]}")
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.iota == IotaDevices((4,))
    assert sharding.tile_assignment.device_ids() == (0, 1, 2, 3)


def test_iota_with_transpose() -> None:
    sharding = parse_sharding("{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}")
    assignment = sharding.tile_assignment
    assert assignment is not None
    assert assignment.dims == (2, 1, 4)
    assert assignment.iota == IotaDevices((4, 2), (1, 0))
    # iota(8) as [4,2], transposed to [2,4]: 0,2,4,6,1,3,5,7.
    assert assignment.device_ids() == (0, 2, 4, 6, 1, 3, 5, 7)
    assert sharding.last_tile_dim_replicate
    assert sharding.data_tile_dims == (2, 1)


def test_identity_transpose_is_dropped() -> None:
    sharding = parse_sharding("{devices=[2,2]<=[2,2]T(0,1)}")
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.iota == IotaDevices((2, 2), None)


def test_last_tile_dims() -> None:
    sharding = parse_sharding("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}")
    assert sharding.last_tile_dims == (SubgroupType.MANUAL, SubgroupType.REPLICATED)
    assert not sharding.last_tile_dim_replicate
    assert sharding.data_tile_dims == (2,)
    unreduced = parse_sharding("{devices=[1,2,2]<=[4] last_tile_dims={unreduced}}")
    assert unreduced.last_tile_dims == (SubgroupType.UNREDUCED,)


def test_shard_group() -> None:
    assert parse_sharding("{unknown shard_as 0}").shard_group == ("shard_as", 0)
    sharding = parse_sharding("{devices=[2,2]<=[4] shard_like 7}")
    assert sharding.shard_group == ("shard_like", 7)
    assert sharding.kind is ShardingKind.TILED


def test_metadata_single_and_list() -> None:
    one = parse_sharding('{replicated metadata={op_name="a" source_line=3}}')
    assert [m.op_name for m in one.metadata] == ["a"]
    assert one.metadata[0].source_line == 3
    two = parse_sharding('{devices=[2]0,1 metadata={{op_name="b"}, {op_name="c"}}}')
    assert [m.op_name for m in two.metadata] == ["b", "c"]
    assert two.tile_assignment is not None and two.tile_assignment.dims == (2,)


def test_tuple_sharding_with_comments() -> None:
    sharding = parse_sharding("{{replicated}, /*index=1*/{devices=[2]0,1}, {maximal device=1}}")
    assert sharding.kind is ShardingKind.TUPLE
    kinds = [e.kind for e in sharding.tuple_elements]
    assert kinds == [ShardingKind.REPLICATED, ShardingKind.TILED, ShardingKind.MAXIMAL]
    assert sharding.tuple_elements[1].text == "{devices=[2]0,1}"


def test_empty_tuple_sharding() -> None:
    sharding = parse_sharding("{}")
    assert sharding.kind is ShardingKind.TUPLE
    assert sharding.tuple_elements == ()


def test_whitespace_and_newlines_anywhere() -> None:
    sharding = parse_sharding("{\n  devices=[2, 2]\n  0, 1,\n 2, 3\n  last_tile_dim_replicate }")
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.explicit == (0, 1, 2, 3)
    assert sharding.last_tile_dim_replicate


def test_named_sharding_basic() -> None:
    sharding = parse_sharding("{mesh['a'=2,'b'=4], [{'a'}, {}], replicated={'b'}}")
    named = sharding.named
    assert named is not None
    assert named.axes == (MeshAxis("a", 2), MeshAxis("b", 4))
    assert named.dim_axes == (("a",), ())
    assert named.replicated_axes == ("b",)
    # Lowered as XLA does: [2,1] data tiles, the 4 'b' devices replicated.
    assert sharding.kind is ShardingKind.TILED
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.dims == (2, 1, 4)
    assert sharding.last_tile_dim_replicate
    assert sharding.tile_assignment.device_ids() == tuple(range(8))


def test_named_sharding_without_comma_and_unreduced() -> None:
    sharding = parse_sharding("{mesh['x'=2,'y'=2] [{?},{'x'}], unreduced={'y'}}")
    named = sharding.named
    assert named is not None
    assert named.open_dims == (True, False)
    assert named.unreduced_axes == ("y",)
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.dims == (1, 2, 2)
    assert sharding.last_tile_dims == (SubgroupType.UNREDUCED,)


def test_named_sharding_sub_axes() -> None:
    sharding = parse_sharding("{mesh['x'=8] [{'x':(1)2, 'x':(4)2}, {'x':(2)2}]}")
    named = sharding.named
    assert named is not None
    assert named.dim_refs == ((AxisRef("x", 1, 2), AxisRef("x", 4, 2)), (AxisRef("x", 2, 2),))
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.dims == (4, 2)
    # Factors of x (major to minor) are x1, x2, x3; dim 0 = (x1, x3), dim 1 = x2.
    assert sharding.tile_assignment.device_ids() == (0, 2, 1, 3, 4, 6, 5, 7)


def test_named_sharding_device_ids() -> None:
    explicit = parse_sharding("{mesh['x'=2,'y'=2], device_ids=(3,2,1,0), [{'x'}, {'y'}]}")
    assert explicit.named is not None and explicit.named.device_ids == (3, 2, 1, 0)
    assert explicit.tile_assignment is not None
    assert explicit.tile_assignment.device_ids() == (3, 2, 1, 0)
    iota = parse_sharding("{mesh['a'=2,'b'=2], device_ids=([2,2]T(1,0)), [{'a'}, {'b'}]}")
    assert iota.named is not None and iota.named.device_iota == IotaDevices((2, 2), (1, 0))
    assert iota.tile_assignment is not None
    assert iota.tile_assignment.device_ids() == (0, 2, 1, 3)


def test_named_sharding_full_forms() -> None:
    assert parse_sharding("{mesh[], replicated}").kind is ShardingKind.REPLICATED
    assert parse_sharding("{mesh['a'=2,'b'=4], replicated}").kind is ShardingKind.REPLICATED
    manual = parse_sharding("{mesh['a'=2,'b'=4], manual}")
    assert manual.kind is ShardingKind.MANUAL
    assert manual.named is not None and manual.named.manual_axes == ("a", "b")
    assert parse_sharding("{mesh['a'=2,'b'=4], unreduced}").kind is ShardingKind.UNREDUCED
    maximal = parse_sharding('{maximal_mesh[device_id=5], metadata={op_name="m"}}')
    assert maximal.kind is ShardingKind.MAXIMAL
    assert maximal.maximal_device == 5
    assert maximal.metadata[0].op_name == "m"


def test_named_sharding_all_attributes() -> None:
    sharding = parse_sharding(
        "{mesh['a'=2,'b'=4,'c'=3,'d'=8], [{'a'}], replicated={'c'}, unreduced={'d':(4)2}, "
        'manual={\'b\':(2)2}, metadata={{op_name="foo"}, {op_name="bar"}}}'
    )
    named = sharding.named
    assert named is not None
    assert named.manual_refs == (AxisRef("b", 2, 2),)
    assert named.unreduced_refs == (AxisRef("d", 4, 2),)
    assert [m.op_name for m in sharding.metadata] == ["foo", "bar"]
    assert sharding.tile_assignment is not None
    assert sharding.tile_assignment.dims == (2, 2, 2, 24)
    assert sharding.last_tile_dims == (
        SubgroupType.MANUAL, SubgroupType.UNREDUCED, SubgroupType.REPLICATED
    )


def test_named_sharding_newer_unreduced_reduction() -> None:
    # Newer XLA than jaxlib 0.10.2 writes the reduction: unreduced=max{...}.
    sharding = parse_sharding("{mesh['a'=2, 'b'=2], [{'a'}, {}], unreduced=max{'b'}}")
    assert sharding.named is not None
    assert sharding.named.unreduced_reduction == "max"
    assert sharding.named.unreduced_axes == ("b",)
    assert parse_sharding("{mesh['x'=2,'y'=2], unreduced=max}").kind is ShardingKind.UNREDUCED


def test_named_axis_by_index_and_odd_names() -> None:
    by_index = parse_sharding("{mesh['a'=2], [{'0'}]}")
    assert by_index.named is not None and by_index.named.dim_axes == (("a",),)
    odd = parse_sharding("{mesh['a.b'=2,'<axis> def'=4], [{'a.b'}, {'<axis> def':(2)2}]}")
    assert odd.named is not None
    assert odd.named.axes[1].name == "<axis> def"


def test_sharding_is_cached() -> None:
    assert parse_sharding("{devices=[4]<=[4]}") is parse_sharding("{devices=[4]<=[4]}")


# --------------------------------------------------------------------------
# Shardings: errors


@pytest.mark.parametrize(
    ("text", "message", "col"),
    [
        ("{devices=[2,2]0,1,2}", "3 device ids given but the tile grid [2, 2] has 4 tiles", 15),
        ("{devices=[2,2]<=[8]}", "iota has 8 devices", 17),
        ("{devices=[4]<=[2,2]}", "expected 'T('", 20),
        ("{devices=[4]<=[2,2]T(0,0)}", "is not a permutation", 22),
        ("{devices=[2]0,1", "expected '}' to end sharding", 16),
        ("{replicated devices=[2]0,1}", "replicated shardings must not have devices", 2),
        ("{maximal}", "exactly one device=", 2),
        ("{manual replicated}", "conflicting sharding kinds", 9),
        ("{devices=[2]0,1 bogus}", "unexpected 'bogus'", 17),
        ("{devices=[2]0,1 colour=3}", "unknown sharding attribute 'colour='", 17),
        ("{devices=[2,2]<=[4] last_tile_dims={sideways}}", "expected replicated, manual", 37),
        ("{devices=[2]0,1 last_tile_dim_replicate last_tile_dim_replicate last_tile_dims={manual}}",
         "cannot both be given", 65),
        ("{devices=[1]0}", "more than one device", 13),
        ("{}}", "unexpected text after the sharding", 3),
        ("", "expected '{' to start sharding", 1),
        ("{mesh['a'=2], [{'c'}]}", "unknown mesh axis 'c'", 17),
        ("{mesh['a'=4], [{'a':(1)3}]}", "does not divide", 17),
        ("{mesh['a'=2,'b'=4], [{'a'}, {}], replicated={'b'}, unreduced={'a'}}",
         "mesh axis 'a' is used more than once", 2),
        ("{mesh['a'=2], [{?, 'a'}]}", "after '?'", 18),
        ("{mesh['a'=2], [{'a'}], sideways={'a'}}", "unknown named sharding attribute", 24),
        ("{mesh['a'=2,'b'=2], device_ids=(0,1,2), [{'a'}]}", "3 device_ids given", 33),
        ('{replicated metadata={op_name="a}}', "expected a quoted string", 31),
    ],
)
def test_sharding_errors(text: str, message: str, col: int) -> None:
    with pytest.raises(ParseError) as info:
        parse_sharding(text)
    assert message in info.value.message
    assert (info.value.line, info.value.col) == (1, col)


def test_error_line_and_caret_on_multiline_text() -> None:
    with pytest.raises(ParseError) as info:
        parse_sharding("{\n  devices=[2,2]\n  0,1,2\n}")
    assert info.value.line == 3
    assert info.value.col == 3
    assert info.value.excerpt() == "  0,1,2\n  ^"


# A fuzz test: random mutations of valid shardings give a Sharding or a
# ParseError, never another exception.
_SEEDS = [
    "{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}",
    "{{replicated}, /*index=1*/{devices=[2]0,1}}",
    '{maximal device=7 metadata={{op_name="b"}, {op_name="c"}}}',
    "{devices=[2,2,2,2]<=[16] last_tile_dims={manual, replicated} shard_like 1}",
    "{mesh['a'=2,'b'=4,'c'=3,'d'=8], [{'b':(2)2}, {'d':(4)2, 'c', ?}], unreduced={'a'}}",
    "{mesh['x'=2,'y'=2], device_ids=(3,2,1,0), [{'x'}, {}], replicated={'y'}}",
    "{maximal_mesh[device_id=5]}",
    "{unknown shard_as 0}",
]
_ALPHABET = "{}[](),=<>T?:'\"/* 0123456789-abcdeilmnpqrtuvxy_"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(_SEEDS),
    edits=st.lists(
        st.tuples(st.sampled_from(["insert", "delete", "replace", "swap"]),
                  st.integers(0, 200), st.sampled_from(_ALPHABET)),
        min_size=1, max_size=4,
    ),
)
def test_fuzz_mutated_shardings(seed: str, edits: list[tuple[str, int, str]]) -> None:
    text = seed
    for op, where, char in edits:
        i = where % (len(text) + 1)
        if op == "insert":
            text = text[:i] + char + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + 1 :]
        elif op == "replace":
            text = text[:i] + char + text[i + 1 :]
        elif i + 1 < len(text):
            text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]
    try:
        sharding = parse_sharding(text)
    except ParseError as error:
        assert error.message
        assert 1 <= error.col <= len(text) + 1
    else:
        assert sharding.text == text


# --------------------------------------------------------------------------
# Replica groups


def test_replica_groups_explicit() -> None:
    groups = parse_replica_groups("{{0,1},{2,3}}")
    assert groups.explicit == ((0, 1), (2, 3))
    assert groups.groups() == ((0, 1), (2, 3))
    assert parse_replica_groups("{}").groups() == ()
    assert parse_replica_groups("{{0}}").groups() == ((0,),)


def test_replica_groups_iota() -> None:
    plain = parse_replica_groups("[2,4]<=[8]")
    assert plain.iota_shape == (2, 4)
    assert plain.groups() == ((0, 1, 2, 3), (4, 5, 6, 7))
    transposed = parse_replica_groups("[4,2]<=[2,4]T(1,0)")
    assert transposed.groups() == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_replica_groups_mesh() -> None:
    # XLA's MeshAxesReplicaGroupList: the selected axes vary inside a group,
    # the others (in mesh order) pick the group.
    minor = parse_replica_groups("mesh['axis_0'=2,'axis_1'=2] {'axis_1'}")
    assert minor.mesh_axes == (MeshAxis("axis_0", 2), MeshAxis("axis_1", 2))
    assert minor.mesh_selected == ("axis_1",)
    assert minor.groups() == ((0, 1), (2, 3))
    major = parse_replica_groups("mesh['axis_0'=2,'axis_1'=2] {'axis_0'}")
    assert major.groups() == ((0, 2), (1, 3))
    single = parse_replica_groups("mesh['axis_0'=4,'axis_1'=1] {'axis_0'}")
    assert single.groups() == ((0, 1, 2, 3),)


def test_replica_groups_mesh_order_sub_axes_and_device_ids() -> None:
    # Selected axes keep the order written: {'b','a'} puts b major in a group.
    swapped = parse_replica_groups("mesh['a'=2,'b'=2] {'b', 'a'}")
    assert swapped.groups() == ((0, 2, 1, 3),)
    sub = parse_replica_groups("mesh['a'=8] {'a':(2)2}")
    assert sub.mesh_refs == (AxisRef("a", 2, 2),)
    assert sub.groups() == ((0, 2), (1, 3), (4, 6), (5, 7))
    ids = parse_replica_groups("mesh['a'=2,'b'=2], device_ids=(3,2,1,0) {'a'}")
    assert ids.groups() == ((3, 1), (2, 0))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[2,4]<=[4]", "iota has 4 devices"),
        ("[8]<=[8]", "need [num_groups,group_size]"),
        ("{{0,1},{2,3}", "expected ','"),
        ("{{0,x}}", "expected '}'"),
        ("mesh['a'=2] {'b'}", "unknown mesh axis 'b'"),
        ("mesh['a'=2,'b'=1] {'b'}", "more than one device per group"),
        ("groups", "expected replica groups"),
    ],
)
def test_replica_group_errors(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_replica_groups(text)


# --------------------------------------------------------------------------
# Metadata and int lists


def test_metadata_fields() -> None:
    metadata = parse_metadata(
        '{op_type="dot" op_name="jit(f)/dot_general" source_file="/x/y.py" '
        "source_line=12 source_end_line=14 source_column=3 source_end_column=9 "
        "stack_frame_id=4 scheduling_name=\"d.1\" profile_type={1,2} deduplicated_name=\"z\"}"
    )
    assert metadata.op_type == "dot"
    assert metadata.op_name == "jit(f)/dot_general"
    assert metadata.source_file == "/x/y.py"
    assert (metadata.source_line, metadata.source_end_line, metadata.source_column) == (12, 14, 3)
    assert metadata.stack_frame_id == 4
    assert "scheduling_name" in metadata.text


def test_metadata_escapes() -> None:
    metadata = parse_metadata(r'{op_name="say \"hi\"\n\x41\101" source_file="a\\b"}')
    assert metadata.op_name == 'say "hi"\nAA'
    assert metadata.source_file == "a\\b"
    assert parse_metadata("{}").op_name is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{op_name="a"', "expected '}' to end metadata"),
        ("{source_line=x}", "expected an integer for source_line"),
        ("{op_name=3}", "expected a quoted string for op_name"),
        ('{op_name="a"} tail', "unexpected text after metadata"),
        ("{=3}", "expected a metadata attribute name"),
    ],
)
def test_metadata_errors(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_metadata(text)


def test_int_lists() -> None:
    assert parse_int_list("{0,1}") == (0, 1)
    assert parse_int_list("{}") == ()
    assert parse_int_list("{ -1 , 2 }") == (-1, 2)
    assert parse_int_lists("{{0,1},{1,2}}") == ((0, 1), (1, 2))
    assert parse_int_lists("{}") == ()
    assert parse_int_lists("{{}, {3}}") == ((), (3,))
    with pytest.raises(ParseError, match="expected '}'"):
        parse_int_list("{0,1")
    with pytest.raises(ParseError, match="expected '{'"):
        parse_int_lists("{0,1}")


# --------------------------------------------------------------------------
# The corpus (../shared/corpus/xla-hlo, read in place)


def _corpus_lines(shared_dir: Path, *names: str) -> list[str]:
    lines: list[str] = []
    for name in names:
        path = shared_dir / "corpus" / "xla-hlo" / name
        if not path.is_file():
            pytest.skip(f"{path} is absent")
        lines += [line for line in path.read_text().splitlines() if line.strip()]
    return lines


_VALID = ("shardings.valid.txt", "standalone_shardings/shardings.valid.txt")
_INVALID = ("shardings.invalid.txt", "standalone_shardings/shardings.invalid.txt")


@pytest.mark.corpus
def test_corpus_valid_shardings_parse(shared_dir: Path) -> None:
    lines = _corpus_lines(shared_dir, *_VALID)
    failures = []
    for line in lines:
        try:
            parse_sharding(line)
        except ParseError as error:
            failures.append(f"{line}: {error}")
    print(f"parsed {len(lines) - len(failures)}/{len(lines)} corpus shardings")
    assert not failures, "\n".join(failures[:20])


@pytest.mark.corpus
def test_corpus_rejected_shardings_parse_or_raise(shared_dir: Path) -> None:
    # jaxlib 0.10.2 rejects these (unreduced=max{...} is newer syntax); we may
    # accept them, but must never fail with anything but ParseError.
    for line in _corpus_lines(shared_dir, *_INVALID):
        try:
            parse_sharding(line)
        except ParseError:
            pass


# --------------------------------------------------------------------------
# Cross-check against XLA itself (jaxlib's HloSharding), in a subprocess:
# a few HloSharding methods abort the process on v3 shardings.

_XLA_CHECK = r'''
import json, sys
from jaxlib import _hlo
from hlo_doctor.graph.sharding import canonicalize, subgroup_types
from hlo_doctor.hlo.attributes import parse_sharding
from hlo_doctor.hlo.ir import IotaDevices, ShardingKind

T = _hlo.OpSharding_Type
SUBGROUP = {T.REPLICATED: "replicated", T.MANUAL: "manual", T.MAXIMAL: "maximal",
            T.UNREDUCED: "unreduced"}
SIMPLE = {T.REPLICATED: "replicated", T.MANUAL: "manual", T.UNKNOWN: "unknown",
          T.UNREDUCED: "unreduced"}


def xla_view(proto):
    if proto.type == T.TUPLE:
        return ["tuple", [xla_view(e) for e in proto.tuple_shardings]]
    group = ([str(proto.shard_group_type).rsplit(".", 1)[-1].lower(), proto.shard_group_id]
             if proto.is_shard_group else None)
    if proto.type in SIMPLE:
        return [SIMPLE[proto.type], group]
    if proto.type == T.MAXIMAL:
        return ["maximal", list(proto.tile_assignment_devices), group]
    if proto.iota_reshape_dims:
        devices = IotaDevices(tuple(proto.iota_reshape_dims),
                              tuple(proto.iota_transpose_perm)).device_ids()
    else:
        devices = proto.tile_assignment_devices
    subgroups = (["replicated"] if proto.replicate_on_last_tile_dim
                 else [SUBGROUP[t] for t in proto.last_tile_dims])
    return ["tiled", list(proto.tile_assignment_dimensions), list(devices), subgroups, group]


def our_view(sharding):
    s = canonicalize(sharding)
    if s.kind is ShardingKind.TUPLE:
        return ["tuple", [our_view(e) for e in s.tuple_elements]]
    group = None
    if s.shard_group is not None:
        group = [s.shard_group[0].removeprefix("shard_"), s.shard_group[1]]
    if s.kind is ShardingKind.MAXIMAL:
        return ["maximal", [s.maximal_device], group]
    if s.kind is not ShardingKind.TILED:
        return [s.kind.value, group]
    return ["tiled", list(s.tile_assignment.dims), list(s.tile_assignment.device_ids()),
            [t.value for t in subgroup_types(s)], group]


def lowered(x, text):
    # Named (v3) shardings: compare with XLA's own lowering to a tile assignment.
    if "mesh" not in text:
        return x.to_proto()
    if x.to_proto().type == T.TUPLE:
        return None
    return x.v3_to_v2_sharding().to_proto()


results = []
for text in json.load(sys.stdin):
    x = _hlo.HloSharding.from_string(text)
    proto = lowered(x, text)
    if proto is None:
        theirs = ["tuple", [xla_view(e.v3_to_v2_sharding().to_proto()) for e in x.tuple_elements()]]
    else:
        theirs = xla_view(proto)
    ours = our_view(parse_sharding(text))
    results.append(None if ours == theirs else [text, ours, theirs])
json.dump(results, sys.stdout)
'''


@pytest.mark.corpus
def test_corpus_shardings_agree_with_xla(shared_dir: Path) -> None:
    pytest.importorskip("jaxlib")
    import json

    lines = _corpus_lines(shared_dir, *_VALID)
    run = subprocess.run(
        [sys.executable, "-c", _XLA_CHECK],
        input=json.dumps(lines), capture_output=True, text=True, timeout=600,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout)
    mismatches = [r for r in results if r is not None]
    print(f"XLA cross-check: {len(lines) - len(mismatches)}/{len(lines)} shardings agree")
    assert not mismatches, "\n".join(json.dumps(m) for m in mismatches[:10])
