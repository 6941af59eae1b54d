"""The HTML report without a browser: self-contained, the inventory's shape, and a dump that is gone."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from hlo_doctor.report import render
from hlo_doctor.report.html import INVENTORY_KEYS, module_inventory

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


def test_bars_group_by_the_rows_role(report, monkeypatch):
    from hlo_doctor.report import html

    def with_roles(ctx):
        rows = module_inventory(ctx)
        return [dict(row, role=("activation-gather" if row["instruction"] == "all-gather" else "weight-gather"))
                for row in rows]

    monkeypatch.setattr(html, "module_inventory", with_roles)
    page = render(report, "html")
    assert 'class="bar-label">activation-gather</text>' in page and 'class="bar-label">weight-gather</text>' in page
    assert "<td>activation-gather</td>" in page


def test_a_dump_that_is_gone_still_gives_a_report(report):
    page = render(dataclasses.replace(report, dump="/no/such/dump"), "html")
    assert "pictures left out: the dump cannot be read again" in page
    assert page.count('<section class="finding') == len(report.findings)
