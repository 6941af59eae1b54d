"""Unit tests for each grammar feature of the HLO parser.

The HLO snippets here are hand-written for these unit tests (they are not
compiler output); each exercises one feature of XLA's text format.
"""

from __future__ import annotations

import pytest

from hlo_doctor.hlo import ParseError, Position, parse_module
from hlo_doctor.hlo.shapes import parse_shape


def only_computation(text: str):
    module = parse_module(text)
    return module.computations[-1]


def test_contract_names_opcodes_operands() -> None:
    module = parse_module(
        """HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %ag = f32[8]{0} all-gather(f32[4]{0} %p), replica_groups={{0,1}}, dimensions={0}
  ROOT %s = f32[4]{0} slice(%ag), slice={[0:4]}
}
"""
    )
    (main,) = module.computations
    assert main.name == "main"
    assert [(i.name, i.opcode, i.operands) for i in main.instructions] == [
        ("p", "parameter", ()),
        ("ag", "all-gather", ("p",)),
        ("s", "slice", ("ag",)),
    ]
    assert main.root is main.instructions[-1]
    assert module.entry is main


def test_positions_are_line_and_column_of_the_instruction() -> None:
    comp = only_computation("HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n    ROOT b = f32[] negate(a)\n}\n")
    assert comp.instructions[0].position == Position(3, 3)
    assert comp.instructions[1].position == Position(4, 5)


@pytest.mark.parametrize(
    ("text", "element_type", "dims", "dynamic"),
    [
        ("f32[2,3]{1,0}", "f32", (2, 3), ()),
        ("bf16[]", "bf16", (), ()),
        ("s32[<=4,8]", "s32", (4, 8), (True, False)),
        ("f32[?,2]", "f32", (-1, 2), (True, False)),
        ("pred[7]", "pred", (7,), ()),
        ("token[]", "token", (), ()),
    ],
)
def test_array_shapes(text: str, element_type: str, dims: tuple, dynamic: tuple) -> None:
    shape = parse_shape(text)
    assert (shape.element_type, shape.dims, shape.dynamic) == (element_type, dims, dynamic)


def test_layout_with_tiles_and_memory_space() -> None:
    shape = parse_shape("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}")
    assert shape.layout is not None
    assert shape.layout.minor_to_major == (1, 0)
    assert shape.layout.text == "{1,0:T(8,128)(2,1)S(1)}"
    assert shape.byte_size == 8 * 128 * 2


def test_tuple_shapes_with_index_comments() -> None:
    shape = parse_shape("(f32[2]{0}, /*index=1*/(s32[], token[]), u8[3])")
    assert shape.is_tuple
    assert [str(s) for s in shape.tuple_shapes] == ["f32[2]", "(s32[], token[])", "u8[3]"]
    assert shape.byte_size == 8 + 4 + 3


def test_bad_shape_raises_parse_error_with_column() -> None:
    with pytest.raises(ParseError) as info:
        parse_shape("f32[2,x]")
    assert info.value.col == 7  # points at the x


def test_instruction_without_result_shape_gets_inferred_shape() -> None:
    comp = only_computation(
        "HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  b = s32[] parameter(1)\n"
        "  t = tuple(a, b)\n  ROOT g = get-tuple-element(t), index=1\n}"
    )
    tuple_instruction, gte = comp.instructions[2], comp.instructions[3]
    assert str(tuple_instruction.shape) == "(f32[2], s32[])"
    assert str(gte.shape) == "s32[]"


def test_nested_instruction_operands_become_instructions() -> None:
    comp = only_computation(
        "HloModule m\nENTRY e {\n  ROOT b = f32[4] broadcast(f32[] constant(0)), dimensions={}\n}"
    )
    assert [i.opcode for i in comp.instructions] == ["constant", "broadcast"]
    assert comp.instructions[1].operands == (comp.instructions[0].name,)
    assert comp.instructions[0].literal == "0"


def test_comments_anywhere_and_one_line_computation() -> None:
    module = parse_module(
        "HloModule m /* header */\n// a line comment\nadd { x = f32[] parameter(0) y = f32[] parameter(1) "
        "ROOT r = f32[] add(x, /* inline */ y) }\nENTRY e { // comment\n  p = f32[] parameter(0)\n"
        "  ROOT c = f32[] call(p, p), to_apply=add\n}"
    )
    assert [c.name for c in module.computations] == ["add", "e"]
    assert module.computations[0].instructions[2].operands == ("x", "y")
    assert module.computations[1].instructions[1].called_computations == ("add",)


def test_root_not_last_and_execution_thread_trailer() -> None:
    module = parse_module(
        "HloModule m\nasync_comp {\n  ROOT r = f32[] negate(p)\n  p = f32[] parameter(0)\n}, "
        'execution_thread="parallel"\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}'
    )
    comp = module.computations[0]
    assert comp.root is not None and comp.root.name == "r"
    assert comp.execution_thread == "parallel"


