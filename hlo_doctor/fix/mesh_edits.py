"""The ``mesh`` edit: reorder a mesh's axes, change its shape, or put its devices in host order.

Understood constructions (the call on the line):

* ``jax.make_mesh(shape, names)``, ``keras.distribution.DeviceMesh(shape, axis_names, ...)``,
  ``xs.Mesh(device_ids, shape, names)``: the shape tuple and the names are rewritten;
* ``Mesh(devices.reshape(a, b), names)`` (also ``np.array(...).reshape((a, b))``,
  ``mesh_utils.create_device_mesh((a, b))``): the reshape's sizes and the names;
* ``xs.HybridMesh(ici_mesh_shape=..., dcn_mesh_shape=..., axis_names=...)``: both shapes are
  permuted with the names (a new shape is refused: it has to be split between ICI and DCN).

``details["axis_names"]``, a permutation of today's names, permutes the sizes with them, keeping
what the program wrote for each (``n // 2`` stays ``n // 2``); ``details["shape"]`` is written as
numbers only where the sizes are literal or no permutation says where they go.
``details["device_order"] == "host-major"`` removes a transpose (``.T``, ``.transpose(...)``,
``np.transpose(...)``) of the devices, permuting the reshape so that the mesh keeps its shape.
Refused: no mesh construction on the line, names or shapes that are not literal, a rank that does
not match, and a mesh that is already as asked.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.locate import MESH_CONSTRUCTORS, CannotEdit, Source, dotted, is_literal, literal
from hlo_doctor.fix.specs import axes_code

__all__ = ["mesh"]

_code = cst.Module([]).code_for_node
_TRANSPOSE_FUNCTIONS = ("np.transpose", "numpy.transpose", "jnp.transpose", "onp.transpose")


def _arg(call: cst.Call, index: int, *keywords: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in keywords:
            return arg
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[index] if index < len(positional) else None


class _Sizes:
    """A list of size expressions written somewhere (a tuple literal, or a call's arguments)."""

    def __init__(self, node: cst.CSTNode, values: Sequence[cst.BaseExpression]):
        self.node, self.values = node, list(values)

    @classmethod
    def of(cls, node: cst.BaseExpression) -> _Sizes:
        if isinstance(node, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement)
                                                                for e in node.elements):
            return cls(node, [e.value for e in node.elements])
        raise CannotEdit(f"the mesh shape {_code(node)} is not a literal tuple")

    def rebuilt(self, values: Sequence[cst.BaseExpression]) -> cst.CSTNode:
        node = self.node
        if isinstance(node, (cst.Tuple, cst.List)):
            elements = list(node.elements)
            if len(values) != len(elements):
                text = ", ".join(_code(v) for v in values)
                return cst.parse_expression(f"({text},)" if len(values) == 1 else f"({text})")
            return node.with_changes(elements=[e.with_changes(value=v) for e, v in zip(elements, values, strict=True)])
        assert isinstance(node, cst.Call)  # reshape(a, b): positional sizes
        args = [a for a in node.args]
        if len(values) != len(args):
            parsed = cst.parse_expression(f"f({', '.join(_code(v) for v in values)})")
            assert isinstance(parsed, cst.Call)
            return node.with_changes(args=parsed.args)
        return node.with_changes(args=[a.with_changes(value=v) for a, v in zip(args, values, strict=True)])


def _reshape_sizes(call: cst.Call) -> _Sizes:
    """``x.reshape(a, b)`` / ``x.reshape((a, b))`` / ``create_device_mesh((a, b))``."""
    if len(call.args) == 1 and isinstance(call.args[0].value, (cst.Tuple, cst.List)):
        return _Sizes.of(call.args[0].value)
    if any(a.keyword is not None or a.star for a in call.args):
        raise CannotEdit(f"the reshape {_code(call)} is not literal enough")
    return _Sizes(call, [a.value for a in call.args])


def _devices_sizes(devices: cst.BaseExpression) -> tuple[_Sizes | None, cst.BaseExpression | None, list[int] | None]:
    """For Mesh(devices, names): (the sizes, the transposed expression, its permutation)."""
    transposed: cst.BaseExpression | None = None
    perm: list[int] | None = None
    inner = devices
    if isinstance(devices, cst.Attribute) and devices.attr.value == "T":
        transposed, inner = devices, devices.value
    elif isinstance(devices, cst.Call) and isinstance(devices.func, cst.Attribute) and \
            devices.func.attr.value == "transpose" and dotted(devices.func) not in _TRANSPOSE_FUNCTIONS:
        transposed, inner = devices, devices.func.value
        perm = _perm(devices.args)
    elif isinstance(devices, cst.Call) and dotted(devices.func) in _TRANSPOSE_FUNCTIONS and devices.args:
        transposed, inner = devices, devices.args[0].value
        perm = _perm(devices.args[1:])
    if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value == "reshape":
        return _reshape_sizes(inner), transposed, perm
    if isinstance(inner, cst.Call) and (dotted(inner.func) or "").rsplit(".", 1)[-1] in (
            "create_device_mesh", "create_hybrid_device_mesh") and inner.args:
        if (dotted(inner.func) or "").endswith("create_hybrid_device_mesh"):
            raise CannotEdit("the mesh's devices come from create_hybrid_device_mesh: change its shapes by hand")
        return _Sizes.of(inner.args[0].value), transposed, perm
    return None, transposed, perm


