"""The ``hlo-doctor`` command line: thin click commands over the library.

Each command lives next to the stage it drives and is registered here.
Errors in the user's input are reported as one line on stderr with exit 2.
"""

from __future__ import annotations

import click

from hlo_doctor import __version__

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


def _register() -> None:
    from hlo_doctor.commands import register_all

    register_all(main)


_register()


if __name__ == "__main__":  # python -m hlo_doctor.cli (venvs without the console script)
    main()
