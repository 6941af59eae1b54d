"""The ``hlo-doctor`` command line: thin click commands over the library.

The library never imports this package. One module per group of commands:

* :mod:`.ls` (``ls``: the dump inventory), :mod:`.analyze` (``analyze``,
  ``rules``), :mod:`.gate` (``check``, ``diff``, ``config``), :mod:`.run`
  (``run``, ``examples``), :mod:`.show` (``show``, ``explain``),
  :mod:`.collectives` (``collectives``);
* :mod:`.common` and :mod:`.output`: the options, configuration, progress and
  report writing the commands share; :mod:`.commands` adds every command to
  the group in :mod:`.main`.

Errors in the user's input are reported as one line on stderr with exit 2.
"""

from __future__ import annotations

from hlo_doctor.cli.commands import register_all
from hlo_doctor.cli.main import INTERRUPTED, main

__all__ = ["INTERRUPTED", "main"]

register_all(main)
