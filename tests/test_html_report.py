"""The HTML report without a browser: self-contained, the inventory's shape, drawn from the Report alone."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hlo_doctor.pictures import INVENTORY_KEYS
from hlo_doctor.report import render
from hlo_doctor.rules.drawings import module_inventory

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"


@pytest.fixture(scope="module")
def report():
    from hlo_doctor.analysis import analyze_dump

    return analyze_dump(SEED)


def test_page_fetches_nothing(report):
    page = render(report, "html")
    assert "default-src 'none'" in page  # the CSP forbids every fetch, whatever the page holds
    links = re.findall(r'(?:src|href)="([^"#][^"]*)"', page)
    assert links == []  # only in-page anchors
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    assert len(page) < 100_000


def test_inventory_rows_have_exactly_the_agreed_keys(report):
    from hlo_doctor.dump import load_dump
    from hlo_doctor.rules import RuleContext

    dump = load_dump(SEED)
    rows = module_inventory(RuleContext(dump, dump.modules[0]))
    assert [row["instruction"] for row in rows] == ["all-gather", "all-gather.1"]
    assert all(tuple(row) == INVENTORY_KEYS for row in rows)
    assert rows[0]["bytes_per_device"] == 819200 and rows[0]["axes"] == ["fsdp"] and rows[0]["group_size"] == 4
    assert module_inventory(None) is None


def test_the_analysis_hands_the_report_its_inventory(report):
    [module] = report.modules
    assert [row["instruction"] for row in module.inventory] == ["all-gather", "all-gather.1"]
    assert all(tuple(row) == INVENTORY_KEYS for row in module.inventory)


def test_bars_group_by_the_rows_role(report):
    [module] = report.modules
    rows = tuple(dict(row, role=("activation-gather" if row["instruction"] == "all-gather" else "weight-gather"))
                 for row in module.inventory)
    page = render(dataclasses.replace(report, modules=(dataclasses.replace(module, inventory=rows),)), "html")
    assert 'class="bar-label">activation-gather</text>' in page and 'class="bar-label">weight-gather</text>' in page
    assert "<td>activation-gather</td>" in page


def test_the_page_is_drawn_from_the_report_alone(report, monkeypatch):
    """Every picture comes with the findings: a dump that is gone (or any read of it) changes nothing."""
    import hlo_doctor.dump.folder
    import hlo_doctor.dump.snapshot

    def must_not_read(*args, **kwargs):
        raise AssertionError("the report read the dump")

    monkeypatch.setattr(hlo_doctor.dump.folder, "load_dump", must_not_read)
    monkeypatch.setattr(hlo_doctor.dump.snapshot.Snapshot, "module", must_not_read)
    page = render(dataclasses.replace(report, dump="/no/such/dump"), "html")
    assert page.count('<section class="finding') == len(report.findings)
    [finding] = report.findings
    assert finding.pictures is not None and finding.pictures.notes == ()
    assert "dataflow around %dot (" in page
    assert page.count('<svg class="picture ') == 3 * len(report.findings)


def test_symptoms_are_a_table_of_kinds(report):
    page = render(report, "html")
    # the seed: the two activation gathers of the feature-sharded layer, 600 KiB + 450 KiB over the wire
    assert ("<tr><td>activation all-gather</td><td>2</td><td>1.03 MiB</td><td>activation-all-gather</td></tr>"
            in page)
    assert "<summary>each symptom (2)</summary>" in page
    assert "it also causes" not in page


@pytest.mark.parametrize("fixture", ["fsdp-activation-gather/jax-shardy-bad", "hf-1d-params-torch-xla/torch_xla-bad"])
def test_format_html_parses_the_dump_once(fixture, tmp_path, monkeypatch):
    """`analyze --format html` parses each snapshot once: the ones `--format text` parses, and the optimized
    module, which the memory picture reads (XLA's buffer assignment names its instructions)."""
    from collections import Counter

    from click.testing import CliRunner

    import hlo_doctor.hlo
    from hlo_doctor.cli import main

    parses: Counter[str] = Counter()
    parse = hlo_doctor.hlo.parse_module

    def counted(text, *args, path=None, **kwargs):
        parses[str(path)] += 1
        return parse(text, *args, path=path, **kwargs)

    monkeypatch.setattr(hlo_doctor.hlo, "parse_module", counted)
    dump = str(ROOT / "fixtures" / fixture)
    by_format = {}
    for output_format in ("text", "html"):
        parses.clear()
        out = tmp_path / f"report.{output_format}"
        result = CliRunner().invoke(main, ["analyze", dump, "--jobs", "1", "--format", output_format, "-o", str(out)])
        assert result.exit_code in (0, 1), result.output
        by_format[output_format] = dict(parses)
    assert by_format["html"] and set(by_format["html"].values()) == {1}
    extra = set(by_format["html"]) - set(by_format["text"])
    assert all(path.endswith("cpu_after_optimizations.txt") for path in extra), extra
    assert set(by_format["text"]) <= set(by_format["html"])
    page = (tmp_path / "report.html").read_text()
    assert '<svg class="picture dataflow"' in page and '<svg class="picture mesh"' in page
    assert 'class="picture memory"' in page


def test_an_analysis_without_drawings_says_so_in_the_page():
    """The CLI asks for drawings only for --format html; a report made without them still renders."""
    from hlo_doctor.analysis import analyze_dump

    report = analyze_dump(SEED, drawings=False)
    assert not report.drawings and all(f.pictures is None for f in report.findings)
    assert all(module.inventory is None for module in report.modules)
    page = render(report, "html")
    assert "pictures and inventories left out: the analysis did not make them" in page
    assert '<svg class="picture' not in page and "not made by the analysis" in page


def test_the_page_shows_each_modules_memory_against_the_target(tmp_path):
    """The memory picture: the peak stacked by class against the target's HBM, drawn from the Report."""
    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.units import format_bytes

    folder = ROOT / "fixtures" / "device-memory" / "jax-v5e_4x4-bad"  # 20.44 GiB on a 16 GiB v5e chip
    report = analyze_dump(folder, select=["exceeds-device-memory"], jobs=1)
    [module] = report.modules
    memory = module.memory
    assert memory["peak_source"] == "xla-buffer-assignment"
    assert sum(memory["classes"].values()) == memory["peak_bytes"]
    assert memory["target"]["hardware"] == "tpu-v5e" and memory["target"]["headroom_bytes"] < 0
    assert len(memory["items"]) <= 12
    page = render(dataclasses.replace(report, dump="/no/such/dump"), "html")  # drawn from the report alone
    section = page[page.index('<section class="module memory">'):]
    section = section[:section.index("</section>")]
    assert "peak 20.44 GiB per device (XLA&#x27;s buffer assignment); tpu-v5e 16.00 GiB per device: " \
           "over by 4.44 GiB: does not fit" in section
    for cls, size in memory["classes"].items():
        assert f"<title>{cls}: {format_bytes(size)}</title>" in section  # one segment per class
    assert section.count("<rect") == 2 * len(memory["classes"])  # a segment and a legend swatch each
    assert "<script" not in section
    # names from the dump are escaped
    hostile = dataclasses.replace(module, memory=dict(memory, items=[
        {"class": "weights", "name": "<img src=x onerror=alert(1)>", "bytes": 1, "source": None}]))
    page = render(dataclasses.replace(report, modules=(hostile,)), "html")
    assert "<img src=x" not in page and "&lt;img src=x" in page


def test_no_memory_without_drawings():
    from hlo_doctor.analysis import analyze_dump

    report = analyze_dump(ROOT / "fixtures" / "device-memory" / "jax-v5e_4x4-fixed", select=["exceeds-device-memory"],
                          drawings=False, jobs=1)
    assert all(module.memory is None for module in report.modules)
    assert '<section class="module memory">' not in render(report, "html")

