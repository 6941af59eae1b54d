"""The shortcuts the analyses take for speed give what the long way gives.

The attribute texts here are written by hand (each says what it exercises); the
corpus conformance test holds the parser as a whole to XLA's view.
"""

from __future__ import annotations

import pytest

from hlo_doctor.graph.dataflow import bitset_interner, set_bits
from hlo_doctor.hlo import parse_module
from hlo_doctor.hlo.errors import ParseError
from hlo_doctor.hlo.fast_path import scan_attribute, scan_attributes
from hlo_doctor.hlo.ir import Instruction, new_instruction
from hlo_doctor.hlo.parser import split_attributes
from hlo_doctor.semantics.roles import _numbers
from tests.corpus import CORPUS, corpus_files

ATTRIBUTE_TEXTS = [
    # the common form: sharding first, metadata last
    ', sharding={devices=[4,2]<=[8]}, metadata={op_name="jit(f)/dot" source_file="m.py" source_line=3}',
    # a key that also appears inside a later value
    ', dimensions={0}, frontend_attributes={sharding="x",dimensions="y"}',
    # a key inside a string before the real one
    ', metadata={op_name="sharding=bad"}, sharding={replicated}',
    # a comment between attributes: not the common form, so the whole text is split
    ', dimensions={1} /*c*/, sharding={maximal device=0}',
    # odd spacing
    ',dimensions={1},  sharding={replicated}',
    # a value the fast regex cannot delimit: more text follows the bare token
    ', custom_call_target="foo", backend_config="{}", dimensions={0,1}',
    # nothing
    '',
]
KEYS = ["sharding", "dimensions", "metadata", "frontend_attributes", "custom_call_target", "absent"]


@pytest.mark.parametrize("text", ATTRIBUTE_TEXTS)
@pytest.mark.parametrize("key", KEYS)
def test_scan_attribute_agrees_with_the_whole_split(text: str, key: str) -> None:
    expected = dict(reversed(split_attributes(text))).get(key)  # the first occurrence wins
    known, value = scan_attribute(text, key)
    if known:
        assert value == expected
    # else: the caller splits the whole text, which is the expected value by definition


@pytest.mark.parametrize("text", ATTRIBUTE_TEXTS)
def test_scan_attributes_agrees_with_one_scan_per_key(text: str) -> None:
    for count in range(1, len(KEYS) + 1):
        keys = tuple(KEYS[:count])
        found = scan_attributes(text, keys)
        for key in keys:
            known, value = scan_attribute(text, key)
            if key in found:
                assert known and found[key] == value
            else:  # left to the split, as the one-key scan leaves it
                assert not known


def test_scan_attributes_stops_at_the_first_stretch_not_in_the_common_form() -> None:
    text = ", dimensions={1}, sharding={maximal device=0} /*c*/, metadata={}"
    assert scan_attributes(text, ("dimensions", "sharding", "metadata")) == {"dimensions": "{1}"}
    assert scan_attributes(", dimensions={0}", ("dimensions", "sharding")) == {"dimensions": "{0}", "sharding": None}


def test_scan_attribute_stops_short_of_a_malformed_tail() -> None:
    known, value = scan_attribute(", sharding={replicated}, metadata={op_name=", "sharding")
    assert (known, value) == (True, "{replicated}")
    assert scan_attribute(", metadata={op_name=", "sharding") == (False, None)


def test_instruction_attributes_read_in_any_order_agree_with_their_split() -> None:
    # a hand-written module: reads of one instruction's attributes in a row share one split
    module = parse_module(
        "HloModule m\n\nENTRY %e (p: f32[8,4]) -> f32[4,8] {\n"
        '  %p = f32[8,4]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}, metadata={op_name="x"}\n'
        '  ROOT %t = f32[4,8]{1,0} transpose(%p), dimensions={1,0}, sharding={devices=[1,2]<=[2]}, '
        'metadata={op_name="jit(f)/transpose" source_line=7}\n}\n'
    )
    entry = module.entry
    assert entry is not None
    for instruction in entry.instructions:
        pairs = dict(instruction.attributes)
        for key in ("metadata", "sharding", "dimensions", "absent", "sharding"):
            assert instruction.attribute(key) == pairs.get(key)
        assert dict(instruction.attributes) == pairs
        keys = ("dimensions", "absent", "metadata", "sharding")
        instruction.origin._split_offset = -1
        assert instruction.attributes_of(keys) == tuple(pairs.get(key) for key in keys)


def test_new_instruction_is_the_dataclass_instruction() -> None:
    module = parse_module("HloModule m\n\nENTRY %e {\n  ROOT %c = f32[] constant(1)\n}\n")
    made = module.entry.instructions[0]  # type: ignore[union-attr]
    fields = dict(name=made.name, opcode=made.opcode, shape=made.shape, operands=made.operands, offset=made.offset,
                  origin=made.origin, is_root=made.is_root, raw_attributes=made.raw_attributes, literal=made.literal)
    built = Instruction(**fields)
    fast = new_instruction(*fields.values())
    assert fast == built and hash(fast) == hash(built) and repr(fast) == repr(built)
    assert fast.called is None and fast.printed_opcode is None


