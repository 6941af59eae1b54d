"""The child's environment: dump flags, device count, partitioner, instrumentation."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hlo_doctor.errors import ConfigurationError
from hlo_doctor.runner.detect import JAX, TORCH_XLA
from hlo_doctor.runner.flags import DUMP_PASS_RE, merge_xla_flags

EVENTS_VAR = "HLO_DOCTOR_EVENTS"
USER_PATHS_VAR = "HLO_DOCTOR_USER_PATHS"
TARGET_VAR = "HLO_DOCTOR_TARGET"
PARTITIONERS = ("shardy", "gspmd")
# A deviceless TPU compile touches no TPU: let several run at once (libtpu otherwise holds
# /tmp/libtpu_lockfile per process), skip the GCE metadata server, and name no workers.
TPU_DEVICELESS_ENV = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1",
                      "TPU_WORKER_HOSTNAMES": "localhost"}


def build_env(
    base: Mapping[str, str],
    *,
    framework: str,
    dump_dir: Path,
    devices: int | None = None,
    partitioner: str | None = None,
    bootstrap_dir: Path | None = None,
    events_file: Path | None = None,
    user_paths: tuple[Path, ...] = (),
    target: str | None = None,
) -> dict[str, str]:
    """A copy of ``base`` set up to dump the SPMD passes of ``framework`` into ``dump_dir``.

    ``target`` (JAX only) is the JSON the child's deviceless hook reads
    (:func:`hlo_doctor.runner.targets.target_env_value`); it forces
    ``JAX_PLATFORMS=cpu``, without which the CUDA plugin probes for a GPU.
    """
    if partitioner is not None and partitioner not in PARTITIONERS:
        raise ConfigurationError(f"unknown partitioner {partitioner!r}; expected shardy or gspmd")
    if partitioner is not None and framework != JAX:
        raise ConfigurationError("only JAX lets you choose the partitioner; torch_xla always uses GSPMD")
    if devices is not None and devices < 1:
        raise ConfigurationError(f"devices must be at least 1, got {devices}")
    if target is not None and framework != JAX:
        raise ConfigurationError("--target compiles JAX programs only; torch_xla needs a GPU")
    if target is not None and devices is not None:
        raise ConfigurationError("--target sets the devices itself; drop --devices")

    env = dict(base)
    ours: dict[str, str | None] = {
        "xla_dump_to": str(dump_dir),
        "xla_dump_hlo_pass_re": DUMP_PASS_RE,
    }
    if framework == JAX:
        if devices is not None:
            ours["xla_force_host_platform_device_count"] = str(devices)
            env["JAX_PLATFORMS"] = "cpu"
        if target is not None:
            env["JAX_PLATFORMS"] = "cpu"
            env[TARGET_VAR] = target
            if '"platform": "tpu"' in target:
                for name, value in TPU_DEVICELESS_ENV.items():
                    env.setdefault(name, value)
        if partitioner is not None:
            env["JAX_USE_SHARDY_PARTITIONER"] = "1" if partitioner == "shardy" else "0"
    elif framework == TORCH_XLA:
        if devices is not None:
            env["PJRT_DEVICE"] = "CPU"
            env["CPU_NUM_DEVICES"] = str(devices)
        env["XLA_HLO_DEBUG"] = "1"
    else:
        raise ConfigurationError(f"unknown framework {framework!r}")
    env["XLA_FLAGS"] = merge_xla_flags(base.get("XLA_FLAGS"), ours)

    if bootstrap_dir is not None:
        old = base.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([str(bootstrap_dir)] + ([old] if old else []))
    if events_file is not None:
        env[EVENTS_VAR] = str(events_file)
    if user_paths:
        env[USER_PATHS_VAR] = os.pathsep.join(str(p) for p in user_paths)
    return env