def _perm(args: Sequence[cst.Arg]) -> list[int] | None:
    values = [literal(a.value) for a in args]
    if len(values) == 1 and isinstance(values[0], tuple):
        values = list(values[0])
    if not values:
        return None
    if not all(isinstance(v, int) for v in values):
        raise CannotEdit("the devices' transpose is not literal")
    return [v for v in values if isinstance(v, int)]


def _names(node: cst.BaseExpression | None) -> tuple[str, ...]:
    value = literal(node) if node is not None else None
    if isinstance(value, str):
        return (value,)
    if not is_literal(value) or not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise CannotEdit("the mesh's axis names are not a literal tuple of strings")
    return tuple(str(v) for v in value)


def _names_node(old: cst.BaseExpression, names: Sequence[str], quote: str) -> cst.BaseExpression:
    if isinstance(old, (cst.Tuple, cst.List)) and len(old.elements) == len(names):
        return old.with_changes(elements=[e.with_changes(value=cst.parse_expression(axes_code(n, quote)))
                                          for e, n in zip(old.elements, names, strict=True)])
    text = ", ".join(axes_code(n, quote) for n in names)
    if isinstance(old, cst.List):
        return cst.parse_expression(f"[{text}]")
    return cst.parse_expression(f"({text},)" if len(names) == 1 else f"({text})")


def _construction(source: Source, line: int) -> cst.Call:
    calls = source.calls_on(line, *MESH_CONSTRUCTORS)
    if not calls:
        raise CannotEdit(f"line {line} builds no mesh (Mesh, jax.make_mesh, xs.Mesh, xs.HybridMesh, DeviceMesh)")
    if len(calls) > 1:
        raise CannotEdit(f"line {line} builds {len(calls)} meshes: which one is meant is ambiguous")
    return calls[0]


