"""``hlo-doctor run`` and ``hlo-doctor examples``: thin click commands over the runner."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.examples import EXAMPLES, get_example
from hlo_doctor.program.locate import SourceSettings
from hlo_doctor.report.source import SourcePolicy
from hlo_doctor.report.text import render_text
from hlo_doctor.runner.detect import FrameworkError, detect_framework
from hlo_doctor.runner.extras import MissingExtra, extras_for, require_extras
from hlo_doctor.runner.run import RunError, RunResult, run_example, run_script
from hlo_doctor.runner.targets import TARGET_SPECS, TargetError, parse_target


def _split_command(command: tuple[str, ...]) -> tuple[str | None, str, list[str]]:
    """``python train.py --lr 1`` -> (python, train.py, [--lr, 1]); ``train.py`` alone works too."""
    first, rest = command[0], list(command[1:])
    if os.path.basename(first).startswith("python") and not first.endswith(".py"):
        if not rest or rest[0].startswith("-"):
            raise click.UsageError("expected `python SCRIPT [ARGS...]` after `--`")
        return first, rest[0], rest[1:]
    return None, first, rest


def _detected(script: str) -> str | None:
    """The script's framework from its imports, or None (the run then says what is wrong)."""
    try:
        return detect_framework(script)
    except (FrameworkError, OSError):
        return None


def _default_dump_dir(stem: str) -> Path:
    return Path("hlo-doctor-dumps") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _summarize(result: RunResult) -> None:
    sidecar = result.sidecar
    click.echo(
        f"framework {sidecar['framework']}, partitioner {sidecar['partitioner'] or 'unknown'}, "
        f"{sidecar['device_count'] or '?'} devices"
    )
    if sidecar.get("target"):
        t = sidecar["target"]
        if t.get("platform") == "tpu":
            click.echo(f"target {t['topology_name']} ({t.get('device_kind', 'TPU')}): "
                       f"{len(sidecar.get('devices') or [])} devices on "
                       f"{len(sidecar.get('hosts') or [])} hosts, {t['num_slices']} slice(s), "
                       f"{len(sidecar.get('compiles') or [])} compiles")
        else:
            click.echo(f"target {t['name']}: {t['hosts']} hosts x {t['devices_per_host']} devices "
                       f"({t.get('device_kind', t['platform'])}), "
                       f"{len(sidecar.get('device_assignments') or {})} modules compiled")
    for mesh in sidecar["meshes"]:
        axes = ", ".join(f"{n}={s}" for n, s in zip(mesh["axis_names"], mesh["shape"], strict=True))
        click.echo(f"mesh ({axes}) devices {mesh['device_ids']}")


def _analyze(dump_dir: Path, program: str | None) -> None:
    # The runner ran ``program`` in this invocation: its folder may be read and quoted.
    settings = SourceSettings(programs=(program,) if program else ())
    report = analyze_dump(dump_dir, drawings=False, sources=settings)  # a text report
    sources = SourcePolicy.of(settings, report.dump)
    click.echo(render_text(report, color=False, width=100, sources=sources).rstrip("\n"))


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the dump (new or empty). Default: ./hlo-doctor-dumps/SCRIPT-TIME")
@click.option("--framework", type=click.Choice(["jax", "torch-xla", "torch_xla"],
              case_sensitive=False), help="Default: read from the script's imports.")
@click.option("--devices", type=click.IntRange(min=1),
              help="Simulate this many CPU devices.")
@click.option("--devices-per-host", type=click.IntRange(min=1),
              help="Devices per host to assume when judging cross-host collectives.")
@click.option("--shardy/--gspmd", "shardy", default=None,
              help="JAX only: the partitioner (default: JAX's own default).")
@click.option("--no-analyze", is_flag=True, help="Only produce the dump.")
@click.option("--example", "example", metavar="NAME",
              help="Run a gallery example instead of a script (see `hlo-doctor examples`).")
@click.option("--variant", type=click.Choice(["bad", "fixed", "healthy"]),
              help="The example's variant (default: its first).")
@click.option("--target", "target", metavar="TARGET",
              help=f"JAX only: compile without the hardware for a GPU cluster, e.g. h100:2x8 "
                   f"({', '.join(sorted(TARGET_SPECS))}; default 1x8; needs the gpu-target extra), "
                   f"or a TPU slice, e.g. v4:4x4x8, v4-256, v5e:4x4, v5e:4x4x2slices "
                   f"(multi-slice; needs the tpu-target extra). Jitted calls are compiled, not run.")
