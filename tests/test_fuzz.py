"""Fuzz: mutated real modules give either an HloModule or a ParseError.

Seeds are real HLO texts: the checked-in fixtures (real compiler output) and,
when present, a sample of ../shared/corpus/xla-hlo/valid.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hlo_doctor.hlo import HloModule, ParseError, parse_module
from tests.corpus import corpus_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def seed_texts() -> list[str]:
    seeds = [p.read_text() for p in sorted(FIXTURES.glob("**/*after_spmd-partitioning*.txt"))[:6]]
    seeds += [p.read_text() for p in corpus_files("valid")[::400]]
    return [s for s in seeds if len(s) < 200_000]


SEEDS = seed_texts()
TOKENS = ["{", "}", "(", ")", "[", "]", ",", "=", '"', "%", "ROOT ", "/*", "*/", "//", "\n", "<=", "T(", "-", "0", "f32[", "\x00", "é"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "truncate", "duplicate"]))
        at = draw(st.integers(0, max(0, len(text) - 1)))
        if kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif kind == "truncate":
            text = text[:at]
        else:
            end = min(len(text), at + draw(st.integers(1, 200)))
            text = text[:end] + text[at:end] + text[end:]
    return text


@pytest.mark.skipif(not SEEDS, reason="no seed modules (fixtures and corpus absent)")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_modules_parse_or_raise_parse_error(text: str) -> None:
    try:
        module = parse_module(text, path="fuzz.txt")
    except ParseError as error:
        assert error.line >= 1 and error.col >= 1
        assert "\n" not in str(error)
        return
    assert isinstance(module, HloModule)
    for _, instruction in module.instructions():
        # The lazily interpreted attributes must fail the same clean way.
        for getter in ("sharding", "metadata", "replica_groups", "dimensions", "source"):
            try:
                getattr(instruction, getter)
            except ParseError:
                pass
