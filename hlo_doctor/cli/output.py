"""The output half of ``analyze`` and ``check``: analyze, render, write, and the flags that shape them.

``--format json`` always prints a document: when the dump cannot be used at
all, one with the error in ``errors`` (and the exit code is still 2).
``--statistics`` prints counts per rule, ``--quiet`` leaves out the summary
and the messages on stderr, ``--show-source-anywhere`` lets the report quote
any file the dump names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from hlo_doctor._version import __version__
from hlo_doctor.cli.common import emit, fail, run_analysis, source_settings
from hlo_doctor.errors import InputError
from hlo_doctor.hlo import ParseError
from hlo_doctor.program.locate import SourceSettings
from hlo_doctor.report import render
from hlo_doctor.report.json import SCHEMA_VERSION
from hlo_doctor.report.source import SourcePolicy
from hlo_doctor.report.text import render_statistics

if TYPE_CHECKING:
    from hlo_doctor.config import Config
    from hlo_doctor.findings import Report

__all__ = ["OutputOptions", "analyze_or_exit", "failures_as_json", "write_report"]


@dataclass(frozen=True, slots=True)
class OutputOptions:
    output_format: str = "text"
    output: str | None = None
    quiet: bool = False
    statistics: bool = False
    exit_zero: bool = False
    show_source_anywhere: bool = False
    path_map: tuple[str, ...] = ()

    @classmethod
    def pop_from(cls, options: dict[str, Any]) -> OutputOptions:
        """The output options taken out of a command's keyword arguments."""
        return cls(**{f.name: options.pop(f.name) for f in dataclasses.fields(cls) if f.name in options})


@contextmanager
def failures_as_json(dump: str, out: OutputOptions) -> Iterator[None]:
    """Unusable input (a bad config value, an unreadable dump) ends the command with exit 2;
    with ``--format json`` a document holding the error is printed first."""
    try:
        yield
    except (InputError, ParseError) as error:
        if out.output_format == "json":
            with contextlib.suppress(InputError):  # -o cannot be written: the line below says why the run failed
                emit(failure_document(dump, str(error)), out.output)
        fail(error)


def analyze_or_exit(dump: str, config: Config, verbose: bool, registry, jobs: int | None, out: OutputOptions) -> Report:
    """:func:`run_analysis` after the output options are checked (call it inside :func:`failures_as_json`)."""
    if out.statistics and out.output_format != "text":
        raise InputError("--statistics prints text; leave out --format or use --format text")
    if out.output_format == "html" and out.output is None:
        raise InputError("--format html writes a file: add -o report.html")
    return run_analysis(dump, config, verbose, registry, jobs, drawings=out.output_format == "html",
                        sources=source_settings(config, out.path_map, out.show_source_anywhere))


def failure_document(dump: str, message: str) -> str:
    """The JSON report (schema version 1) of a dump that could not be analyzed at all."""
    document = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "hlo-doctor", "version": __version__},
        "dump": dump,
        "hardware": None,
        "rules": [],
        "modules": [],
        "findings": [],
        "skipped": [],
        "errors": [{"path": dump, "module": None, "message": message}],
        "sources": [],
    }
    return json.dumps(document, indent=2) + "\n"


def write_report(report: Report, out: OutputOptions, config: Config | None = None) -> None:
    """Render ``report`` as ``out`` asks, to stdout or (atomically) to ``out.output``; source lines are
    quoted from the files the analysis read (found with ``config``'s and ``out``'s path maps)."""

    if out.statistics:
        emit(render_statistics(report), out.output)
        return
    settings = source_settings(config, out.path_map, out.show_source_anywhere) if config is not None else \
        SourceSettings(anywhere=out.show_source_anywhere)
    sources = SourcePolicy.of(settings, report.dump)
    text = render(report, out.output_format, color=None if out.output is None else False, quiet=out.quiet,
                  sources=sources)
    emit(text, out.output)
    if out.output is not None and not out.quiet:
        click.echo(f"wrote {out.output_format} report to {out.output}", err=True)