@click.option("--target-config", type=click.Path(dir_okay=False, path_type=Path),
              help="Your own GpuTargetConfigProto text file for --target (NAME is then free).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_command(dump_dir, framework, devices, devices_per_host, shardy, no_analyze, example,
                variant, target, target_config, command):
    """Run a JAX or torch_xla script with HLO dumping on, then analyze the dump.

    \b
      hlo-doctor run --devices 8 -- python train.py --steps 1
      hlo-doctor run --target h100:2x8 -- python train.py
      hlo-doctor run --target v4:4x4x8 -- python train.py
      hlo-doctor run --example fsdp-activation-gather --variant bad
      hlo-doctor run --example fsdp-activation-gather --target a100:2x8
    """
    partitioner = None if shardy is None else ("shardy" if shardy else "gspmd")
    compile_target = None  # a GPU Target or a TpuTarget
    if target is not None or target_config is not None:
        try:
            compile_target = parse_target(target, config_file=target_config)
        except TargetError as error:
            raise click.BadParameter(str(error), param_hint="'--target'") from None
        if devices is not None:
            raise click.UsageError("--target sets the device count itself; drop --devices")
        if framework is not None and framework.replace("-", "_").lower() != "jax":
            raise click.UsageError("--target compiles JAX programs only")
    try:
        if example is not None:
            if command or devices is not None or devices_per_host is not None:
                raise click.UsageError("--example takes no script, --devices or --devices-per-host")

            entry = get_example(example)
            framework = framework or entry.frameworks[0]
            platform = _platform(compile_target if compile_target is not None or not entry.target_only
                                 else parse_target(entry.targets[0]))
            require_extras(extras_for(framework, target_platform=platform)
                           + ([entry.extra] if entry.extra else []))
            result = run_example(
                example, framework=framework, variant=variant or entry.variants[0],
                dump_dir=dump_dir or _default_dump_dir(example), partitioner=partitioner,
                echo=True, target=compile_target,
            )
        else:
            if not command:
                raise click.UsageError("give a script: hlo-doctor run [OPTIONS] -- python SCRIPT")
            if variant is not None:
                raise click.UsageError("--variant needs --example")
            python, script, args = _split_command(command)
            used = "jax" if compile_target is not None else framework or _detected(script)
            require_extras(extras_for(used, target_platform=_platform(compile_target)), python)
            result = run_script(
                script, args, dump_dir=dump_dir or _default_dump_dir(Path(script).stem),
                framework="jax" if compile_target is not None else framework, devices=devices,
                partitioner=partitioner, devices_per_host=devices_per_host, python=python,
                echo=True, target=compile_target,
            )
    except RunError as error:
        click.echo(f"error: {error}; last lines of its stderr:", err=True)
        click.echo(error.format_tail(), err=True)
        sys.exit(2)
    except MissingExtra as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    except (FrameworkError, ValueError, FileNotFoundError) as error:
        raise click.UsageError(str(error)) from None

    _summarize(result)
    if no_analyze:
        click.echo(f"dump: {result.dump_dir}")
    else:
        script = result.sidecar.get("script")  # the record this invocation's runner wrote
        path = script.get("path") if isinstance(script, dict) else None
        _analyze(result.dump_dir, path if isinstance(path, str) else None)


@click.command("examples")
def examples_command():
    """List the example gallery: one example per line."""
    width = max(len(e.name) for e in EXAMPLES)
    for e in EXAMPLES:
        click.echo(
            f"{e.name:<{width}}  {'/'.join(e.variants):<9}  {str(e.devices) + ' dev':<6}  "
            f"{example_needs(e):<24}  {e.description}"
        )


def example_needs(example) -> str:
    """The extras an example needs: one per framework (``jax | torch-xla``), ``+gpu-target`` for a GPU-only one
    and ``+tpu-target`` for a TPU-only one."""
    platform = _platform(parse_target(example.targets[0])) if example.target_only else None
    needs = " | ".join("+".join(extras_for(f, target_platform=platform)
                                + ([example.extra] if example.extra else [])) for f in example.frameworks)
    return f"needs {needs}"


def _platform(compile_target) -> str | None:  # noqa: ANN001 - a Target, a TpuTarget or None
    """The platform a deviceless target compiles for (``cuda``, ``tpu``), None for CPU devices."""
    return compile_target.platform if compile_target is not None else None
