"""The README's commands and examples actually run."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"README has no '{title}' section"
    return match.group(1)


def first_block(text: str, language: str = "") -> str:
    match = re.search(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
    assert match
    return match.group(1)


@pytest.mark.parametrize("title", ["Quick start", "Tests"])
def test_sections_hold_one_command_line(title: str) -> None:
    block = first_block(section(title)).strip()
    assert block and "\n" not in block


def test_ci_runs_exactly_the_tests_command() -> None:
    command = first_block(section("Tests")).strip()
    extracted = subprocess.run(
        ["bash", "-c", "source <(sed -n '/^command=/,/^if /p' .ci/run | head -n -1); echo \"$command\""],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert extracted == command


def test_each_extra_on_its_own_runs_a_readme_command() -> None:
    """.ci/extras.sh (run in CI after the tests) installs each extra alone and runs the README's command for it."""
    assert first_block(section("Tests")).strip().endswith(" && .ci/extras.sh")
    cases = re.findall(r'^  "([^"|]+)\|([^"]+)"$', (ROOT / ".ci" / "extras.sh").read_text(), re.M)
    assert [extras for extras, _ in cases] == ["jax", "torch-xla", "jax,gpu-target", "jax,tpu-target"]
    for extras, command in cases:
        assert command in README and f"'.[{extras}]'" in README, (extras, command)


@pytest.mark.slow
def test_quick_start_prints_the_diagnosis_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jax")
    from click.testing import CliRunner

    from hlo_doctor.cli import main

    command = first_block(section("Quick start")).strip()
    doctor = command.split("&&")[-1].strip()
    assert doctor.startswith("hlo-doctor ")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, shlex.split(doctor)[1:])
    assert result.exit_code == 0, result.output
    for expected in ("  symptoms: 2 activation all-gathers, 1.03 MiB per step (activation-all-gather)\n",
                     "fsdp_activation_gather.py:49:9: warning non-batch-dim-sharding ",
                     "jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(('fsdp', 'replica'), None)))"):
        assert expected in result.output
    assert "xs.mark_sharding" not in result.output  # a JAX program: the JAX fix only


def test_python_api_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    exec(compile(first_block(section("Python API"), "python"), "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("non-batch-dim-sharding dot 49 ") for line in printed), printed


@pytest.mark.slow
def test_analyze_jax_example_runs_in_a_fresh_process() -> None:
    pytest.importorskip("jax")
    import sys

    blocks = re.findall(r"^```python\n(.*?)^```", section("Python API"), re.S | re.M)
    example = next(block for block in blocks if "analyze_jax" in block)
    assert "ShapeDtypeStruct" in example and "jnp.ones" not in example
    result = subprocess.run([sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.fullmatch(r"\d+ findings in \S+\n", result.stdout), result.stdout


def test_collectives_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from click.testing import CliRunner

    from hlo_doctor.cli import main

    command = first_block(section("What your step sends, and why")).strip()
    assert command.startswith("hlo-doctor collectives ")
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["schema_version"] == 1
    [module] = document["modules"]
    roles = {c["role"] for c in module["collectives"]}
    assert roles == {"weight-gather", "gradient-reduce", "scalar-reduce"}  # an FSDP train step
    keys = {"instruction", "kind", "role", "phase", "parameters", "axes", "group_size", "crosses_hosts",
            "bytes_per_device", "executions", "source", "reason"}
    assert all(set(c) == keys for c in module["collectives"])


def test_diff_critical_path_example_passes_the_right_fix() -> None:
    from click.testing import CliRunner

    from hlo_doctor.cli import main

    text = section("Use in CI")
    command = re.search(r"^(hlo-doctor diff .*--critical-path)$", text, re.M).group(1)
    result = CliRunner().invoke(main, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    ending = re.search(r"ends with `(.*?)` and exits 0", text, re.S).group(1)
    assert " ".join(ending.split()) in result.stdout


@pytest.mark.slow
def test_fix_verify_example_runs_and_prints_what_the_readme_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jax")
    import sys

    from click.testing import CliRunner

    import hlo_doctor.fix as fixlib
    from hlo_doctor.cli import main

    try:
        fixlib.plan_fixes(())
    except NotImplementedError:
        pytest.skip("hlo_doctor.fix.plan_fixes is not built yet")
    text = section("Fix it, and check the fix")
    blocks = re.findall(r"^```\n(.*?)^```", text, re.S | re.M)
    command, shown = blocks[0].strip(), blocks[1]
    args = shlex.split(command)[1:]
    args[args.index("python")] = sys.executable
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == shown
