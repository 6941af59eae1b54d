"""Options shared by ``analyze`` and ``check``, and the way they meet the config file."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.config import Config, load_config
from hlo_doctor.errors import InputError
from hlo_doctor.files import write_atomically
from hlo_doctor.hlo import ParseError
from hlo_doctor.program.locate import SourceSettings, parse_path_maps
from hlo_doctor.report.safe import plain, rich_text
from hlo_doctor.rules import discover, select_rules
from hlo_doctor.semantics.hardware import profile_names

FORMATS = ("text", "json", "sarif", "markdown", "github", "html")


def ids(values: tuple[str, ...]) -> list[str]:
    """``--select a --select b,c`` -> [a, b, c]."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


strict_plugins_option = click.option(
    "--strict-plugins", is_flag=True,
    help="Exit 2 when a rule plugin cannot be loaded (import error, id clash, incompatible api_version) "
         "instead of reporting it and going on.",
)


def load_rules(strict_plugins: bool = False):
    """Discover the rules; with ``strict_plugins``, a plugin that was not loaded ends the command (exit 2)."""
    registry = discover()
    if strict_plugins and registry.errors:
        for error in registry.errors:
            click.echo(f"error: rule plugin {error.entry_point} ({error.origin}) not loaded: {error.message}",
                       err=True)
        count = len(registry.errors)
        click.echo(f"error: {count} rule plugin{'s' if count != 1 else ''} not loaded (--strict-plugins)", err=True)
        sys.exit(2)
    return registry


def _analysis_decorators() -> dict[str, Callable[..., Any]]:
    """The options ``analyze`` and ``check`` share, by parameter name, in ``--help`` order."""
    return {
        "output_format": click.option(
            "--format", "output_format", type=click.Choice(FORMATS), default="text", show_default=True,
            help="Output format (html: one self-contained file, for -o)."),
        "output": click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True),
                               help="Write the report to this file instead of stdout."),
        "devices_per_host": click.option("--devices-per-host", type=click.IntRange(min=1),
                                         help="Devices per host, to judge which collectives cross hosts."),
        "hardware": click.option(
            "--hardware", metavar="NAME",
            help="Hardware profile for cost estimates: a100, b200, h100, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, or a JSON file."),
        "select": click.option("--select", multiple=True, metavar="ID",
                               help="Run only these rules (repeat or comma-separate)."),
        "ignore": click.option("--ignore", multiple=True, metavar="ID", help="Do not run these rules."),
        "config_file": click.option(
            "--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="Configuration file (default: the nearest hlo-doctor.toml, or pyproject.toml "
                 "with [tool.hlo-doctor])."),
        "verbose": click.option(
            "-v", "--verbose", is_flag=True,
            help="Text: add each finding's dump location, HLO line and evidence, and the modules' collectives."),
        "quiet": click.option("-q", "--quiet", is_flag=True,
                              help="Print the findings only: no summary, no messages on stderr."),
        "statistics": click.option("--statistics", is_flag=True,
                                   help="Print the number of findings per rule instead of them."),
        "exit_zero": click.option("--exit-zero", is_flag=True,
                                  help="Exit 0 even when findings remain (errors in the input still exit 2)."),
        "show_source_anywhere": click.option(
            "--show-source-anywhere", is_flag=True,
            help="Quote source lines from any file the dump names, not only from files below the "
                 "project root or the dump's folder."),
        "path_map": click.option(
            "--path-map", multiple=True, metavar="RECORDED=LOCAL",
            help="The program files the dump recorded below RECORDED (a file or folder of the machine "
                 "that compiled) are at LOCAL here (repeatable; the longest match wins). Without it a "
                 "recorded file not here is looked for by its path's tail below the dump's folder and "
                 "the project root."),
        "jobs": click.option(
            "--jobs", "-j", type=click.IntRange(min=1), default=None,
            help="Processes that may work at once: several modules are analysed in up to N worker "
                 "processes, one big module shares its rules between two (1: all in this one; the "
                 "report is the same).  [default: the usable cores, at most 4]"),
        "strict_plugins": strict_plugins_option,
    }


