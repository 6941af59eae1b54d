"""Atomic file output: moved to :mod:`hlo_doctor.files` (the gate writes baselines with it); re-exported."""

from hlo_doctor.files import write_atomically

__all__ = ["write_atomically"]
