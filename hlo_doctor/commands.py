"""Collects the click commands of each stage into the ``hlo-doctor`` group."""

from __future__ import annotations

import importlib

import click

# (module, attribute) of every command, in the order `hlo-doctor --help` lists them.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("hlo_doctor.dump.cli", "ls_command"),
    ("hlo_doctor.rules.cli", "analyze_command"),
    ("hlo_doctor.gate.cli", "check_command"),
    ("hlo_doctor.gate.cli", "diff_command"),
    ("hlo_doctor.rules.cli", "rules_command"),
    ("hlo_doctor.gate.cli", "config_command"),
    ("hlo_doctor.runner.cli", "run_command"),
    ("hlo_doctor.runner.cli", "examples_command"),
    ("hlo_doctor.graph.cli", "show_command"),
    ("hlo_doctor.graph.cli", "explain_command"),
    ("hlo_doctor.semantics.cli", "collectives_command"),
)


def register_all(group: click.Group) -> None:
    for module_name, attribute in COMMANDS:
        module = importlib.import_module(module_name)
        group.add_command(getattr(module, attribute))