def mesh(source: Source, edit: SourceEdit, line: int) -> tuple[dict, None, str]:
    call = _construction(source, line)
    kind = (dotted(call.func) or "").rsplit(".", 1)[-1]
    details = dict(edit.details)
    quote = source.quote()
    new_names = tuple(details["axis_names"]) if details.get("axis_names") else None
    new_shape = tuple(int(s) for s in details["shape"]) if details.get("shape") else None
    host_major = details.get("device_order") == "host-major"
    if new_names is None and new_shape is None and not host_major:
        raise CannotEdit("the mesh edit gives no axis names, shape or device order")
    changes: dict = {}
    if kind == "HybridMesh":
        return _hybrid(source, call, new_names, new_shape, host_major, quote)
    if kind == "Mesh" and not _is_xs_mesh(source, call):  # jax.sharding.Mesh(devices, names)
        names_arg = _arg(call, 1, "axis_names")
        devices_arg = _arg(call, 0, "devices")
        if names_arg is None or devices_arg is None:
            raise CannotEdit(f"the mesh on line {line} does not write its devices and axis names")
        sizes, transposed, perm = _devices_sizes(devices_arg.value)
    else:  # make_mesh(shape, names), DeviceMesh(shape, names), xs.Mesh(ids, shape, names)
        shape_index = 1 if kind == "Mesh" else 0
        shape_arg = _arg(call, shape_index, "mesh_shape", "shape", "axis_shapes")
        names_arg = _arg(call, shape_index + 1, "axis_names")
        if shape_arg is None or names_arg is None:
            raise CannotEdit(f"the mesh on line {line} does not write its shape and axis names")
        sizes, transposed, perm = _Sizes.of(shape_arg.value), None, None
    old_names = _names(names_arg.value)
    values = list(sizes.values) if sizes is not None else None
    notes = []
    if host_major:
        if transposed is None:
            raise CannotEdit(f"the mesh's devices on line {line} are not transposed: cannot tell the host order")
        if values is None:
            raise CannotEdit(f"the transposed devices on line {line} have no literal reshape")
        order = perm or list(reversed(range(len(values))))
        values = [values[i] for i in order]
        if isinstance(transposed, cst.Attribute):
            untransposed = transposed.value
        elif isinstance(transposed, cst.Call) and dotted(transposed.func) in _TRANSPOSE_FUNCTIONS:
            untransposed = transposed.args[0].value
        elif isinstance(transposed, cst.Call) and isinstance(transposed.func, cst.Attribute):
            untransposed = transposed.func.value
        else:  # pragma: no cover - _devices_sizes only finds these three
            raise CannotEdit("the devices' transpose is not understood")
        inner_sizes = sizes
        assert inner_sizes is not None
        replaced_inner = untransposed.deep_replace(inner_sizes.node, inner_sizes.rebuilt(values))
        changes[transposed] = replaced_inner
        notes.append("devices in host order (no transpose)")
        sizes = None  # written through the transpose's replacement
    names = old_names
    if new_names is not None and new_names != old_names:
        if sorted(new_names) == sorted(old_names):
            permutation = list(details.get("permutation") or [old_names.index(n) for n in new_names])
            if [old_names[i] for i in permutation] != list(new_names):
                raise CannotEdit(f"the permutation {tuple(permutation)} does not take {old_names} to {new_names}")
            if values is not None:
                values = [values[i] for i in permutation]
        elif len(new_names) != len(old_names) and new_shape is None:
            raise CannotEdit(f"new axis names {new_names} for a mesh of {len(old_names)} axes, without a shape")
        names = new_names
        notes.append(f"axes {names}")
    if new_shape is not None:
        literal_values = [literal(v) for v in values] if values is not None else None
        symbolic = literal_values is not None and not all(isinstance(v, int) for v in literal_values)
        if values is None:
            raise CannotEdit(f"the mesh on line {line} does not write its shape: cannot make it {new_shape}")
        if symbolic and len(values) == len(new_shape) and new_names is not None and sorted(new_names) == sorted(
                old_names):
            notes.append("sizes kept as written")
        elif list(literal_values or []) != list(new_shape):
            values = [cst.Integer(str(s)) for s in new_shape]
            notes.append(f"shape {new_shape}")
    if sizes is not None and values is not None and [_code(v) for v in values] != [_code(v) for v in sizes.values]:
        changes[sizes.node] = sizes.rebuilt(values)
    if names != old_names:
        changes[names_arg.value] = _names_node(names_arg.value, names, quote)
    if not changes:
        raise CannotEdit(f"the mesh on line {line} is already as asked (already applied?)")
    return _merge(call, changes), None, f"line {line}: mesh {', '.join(notes) or 'changed'}"


def _is_xs_mesh(source: Source, call: cst.Call) -> bool:
    from hlo_doctor.fix.imports import Imports

    name = dotted(call.func) or ""
    full = Imports(source).names.get(name.split(".")[0], "")
    return "torch_xla" in full


def _merge(call: cst.Call, changes: dict) -> dict:
    """The changes, as one replacement of the construction call (nested nodes swapped inside it)."""
    by_id = {id(k): v for k, v in changes.items()}

    class _Swap(cst.CSTTransformer):
        def on_leave(self, original_node, updated_node):
            return by_id.get(id(original_node), updated_node)

    return {call: call.visit(_Swap())}


def _hybrid(source: Source, call: cst.Call, new_names, new_shape, host_major, quote) -> tuple[dict, None, str]:
    if new_shape is not None or host_major:
        raise CannotEdit("a new shape or device order for xs.HybridMesh has to be split between ICI and DCN: "
                         "change it by hand")
    names_arg = _arg(call, 2, "axis_names")
    ici, dcn = _arg(call, 0, "ici_mesh_shape"), _arg(call, 1, "dcn_mesh_shape")
    if names_arg is None or ici is None or new_names is None:
        raise CannotEdit("the HybridMesh does not write its shapes and axis names")
    old_names = _names(names_arg.value)
    if sorted(new_names) != sorted(old_names):
        raise CannotEdit(f"{new_names} is not a reordering of the HybridMesh's axes {old_names}")
    if tuple(new_names) == old_names:
        raise CannotEdit("the HybridMesh is already as asked (already applied?)")
    permutation = [old_names.index(n) for n in new_names]
    changes: dict = {names_arg.value: _names_node(names_arg.value, new_names, quote)}
    for arg in (ici, dcn):
        if arg is not None:
            sizes = _Sizes.of(arg.value)
            changes[sizes.node] = sizes.rebuilt([sizes.values[i] for i in permutation])
    line = source.lines(call)[0]
    return _merge(call, changes), None, f"line {line}: HybridMesh axes {tuple(new_names)}"
