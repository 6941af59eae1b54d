"""Hardware profiles: moved to :mod:`hlo_doctor.semantics.hardware` (the cost model reads them).

Re-exported here so rules and plugins that import ``hlo_doctor.rules.hardware`` keep working.
"""

from hlo_doctor.semantics.hardware import (
    HardwareProfile,
    bundled_profiles,
    load_profile,
    profile_for_backend,
    profile_for_dump,
    profile_names,
)

__all__ = [
    "HardwareProfile",
    "bundled_profiles",
    "load_profile",
    "profile_for_backend",
    "profile_for_dump",
    "profile_names",
]
