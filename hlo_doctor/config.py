"""Configuration: ``[tool.hlo-doctor]`` in the nearest ``pyproject.toml``, or ``hlo-doctor.toml``.

Lookup walks up from the start folder (the current directory) and takes the
first folder holding either file; in one folder ``hlo-doctor.toml`` wins over
``pyproject.toml`` (as ``ruff.toml`` does over ``pyproject.toml``), and a
``pyproject.toml`` without a ``[tool.hlo-doctor]`` table does not count.
Command-line flags override the file. Every value remembers where it came
from, so ``hlo-doctor config`` can say so.

Keys (kebab-case, as in the file)::

    select = ["activation-all-gather"]      # rule ids; default: all
    ignore = ["communication-bound"]
    devices-per-host = 8
    hardware = "h100"
    ignore-ops = ["jit(train_step)/optimizer/*"]   # globs on op_name
    fail-on = "warning"                     # error | warning | info
    path-map = {"/home/ci/work/repo" = "."}  # recorded path prefix -> here (relative: to this file)

    [tool.hlo-doctor.rules.replicated-large-parameter]
    min-bytes = 1048576                     # per-rule options (see `hlo-doctor rules ID`)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from hlo_doctor.errors import InputError
from hlo_doctor.semantics.hardware import profile_names

SEVERITIES = ("error", "warning", "info")
TOP_LEVEL_KEYS = ("select", "ignore", "devices-per-host", "hardware", "ignore-ops", "fail-on", "path-map", "rules")
DEFAULT = "default"
COMMAND_LINE = "command line"


@dataclass(frozen=True, slots=True)
class Setting:
    value: Any
    origin: str


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration; each value with its origin."""

    select: Setting = Setting((), DEFAULT)
    ignore: Setting = Setting((), DEFAULT)
    devices_per_host: Setting = Setting(None, DEFAULT)
    hardware: Setting = Setting(None, DEFAULT)
    ignore_ops: Setting = Setting((), DEFAULT)
    fail_on: Setting = Setting("warning", DEFAULT)
    # (recorded prefix, local prefix) pairs: where a dump made elsewhere has its program files here
    path_map: Setting = Setting((), DEFAULT)
    # rule id -> option name (python identifier) -> Setting
    rule_options: Mapping[str, Mapping[str, Setting]] = field(default_factory=dict)
    path: Path | None = None

    def options_for(self, rule_id: str) -> dict[str, Any]:
        return {name: setting.value for name, setting in self.rule_options.get(rule_id, {}).items()}

    def with_overrides(self, **overrides: Any) -> Config:
        """Command-line values (None = not given) replace the file's."""
        changes = {
            name: Setting(tuple(value) if isinstance(value, list) else value, COMMAND_LINE)
            for name, value in overrides.items()
            if value is not None and not (isinstance(value, (list, tuple)) and not value)
        }
        for name in changes:
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise TypeError(f"unknown config field {name}")
        if "fail_on" in changes:
            _check_choice("fail-on", changes["fail_on"].value, SEVERITIES, COMMAND_LINE)
        if "select" in changes and "ignore" not in changes:
            # A rule selected on the command line beats the file's ignore (as in ruff).
            kept = tuple(i for i in self.ignore.value if i not in changes["select"].value)
            if kept != tuple(self.ignore.value):
                changes["ignore"] = Setting(kept, self.ignore.origin)
        return dataclasses.replace(self, **changes)


