"""The runner's record (``hlo_doctor_run.json``) checked against the types of its schema.

The record is part of the dump, so it is untrusted input like the HLO: a field of the wrong
type (``"sharding_calls": 3``, a mesh whose ``shape`` is a string) would otherwise reach the
analyses that read it and crash them. :func:`checked_run_record` drops every such field, or
every such entry of a list, and says which (one :class:`DumpError` each); what is left has the
types the schema in :mod:`hlo_doctor.runner.sidecar` documents, as far as the readers look.
"""

from __future__ import annotations

from typing import Any

from hlo_doctor.dump.snapshot import DumpError

__all__ = ["checked_run_record"]

_LIST = (list,)
_DICT = (dict,)
_INT = (int, type(None))
_STR = (str, type(None))

# Top-level fields.
_TOP: dict[str, tuple[type, ...]] = {
    "schema_version": _INT, "command": _LIST, "framework": _STR, "versions": _DICT, "partitioner": _STR,
    "device_count": _INT, "devices_per_host": _INT, "meshes": _LIST, "sharding_calls": _LIST,
    "module_calls": _LIST, "module_trees": _LIST, "keras": (dict, type(None)), "flax_logical_rules": _LIST,
    "nnx_jit_calls": _LIST, "example": (dict, type(None)), "script": (dict, type(None)),
    "instrumentation_errors": _LIST, "target": (dict, type(None)), "devices": _LIST, "hosts": _LIST,
    "compiles": _LIST, "device_assignments": _DICT,
}
# Fields of the objects inside (entries of the lists above, and the objects they hold), by name.
_NESTED: dict[str, tuple[type, ...]] = {
    "axis_names": _LIST, "shape": (list, type(None)), "device_ids": (list, type(None)), "stack": _LIST,
    "mesh_axis_names": (list, type(None)), "modules": _LIST, "parameters": _LIST, "layouts": _LIST,
    "variables": _LIST, "states": _LIST, "groups": _LIST, "rules": _LIST, "arguments": _LIST,
    "leaves": _LIST, "coords": (list, type(None)), "axes": (list, type(None)),
    "count": _INT, "line": _INT, "id": _INT, "index": _INT, "process_index": _INT, "slice_index": _INT,
    "core_on_chip": _INT, "device_count": _INT, "devices_per_host": _INT, "num_slices": _INT,
    "file": _STR, "function": _STR, "module_class": _STR, "path": _STR, "kind": _STR, "name": _STR,
    "dtype": _STR, "type": _STR, "where": _STR, "error": _STR, "platform": _STR, "sha256": _STR,
    "variant": _STR,
}
# Lists whose entries are objects (checked one by one); other lists are left as they are. At the
# top, ``devices`` and ``hosts`` hold objects; inside (a Keras mesh's ``devices``) they need not.
_TOP_LISTS_OF_OBJECTS = frozenset({
    "meshes", "sharding_calls", "module_calls", "module_trees", "flax_logical_rules", "nnx_jit_calls",
    "instrumentation_errors", "devices", "hosts", "compiles",
})
_LISTS_OF_OBJECTS = frozenset({
    "meshes", "stack", "modules", "parameters", "layouts", "variables", "states", "groups", "arguments", "leaves",
})


def checked_run_record(record: dict[str, Any], path: str) -> tuple[dict[str, Any], list[DumpError]]:
    """``record`` without the fields and list entries whose type the schema does not allow, and
    an error for each one dropped."""
    errors: list[DumpError] = []
    checked: dict[str, Any] = {}
    for key, value in record.items():
        allowed = _TOP.get(key)
        if allowed is not None and (not isinstance(value, allowed) or isinstance(value, bool)):
            errors.append(DumpError(path, f"'{key}' must be {_names(allowed)}, not {_kind(value)}; ignored"))
            continue
        problem = _problem(key, value, top=True)
        if problem is not None:
            value = _without_bad_entries(key, value, path, errors) if isinstance(value, list) else None
            if value is None:
                errors.append(DumpError(path, f"'{key}': {problem}; ignored"))
                continue
        checked[key] = value
    return checked, errors


def _without_bad_entries(key: str, entries: list[Any], path: str, errors: list[DumpError]) -> list[Any]:
    kept = []
    for number, entry in enumerate(entries):
        problem = _entry_problem(key, entry, top=True)
        if problem is None:
            kept.append(entry)
        else:
            errors.append(DumpError(path, f"'{key}'[{number}]: {problem}; ignored"))
    return kept


def _problem(key: str, value: Any, *, top: bool = False) -> str | None:
    """What is wrong with ``value`` (a field named ``key``; ``top``: of the record itself) or
    anything in it, or None."""
    if isinstance(value, list):
        for entry in value:
            problem = _entry_problem(key, entry, top=top)
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for name, inner in value.items():
            allowed = _NESTED.get(name)
            if allowed is not None and (not isinstance(inner, allowed) or isinstance(inner, bool)):
                return f"'{name}' must be {_names(allowed)}, not {_kind(inner)}"
            problem = _problem(name, inner)
            if problem is not None:
                return problem
    return None


def _entry_problem(key: str, entry: Any, *, top: bool = False) -> str | None:
    if key in (_TOP_LISTS_OF_OBJECTS if top else _LISTS_OF_OBJECTS) and not isinstance(entry, dict):
        return f"an entry must be an object, not {_kind(entry)}"
    return _problem(key, entry)


def _names(types: tuple[type, ...]) -> str:
    words = {list: "a list", dict: "an object", int: "an integer", str: "a string", type(None): "null"}
    return " or ".join(words[t] for t in types)


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)
