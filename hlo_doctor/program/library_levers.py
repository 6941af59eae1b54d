"""The levers of the sharding libraries: Flax linen's logical axis rules, a Keras 3
``LayoutMap`` key, Flax NNX's partitioning metadata.

* Flax linen: the logical axis rules (``nn.logical_axis_rules``) map the logical
  axes of ``nn.with_logical_constraint`` to mesh axes, first rule first; the fix
  is the rules list, not another constraint.
* Keras 3: a ``LayoutMap`` whose keys match no variable leaves it replicated; the
  fix is a key.
* Flax NNX: a parameter made without ``nnx.with_partitioning`` metadata.

The runner's record says which variable a parameter is and which rules and keys the
program used; on a dump made without the runner, the program's source alone says
where the rules, the map and the layers are, and what the dump cannot tell (a
variable's path) is a visible placeholder.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hlo_doctor.findings import SourceEdit
from hlo_doctor.program.levers import Lever, literal_strings, with_lever
from hlo_doctor.program.records import record_entries, user_line
from hlo_doctor.program.source import call_name, parsed_program
from hlo_doctor.program.suggest import DimAxes, jax_spec, spec_tuple, torch_spec

__all__ = [
    "at_flax_rules",
    "flax_logical_rule",
    "keras_layout_key",
    "keras_layout_template",
    "nnx_partitioning",
    "nnx_partitioning_template",
]


# -- Flax linen: the logical axis rules ------------------------------------------------

def flax_logical_rule(record: Mapping[str, Any] | None, source_file: str | None, source_line: int | None,
                      dims: Sequence[DimAxes], target: str, programs: Sequence[str | None] = ()) -> Lever | None:
    """The logical axis rule that puts the batch back on the batch dim of a logical constraint.

    The constraint is the ``nn.with_logical_constraint(target, (names...))`` the program applies
    to ``target`` on or after the finding's line (read from the source). Flax maps an array's
    logical axes rule by rule, first rule first, and gives each mesh axis to one dim only: the
    rule of the batch dim's logical name must come before the rules of the other dims' names
    that take the same mesh axes.

    The rules are the runner's record of them; on a dump made without the runner, the literal
    rules the program's files (``programs``, and the finding's) pass to ``nn.logical_axis_rules``,
    followed through names and both branches of ``A if cond else B``: of those, the one rule list
    that explains the finding (the others already put the batch first) is taken.
    """
    tree = parsed_program(source_file)
    if tree is None or source_line is None:
        return None
    entries = list(record_entries(record, "flax_logical_rules"))
    if entries:
        entry = entries[-1]
        where = user_line(entry)
        rules = [(str(r[0]), r[1]) for r in entry.get("rules") or () if isinstance(r, list) and len(r) == 2]
        candidates = [(where, rules)] if where is not None and rules else []
    else:
        candidates = [] if record else _static_rule_lists([*programs, source_file])
    batch_dim = next((d for d, axes in enumerate(dims) if axes), None)
    if batch_dim is None or not candidates:
        return None
    logical = _logical_names(tree, source_line, target)
    if logical is None or batch_dim >= len(logical) or logical[batch_dim] is None:
        return None
    levers = [lever for where, rules in candidates
              for lever in [_rule_first(tree, where, rules, logical, batch_dim, tuple(dims[batch_dim] or ()))] if lever]
    return levers[0] if len({lever.code for lever in levers}) == 1 else None


def _rule_first(tree: ast.Module, where: tuple[str, int], rules: list[tuple[str, object]],
                logical: tuple[str | None, ...], batch_dim: int, mesh_axes: tuple[str, ...]) -> Lever | None:
    """The rules ``rules`` (passed at ``where``) with the batch name's rule first; None when they
    already put it ahead of every rule that competes for its mesh axes (they are not the cause)."""
    batch_name = logical[batch_dim]
    assert batch_name is not None

    def axes_of(value: object) -> tuple[str, ...]:
        if isinstance(value, str):
            return (value,)
        return tuple(v for v in value if isinstance(v, str)) if isinstance(value, (list, tuple)) else ()

    index = next((i for i, (name, _) in enumerate(rules) if name == batch_name), None)
    # the logical names an array constrained with the batch name also carries (on any line)
    together = {n for names in _all_logical_constraints(tree) if batch_name in names for n in names if n}
    competitors = [name for i, (name, value) in enumerate(rules)
                   if name in together and name != batch_name and set(axes_of(value)) & set(mesh_axes)
                   and (index is None or i < index)]
    if index is not None and axes_of(rules[index][1]) == mesh_axes and not competitors:
        return None  # the rules already say it: the constraint is not the cause
    fixed = [(batch_name, mesh_axes)] + [(n, v) for n, v in rules if n != batch_name]
    axes_text = repr(mesh_axes[0]) if len(mesh_axes) == 1 else repr(mesh_axes)
    rules_text = "[" + ", ".join(f"({n!r}, {_rule_value(v)})" for n, v in fixed) + "]"
    summary = (f"Put the logical axis rule ({batch_name!r}, {axes_text}) first in the rules passed to "
               f"nn.logical_axis_rules at line {where[1]}"
               + (f", before {', '.join(repr(c) for c in competitors)}" if competitors else "")
               + f": Flax gives each mesh axis of an array to the first rule that claims it; with the batch rule "
               f"first, the logical axes {tuple(logical)} put {axes_text} on dim {batch_dim} ({batch_name!r}), and "
               "the weights, whose logical axes have no batch, keep their sharding")
    edit = SourceEdit("logical-rule", "jax", target=batch_name, file=where[0], line=where[1],
                      details={"logical": batch_name, "mesh_axes": mesh_axes, "before": tuple(competitors)})
    return Lever(summary, f"rules = {rules_text}", (edit,))


# The calls that take Flax linen's logical axis rules.
_RULES_CALLS = frozenset({"logical_axis_rules", "axis_rules", "set_logical_axis_rules"})


def _static_rule_lists(paths: Sequence[str | None]) -> list[tuple[tuple[str, int], list[tuple[str, object]]]]:
    """(the call's file and line, the rules) for each literal rule list a call of ``nn.logical_axis_rules``
    in the files ``paths`` may be given."""
    found = []
    for path in dict.fromkeys(p for p in paths if p):
        tree = parsed_program(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and call_name(node) in _RULES_CALLS and node.args:
                found += [((path, node.lineno), rules) for rules in _rule_literals(tree, node.args[0], 4)]
    return found


def _rule_literals(tree: ast.Module, node: ast.expr, depth: int) -> list[list[tuple[str, object]]]:
    """The literal rule lists ``node`` may be: itself, both branches of a conditional, or what a name
    is assigned anywhere in the file."""
    if depth == 0:
        return []
    if isinstance(node, ast.IfExp):
        return _rule_literals(tree, node.body, depth - 1) + _rule_literals(tree, node.orelse, depth - 1)
    if isinstance(node, ast.Name):
        return [rules for assign in ast.walk(tree) if isinstance(assign, ast.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0], ast.Name) and assign.targets[0].id == node.id
                for rules in _rule_literals(tree, assign.value, depth - 1)]
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return []
    pairs = value if isinstance(value, (list, tuple)) else ()
    if pairs and all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
        return [[(str(p[0]), p[1]) for p in pairs]]
    return []


def at_flax_rules(finding: Any, record: Mapping[str, Any] | None, dims: Sequence[DimAxes],
                  framework: str | None, programs: Sequence[str | None] = ()) -> Any:
    """``finding`` with its fix at the Flax linen logical axis rules when the program has them (see
    :func:`flax_logical_rule`), unchanged otherwise."""
    if finding.suggestion is None or finding.source is None:
        return finding
    edit = finding.suggestion.edits[0] if finding.suggestion.edits else None
    target = edit.target if edit is not None and edit.target else ""
    lever = flax_logical_rule(record, finding.source.file, finding.source.line, dims, target, programs)
    return with_lever(finding, lever, framework)

def _rule_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return repr(tuple(value)) if len(value) != 1 else repr(value[0])
    return repr(value)


def _logical_constraints(scope: ast.AST) -> list[tuple[int, str | None, tuple[str | None, ...]]]:
    """(line, constrained variable, logical axes) of each literal ``with_logical_constraint`` in ``scope``."""
    found = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and call_name(node) == "with_logical_constraint" and len(node.args) >= 2:
            names = literal_strings(node.args[1])
            if names is not None:
                value = node.args[0].id if isinstance(node.args[0], ast.Name) else None
                found.append((node.lineno, value, names))
    return sorted(found, key=lambda f: f[0])


@functools.lru_cache(maxsize=8)
def _all_logical_constraints(tree: ast.Module) -> tuple[tuple[str | None, ...], ...]:
    return tuple(names for _, _, names in _logical_constraints(tree))


def _logical_names(tree: ast.Module, line: int, target: str) -> tuple[str | None, ...] | None:
    """The logical axes the program gives the value of ``line``: the first
    ``with_logical_constraint(target, ...)`` on or after it in its function, else the constraint
    of that function nearest the line."""
    function = _enclosing_function(tree, line)
    found = _logical_constraints(function if function is not None else tree)
    after = [names for at, value, names in found if at >= line and value == target]
    if after:
        return after[0]
    if not found:
        return None
    return min(found, key=lambda f: abs(f[0] - line))[2]


def _enclosing_function(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        inside = node.lineno <= line <= (node.end_lineno or node.lineno)
        if inside and (best is None or node.lineno > best.lineno):
            best = node
    return best


# -- Keras 3: the LayoutMap key ------------------------------------------------------

_INDEXED = re.compile(r"_\d+(?=/|$)")


def keras_layout_key(record: Mapping[str, Any] | None, shape: Sequence[int],
                     dims: Sequence[DimAxes], path: str) -> Lever | None:
    """``layout_map[key] = spec`` for the Keras variable ``path`` that no key matched.

    The runner records every variable the distribution looked up and the key that matched it
    (None: none did, so Keras replicated it), and the variables of each jitted step's state with
    their shapes. The key generalizes the layer index (``decoder_block_\\d+/ffw_gating/kernel``)
    when every variable it would then match is unmatched and of this shape, else it is the path
    itself; it goes after the program's last key. The edit is the same for every variable the key
    matches (one fix). A parameter whose path the record does not give gets no key: which
    variable it is would be a guess.
    """
    layouts = list(record_entries(record, "keras", "layouts"))
    where = user_line(layouts[-1]) if layouts else None
    found = _keras_key(record, path, shape, {str(e.get("key")) for e in layouts}) if where is not None else None
    if where is None or found is None:
        return None
    key, covered = found
    spec = spec_tuple(dims)
    mapping = _subscripted_name(where) or "layout_map"
    # one key, one edit: every variable the key covers gets the same one (target: the first)
    edit = SourceEdit("layout-map-key", "jax", target=covered[0], spec=spec, file=where[0], line=where[1],
                      details={"key": key, "paths": covered})
    also = [p for p in covered if p != path]
    summary = (f"No key of the LayoutMap matches {path}, so Keras replicates it on every device: "
               f'add the key r"{key}" after line {where[1]}'
               + (f" (it also matches {', '.join(also)})" if also else ""))
    return Lever(summary, f'{mapping}[r"{key}"] = {torch_spec(dims)}', (edit,))


def _keras_key(record: Mapping[str, Any] | None, path: str, shape: Sequence[int],
               keys: set[str]) -> tuple[str, tuple[str, ...]] | None:
    """The LayoutMap key for the unmatched variable ``path`` (its layer pattern, else the path)
    and the recorded variables it matches, sorted.

    Keras looks a path up as a key, then with ``re.fullmatch`` of every key, and refuses a path
    two keys match; so a key counts only when each path the runner recorded that it matches is
    unmatched (and of this shape, so one spec fits them all), and the program has no such key.
    """
    variables = {str(v.get("path")): v.get("matched_key") for v in record_entries(record, "keras", "variables")}
    if variables.get(path) is not None:
        return None  # a key matched it: that key's value, not a missing key, replicates it
    shapes: dict[str, tuple[int, ...]] = {}
    for state in record_entries(record, "keras", "states"):
        for group in state.get("groups") or ():
            for variable in (group.get("variables") or ()) if isinstance(group, Mapping) else ():
                if isinstance(variable, Mapping) and isinstance(variable.get("shape"), list):
                    shapes.setdefault(str(variable.get("path")), tuple(variable["shape"]))
    for key in dict.fromkeys((_layer_pattern(path), re.escape(path))):
        try:
            pattern = re.compile(key)
        except re.error:
            continue
        if key in keys or not pattern.fullmatch(path):
            continue
        matched = sorted({p for p in (*variables, *shapes, path) if pattern.fullmatch(p)})
        if all(variables.get(p) is None and shapes.get(p, tuple(shape)) == tuple(shape) for p in matched):
            return key, tuple(matched)
    return None


def keras_layout_template(programs: Sequence[str | None], parameter: str, dims: Sequence[DimAxes]) -> Lever | None:
    """On a dump made without the runner, whose parameters Keras names only by position
    (``state[0][7]``): the program's LayoutMap (its one ``name = ...LayoutMap(...)`` in the files
    ``programs``), with a key written as a placeholder after its last ``name[key] = ...`` line. The
    dump does not say which variable the parameter is, so no edit is given."""
    found = [(path, site) for path in dict.fromkeys(programs) if path
             for site in [_layout_map_site(path)] if site is not None]
    if len(found) != 1:
        return None
    path, (mapping, made, last) = found[0]
    summary = (f"Keras places each variable by the LayoutMap {mapping} of line {made}, and it leaves {parameter} "
               f"replicated: no key matches its variable path, or the key that does writes no mesh axis. Give "
               f"that variable the layout below (a key after line {last}, or the one that matches it)")
    no_edit = (f"the dump names the variable only by its position ({parameter}), not by its path: write its path "
               "as the key (hlo-doctor run records the paths)")
    return Lever(summary, f'{mapping}[r"<variable path of {parameter}>"] = {torch_spec(dims)}', (), no_edit=no_edit)


def _layout_map_site(path: str) -> tuple[str, int, int] | None:
    """(the LayoutMap's variable, the line that makes it, the line of its last key) of the one
    LayoutMap the program at ``path`` makes."""
    tree = parsed_program(path)
    if tree is None:
        return None
    made = [(node.targets[0].id, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call) and call_name(node.value).endswith("LayoutMap")]
    if len(made) != 1:
        return None
    mapping, line = made[0]
    keys = [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == mapping]
    return mapping, line, max([line, *keys])


def _layer_pattern(path: str) -> str:
    """``decoder_block_0/ffw_gating_2/kernel`` -> ``decoder_block_\\d+/ffw_gating_2/kernel``: the layer
    index of the first component generalized, the rest kept."""
    head, _, rest = path.partition("/")
    return _INDEXED.sub(r"_\\d+", head) + ("/" + rest if rest else "")


def _subscripted_name(where: tuple[str, int]) -> str | None:
    """The mapping a ``name[key] = value`` statement on that line assigns into (the program's LayoutMap)."""
    tree = parsed_program(where[0])
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Assign) and node.lineno == where[1] and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                return target.value.id
    return None


# -- Flax NNX: with_partitioning on the layer's initializer ---------------------------

def nnx_partitioning(source_file: str | None, path: str, dims: Sequence[DimAxes]) -> Lever | None:
    """``nnx.with_partitioning`` on the initializer of the layer ``path`` names (``unembed/kernel``):
    the program's ``self.unembed = nnx.Linear(...)``."""
    tree = parsed_program(source_file)
    parts = path.split("/")
    if tree is None or len(parts) < 2:
        return None
    layer, leaf = parts[-2], parts[-1]
    made = [node for node in ast.walk(tree) if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == layer
            and isinstance(node.value, ast.Call)]
    # a construction that already carries partitioning metadata is not the one that lost it
    made = [n for n in made if not any(isinstance(c, ast.Call) and call_name(c) == "with_partitioning"
                                       for c in ast.walk(n.value))]
    if len(made) != 1 or source_file is None:
        return None
    node = made[0]
    argument = f"{leaf}_init"
    spec = jax_spec(dims)[1:]  # "P(None, 'fsdp')" -> "(None, 'fsdp')"
    if not spec.endswith(",)") and spec.count(",") == 0:
        spec = spec[:-1] + ",)"
    edit = SourceEdit("with-partitioning", "jax", target=path, spec=spec_tuple(dims), file=source_file,
                      line=node.lineno, details={"argument": argument})
    code = f"{argument}=nnx.with_partitioning(nnx.initializers.lecun_normal(), {spec})"
    summary = (f"Give {layer} partitioning metadata where line {node.lineno} makes it: {argument}=nnx.with_partitioning"
               f"(..., {spec}), so nnx.get_partition_spec shards its {leaf} like the other weights: each device holds its "
               "shard, and the partitioner gathers it where it is used (a weight gather, which can be prefetched)")
    return Lever(summary, code, (edit,))


# NNX layers whose weights take partitioning metadata through an ``*_init`` argument.
_NNX_LAYERS = frozenset({"Linear", "LinearGeneral", "Einsum", "Embed", "Conv", "ConvTranspose"})


def nnx_partitioning_template(programs: Sequence[str | None], parameter: str, dims: Sequence[DimAxes]) -> Lever | None:
    """On a dump made without the runner, whose parameters NNX names only by position
    (``model.states[0][5]``), in a program that gives its layers ``nnx.with_partitioning``: the layer
    constructions that give none (one of them made this weight; which one, the dump does not say),
    and the initializer to write there. No edit."""
    trees = [(path, tree) for path in dict.fromkeys(programs) if path
             for tree in [parsed_program(path)] if tree is not None]
    if not any(isinstance(c, ast.Call) and call_name(c) == "with_partitioning"
               for _, tree in trees for c in ast.walk(tree)):
        return None
    bare = [(path, node.lineno, call_name(node)) for path, tree in trees for node in ast.walk(tree)
            if isinstance(node, ast.Call) and call_name(node) in _NNX_LAYERS
            and not any(isinstance(c, ast.Call) and call_name(c) == "with_partitioning" for c in ast.walk(node))]
    if not bare:
        return None
    spec = jax_spec(dims)[1:]
    if not spec.endswith(",)") and spec.count(",") == 0:
        spec = spec[:-1] + ",)"
    where = ", ".join(f"line {line} ({layer})" for _, line, layer in bare[:4]) + (" ..." if len(bare) > 4 else "")
    built = (f"line {bare[0][1]} builds an nnx.{bare[0][2]} without it" if len(bare) == 1
             else f"{len(bare)} layers are built without it ({where})")
    summary = (f"The program gives its layers partitioning metadata with nnx.with_partitioning, but {built}, and NNX "
               f"leaves such a layer's weights replicated, as the dump shows {parameter}: wrap the initializer of the "
               "layer that makes it, so nnx.get_partition_spec shards the weight like the others")
    no_edit = (f"the dump names the weight only by its position ({parameter}), not by its layer: pick the layer "
               "above that makes it (hlo-doctor run records the paths)")
    return Lever(summary, f"<weight>_init=nnx.with_partitioning(<its initializer>, {spec})", (), no_edit=no_edit)
