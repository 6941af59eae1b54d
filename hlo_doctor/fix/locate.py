"""Where an edit goes: the statement, the calls and the scope at a line of the user's program.

:class:`Source` parses a program once with libcst (which keeps formatting and comments) and
answers the questions every edit kind asks: the statement on a line (the innermost simple
statement, or the header of a ``with``/``for``/``if``/``while``), the calls written in it, the
functions and class around it, and the variable that holds the program's mesh there. Edits
then replace nodes (:meth:`Source.replace`) and get the new text back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

__all__ = ["CannotEdit", "Source", "dotted", "literal", "MESH_CONSTRUCTORS"]

MESH_CONSTRUCTORS = frozenset({"Mesh", "make_mesh", "HybridMesh", "DeviceMesh"})
"""The last part of the name of a call that builds a mesh (jax.sharding.Mesh, jax.make_mesh,
xs.Mesh, xs.HybridMesh, keras.distribution.DeviceMesh)."""


class CannotEdit(Exception):
    """The edit cannot be made safely; the message says why (it becomes a Refusal)."""


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


_NOT_LITERAL = object()


def literal(node: cst.BaseExpression) -> object:
    """The Python value of a literal of strings, ints, None and tuples/lists of them, else a sentinel
    (check with :func:`is_literal`)."""
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        text = node.evaluated_value
        return text if isinstance(text, str) else _NOT_LITERAL
    if isinstance(node, cst.Integer):
        return int(node.value, 0)
    if isinstance(node, cst.Name) and node.value in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[node.value]
    if isinstance(node, (cst.Tuple, cst.List)):
        items: list[object] = []
        for element in node.elements:
            if isinstance(element, cst.StarredElement):
                return _NOT_LITERAL
            value = literal(element.value)
            if value is _NOT_LITERAL:
                return _NOT_LITERAL
            items.append(value)
        return tuple(items)
    return _NOT_LITERAL


def is_literal(value: object) -> bool:
    return value is not _NOT_LITERAL


@dataclass(frozen=True)
class Binding:
    """``name`` bound to ``value`` by the statement ``statement`` (an Assign, or a with item)."""

    name: str
    value: cst.BaseExpression
    statement: cst.CSTNode


class _Replacer(cst.CSTTransformer):
    def __init__(self, replacements: Mapping[int, cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel]):
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        return self.replacements.get(id(original_node), updated_node)


class Source:
    """One program, parsed with positions and parents."""

    def __init__(self, text: str, path: str = "<program>"):
        self.text = text
        self.path = path
        try:
            self.wrapper = MetadataWrapper(cst.parse_module(text))
        except cst.ParserSyntaxError as error:
            raise CannotEdit(f"{path} does not parse: {str(error).splitlines()[0]}") from None
        self.module = self.wrapper.module
        self.positions = self.wrapper.resolve(PositionProvider)
        self.parents = self.wrapper.resolve(ParentNodeProvider)

    # -- positions -------------------------------------------------------------------------
    def lines(self, node: cst.CSTNode) -> tuple[int, int]:
        position = self.positions[node]
        return position.start.line, position.end.line

    def walk(self, root: cst.CSTNode | None = None) -> Iterator[cst.CSTNode]:
        stack: list[cst.CSTNode] = [root or self.module]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def statement_at(self, line: int) -> cst.CSTNode:
        """The innermost simple statement line covering ``line``, or the compound statement whose
        header covers it; raises CannotEdit when the line holds no statement."""
        best: cst.CSTNode | None = None
        for node in self.walk():
            if not isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                continue
            start, end = self.lines(node)
            if isinstance(node, cst.BaseCompoundStatement):
                body = node.body
                if isinstance(body, cst.IndentedBlock) and body.body:
                    end = max(start, self.lines(body.body[0])[0] - 1)
            if start <= line <= end and (best is None or self.lines(best)[0] <= start):
                best = node
        if best is None:
            raise CannotEdit(f"line {line} of {self.path} holds no statement")
        return best

    def header_parts(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """What is written on a statement's own line(s): all of a simple statement, the header of a
        compound one."""
        if isinstance(statement, cst.SimpleStatementLine):
            return [statement]
        if isinstance(statement, cst.With):
            return list(statement.items)
        if isinstance(statement, cst.For):
            return [statement.target, statement.iter]
        if isinstance(statement, (cst.If, cst.While)):
            return [statement.test]
        return []

    def nodes_on(self, line: int, kind: type | tuple[type, ...]) -> list[cst.CSTNode]:
        """The nodes of ``kind`` written in the statement on ``line``, in source order."""
        statement = self.statement_at(line)
        found: list[cst.CSTNode] = []
        for part in self.header_parts(statement):
            found.extend(node for node in self.walk(part) if isinstance(node, kind))
        return found

    def calls_on(self, line: int, *last_names: str) -> list[cst.Call]:
        calls = [c for c in self.nodes_on(line, cst.Call) if isinstance(c, cst.Call)]
        if not last_names:
            return calls
        return [c for c in calls if (dotted(c.func) or "").rsplit(".", 1)[-1] in last_names]

    # -- scope -----------------------------------------------------------------------------
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        parent = self.parent(node)
        while parent is not None:
            yield parent
            parent = self.parent(parent)

    def scopes(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """The functions around ``node``, innermost first, then the module (classes skipped: their
        bodies are not visible from their methods)."""
        return [a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)] + [self.module]

    def enclosing_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.ClassDef):
                return ancestor
        return None

    def own_statements(self, scope: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The statements of a function or module body, into if/for/with/try blocks, not into nested
        functions or classes."""
        body = scope.body if isinstance(scope, cst.FunctionDef) else scope
        stack: list[cst.CSTNode] = list(reversed(body.children))
        while stack:
            node = stack.pop()
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                if node is not scope:
                    yield node
                continue
            if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                yield node
            stack.extend(reversed(node.children))

    def bindings(self, scope: cst.CSTNode, name: str | None = None) -> list[Binding]:
        """``name = value`` (a single Name target) and ``with value as name`` in ``scope``'s own body."""
        found = []
        for statement in self.own_statements(scope):
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Assign) and len(small.targets) == 1:
                        target = small.targets[0].target
                        if isinstance(target, cst.Name) and name in (None, target.value):
                            found.append(Binding(target.value, small.value, statement))
                    elif (isinstance(small, cst.AnnAssign) and small.value is not None
                          and isinstance(small.target, cst.Name) and name in (None, small.target.value)):
                        found.append(Binding(small.target.value, small.value, statement))
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    if (item.asname is not None and isinstance(item.asname.name, cst.Name)
                            and name in (None, item.asname.name.value)):
                        found.append(Binding(item.asname.name.value, item.item, statement))
        return found

    def resolve(self, node: cst.CSTNode, name: str) -> list[Binding]:
        """The bindings of ``name`` in the innermost scope around ``node`` that binds it."""
        for scope in self.scopes(node):
            found = self.bindings(scope, name)
            if found:
                return found
        return []

    def mesh_variable(self, node: cst.CSTNode) -> str:
        """The name the program gives its mesh, visible at ``node``: a variable bound to a mesh
        construction in an enclosing function or the module, a parameter called ``mesh`` of an
        enclosing function, or ``self.<...mesh>`` set in the enclosing class. CannotEdit if none or
        several."""
        for scope in self.scopes(node):
            names = sorted({b.name for b in self.bindings(scope) if is_mesh_construction(b.value)})
            if isinstance(scope, cst.FunctionDef):
                params = [p.name.value for p in (*scope.params.params, *scope.params.kwonly_params)]
                names += [p for p in params if p == "mesh" and p not in names]
            if len(names) == 1:
                return names[0]
            if len(names) > 1:
                if "mesh" in names:
                    return "mesh"
                raise CannotEdit(f"several mesh variables are visible there ({', '.join(names)}): "
                                 "say which with the edit's mesh")
            if isinstance(scope, cst.FunctionDef):
                attribute = self._self_mesh_attribute(scope)
                if attribute:
                    return attribute
        raise CannotEdit("no mesh variable is visible at that line (no Mesh(...), jax.make_mesh, "
                         "xs.Mesh or DeviceMesh bound in an enclosing function or the module)")

    def _self_mesh_attribute(self, function: cst.FunctionDef) -> str | None:
        cls = self.enclosing_class(function)
        params = function.params.params
        if cls is None or not params or params[0].name.value != "self":
            return None
        attributes = set()
        for node in self.walk(cls):
            if isinstance(node, cst.Assign) and len(node.targets) == 1:
                target = dotted(node.targets[0].target) or ""
                if target.startswith("self.") and target.count(".") == 1 and (
                        target.endswith(".mesh") or target.endswith("_mesh")):
                    attributes.add(target)
        return attributes.pop() if len(attributes) == 1 else None

    def simple_statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement (simple line or compound) that contains ``node``."""
        for candidate in [node, *self.ancestors(node)]:
            if isinstance(candidate, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return candidate
        raise CannotEdit("no statement holds that node")

    def top_statement_in_scope(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement of the innermost function's (or the module's) own body that holds ``node``."""
        chain = [node, *self.ancestors(node)]
        for index, candidate in enumerate(chain):
            if isinstance(candidate, (cst.FunctionDef, cst.Module)):
                for inner in reversed(chain[:index]):
                    if isinstance(inner, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                        return inner
        raise CannotEdit("no statement holds that node")

    # -- style -----------------------------------------------------------------------------
    def quote(self) -> str:
        """The quote character the program uses most for its strings."""
        counts = {'"': 0, "'": 0}
        for node in self.walk():
            if isinstance(node, cst.SimpleString):
                prefix = node.quote
                if prefix in counts:
                    counts[prefix] += 1
        return "'" if counts["'"] > counts['"'] else '"'

    # -- editing ---------------------------------------------------------------------------
    def replace(self, replacements: Mapping[cst.CSTNode, cst.CSTNode | Sequence[cst.CSTNode]]) -> str:
        """The program's text with each node replaced (a sequence: several statements in its place)."""
        by_id: dict[int, cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel] = {}
        for old, new in replacements.items():
            if isinstance(new, cst.CSTNode):
                by_id[id(old)] = new
            else:
                by_id[id(old)] = cst.FlattenSentinel(list(new)) if new else cst.RemovalSentinel.REMOVE
        return self.module.visit(_Replacer(by_id)).code


def is_mesh_construction(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Call) and (dotted(node.func) or "").rsplit(".", 1)[-1] in MESH_CONSTRUCTORS


LINE_LIMIT = 110
"""An argument an edit adds or lengthens goes on a line of its own when the call's line would
pass this many characters (aligned under the call's first argument)."""


def fit_argument(source: Source, call: cst.Call, new_call: cst.Call, index: int) -> cst.Call:
    """``new_call`` (``call`` with argument ``index`` added or changed), with that argument moved to
    a new line under the first argument when the line it is on would be too long."""
    if index == 0 or not call.args:
        return new_call
    position = source.positions[call]
    lines = source.text.splitlines()
    end_line = lines[position.end.line - 1] if position.end.line <= len(lines) else ""
    suffix = len(end_line) - position.end.column
    code = cst.Module([]).code_for_node(new_call).splitlines()
    last = (position.start.column + len(code[0])) if len(code) == 1 else len(code[-1])
    if last + suffix <= LINE_LIMIT:
        return new_call
    first = source.positions[call.args[0]].start
    column = first.column if first.line == position.start.line else None
    if column is None:
        return new_call
    previous = new_call.args[index - 1]
    comma = previous.comma if isinstance(previous.comma, cst.Comma) else cst.Comma()
    wrapped = comma.with_changes(whitespace_after=cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), empty_lines=[], indent=False,
        last_line=cst.SimpleWhitespace(" " * column)))
    args = list(new_call.args)
    args[index - 1] = previous.with_changes(comma=wrapped)
    return new_call.with_changes(args=args)
