""":func:`plan_fixes`: every finding's edits made on its program's text, or refused with the reason.

Each edit is made on the text as the edits before it left it: the file is parsed again with
libcst for every edit, and the line an edit names (a line of the program as it was compiled)
is carried through the earlier edits' changes by a line map (:class:`_LineMap`), so an import
added at the top or a constraint inserted above does not shift it.

Edits that are the same (kind, file, line, target, specs and details) are made once, with
every finding they answer recorded; a second, different edit of the same kind at the same
place (line and target) is refused as a conflict with the first. Files of installed libraries
(``site-packages``) are never edited, and an edit that fails unexpectedly is a refusal that says
so (the other edits are still made), as a crashing rule is an internal-error finding.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import libcst as cst

from hlo_doctor.examples.registry import local_program_file
from hlo_doctor.files import real_path
from hlo_doctor.findings import Finding, SourceEdit
from hlo_doctor.fix import FixPlan, PlannedEdit, Refusal
from hlo_doctor.fix.constrain import constrain
from hlo_doctor.fix.flags import xla_flag
from hlo_doctor.fix.forward_hook import forward_hook
from hlo_doctor.fix.imports import Imports
from hlo_doctor.fix.locate import CannotEdit, Source
from hlo_doctor.fix.mesh_edits import mesh
from hlo_doctor.fix.shard_output import shard_output
from hlo_doctor.fix.specs import reaxes, respec
from hlo_doctor.fix.third_party_edits import layout_map_key, logical_rule, with_partitioning

__all__ = ["diff", "plan_fixes", "resolve_path"]

NO_EDIT = "the rule gives no edit for this finding"

Handler = Callable[[Source, SourceEdit, int], tuple[dict, Imports | None, str]]


def _respec(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports | None, str]:
    if edit.spec is None:
        raise CannotEdit("the edit gives no new partition spec")
    changes, description = respec(source, line, edit.target, edit.old_spec, edit.spec)
    return changes, None, description


def _reaxes(source: Source, edit: SourceEdit, line: int) -> tuple[dict, Imports | None, str]:
    if not edit.spec or not edit.old_spec:
        raise CannotEdit("the edit gives no axes")
    variable = edit.details.get("variable")
    changes, description = reaxes(source, line, str(variable) if variable else None, edit.old_spec[0],
                                  edit.spec[0])
    return changes, None, description


HANDLERS: dict[str, Handler] = {
    "constrain": constrain,
    "respec": _respec,
    "axes": _reaxes,
    "mesh": mesh,
    "logical-rule": logical_rule,
    "layout-map-key": layout_map_key,
    "with-partitioning": with_partitioning,
    "shard-output": shard_output,
    "forward-hook": forward_hook,
}


class _LineMap:
    """Original line -> line in the current text, through every change made so far."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.map: dict[int, int] = {n: n for n in range(1, len(self.lines) + 2)}

    def update(self, new_text: str) -> None:
        new_lines = new_text.splitlines()
        step: dict[int, int] = {}
        matcher = difflib.SequenceMatcher(a=self.lines, b=new_lines, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for k in range(i2 - i1):
                if tag == "equal":
                    step[i1 + k + 1] = j1 + k + 1
                elif tag == "replace":
                    step[i1 + k + 1] = j1 + min(k, j2 - j1 - 1) + 1
                else:  # delete: the line that now follows
                    step[i1 + k + 1] = j1 + 1
        step[len(self.lines) + 1] = len(new_lines) + 1
        self.map = {orig: step.get(cur, cur) for orig, cur in self.map.items()}
        self.lines = new_lines

    def __getitem__(self, line: int) -> int:
        return self.map.get(line, line)


def resolve_path(path: str, path_map: Mapping[str, str] | None) -> str:
    """Where to read ``path`` (a path as the finding records it, maybe of another machine): the
    ``path_map`` entry for the file itself, else for its longest mapped folder prefix."""
    if not path_map:
        return path
    if path in path_map:
        return path_map[path]
    best = max((p for p in path_map if path.startswith(p.rstrip("/") + "/")), key=len, default=None)
    if best is None:
        return path
    return os.path.join(path_map[best], path[len(best.rstrip("/")) + 1:])


def _edit_key(edit: SourceEdit, path: str, line: int) -> tuple:
    details = tuple(sorted((k, repr(v)) for k, v in dict(edit.details).items()))
    return (edit.kind, path, line, edit.target, edit.spec, edit.old_spec, edit.mesh, details)


def _place_key(edit: SourceEdit, path: str, line: int) -> tuple:
    return (edit.kind, path, line, edit.target)


def plan_fixes(findings: Sequence[Finding], *, program: str | None = None, select: Collection[str] = (),
               path_map: Mapping[str, str] | None = None, sources: Mapping[str, str] | None = None,
               readable: Callable[[str], bool] | None = None) -> FixPlan:
    """See :func:`hlo_doctor.fix.plan_fixes`."""
    plan = FixPlan()
    done: dict[tuple, PlannedEdit] = {}
    places: dict[tuple, SourceEdit] = {}
    line_maps: dict[str, _LineMap] = {}
    for finding in findings:
        if select and finding.rule not in select:
            continue
        suggestion = finding.suggestion
        edits = suggestion.edits if suggestion is not None else ()
        if not edits:
            reason = (suggestion.no_edit if suggestion is not None else None) or NO_EDIT
            plan.refused.append(Refusal(finding, reason))
            continue
        for edit in edits:
            result = _plan_one(plan, finding, edit, program, path_map, sources, readable, done, places,
                               line_maps)
            if isinstance(result, Refusal):
                plan.refused.append(result)
    return plan


def _read(path: str, plan: FixPlan, sources: Mapping[str, str] | None) -> str:
    if path in plan.patched:
        return plan.patched[path]
    if sources is not None and path in sources:
        text = sources[path]
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise CannotEdit(f"cannot read {path}: {error}") from None
    plan.originals[path] = text
    plan.patched[path] = text
    return text


def _plan_one(plan: FixPlan, finding: Finding, edit: SourceEdit, program: str | None,
              path_map: Mapping[str, str] | None, sources: Mapping[str, str] | None,
              readable: Callable[[str], bool] | None,
              done: dict[tuple, PlannedEdit], places: dict[tuple, SourceEdit],
              line_maps: dict[str, _LineMap]) -> PlannedEdit | Refusal | None:
    if edit.kind == "xla-flag":
        recorded = edit.file or program or (finding.source.file if finding.source else None)
    else:
        recorded = edit.file or (finding.source.file if finding.source else None) or program
    line = edit.line if edit.line is not None else (finding.source.line if finding.source else None)
    if recorded is None:
        return Refusal(finding, "the finding names no file of the program to edit")
    path = resolve_path(recorded, path_map)
    if path == recorded and not (sources is not None and path in sources) and not Path(path).is_file():
        local = local_program_file(recorded)  # a gallery program recorded by another checkout
        path = str(local) if local is not None else path
    # Checked on the real path: a project folder that is a link into site-packages is the library.
    if {"site-packages", "dist-packages"} & set(Path(path).parts + real_path(path).parts):
        return Refusal(finding, f"{path} is an installed library's file, not the program's: "
                                "the fix belongs in the code that calls it")
    given = sources is not None and path in sources
    if readable is not None and not given and path not in plan.patched and not readable(path):
        return Refusal(finding, f"{path} is outside the project root and the dump: not read (the dump "
                                "names it; run hlo-doctor fix in the program's project, or map it with "
                                "--path-map RECORDED=LOCAL)")
    key = _edit_key(edit, path, line or 0)
    if key in done:
        first = done[key]
        plan.applied.append(PlannedEdit(finding, edit, first.description))
        return None
    place = _place_key(edit, path, line or 0)
    if place in places:
        return Refusal(finding, f"conflicts with another {edit.kind} edit at {os.path.basename(path)}:{line} "
                                f"(the first one was made)")
    try:
        text = _read(path, plan, sources)
        if edit.kind == "xla-flag":
            new_text, description = xla_flag(Source(text, path), edit)
        else:
            handler = HANDLERS.get(edit.kind)
            if handler is None:
                raise CannotEdit(f"unknown edit kind {edit.kind!r}")
            if line is None:
                raise CannotEdit("the finding names no line of the program")
            if path not in line_maps:
                line_maps[path] = _LineMap(plan.originals[path])
            source = Source(text, path)
            changes, imports, description = handler(source, edit, line_maps[path][line])
            if imports is not None:
                for node, change in imports.replacements().items():
                    if node in changes:
                        raise CannotEdit("the edit and the imports it needs change the same statement")
                    changes[node] = change
                added = imports.added()
                if added:
                    description += f" (imports: {'; '.join(added)})"
            new_text = source.replace(changes)
            cst.parse_module(new_text)  # the edit must leave a program that parses
    except CannotEdit as error:
        return Refusal(finding, str(error))
    except Exception as error:  # a bug here must not lose the other findings' edits
        return Refusal(finding, f"internal error making the {edit.kind} edit ({type(error).__name__}: {error}): "
                                "please report it")
    plan.patched[path] = new_text
    if path in line_maps:
        line_maps[path].update(new_text)
    else:
        line_maps[path] = _LineMap(plan.originals[path])
        line_maps[path].update(new_text)
    planned = PlannedEdit(finding, edit, f"{os.path.basename(path)}: {description}")
    done[key] = planned
    places[place] = edit
    plan.applied.append(planned)
    return planned


def diff(plan: FixPlan, relative_to: str | None = None) -> str:
    """A unified diff of every file the plan changes, ``a/<path>``, ``b/<path>`` (relative to
    ``relative_to``, default the current folder, when the file is under it)."""
    base = Path(relative_to or os.getcwd()).resolve()
    chunks = []
    for path in sorted(plan.patched):
        before, after = plan.originals.get(path, ""), plan.patched[path]
        if before == after:
            continue
        resolved = Path(path).resolve()
        try:
            shown = resolved.relative_to(base).as_posix()
        except ValueError:
            shown = path.lstrip("/")
        for line in difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                         fromfile=f"a/{shown}", tofile=f"b/{shown}"):
            # a last line without its newline: say so, as diff does, so that patch applies it
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)