def test_inline_called_computation_body() -> None:
    module = parse_module(
        "HloModule m\nENTRY e {\n  a = f32[4] parameter(0)\n"
        "  ROOT f = f32[4] fusion(a), kind=kLoop, calls={\n"
        "    x = f32[4] parameter(0)\n    ROOT n = f32[4] negate(x)\n  }\n}"
    )
    assert len(module.computations) == 2
    fused, entry = module.computations
    assert [i.opcode for i in fused.instructions] == ["parameter", "negate"]
    assert entry.instructions[1].called_computations == (fused.name,)
    assert entry.instructions[1].attribute("kind") == "kLoop"


def test_async_sugar_becomes_async_start_with_wrapped_computation() -> None:
    module = parse_module(
        "HloModule m\ndouble {\n  p = f32[2] parameter(0)\n  ROOT a = f32[2] add(p, p)\n}\n"
        "ENTRY e {\n  p0 = f32[2] parameter(0)\n"
        "  s = ((f32[2]), f32[2], s32[]) fusion-start(p0), kind=kLoop, calls=double\n"
        "  ROOT d = f32[2] fusion-done(s)\n}"
    )
    entry = module.entry
    assert entry is not None
    start, done = entry.instructions[1], entry.instructions[2]
    assert (start.opcode, start.printed_opcode) == ("async-start", "fusion-start")
    assert (done.opcode, done.printed_opcode) == ("async-done", "fusion-done")
    wrapped = module.computation(start.called_computations[0])
    assert wrapped is not None
    assert [i.opcode for i in wrapped.instructions] == ["parameter", "fusion"]
    assert wrapped.instructions[-1].called_computations == ("double",)
    assert done.called_computations == start.called_computations


def test_dedicated_async_collectives_keep_their_opcode() -> None:
    comp = only_computation(
        "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n"
        "  s = (f32[4], f32[8]) all-gather-start(p), replica_groups=[1,2]<=[2], dimensions={0}\n"
        "  ROOT d = f32[8] all-gather-done(s)\n}"
    )
    assert [i.opcode for i in comp.instructions] == ["parameter", "all-gather-start", "all-gather-done"]


@pytest.mark.parametrize(
    "literal",
    ["-nan(0x7f)", "{...}", "{ (1, 2), (3, -4.5) }", "{ {1, 2}, {3, 4} }", "true", "inf", "-inf"],
)
def test_constant_literals(literal: str) -> None:
    comp = only_computation(f"HloModule m\nENTRY e {{\n  ROOT c = f32[2,2] constant({literal})\n}}")
    assert comp.instructions[0].literal == literal


def test_attribute_languages_are_kept_as_raw_text() -> None:
    comp = only_computation(
        "HloModule m\nENTRY e {\n  a = f32[1,8,8,3] parameter(0)\n  k = f32[3,3,3,4] parameter(1)\n"
        "  ROOT c = f32[1,8,8,4] convolution(a, k), window={size=3x3 pad=1_1x1_1}, "
        'dim_labels=b01f_01io->b01f, backend_config="{\\"x\\":{\\"y\\":1}}", '
        "frontend_attributes={_xla_a=\"1\",b=\"2\"}, future_attribute=[1,2]<=[2]\n}"
    )
    conv = comp.instructions[2]
    assert conv.attribute("window") == "{size=3x3 pad=1_1x1_1}"
    assert conv.attribute("dim_labels") == "b01f_01io->b01f"
    assert conv.attribute("backend_config") == '"{\\"x\\":{\\"y\\":1}}"'
    assert conv.attribute("future_attribute") == "[1,2]<=[2]"


def test_braced_backend_config_and_replica_group_spellings() -> None:
    comp = only_computation(
        "HloModule m\nENTRY e {\n  p = f32[8] parameter(0)\n"
        "  a = f32[8] all-reduce(p), replica_groups=mesh['a'=2,'b'=4] {'a'}, to_apply=add, "
        "backend_config={flag: true}\n"
        "  ROOT b = f32[8] all-reduce(a), replica_groups=[2,4]<=[4,2]T(1,0), channel_id=7, to_apply=add\n}"
    )
    first, second = comp.instructions[1], comp.instructions[2]
    assert first.attribute("replica_groups") == "mesh['a'=2,'b'=4] {'a'}"
    assert first.attribute("backend_config") == "{flag: true}"
    assert second.attribute("replica_groups") == "[2,4]<=[4,2]T(1,0)"
    assert second.channel_id == 7


