"""Each output format against a checked-in snapshot of a real fixture's report.

Regenerate on purpose with ``python -m pytest tests/test_report_snapshots.py --update-snapshots``
in a clean clone (not the checkout that compiled the fixtures) and review the diff. Paths of this checkout are written as ``<repo>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hlo_doctor import __version__
from hlo_doctor.report import FORMATS, render

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).parent / "snapshots"
CASES = {
    "seed-shardy-bad": "fixtures/fsdp-activation-gather/jax-shardy-bad",
    "seed-torch_xla-bad": "fixtures/fsdp-activation-gather/torch_xla-bad",
    "seed-shardy-fixed": "fixtures/fsdp-activation-gather/jax-shardy-fixed",
    # the seed's own 1-D strategy: one root cause with 17 symptoms of three kinds
    "seed-1d-torch_xla-bad": "fixtures/hf-1d-params-torch-xla/torch_xla-bad",
}
SUFFIX = {"text": "txt", "json": "json", "sarif": "sarif", "markdown": "md", "github": "txt", "html": "html"}


def recorded_root(folder: str) -> str:
    """The checkout the fixture was compiled in (its sidecar's program path, three levels up)."""
    script = json.loads((ROOT / folder / "hlo_doctor_run.json").read_text())["script"]["path"]
    return str(Path(script).parents[3])


def normalize(text: str, folder: str) -> str:
    text = text.replace(str(ROOT / "fixtures"), "<repo>/fixtures")
    # The longer path first: a clean clone may sit under a folder that ends with the recorded one.
    for path, token in sorted(
        {recorded_root(folder): "<compiled-in>", str(ROOT): "<repo>"}.items(), key=lambda kv: -len(kv[0])
    ):
        text = text.replace(path, token)
    return text.replace(f'"{__version__}"', '"<version>"').replace(f"hlo-doctor {__version__}", "hlo-doctor <version>")


@pytest.fixture(scope="module")
def reports():
    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.testing import builtin_rule_ids

    # Built-in rules only: installed plugins must not change the snapshots.
    return {name: analyze_dump(ROOT / folder, select=builtin_rule_ids()) for name, folder in CASES.items()}


@pytest.mark.parametrize("output_format", FORMATS)
@pytest.mark.parametrize("case", CASES)
def test_report_matches_snapshot(
    case: str, output_format: str, reports, matches_snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    if recorded_root(CASES[case]) == str(ROOT):
        # The checkout that compiled the fixtures reads their program files where they were recorded;
        # the snapshots hold what every other checkout reads (by the recorded path's tail), as CI's
        # clean clone does. Regenerate them in a clean clone.
        pytest.skip("the fixture was compiled in this checkout")
    monkeypatch.chdir(ROOT)  # SARIF and annotations write paths relative to the checkout
    produced = normalize(render(reports[case], output_format, color=False, width=110), CASES[case])
    matches_snapshot(SNAPSHOTS / f"{case}.{output_format}.{SUFFIX[output_format]}", produced)


def test_text_gives_one_line_per_kind_of_symptom_and_verbose_each_one(reports) -> None:
    import dataclasses

    report = reports["seed-1d-torch_xla-bad"]
    [finding] = report.findings
    symptoms = finding.evidence["symptoms"]
    assert len(symptoms) == 17
    short = render(report, "text", color=False)
    kinds = [line for line in short.splitlines() if "per step (" in line]
    assert kinds[0].startswith("  symptoms: 14 cross-host activation all-gathers, 912 KiB per step (")
    assert len(kinds) == 3 and "it also causes" not in short
    assert not any(f"\n      {s['instruction']} ({s['rule']}, " in short for s in symptoms)
    verbose = render(dataclasses.replace(report, verbose=True), "text", color=False)
    for symptom in symptoms:
        assert f"\n      {symptom['instruction']} ({symptom['rule']}, " in verbose
