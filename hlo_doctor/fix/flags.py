"""The ``xla-flag`` edit: take a flag out of the ``XLA_FLAGS`` the program sets itself.

The program must write the flag in a string literal (``os.environ["XLA_FLAGS"] = "... --flag=v"``,
``os.environ.setdefault("XLA_FLAGS", ...)``, a constant it builds them from): the flag is removed
from that literal, the rest of the string kept. A flag the program's source does not contain was
set outside it (the shell, a launcher, the runner's registry): refused with "remove it from your
environment". A flag written in several literals is refused as ambiguous.
"""

from __future__ import annotations

import re

import libcst as cst

from hlo_doctor.findings import SourceEdit
from hlo_doctor.fix.locate import CannotEdit, Source

__all__ = ["SET_OUTSIDE", "xla_flag"]

SET_OUTSIDE = "is set outside the program"
"""The refusal of a flag the source does not write (``fix --verify`` recompiles without it instead)."""


def _flag_pattern(flag: str) -> re.Pattern[str]:
    name = flag.split("=", 1)[0]
    if "=" in flag:
        return re.compile(rf"\s*{re.escape(flag)}(?=\s|$)")
    return re.compile(rf"\s*{re.escape(name)}(=\S*)?(?=\s|$)")


def xla_flag(source: Source, edit: SourceEdit) -> tuple[str, str]:
    flag = str(edit.details.get("flag") or "")
    if not flag.startswith("--"):
        raise CannotEdit("the edit names no XLA flag")
    pattern = _flag_pattern(flag)
    hits = [node for node in source.walk() if isinstance(node, cst.SimpleString)
            and isinstance(node.evaluated_value, str) and pattern.search(node.evaluated_value)
            and not isinstance(source.parent(node), cst.Expr)]  # not a docstring
    name = flag.split("=", 1)[0]
    if not hits and re.search(rf"(?<![\w-]){re.escape(name)}", _code_only(source)):
        raise CannotEdit(f"{name} is written in {source.path} in a way that cannot be edited safely "
                         "(not in a plain string literal): remove it by hand")
    if not hits:
        raise CannotEdit(f"{flag.split('=', 1)[0]} {SET_OUTSIDE}: remove it from your "
                         "environment (XLA_FLAGS) or your launcher")
    if len(hits) > 1:
        raise CannotEdit(f"{flag.split('=', 1)[0]} is written {len(hits)} times in {source.path}: "
                         "which one sets it is ambiguous")
    node = hits[0]
    body = node.value[len(node.prefix) + len(node.quote):-len(node.quote)]
    new_body = pattern.sub("", body, count=1)
    if body.startswith(" ") is False and new_body.startswith(" "):
        new_body = new_body.lstrip(" ")
    replacement = node.with_changes(value=node.value[:len(node.prefix) + len(node.quote)] + new_body + node.quote)
    line = source.lines(node)[0]
    return source.replace({node: replacement}), f"line {line}: {flag.split('=', 1)[0]} removed from XLA_FLAGS"


def _code_only(source: Source) -> str:
    """The program's code without its docstrings and comments."""
    docstrings = {id(n) for n in source.walk() if isinstance(n, cst.Expr)}

    class _Strip(cst.CSTTransformer):
        def leave_SimpleStatementLine(self, original, updated):  # noqa: N802
            if len(original.body) == 1 and id(original.body[0]) in docstrings and isinstance(
                    original.body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
                return cst.RemoveFromParent()
            return updated

        def leave_Comment(self, original, updated):  # noqa: N802
            return cst.RemoveFromParent()

    try:
        return source.module.visit(_Strip()).code
    except Exception:  # pragma: no cover - a tree libcst cannot rebuild
        return source.text