def test_bitset_interner_shares_equal_bitsets_and_keeps_tuples() -> None:
    intern = bitset_interner()
    wide = 1 << 5000 | 1
    first = intern(wide)
    again = intern((1 << 5000) | 1)  # equal, another object
    assert again is first
    assert intern(first) is first
    pair = intern((wide, 3))
    assert pair == (wide, 3) and pair[0] is first


@pytest.mark.parametrize("bits", [0, 1, 0b1011, 1 << 700 | 1 << 3, (1 << 300) - 1])
def test_set_bits_ascending(bits: int) -> None:
    expected = [i for i in range(bits.bit_length()) if bits >> i & 1]
    assert set_bits(bits) == expected
    assert _numbers(bits) == frozenset(expected)


def _corpus_modules():  # noqa: ANN202 - (path, HloModule) pairs
    """Every module of the valid corpus that parses."""
    for path in corpus_files("valid"):
        try:
            yield path, parse_module(path.read_text(), path=str(path))
        except ParseError:
            continue


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/xla-hlo is absent")
def test_scan_path_agrees_with_the_split_on_every_corpus_attribute() -> None:
    """Every attribute of every instruction of the valid corpus (and three keys it may lack),
    read through the scan from the line's start, is what the whole split gives."""
    disagree, reads = [], 0
    for path, module in _corpus_modules():
        for computation in module.computations:
            for instruction in computation.instructions:
                try:
                    pairs = instruction.attributes
                except ParseError:
                    continue
                first: dict[str, str] = {}
                for key, value in pairs:
                    first.setdefault(key, value)
                keys = [*first, "sharding", "dimensions", "not_an_attribute"]
                for key in keys:
                    instruction.origin._split_offset = -1  # the one-entry cache would answer instead
                    reads += 1
                    if instruction.attribute(key) != first.get(key):
                        disagree.append(f"{path.name}: {instruction.name} {key}")
                instruction.origin._split_offset = -1
                if instruction.attributes_of(tuple(keys)) != tuple(first.get(key) for key in keys):
                    disagree.append(f"{path.name}: {instruction.name} {keys} in one pass")
    assert reads > 100_000
    assert not disagree, disagree[:5]


def test_the_entry_line_is_found_where_the_multi_line_regex_finds_it() -> None:
    """parse_entry_parameters finds the ENTRY line with str.find; ``^ENTRY[ \\t]`` (re.M) is the definition."""
    import random
    import re

    from hlo_doctor.hlo.parser import _entry_line_start

    definition = re.compile(r"^ENTRY[ \t]", re.M)
    rng = random.Random(0)
    texts = ["ENTRY e {", "ENTRYx\nENTRY\tf", "x\nENTRY", "", "ENTRY", "ENTRY\nENTRY e", "x\nENTRYENTRY e\nENTRY\te"]
    texts += ["".join(rng.choice(["ENTRY", "\n", " ", "\t", "x"]) for _ in range(rng.randint(0, 8))) for _ in range(5000)]
    for text in texts:
        found = definition.search(text)
        assert _entry_line_start(text) == (found.start() if found else -1), repr(text)


def test_a_position_counted_is_the_position_indexed() -> None:
    """The first few positions are counted (no line index): they must be what the index gives."""
    from hlo_doctor.hlo.ir import ModuleText

    text = "HloModule m\n\nENTRY %e {\n  %p = f32[2] parameter(0)\n\n  ROOT %r = f32[2] negate(%p)\n}\n"
    indexed = ModuleText(text)
    indexed._newline_index()
    for offset in range(len(text) + 1):
        assert ModuleText(text).position(offset) == indexed.position(offset), offset
    counted = ModuleText(text)
    assert [counted.position(o) for o in range(len(text))] == [indexed.position(o) for o in range(len(text))]
    assert counted._newlines is not None  # after a few, the index is made


def test_sorted_parameters_are_made_once_and_handed_out_as_new_lists() -> None:
    module = parse_module("HloModule m\n\nENTRY %e {\n  %b = f32[] parameter(1)\n  %a = f32[] parameter(0)\n"
                          "  ROOT %s = f32[] add(%a, %b)\n}\n")
    entry = module.entry
    assert entry is not None
    first = entry.parameters()
    assert [p.name for p in first] == ["a", "b"]
    first.clear()
    assert [p.name for p in entry.parameters()] == ["a", "b"] and entry.sorted_parameters is not None


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/xla-hlo is absent")
def test_attribute_of_each_is_attribute_read_one_at_a_time_on_the_corpus() -> None:
    from hlo_doctor.hlo.ir import attribute_of_each

    disagree, reads = [], 0
    for path, module in _corpus_modules():
        for computation in module.computations:
            for key in ("sharding", "dimensions", "metadata", "to_apply", "not_an_attribute"):
                try:
                    expected = [instruction.attribute(key) for instruction in computation.instructions]
                except ParseError:
                    continue
                for instruction in computation.instructions:
                    instruction.origin._split_offset = -1
                reads += len(expected)
                if attribute_of_each(computation.instructions, key) != expected:
                    disagree.append(f"{path.name}: {computation.name} {key}")
    assert reads > 100_000
    assert not disagree, disagree[:5]