def find_config_file(start: Path | None = None) -> Path | None:
    """The nearest hlo-doctor.toml, or pyproject.toml with [tool.hlo-doctor]."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        own = candidate / "hlo-doctor.toml"
        if own.is_file():
            return own
        pyproject = candidate / "pyproject.toml"
        if _may_configure_us(pyproject) and "hlo-doctor" in _read_toml(pyproject).get("tool", {}):
            return pyproject
    return None


def load_config(
    path: Path | None = None,
    *,
    start: Path | None = None,
    rule_options: Mapping[str, type] | None = None,
) -> Config:
    """Read and validate the configuration file (found by lookup when ``path`` is None).

    ``rule_options`` maps each known rule id to its Options dataclass; unknown
    rule ids, unknown options and values of the wrong type are InputErrors that
    list the valid choices.
    """
    path = path or find_config_file(start)
    if path is None:
        return Config()
    data = _read_toml(path)
    table = data.get("tool", {}).get("hlo-doctor", {}) if path.name == "pyproject.toml" else data
    origin = f"{path}" + (" [tool.hlo-doctor]" if path.name == "pyproject.toml" else "")
    if not isinstance(table, dict):
        raise InputError(f"{origin}: expected a table")
    unknown = sorted(set(table) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise InputError(f"{origin}: unknown key '{unknown[0]}' (valid keys: {', '.join(TOP_LEVEL_KEYS)})")
    settings: dict[str, Any] = {"path": path}
    known_rules = sorted(rule_options or {})
    for key in ("select", "ignore"):
        if key in table:
            ids = _string_list(table[key], key, origin)
            if rule_options is not None:
                for rule_id in ids:
                    if rule_id not in rule_options:
                        raise InputError(f"{origin}: {key}: unknown rule '{rule_id}' (valid rules: {', '.join(known_rules)})")
            settings[key] = Setting(tuple(ids), origin)
    if "ignore-ops" in table:
        settings["ignore_ops"] = Setting(tuple(_string_list(table["ignore-ops"], "ignore-ops", origin)), origin)
    if "devices-per-host" in table:
        value = table["devices-per-host"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{origin}: devices-per-host must be a positive integer, not {value!r}")
        settings["devices_per_host"] = Setting(value, origin)
    if "hardware" in table:
        value = table["hardware"]

        _check_choice("hardware", value, tuple(profile_names()), origin)
        settings["hardware"] = Setting(value, origin)
    if "fail-on" in table:
        _check_choice("fail-on", table["fail-on"], SEVERITIES, origin)
        settings["fail_on"] = Setting(table["fail-on"], origin)
    if "path-map" in table:
        settings["path_map"] = Setting(_path_map(table["path-map"], path.parent, origin), origin)
    if "rules" in table:
        settings["rule_options"] = _rule_options(table["rules"], rule_options, origin)
    return Config(**settings)


def _rule_options(
    table: Any, rule_options: Mapping[str, type] | None, origin: str
) -> dict[str, dict[str, Setting]]:
    if not isinstance(table, dict):
        raise InputError(f"{origin}: rules must be a table of rule ids")
    result: dict[str, dict[str, Setting]] = {}
    for rule_id, options in table.items():
        if not isinstance(options, dict):
            raise InputError(f"{origin}: rules.{rule_id} must be a table of options")
        if rule_options is not None and rule_id not in rule_options:
            raise InputError(
                f"{origin}: rules: unknown rule '{rule_id}' (valid rules: {', '.join(sorted(rule_options))})"
            )
        fields = {}
        if rule_options is not None and dataclasses.is_dataclass(rule_options[rule_id]):
            fields = {f.name: f for f in dataclasses.fields(rule_options[rule_id])}
        result[rule_id] = {}
        for key, value in options.items():
            name = key.replace("-", "_")
            if rule_options is not None:
                if name not in fields:
                    valid = ", ".join(f.name.replace("_", "-") for f in fields.values()) or "none"
                    raise InputError(f"{origin}: rules.{rule_id}: unknown option '{key}' (valid options: {valid})")
                _check_type(f"rules.{rule_id}.{key}", value, fields[name], origin)
            result[rule_id][name] = Setting(value, origin)
    return result


def _check_type(where: str, value: Any, field_: dataclasses.Field, origin: str) -> None:
    expected = field_.type if isinstance(field_.type, str) else getattr(field_.type, "__name__", str(field_.type))
    checks = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
    }
    for sequence in ("tuple[str,...]", "list[str]"):
        checks[sequence] = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)
    check = checks.get(expected.replace(" ", "").split("|")[0])
    if check is not None and not check(value):
        raise InputError(f"{origin}: {where} must be {expected}, not {value!r}")
    _check_range(where, field_.name, value, origin)


# Options that are a size or count to round to or divide by: zero makes no sense.
_AT_LEAST_ONE = frozenset({"round_to"})


def _check_range(where: str, name: str, value: Any, origin: str) -> None:
    """Sizes, counts and fractions are never negative; ``round-to`` and the like are at least 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if name in _AT_LEAST_ONE and value < 1:
        raise InputError(f"{origin}: {where} must be at least 1, not {value!r}")
    if value < 0:
        raise InputError(f"{origin}: {where} must not be negative, not {value!r}")


def _path_map(value: Any, folder: Path, origin: str) -> tuple[tuple[str, str], ...]:
    """``path-map = {"/recorded/prefix" = "local/prefix"}``; a relative local prefix is taken from
    the configuration file's folder, and it must exist."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                              for k, v in value.items()):
        raise InputError(f"{origin}: path-map must be a table of strings, recorded path prefix = local "
                         f"prefix (path-map = {{\"/home/ci/repo\" = \".\"}}), not {value!r}")
    pairs = []
    for recorded, local in value.items():
        target = folder / local
        if not target.exists():
            raise InputError(f"{origin}: path-map: {recorded!r} = {local!r}: {target} does not exist")
        pairs.append((recorded, str(target)))
    return tuple(pairs)


def _check_choice(key: str, value: Any, choices: tuple[str, ...], origin: str) -> None:
    if value not in choices:
        raise InputError(f"{origin}: {key} must be one of {', '.join(choices)}, not {value!r}")


def _string_list(value: Any, key: str, origin: str) -> list[str]:
    if isinstance(value, str):
        raise InputError(f"{origin}: {key} must be a list of strings, not the string {value!r} "
                         f"(write {key} = [{value!r}])")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{origin}: {key} must be a list of strings, not {value!r}")
    return value


def _may_configure_us(pyproject: Path) -> bool:
    """Whether ``pyproject`` is a file that names hlo-doctor at all: another tool's
    ``pyproject.toml`` (even one that is not UTF-8 or not TOML) is not read further."""
    try:
        with pyproject.open("rb") as handle:
            return b"hlo-doctor" in handle.read()
    except (OSError, ValueError):
        return False


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = handle.read()
    except OSError as error:
        raise InputError(f"{path}: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        col = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise InputError(f"{path}:{line}:{col}: not UTF-8 (byte 0x{data[error.start]:02x}); "
                         "TOML files are UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InputError(f"{path}: {error}") from None
