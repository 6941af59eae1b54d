"""The computation being parsed (:class:`_Scope`), and what the parser infers for it."""

from __future__ import annotations

from hlo_doctor.hlo.ir import Computation, Instruction, Position, Shape

__all__ = ["LITERAL_OPCODES", "UNKNOWN_SHAPE", "infer_shape", "make_computation"]

# Ops that take a literal, not operands, between their parentheses.
LITERAL_OPCODES = frozenset({"constant", "parameter"})
# Ops whose result shape XLA infers as "same as operand 0" when the text omits it.
_SAME_AS_OPERAND = frozenset(
    {
        "abs", "add", "and", "atan2", "cbrt", "ceil", "copy", "cosine", "divide",
        "exponential", "exponential-minus-one", "floor", "log", "log-plus-one",
        "logistic", "maximum", "minimum", "multiply", "negate", "not", "or", "power",
        "remainder", "round-nearest-even", "rsqrt", "sign", "sine", "sqrt", "subtract",
        "tan", "tanh", "xor", "opt-barrier", "all-reduce", "collective-permute",
        "bitcast", "reduce-precision", "clamp", "select",
    }
)
UNKNOWN_SHAPE = Shape("unknown")


class _Scope:
    """Instructions of the computation being parsed, in order."""

    __slots__ = ("instructions", "by_name", "async_starts", "roots", "unresolved")

    def __init__(self) -> None:
        self.instructions: list[Instruction] = []
        self.by_name: dict[str, Instruction] = {}
        self.async_starts: dict[str, tuple[str, ...]] = {}
        self.roots: list[Instruction] = []
        # Whether an operand may name something not defined before it (the parser's fast path
        # clears nothing: it sets this when a name it reads is not yet defined; the general path
        # always sets it). The computation's operands are checked at its end only then.
        self.unresolved = False

    def shape_of(self, name: str) -> Shape:
        instruction = self.by_name.get(name)
        return instruction.shape if instruction is not None else UNKNOWN_SHAPE

    def add(self, instruction: Instruction) -> None:
        self.unresolved = True
        self.instructions.append(instruction)
        self.by_name[instruction.name] = instruction
        if instruction.is_root:
            self.roots.append(instruction)


def make_computation(
    name: str,
    scope: _Scope,
    position: Position,
    is_entry: bool,
    parameter_shapes: tuple[Shape, ...],
    execution_thread: str | None,
) -> Computation:
    return Computation(
        name=name,
        instructions=tuple(scope.instructions),
        position=position,
        is_entry=is_entry,
        parameter_shapes=parameter_shapes,
        execution_thread=execution_thread,
        by_name=scope.by_name,
    )


def infer_shape(
    opcode: str, operands: tuple[str, ...], attributes: list[tuple[str, str]], scope: _Scope
) -> Shape:
    """The shape XLA would infer for an instruction written without one."""
    shapes = [scope.shape_of(o) for o in operands]
    if opcode == "tuple":
        return Shape("tuple", tuple_shapes=tuple(shapes))
    if opcode == "get-tuple-element" and shapes and shapes[0].is_tuple:
        for key, value in attributes:
            if key == "index" and value.isdigit() and int(value) < len(shapes[0].tuple_shapes):
                return shapes[0].tuple_shapes[int(value)]
    if opcode in _SAME_AS_OPERAND and shapes:
        return shapes[-1] if opcode == "select" else shapes[0]
    return UNKNOWN_SHAPE