def analysis_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``analyze`` and ``check`` share (flags override the config file)."""
    for decorator in reversed(list(_analysis_decorators().values())):
        command = decorator(command)
    return command


# The options that choose and configure the analysis itself (no output options), for commands that
# analyze on the way to something else (``fix``).
RULE_OPTIONS = ("devices_per_host", "hardware", "ignore", "config_file", "verbose", "jobs", "strict_plugins")


def some_analysis_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The named options of :func:`analysis_options` (parameter names, e.g. :data:`RULE_OPTIONS`)."""
    chosen = _analysis_decorators()

    def apply(command: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(names):
            command = chosen[name](command)
        return command

    return apply


def effective_config(config_file: Path | None, registry=None, **overrides: Any) -> Config:
    """The file's configuration (validated against the installed rules, or ``registry``'s) with flags on top."""
    registry = registry if registry is not None else discover()
    known = {rule_id: registry.rules[rule_id].rule.Options for rule_id in registry.ids()}
    config = load_config(config_file, rule_options=known)
    for key in ("select", "ignore"):
        if overrides.get(key):
            unknown = [rule_id for rule_id in overrides[key] if rule_id not in known]
            if unknown:
                raise InputError(f"unknown rule id '{unknown[0]}' (known: {', '.join(sorted(known))})")
    if overrides.get("hardware"):
        name = overrides["hardware"]
        if name not in profile_names() and not Path(name).is_file():
            raise InputError(f"unknown hardware '{name}' (choose {', '.join(profile_names())} or a JSON file)")
    config = config.with_overrides(**overrides)
    warn_if_no_rule(config, registry)
    return config


def warn_if_no_rule(config: Config, registry) -> None:
    """A warning on stderr when select and ignore together leave no rule to run."""
    if (config.select.value or config.ignore.value) and not select_rules(registry, config.select.value,
                                                                         config.ignore.value):
        click.echo(f"warning: select ({config.select.origin}) and ignore ({config.ignore.origin}) leave no rule "
                   "to run", err=True)


def source_settings(config: Config, path_map: tuple[str, ...] = (), anywhere: bool = False,
                    programs: tuple[str, ...] = ()) -> SourceSettings:
    """How the program files a dump names are found: the configuration's ``path-map`` and then
    ``--path-map`` (a later entry for the same prefix wins), ``--show-source-anywhere``, and the
    programs this invocation ran. A malformed ``--path-map``: InputError (one line)."""
    try:
        pairs = parse_path_maps(path_map)
    except ValueError as error:
        raise InputError(str(error)) from None
    return SourceSettings(tuple(config.path_map.value) + pairs, anywhere, programs)


def run_analysis(dump: str, config: Config, verbose: bool, registry=None, jobs: int | None = None,
                 drawings: bool = False, sources: SourceSettings | None = None):
    """``analyze_dump`` with the effective configuration (and ``registry``'s rules) and a progress bar on a terminal;
    ``drawings``: make what the HTML report draws (only an HTML report needs them); ``sources``: how
    the program's files are found (default: the configuration's path maps)."""
    sources = sources if sources is not None else source_settings(config)
    with Progress() as progress:
        return analyze_dump(
            dump,
            select=config.select.value,
            ignore=config.ignore.value,
            devices_per_host=config.devices_per_host.value,
            hardware=config.hardware.value,
            rule_options={rule_id: config.options_for(rule_id) for rule_id in config.rule_options},
            ignore_ops=config.ignore_ops.value,
            verbose=verbose,
            registry=registry,
            progress=progress,
            jobs=jobs,
            drawings=drawings,
            sources=sources,
        )


def emit(text: str, output: str | None) -> None:
    """``text`` on stdout, or written to ``output`` atomically (a temporary file beside it, then a rename)."""
    if output is None:
        click.echo(text, nl=False)
        return

    write_atomically(Path(output), text)


def fail(error: Exception) -> None:
    """One line on stderr (made plain: it may quote the dump) and exit 2."""
    click.echo(f"error: {plain(error)}", err=True)
    sys.exit(2)


def input_errors_exit_2(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn InputError/ParseError into one stderr line and exit 2."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (InputError, ParseError) as error:
            fail(error)

    return wrapper


class Progress:
    """A rich progress bar on stderr, only on a terminal and only once the work has taken ``DELAY`` seconds.

    ``with Progress() as update:`` gives the ``update(done, total, module)``
    callback of :func:`~hlo_doctor.analysis.analyze_dump` (None when stderr is
    not a terminal); a quick analysis never draws anything.
    """

    DELAY = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bar = None
        self._task = None
        self._timer: threading.Timer | None = None
        self._closed = False
        self._state: tuple[int, int | None, str] = (0, None, "")

    def __enter__(self):
        if not sys.stderr.isatty():
            return None
        self._timer = threading.Timer(self.DELAY, self._start)
        self._timer.daemon = True
        self._timer.start()
        return self._update

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import Progress as RichProgress

        with self._lock:
            if self._closed:
                return
            self._bar = RichProgress(console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task("reading the dump", total=None)
            self._bar.start()
            self._show()

    def _update(self, done: int, total: int, module: str) -> None:
        with self._lock:
            self._state = (done, total, module)
            if self._bar is not None:
                self._show()

    def _show(self) -> None:
        done, total, module = self._state
        self._bar.update(self._task, completed=done, total=total,
                         # rich reads markup in a description: a module named ``[link=...]`` must stay text
                         description=f"reading and analyzing {rich_text(module)}" if module else "reading the dump")

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def __exit__(self, *exc_info):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._bar is not None:
                self._bar.stop()
        return False
