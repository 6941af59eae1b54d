"""The ``hlo-doctor`` command group; the commands are added in :mod:`hlo_doctor.cli.commands`."""

from __future__ import annotations

import click

from hlo_doctor._version import __version__

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it; 1 means "findings" to ``check``."""


class _Group(click.Group):
    """The command group; Ctrl-C ends any command with exit 130 and one line on stderr."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            raise SystemExit(INTERRUPTED) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hlo-doctor")
def main() -> None:
    """Diagnose sharding problems in XLA SPMD programs from HLO dumps."""
