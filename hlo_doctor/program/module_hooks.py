"""torch_xla: a forward hook on the ``nn.Module`` that makes a value, where no line of the program does.

Library code (a Hugging Face decoder layer) makes most of a model's ops: the dump records only
library frames for them, so there is no line of the user's to constrain the value after. The
runner writes each submodule's path into the op_name (``model.layers.0.self_attn.o_proj/aten__mm``,
:func:`hlo_doctor.graph.source.module_path_of`), and records the module tree of the model the
program calls, with the line of that call. The fix is then a forward hook on that module,
registered before the model is called::

    def shard_batch(module, args, output):
        xs.mark_sharding(output, mesh, (("replica", "fsdp"),) + (None,) * (output.dim() - 1))

    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(shard_batch)

Only a leaf linear or convolution layer is hooked: its output is the dot's. The loop over the
layers is written only when every layer's module has the finding (the paths
of the findings of the module cover every index of the list in the recorded tree); otherwise
the module itself is named (``model.model.layers[0].self_attn.o_proj``). The output's dim 0
is marked over the batch axes: the module output is batch-major.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hlo_doctor.findings import SourceEdit
from hlo_doctor.program.levers import Lever
from hlo_doctor.program.records import record_entries, user_line
from hlo_doctor.program.source import parsed_program
from hlo_doctor.program.suggest import DimAxes, torch_spec

__all__ = ["HOOK_FUNCTION", "forward_hook_lever", "module_expression"]

HOOK_FUNCTION = "shard_batch"
LOOP_VARIABLE = "layer"
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_LAYER_CLASS = re.compile(r"Linear|Conv", re.IGNORECASE)


def module_expression(root: str, path: str) -> str | None:
    """``model`` + ``model.layers.0.self_attn.o_proj`` -> ``model.model.layers[0].self_attn.o_proj``
    (None when a component is neither an identifier nor an index)."""
    code = root
    for part in path.split(".") if path else ():
        if part.isdigit():
            code += f"[{part}]"
        elif _IDENTIFIER.match(part):
            code += f".{part}"
        else:
            return None
    return code


def _trees_with(record: Mapping[str, Any] | None, path: str) -> list[Mapping[str, Any]]:
    return [t for t in record_entries(record, "module_trees")
            if any(isinstance(m, Mapping) and m.get("path") == path for m in t.get("modules") or ())]


def _is_layer(tree: Mapping[str, Any], path: str) -> bool:
    """Whether ``path`` is a leaf linear or convolution layer of the tree (``torch.nn.Linear``,
    ``Conv2d``, a library's ``ColumnParallelLinear``): its output is its matmul's, one tensor.
    Another module's dot (the attention's ``softmax @ v``) is not what its output is, and its
    output may be a tuple."""
    modules = [m for m in tree.get("modules") or () if isinstance(m, Mapping)]
    own = next((m for m in modules if m.get("path") == path), None)
    if own is None or any(str(m.get("path", "")).startswith(path + ".") for m in modules):
        return False
    return bool(_LAYER_CLASS.search(str(own.get("class", "")).rsplit(".", 1)[-1]))


def _model_variable(file: str, line: int) -> str | None:
    """The model the statement on ``line`` calls: the one call there whose callee is a plain name
    or attribute chain (``model(...)``, ``self.model(...)``)."""
    tree = parsed_program(file)
    if tree is None:
        return None
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno):
            func = node.func
            parts = []
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                names.add(".".join([func.id, *reversed(parts)]))
    return names.pop() if len(names) == 1 else None


def _layer_loop(tree: Mapping[str, Any], path: str, finding_paths: Collection[str]) -> tuple[str, str] | None:
    """(``model.layers``, ``self_attn.o_proj``) when ``path`` is ``model.layers.<i>.self_attn.o_proj``
    and every index of ``model.layers`` in the tree has a finding at the same place."""
    parts = path.split(".")
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if index is None or index == 0:
        return None
    container, rest = ".".join(parts[:index]), ".".join(parts[index + 1:])
    children = {str(m.get("path"))[len(container) + 1:] for m in tree.get("modules") or ()
                if isinstance(m, Mapping) and str(m.get("path", "")).startswith(container + ".")}
    indices = sorted({c for c in children if c.isdigit()}, key=int)
    if len(indices) < 2:
        return None
    wanted = {f"{container}.{i}" + (f".{rest}" if rest else "") for i in indices}
    return (container, rest) if wanted <= set(finding_paths) else None


def forward_hook_lever(record: Mapping[str, Any] | None, path: str, finding_paths: Collection[str],
                       dims: Sequence[DimAxes], batch_dim: int) -> Lever | None:
    """Mark the output of the module at ``path`` over ``dims[batch_dim]``'s axes with a forward hook
    registered before the model call (see the module docstring). None when the record has no
    single tree with that path, the module is not a leaf linear or convolution layer, the call
    line or its model variable is not known, or the batch is not the value's dim 0."""
    axes = dims[batch_dim] if 0 <= batch_dim < len(dims) else None
    trees = _trees_with(record, path)
    if batch_dim != 0 or not axes or not path or len(trees) != 1 or not _is_layer(trees[0], path):
        return None
    where = user_line(trees[0])
    model = _model_variable(*where) if where is not None else None
    if where is None or model is None:
        return None
    loop = _layer_loop(trees[0], path, finding_paths)
    if loop is not None:
        container, rest = loop
        each = module_expression(model, container)
        hooked = module_expression(LOOP_VARIABLE, rest)
        pattern = f"{container}.*" + (f".{rest}" if rest else "")
    else:
        each, hooked, pattern = None, module_expression(model, path), path
    if hooked is None or (loop is not None and each is None):
        return None
    batch = torch_spec([axes])
    register = f"{hooked}.register_forward_hook({HOOK_FUNCTION})"
    code = "\n".join([
        f"def {HOOK_FUNCTION}(module, args, output):",
        f"    xs.mark_sharding(output, mesh, {batch} + (None,) * (output.dim() - 1))",
        "",
        *([f"for {LOOP_VARIABLE} in {each}:", f"    {register}"] if each else [register]),
    ])
    details: dict[str, Any] = {"position": "before", "model": model, "module": hooked}
    if each:
        details["each"] = each
        details["loop"] = LOOP_VARIABLE
    edit = SourceEdit("forward-hook", "torch_xla", target=pattern, spec=(tuple(axes),), file=where[0],
                      line=where[1], details=details)
    which = f"every {pattern}" if each else path
    summary = (f"No line of your program makes this value (it is {path}'s output, in library code): mark the "
               f"output of {which} over {batch[1:-2]} on its dim 0 with a forward hook, registered before the "
               f"model is called at line {where[1]}, so the matmul stays batch-sharded like its input and the "
               "partitioner gathers the weight instead")
    return Lever(summary, code, (edit,), where)
