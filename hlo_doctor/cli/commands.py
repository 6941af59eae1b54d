"""Collects the click commands into the ``hlo-doctor`` group."""

from __future__ import annotations

import click

from hlo_doctor.cli.analyze import analyze_command, rules_command
from hlo_doctor.cli.collectives import collectives_command
from hlo_doctor.cli.fix import fix_command
from hlo_doctor.cli.gate import check_command, config_command, diff_command
from hlo_doctor.cli.ls import ls_command
from hlo_doctor.cli.memory import memory_command
from hlo_doctor.cli.run import examples_command, run_command
from hlo_doctor.cli.show import explain_command, show_command

# Every command, in the order `hlo-doctor --help` lists them.
COMMANDS: tuple[click.Command, ...] = (
    ls_command,
    analyze_command,
    check_command,
    diff_command,
    fix_command,
    rules_command,
    config_command,
    run_command,
    examples_command,
    show_command,
    explain_command,
    collectives_command,
    memory_command,
)


def register_all(group: click.Group) -> None:
    for command in COMMANDS:
        group.add_command(command)
