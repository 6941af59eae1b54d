"""Sugared async ops (``all-gather-start`` and friends written without an ``async-start``):
the part of :class:`~hlo_doctor.hlo.parser.Parser` that builds the wrapped computation XLA would."""

from __future__ import annotations

from hlo_doctor.hlo.frame_tables import FrameTableReader
from hlo_doctor.hlo.ir import Computation, Instruction, Position, Shape
from hlo_doctor.hlo.opcodes import ASYNC_SUFFIXES, DEDICATED_ASYNC, OPCODES
from hlo_doctor.hlo.scope import _Scope, make_computation

__all__ = ["AsyncSugarReader"]

# Attributes that stay on the async-start wrapper; the others go to the wrapped op.
_ASYNC_WRAPPER_KEYS = frozenset({"async_execution_thread", "async_group_id", "metadata", "backend_config"})


class AsyncSugarReader(FrameTableReader):
    """Desugars ``<op>-start`` / ``-update`` / ``-done`` into async-start and a wrapped computation."""

    computations: list[Computation]

    def synthetic_computation_name(self, base: str) -> str:  # pragma: no cover - Parser's
        raise NotImplementedError

    def position(self, offset: int) -> Position:  # pragma: no cover - Parser's
        raise NotImplementedError

    def desugar_async(self, opcode: str, offset: int) -> tuple[str, str]:
        for suffix, async_opcode in ASYNC_SUFFIXES:
            wrapped = opcode[: -len(suffix)]
            if opcode.endswith(suffix) and wrapped in OPCODES and wrapped not in DEDICATED_ASYNC:
                return async_opcode, opcode
        raise self.error(f"unknown opcode '{opcode}'", offset)

    def wrap_async(
        self,
        scope: _Scope,
        name: str,
        opcode: str,
        printed_opcode: str,
        shape: Shape,
        operands: tuple[str, ...],
        attributes: list[tuple[str, str]],
        called: tuple[str, ...],
    ) -> tuple[str, ...]:
        """Sugared ``<op>-start``: build the wrapped computation XLA would build."""
        if opcode != "async-start":
            # -update / -done continue the chain of their operand.
            for operand in operands:
                if operand in scope.async_starts:
                    scope.async_starts[name] = scope.async_starts[operand]
                    return scope.async_starts[operand]
            return called
        wrapped_opcode = printed_opcode[: -len("-start")]
        inner = _Scope()
        params = []
        for index, operand in enumerate(operands):
            param_name = f"{name}.async_param.{index}"
            operand_shape = scope.shape_of(operand)
            inner.add(
                Instruction(
                    name=param_name,
                    opcode="parameter",
                    shape=operand_shape,
                    operands=(),
                    offset=self.pos,
                    origin=self.origin,
                    literal=str(index),
                )
            )
            params.append(param_name)
        result_shape = shape.tuple_shapes[1] if shape.is_tuple and len(shape.tuple_shapes) > 1 else shape
        inner_attributes = [(k, v) for k, v in attributes if k not in _ASYNC_WRAPPER_KEYS]
        inner.add(
            Instruction(
                name=f"{name}.async_op",
                opcode=wrapped_opcode,
                shape=result_shape,
                operands=tuple(params),
                offset=self.pos,
                origin=self.origin,
                is_root=True,
                raw_attributes=tuple(inner_attributes),
                called=called,
            )
        )
        wrapped_name = self.synthetic_computation_name(f"{name}.async_wrapped")
        self.computations.append(
            make_computation(wrapped_name, inner, self.position(self.pos), False, (), None)
        )
        scope.async_starts[name] = (wrapped_name,)
        return (wrapped_name,)