def test_stack_frame_tables_resolve_whole_chain() -> None:
    module = parse_module(
        """HloModule m

FileNames
1 "/home/me/train.py"
2 "/site-packages/jax/_src/api.py"

FunctionNames
1 "loss"
2 "jit_wrapper"

FileLocations
1 {file_name_id=1 function_name_id=1 line=42 end_line=42 column=7 end_column=20}
2 {file_name_id=2 function_name_id=2 line=100 end_line=100 column=1 end_column=2}

StackFrames
1 {file_location_id=2 parent_frame_id=0}
2 {file_location_id=1 parent_frame_id=1}

ENTRY e {
  ROOT p = f32[] parameter(0), metadata={op_name="jit(f)/x" stack_frame_id=2}
}
"""
    )
    instruction = module.entry.instructions[0]  # type: ignore[union-attr]
    assert module.frame_tables is not None
    frames = module.frame_tables.resolve(2)
    assert [(f.file, f.function, f.line) for f in frames] == [
        ("/home/me/train.py", "loss", 42),
        ("/site-packages/jax/_src/api.py", "jit_wrapper", 100),
    ]
    assert instruction.attribute("metadata") == '{op_name="jit(f)/x" stack_frame_id=2}'


@pytest.mark.parametrize(
    ("text", "line", "col", "fragment"),
    [
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n", 4, 1, "missing '}'"),
        ("HloModule m\nENTRY e {\n  a = f32[2 parameter(0)\n}", 3, 7, "shape"),
        ("HloModule m\nENTRY e {\n  a = f32[2] frobnicate(b)\n}", 3, 14, "unknown opcode"),
        ("HloModule m\nENTRY e {\n  ROOT a = f32[2] negate(nope)\n}", 3, 3, "not defined"),
        ("HloModule m\nENTRY e {\n  a = f32[2] parameter(0), sharding={replicated", 3, 37, "'{'"),
        ("ENTRY e {}", 1, 1, "HloModule"),
        ("HloModule m\n", 2, 1, "no computations"),
        ("HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n  a = f32[] parameter(1)\n}", 4, 3, "already defined"),
        ("HloModule m\nENTRY e {\n  ROOT a = f32[] parameter(0)\n  ROOT b = f32[] negate(a)\n}", 4, 3, "ROOT"),
    ],
)
def test_malformed_text_raises_parse_error_at_line_col(text: str, line: int, col: int, fragment: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_module(text, path="x.txt")
    error = info.value
    assert (error.line, error.col) == (line, col), str(error)
    assert fragment in error.message
    assert str(error).startswith(f"x.txt:{line}:{col}: ")
    excerpt = error.excerpt()
    if excerpt:
        assert excerpt.splitlines()[-1] == " " * (col - 1) + "^"


def test_parse_error_on_a_huge_single_line_keeps_the_excerpt_short() -> None:
    text = "HloModule m\nENTRY e { a = f32[] parameter(0) " + "x" * 200_000 + " }"
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert len(info.value.excerpt()) < 1000


def test_stack_frames_with_xla_off_by_one_parent_ids() -> None:
    # jaxlib 0.10.2 prints parent_frame_id one higher than the parent's id, so a
    # root frame names itself; the parser reads such tables as parent - 1.
    module = parse_module(
        """HloModule m

FileNames
1 "/home/me/train.py"

FunctionNames
1 "<module>"
2 "main"
3 "mlp"

FileLocations
1 {file_name_id=1 function_name_id=1 line=52 end_line=52 column=4 end_column=4}
2 {file_name_id=1 function_name_id=2 line=48 end_line=48 column=4 end_column=4}
3 {file_name_id=1 function_name_id=3 line=43 end_line=43 column=16 end_column=16}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}

ENTRY e {
  ROOT p = f32[] parameter(0), metadata={op_name="x" stack_frame_id=3}
}
"""
    )
    source = module.entry.instructions[0].source  # type: ignore[union-attr]
    assert source is not None
    assert [(f.function, f.line) for f in source.frames] == [("mlp", 43), ("main", 48), ("<module>", 52)]
    assert (source.file, source.line, source.function) == ("/home/me/train.py", 43, "mlp")


def test_mesh_replica_groups_with_device_ids() -> None:
    # As XLA:GPU prints them for jax.make_mesh((2, 8)) on 2 hosts x 8 GPUs.
    for separator in ("\n", "\n  // comment\n"):
        comp = only_computation(
            "HloModule m\nENTRY e {\n  p = f32[8] parameter(0)" + separator
            + "  ROOT a = f32[8] all-reduce(p), channel_id=1, replica_groups=mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], "
            "device_ids=([2,8]T(1,0)) {'axis_0'}, use_global_device_ids=true, to_apply=add\n}"
        )
        all_reduce = comp.instructions[1]
        assert all_reduce.attribute("replica_groups") == (
            "mesh['axis_0'=8,'axis_1'=1,'axis_2'=2], device_ids=([2,8]T(1,0)) {'axis_0'}"
        )
        assert all_reduce.replica_groups.groups() == (tuple(range(8)), tuple(range(8, 16)))
        assert all_reduce.attribute("use_global_device_ids") == "true"
