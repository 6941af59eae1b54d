"""The names a program already imports, and the imports an edit adds only when they are missing.

:class:`Imports` reads the module-level imports of a :class:`~hlo_doctor.fix.locate.Source`
and answers "what does this file call ``jax.sharding.NamedSharding``?":

1. the name it imports it as (``NamedSharding``, ``P`` for ``PartitionSpec as P``);
2. else a name added to an existing ``from <module> import ...`` of the same module;
3. else a dotted path through a module it imports (``jax.sharding.NamedSharding`` when the file
   has only ``import jax``);
4. else a new import line after the file's last top-of-file import.

Each answer is recorded, and :meth:`Imports.replacements` gives the node changes to make
(merged with the edit's own by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from hlo_doctor.fix.locate import Source, dotted

__all__ = ["Imports"]


def _module_name(node: cst.BaseExpression | None) -> str:
    return dotted(node) or "" if node is not None else ""


@dataclass
class Imports:
    source: Source
    names: dict[str, str] = field(default_factory=dict)
    """local name -> what it is (``P`` -> ``jax.sharding.PartitionSpec``, ``jax`` -> ``jax``)"""
    _from_statements: dict[str, cst.ImportFrom] = field(default_factory=dict)
    _extend: dict[int, tuple[cst.ImportFrom, list[cst.ImportAlias]]] = field(default_factory=dict)
    _new_lines: list[str] = field(default_factory=list)
    _new_from: dict[str, list[str]] = field(default_factory=dict)
    _anchor: cst.CSTNode | None = None

    def __post_init__(self) -> None:
        for statement in self.source.module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                break
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Import):
                    self._anchor = statement
                    for alias in small.names:
                        full = _module_name(alias.name)
                        if alias.asname is not None:
                            self.names[_module_name(alias.asname.name)] = full
                        else:
                            top = full.split(".")[0]
                            self.names.setdefault(top, top)
                            self.names.setdefault(full, full)  # `import a.b` makes a.b usable
                elif isinstance(small, cst.ImportFrom) and small.relative == ():
                    self._anchor = statement
                    module = _module_name(small.module)
                    if isinstance(small.names, cst.ImportStar):
                        continue
                    self._from_statements.setdefault(module, small)
                    for alias in small.names:
                        local = _module_name(alias.asname.name) if alias.asname else _module_name(alias.name)
                        self.names[local] = f"{module}.{_module_name(alias.name)}"

    def bound(self, name: str) -> bool:
        return name in self.names or any(b.name == name for b in self.source.bindings(self.source.module))

    def name_for(self, qualified: str, *, alias: str | None = None, dotted_ok: bool = True) -> str:
        """How this file can spell ``qualified`` (adding an import if needed). ``alias``: the name to
        import it as when an import is added (``PartitionSpec as P``), unless that name is taken."""
        for local, full in self.names.items():
            if full == qualified and "." not in local:
                return local
        module, _, name = qualified.rpartition(".")
        local = alias if alias and not self.bound(alias) else name
        if self.bound(local) and self.names.get(local) != qualified:
            local = name
        statement = self._from_statements.get(module)
        if statement is not None and not self.bound(local):
            new = cst.ImportAlias(cst.Name(name), asname=cst.AsName(cst.Name(local)) if local != name else None)
            self._extend.setdefault(id(statement), (statement, []))[1].append(new)
            self.names[local] = qualified
            return local
        if dotted_ok:
            prefixes = [(full, local_name) for local_name, full in self.names.items()
                        if qualified.startswith(full + ".") and ("." not in local_name or local_name == full)]
            if prefixes:
                full, local_name = max(prefixes, key=lambda item: len(item[0]))
                return local_name + qualified[len(full):]
        if self.bound(local):
            raise ValueError(f"{local} is taken")
        self._new_from.setdefault(module, []).append(name + (f" as {local}" if local != name else ""))
        self.names[local] = qualified
        return local

    def module_for(self, module: str, alias: str) -> str:
        """How this file can spell the module ``module`` (``import module as alias`` added if needed)."""
        for local, full in self.names.items():
            if full == module:
                return local
        local = alias if not self.bound(alias) else module
        self._new_lines.append(f"import {module} as {alias}" if local == alias else f"import {module}")
        self.names[local] = module
        return local

    def _lines(self) -> list[str]:
        return [*self._new_lines,
                *(f"from {module} import {', '.join(names)}" for module, names in self._new_from.items())]

    def added(self) -> list[str]:
        """The imports added, as written."""
        lines = self._lines()
        for statement, aliases in self._extend.values():
            names = ", ".join(cst.Module([]).code_for_node(a) for a in aliases)
            lines.append(f"from {_module_name(statement.module)} import ... {names}")
        return lines

    def replacements(self) -> dict[cst.CSTNode, cst.CSTNode | list[cst.CSTNode]]:
        changes: dict[cst.CSTNode, cst.CSTNode | list[cst.CSTNode]] = {}
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        for statement, aliases in self._extend.values():
            names = list(statement.names) if not isinstance(statement.names, cst.ImportStar) else []
            if isinstance(names[-1].comma, cst.MaybeSentinel):
                names[-1] = names[-1].with_changes(comma=comma)
                new = [a.with_changes(comma=comma) for a in aliases[:-1]] + [aliases[-1]]
            else:  # a trailing comma (one name a line, in parentheses): the new names follow that layout
                sep = names[-2].comma if len(names) > 1 else comma
                trailing = names[-1].comma
                names[-1] = names[-1].with_changes(comma=sep)
                new = [a.with_changes(comma=sep) for a in aliases[:-1]] + [aliases[-1].with_changes(comma=trailing)]
            changes[statement] = statement.with_changes(names=[*names, *new])
        if self._lines():
            statements = [cst.parse_statement(line + "\n") for line in self._lines()]
            if self._anchor is None:
                first = self.source.module.body[0] if self.source.module.body else None
                if first is not None and _is_docstring(first):
                    changes[first] = [first, *statements]
                elif first is not None:
                    changes[first] = [*statements, first]
            else:
                changes[self._anchor] = [self._anchor, *statements]
        return changes


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))
