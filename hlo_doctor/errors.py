"""The library's errors: every one derives from :class:`HloDoctorError`.

* :class:`InputError`: the user's input cannot be used at all (the CLI exits
  2): a missing path, a folder without HLO modules, a symlink loop, an
  unreadable file or folder. Per-file problems inside an otherwise usable
  dump are not InputErrors but are recorded on the dump (see
  :mod:`hlo_doctor.dump`).
* :class:`~hlo_doctor.hlo.errors.ParseError`: malformed HLO text.
* :class:`ShardingError`: a sharding, mesh or set of replica groups that does
  not fit the value's shape or the device count.
* :class:`OpKindError`: an analysis asked of an op of the wrong kind (the
  dot dimensions of an ``add``).
* :class:`ConfigurationError`: a bad setting given to the library (a version
  requirement, a runner option, a test case file).

``str(error)`` is always one line. The errors for bad values also derive from
``ValueError``, as they did before the hierarchy existed, so callers that
catch ``ValueError`` keep working; :class:`ParseError` does not, so an
``except ValueError`` around an analysis never swallows a parse failure.
"""

from __future__ import annotations


def one_line(text: str, limit: int = 500) -> str:
    """Collapse ``text`` to a single line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 3] + "..."
    return flat


class HloDoctorError(Exception):
    """Base class of the errors hlo-doctor raises on purpose."""


class InputError(HloDoctorError):
    """Unusable input, with a one-line message (``path: what is wrong``)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        self.message = one_line(message)
        super().__init__(f"{path}: {self.message}" if path else self.message)


class ShardingError(HloDoctorError, ValueError):
    """A sharding, mesh or replica groups inconsistent with the shape or the devices."""


class OpKindError(HloDoctorError, ValueError):
    """An analysis asked of an instruction it does not apply to."""


class ConfigurationError(HloDoctorError, ValueError):
    """A bad setting or description handed to the library."""
