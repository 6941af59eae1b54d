"""Compile a model under dump flags to produce an HLO dump folder hlo-doctor can read.

``run_script`` runs a user's JAX or torch_xla script in a child process with
``XLA_FLAGS`` set to dump the sharding passes, records the device meshes and
the user's sharding calls through a ``sitecustomize`` hook (the script is not
changed), writes ``hlo_doctor_run.json`` next to the dump and trims the dump. With a GPU target (``--target h100:2x8``,
:mod:`hlo_doctor.runner.targets`) the script's jitted calls are compiled for
that cluster on the CPU instead of run.
"""

from hlo_doctor.runner.detect import (
    FrameworkError,
    detect_framework,
    normalize_framework,
)
from hlo_doctor.runner.environment import build_env
from hlo_doctor.runner.flags import merge_xla_flags, parse_xla_flags
from hlo_doctor.runner.run import RunError, RunResult, run_example, run_script
from hlo_doctor.runner.sidecar import SIDECAR_NAME, read_sidecar
from hlo_doctor.runner.targets import (
    Target,
    TargetCompile,
    TargetError,
    compile_for_target,
    parse_target,
    target_devices,
)
from hlo_doctor.runner.trim import TrimReport, trim_dump

__all__ = [
    "SIDECAR_NAME",
    "FrameworkError",
    "RunError",
    "RunResult",
    "Target",
    "TargetCompile",
    "TargetError",
    "TrimReport",
    "build_env",
    "compile_for_target",
    "detect_framework",
    "merge_xla_flags",
    "normalize_framework",
    "parse_target",
    "parse_xla_flags",
    "read_sidecar",
    "run_example",
    "run_script",
    "target_devices",
    "trim_dump",
]
