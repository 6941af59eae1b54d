"""The HTML report in a real headless Chromium: it loads without console errors, draws, and shows every finding.

Skipped when no Chromium is installed; CI installs Debian's ``chromium`` (see
the README's Tests section). Console messages are read from Chromium's
``--enable-logging=stderr`` lines (``INFO:CONSOLE``); the report logs nothing,
so any console line fails the test, CSP violations (a fetch) included. The
first test proves that reading works on a page that does throw.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "fixtures" / "fsdp-activation-gather" / "jax-shardy-bad"
CROSS_HOST = ROOT / "fixtures" / "cross-host-tp" / "jax-h100_2x8-bad"
CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (CI installs it)")


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile.mkdir(exist_ok=True)
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, unfiltered rows) of an 8-bit RGB/RGBA PNG, without a library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, idat = 8, b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
        elif kind == b"IDAT":
            idat += body
        position += 12 + length
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    out = bytearray()
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        out += line
        previous = line
    return width, height, channels, bytes(out)


def grey_variance(width: int, height: int, channels: int, pixels: bytes) -> float:
    greys = [sum(pixels[i:i + 3]) / 3 for i in range(0, len(pixels), channels * 7)]  # every 7th pixel
    mean = sum(greys) / len(greys)
    return sum((g - mean) ** 2 for g in greys) / len(greys)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.report import render
    from hlo_doctor.testing import builtin_rule_ids

    folder = tmp_path_factory.mktemp("html")
    out = {}
    for name, dump in (("seed", SEED), ("cross-host", CROSS_HOST)):
        report = analyze_dump(dump, select=builtin_rule_ids())
        page = folder / f"{name}.html"
        page.write_text(render(report, "html"), encoding="utf-8")
        out[name] = (page, report)
    return out


def test_console_reading_catches_a_page_that_throws(tmp_path):
    page = tmp_path / "throws.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>throw new Error('deliberate')</script>")
    result = chromium(page, tmp_path / "profile", "--dump-dom")
    assert any("deliberate" in line for line in console_lines(result.stderr)), result.stderr[-2000:]


def test_blank_page_has_no_variance(tmp_path):
    page = tmp_path / "blank.html"
    page.write_text("<!DOCTYPE html><body style='background:#fff'></body>")
    shot = tmp_path / "blank.png"
    chromium(page, tmp_path / "profile", "--window-size=600,400", f"--screenshot={shot}")
    assert grey_variance(*png_pixels(shot.read_bytes())) == 0


@pytest.mark.parametrize("name", ["seed", "cross-host"])
def test_report_loads_clean_draws_and_shows_every_finding(name, pages, tmp_path):
    page, report = pages[name]
    assert report.findings
    shot = tmp_path / "shot.png"
    result = chromium(page, tmp_path / "profile", "--window-size=1000,1400", f"--screenshot={shot}", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert console_lines(result.stderr) == []
    dom = result.stdout
    ids = re.findall(r'<section class="finding [a-z]+" id="(finding-\d+)" data-rule="([^"]+)"', dom)
    assert ids == [(f"finding-{n}", f.rule) for n, f in enumerate(report.findings, 1)]
    assert dom.count('<button type="button" class="copy"') >= len(report.findings)
    assert dom.count('<svg class="picture dataflow"') == sum(1 for f in report.findings if f.instruction)
    width, height, channels, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    assert grey_variance(width, height, channels, pixels) > 100
