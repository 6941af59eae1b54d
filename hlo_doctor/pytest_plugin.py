"""pytest plugin (entry point ``pytest11``): gate a jitted function's compiled graph in a test.

::

    def test_no_bad_sharding(hlo_doctor):
        hlo_doctor.check_jax(train_step, state, batch, devices=8).assert_clean()

``check_jax`` compiles the function for its arguments (arrays or
``jax.ShapeDtypeStruct`` with shardings), dumps it into the test's temporary
folder and analyzes it. ``assert_clean()`` fails the test with the findings
as the text report prints them. Options:

* ``--hlo-doctor-devices=N`` (or ini ``hlo_doctor_devices``): give JAX N
  virtual CPU devices before any test imports it, so meshes of N devices can
  be built at collection time;
* ``--hlo-doctor-fail-on=error|warning|info`` (ini ``hlo_doctor_fail_on``):
  what ``assert_clean()`` fails on (default ``warning``).

For torch_xla, :meth:`HloDoctorFixture.check_torch_xla` runs a script
through the runner (torch_xla must start in a fresh process with
``PJRT_DEVICE=CPU CPU_NUM_DEVICES=N``) and analyzes its dump.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hlo_doctor.findings import Severity

# pytest loads this plugin (an entry point) in every session of an environment that has
# hlo-doctor installed, so the analysis is imported only when a test asks for it.


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hlo-doctor", "hlo-doctor: gate compiled XLA graphs")
    group.addoption("--hlo-doctor-devices", type=int, default=None,
                    help="virtual CPU devices for JAX (set before JAX starts)")
    group.addoption("--hlo-doctor-fail-on", choices=("error", "warning", "info"), default=None,
                    help="severity at which assert_clean() fails (default: warning)")
    parser.addini("hlo_doctor_devices", "virtual CPU devices for JAX", default="")
    parser.addini("hlo_doctor_fail_on", "severity at which assert_clean() fails", default="warning")


def pytest_configure(config: pytest.Config) -> None:
    devices = config.getoption("--hlo-doctor-devices") or config.getini("hlo_doctor_devices")
    if devices:
        flag = f"--xla_force_host_platform_device_count={int(devices)}"
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


class CheckResult:
    """The analysis of one compiled graph, with assertions for tests."""

    def __init__(self, report: Any, fail_on: str) -> None:
        self.report = report
        self.fail_on = fail_on

    @property
    def findings(self) -> tuple[Any, ...]:
        return self.report.findings

    def failing(self, fail_on: str | None = None) -> list[Any]:
        threshold = Severity(fail_on or self.fail_on).rank
        return [f for f in self.report.findings if f.severity.rank <= threshold]

    def assert_clean(self, *, fail_on: str | None = None, ignore: Sequence[str] = ()) -> CheckResult:
        """Fail the test when findings at or above ``fail_on`` remain (rules in ``ignore`` excepted)."""
        failing = [f for f in self.failing(fail_on) if f.rule not in ignore]
        if failing:
            from hlo_doctor.report.text import render_text

            pytest.fail(
                f"hlo-doctor: {len(failing)} finding{'s' if len(failing) != 1 else ''} in the compiled graph\n"
                + render_text(self.report, color=False, width=120),
                pytrace=False,
            )
        return self

    def assert_finds(self, rule: str) -> CheckResult:
        """Fail unless ``rule`` reports something (to pin a known problem in a regression test)."""
        if not any(f.rule == rule for f in self.report.findings):
            pytest.fail(f"hlo-doctor: expected a {rule} finding, got {[f.rule for f in self.report.findings]}",
                        pytrace=False)
        return self


class HloDoctorFixture:
    def __init__(self, tmp_path: Path, fail_on: str) -> None:
        self.tmp_path = tmp_path
        self.fail_on = fail_on
        self._count = 0

    def _dump_dir(self, label: str) -> Path:
        self._count += 1
        return self.tmp_path / f"hlo-dump-{self._count}-{label}"

    def check_jax(self, fn: Callable[..., Any], *args: Any, devices: int | None = None, **options: Any) -> CheckResult:
        """Compile ``jax.jit(fn)`` for ``args`` and analyze it (options as for ``hlo_doctor.analyze_jax``)."""
        from hlo_doctor.api import analyze_jax

        name = getattr(fn, "__name__", "fn")
        report = analyze_jax(fn, *args, devices=devices, dump_dir=self._dump_dir(name), **options)
        return CheckResult(report, self.fail_on)

    def check_dump(self, path: str | os.PathLike[str], **options: Any) -> CheckResult:
        from hlo_doctor.analysis import analyze_dump

        return CheckResult(analyze_dump(path, **options), self.fail_on)

    def check_torch_xla(self, script: str | os.PathLike[str], *args: str, devices: int = 4,
                        **options: Any) -> CheckResult:
        """Run a torch_xla script through the runner on ``devices`` CPU devices and analyze its dump."""
        from hlo_doctor.analysis import analyze_dump
        from hlo_doctor.runner import run_script

        dump = self._dump_dir(Path(script).stem)
        run_script(Path(script), list(args), dump_dir=dump, framework="torch_xla", devices=devices)
        return CheckResult(analyze_dump(dump, **options), self.fail_on)


@pytest.fixture
def hlo_doctor(request: pytest.FixtureRequest, tmp_path: Path) -> HloDoctorFixture:
    """Compile and analyze graphs inside a test; see :mod:`hlo_doctor.pytest_plugin`."""
    fail_on = request.config.getoption("--hlo-doctor-fail-on") or request.config.getini("hlo_doctor_fail_on")
    return HloDoctorFixture(tmp_path, fail_on or "warning")
