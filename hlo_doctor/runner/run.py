"""Run a user's script in a child process that dumps its HLO, then describe and trim the dump."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlo_doctor.errors import ConfigurationError, HloDoctorError
from hlo_doctor.examples import EXAMPLES, get_example
from hlo_doctor.runner.detect import JAX, detect_framework, normalize_framework
from hlo_doctor.runner.dump_dir import prepare_dump_dir as _prepare_dump_dir
from hlo_doctor.runner.environment import build_env
from hlo_doctor.runner.flags import merge_xla_flags
from hlo_doctor.runner.sidecar import (
    build_sidecar,
    infer_partitioner,
    read_events,
    write_sidecar,
)
from hlo_doctor.runner.targets import Target, parse_target, target_env_value
from hlo_doctor.runner.tpu_targets import TpuTarget
from hlo_doctor.runner.trim import DEFAULT_SIZE_CAP, TrimReport, trim_dump

STDERR_TAIL_LINES = 20
_BOOTSTRAP = Path(__file__).parent / "_child" / "sitecustomize.py"
# Imported by sitecustomize under this name when --target is given.
_DEVICELESS = Path(__file__).parent / "_child" / "deviceless.py"
_DEVICELESS_MODULE = "_hlo_doctor_deviceless.py"
_THIRD_PARTY = Path(__file__).parent / "_child" / "third_party.py"
_THIRD_PARTY_MODULE = "_hlo_doctor_third_party.py"


@dataclass(frozen=True, slots=True)
class RunResult:
    dump_dir: Path
    sidecar_path: Path
    sidecar: dict[str, Any]
    returncode: int
    trim: TrimReport
    stdout: str | None
    stderr_tail: tuple[str, ...]


class RunError(HloDoctorError, RuntimeError):
    """The script exited non-zero; carries its exit code and the last lines of its stderr."""

    def __init__(self, command: Sequence[str], returncode: int, stderr_tail: Sequence[str],
                 dump_dir: Path):
        self.command = list(command)
        self.returncode = returncode
        self.stderr_tail = tuple(stderr_tail)
        self.dump_dir = dump_dir
        super().__init__(f"{' '.join(self.command)} exited with code {returncode}")

    def format_tail(self) -> str:
        return "\n".join(self.stderr_tail)


def _run_child(command: list[str], env: dict[str, str], *, echo: bool, echo_stderr: bool,
               timeout: float | None) -> tuple[int, str | None, list[str]]:
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as out:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL,
            stdout=None if echo else out, stderr=subprocess.PIPE,
            text=True, errors="replace",
        )
        try:
            assert process.stderr is not None
            for line in process.stderr:
                if echo_stderr:
                    sys.stderr.write(line)
                tail.append(line.rstrip("\n"))
            returncode = process.wait(timeout=timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
        stdout = None
        if not echo:
            out.seek(0)
            stdout = out.read()
    return returncode, stdout, list(tail)


def run_script(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    dump_dir: str | Path,
    framework: str | None = None,
    devices: int | None = None,
    partitioner: str | None = None,
    devices_per_host: int | None = None,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    echo: bool = False,
    echo_stderr: bool = False,
    timeout: float | None = None,
    size_cap: int = DEFAULT_SIZE_CAP,
    example: dict[str, str] | None = None,
    target: Target | TpuTarget | None = None,
    xla_flags: Mapping[str, str | None] | None = None,
) -> RunResult:
    """Run ``python script *args`` with HLO dumping on, then write the sidecar and trim.

    With ``target`` (JAX only) the script's ``jax.jit`` calls are compiled for
    that GPU cluster instead of run (see :mod:`hlo_doctor.runner.targets`).
    ``xla_flags`` are added to the child's ``XLA_FLAGS`` (``{"xla_name": "value"}``).

    ``env`` replaces ``os.environ`` as the base environment. With ``echo`` the script's
    stdout goes to ours instead of ``RunResult.stdout``; ``echo_stderr`` copies its stderr
    to ours as it comes (the last lines are kept either way). ``framework`` is read from
    the script's imports when not given. Raises RunError when the script fails.
    """
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"{script}: no such script")
    framework = normalize_framework(framework) if framework else detect_framework(script)
    dump = _prepare_dump_dir(Path(dump_dir))
    command = [python or sys.executable, str(script), *args]

    with tempfile.TemporaryDirectory(prefix="hlo-doctor-run-") as scratch:
        scratch_dir = Path(scratch)
        bootstrap = scratch_dir / "bootstrap"
        bootstrap.mkdir()
        shutil.copy(_BOOTSTRAP, bootstrap / "sitecustomize.py")
        shutil.copy(_DEVICELESS, bootstrap / _DEVICELESS_MODULE)
        shutil.copy(_THIRD_PARTY, bootstrap / _THIRD_PARTY_MODULE)
        events_file = scratch_dir / "events.jsonl"
        base = dict(os.environ if env is None else env)
        if xla_flags:
            base["XLA_FLAGS"] = merge_xla_flags(base.get("XLA_FLAGS"), dict(xla_flags))
        child_env = build_env(
            base,
            framework=framework, dump_dir=dump, devices=devices, partitioner=partitioner,
            bootstrap_dir=bootstrap, events_file=events_file,
            user_paths=(script.resolve().parent,),
            target=target_env_value(target) if target is not None else None,
        )
        returncode, stdout, tail = _run_child(
            command, child_env, echo=echo, echo_stderr=echo_stderr, timeout=timeout
        )
        events = read_events(events_file)

    if returncode != 0:
        raise RunError(command, returncode, tail, dump)

    effective_partitioner = partitioner if framework == JAX and partitioner else None
    sidecar = build_sidecar(
        command=command, framework=framework,
        partitioner=effective_partitioner or infer_partitioner(dump, framework),
        devices=devices, devices_per_host=devices_per_host, events=events, example=example,
        target=target, dump_dir=dump, script=Path(script).resolve(),
    )
    sidecar_path = write_sidecar(dump, sidecar)
    report = trim_dump(dump, size_cap=size_cap)
    return RunResult(dump, sidecar_path, sidecar, returncode, report, stdout, tuple(tail))


def run_example(
    name: str,
    *,
    framework: str,
    variant: str,
    dump_dir: str | Path,
    partitioner: str | None = None,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    echo: bool = False,
    echo_stderr: bool = False,
    timeout: float | None = None,
    target: str | Target | TpuTarget | None = None,
    script: str | Path | None = None,
) -> RunResult:
    """Run one gallery example (see ``hlo_doctor.examples``) through :func:`run_script`.

    ``target`` (``"a100:2x8"``) compiles it deviceless for that GPU cluster; an
    example that only makes sense on a GPU uses its first target by default.
    ``script``: a copy of the example's program to run instead (a patched one), with
    the example's arguments, devices and flags.
    """
    example = get_example(name)
    framework = normalize_framework(framework)
    script = Path(script) if script is not None else example.script(framework)
    if variant not in example.variants:
        raise ConfigurationError(
            f"example {name!r} has variants {', '.join(example.variants)}; not {variant!r}"
        )
    if target is None and example.target_only:
        target = example.targets[0]
    if isinstance(target, str):
        target = parse_target(target)
    args = ["--variant", variant]
    devices: int | None = example.devices
    devices_per_host = example.devices_per_host
    record: dict[str, str] = {"name": name, "variant": variant}
    if target is not None:
        if not example.targets:
            able = ", ".join(e.name for e in EXAMPLES if e.targets)
            raise ConfigurationError(f"example {name!r} does not compile for a deviceless target; "
                             f"these do: {able}")
        args += ["--devices", str(target.device_count),
                 "--devices-per-host", str(target.devices_per_host)]
        devices, devices_per_host = None, target.devices_per_host
        record["target"] = str(target)
    return run_script(
        script, args, dump_dir=dump_dir, framework=framework,
        devices=devices, partitioner=partitioner,
        devices_per_host=devices_per_host, env=env, python=python, echo=echo,
        echo_stderr=echo_stderr, timeout=timeout, example=record, target=target,
        xla_flags=example.variant_xla_flags.get(variant),
    )
