"""Fuzz: mutated real modules give either an HloModule or a ParseError.

Seeds are real HLO texts: the checked-in fixtures (real compiler output) and,
when present, a sample of ../shared/corpus/xla-hlo/valid.
"""

from __future__ import annotations

import re
import shutil
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


# --------------------------------------------------------------------------------------------------
# The whole analysis on mutated dumps (issue 30): a dump is untrusted input. Real fixtures (runner
# output) are copied and one snapshot is mutated per case, by bytes or by HLO tokens; the case is
# analyzed with every rule and rendered in one of the formats, as ``hlo-doctor analyze`` does.
# What may happen: a report (exit 0 or 1) or an InputError/ParseError (exit 2, one line). What
# may not: any other exception (a traceback), an internal-error finding, an internal parser error.

ANALYSIS_SEEDS = [
    "fsdp-activation-gather/jax-shardy-bad",
    "fsdp-activation-gather/torch_xla-bad",
    "fsdp-activation-gather/jax0.4.35-gspmd-bad",
    "cross-host-tp/jax0.4.35-gspmd-bad",
    "transposed-mesh/jax-gspmd-bad",
    "uneven-padding/jax-shardy-bad",
]
CASES = 2000
WORKERS = 2
NUMBERS = ["0", "-1", "1", "7", "1000000000", "4294967296", "99999999999999999999", "2147483648"]
HLO_TOKENS = [*TOKENS, "<=[", "]T(", "{maximal device=", "replicated", "last_tile_dim_replicate", "manual",
              "mesh['a'=2]", "{'a'}", "sharding=", "replica_groups=", "metadata={", "op_name=\"",
              "ROOT %x = f32[] parameter(0)\n", "ENTRY %e {", "while(", "all-gather(", "}, {", ")->"]


def _mutate(data: bytes, rng) -> bytes:
    """One to three byte or token mutations of ``data``."""
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(max(1, len(data)))
        kind = rng.randrange(10)
        if kind == 0:  # a random byte
            data = data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
        elif kind == 1:  # random bytes in
            data = data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[at:]
        elif kind == 2:  # a range out
            data = data[:at] + data[at + rng.randint(1, 64):]
        elif kind == 3:  # a range twice
            end = min(len(data), at + rng.randint(1, 200))
            data = data[:end] + data[at:end] + data[end:]
        elif kind == 4:  # cut short
            data = data[:at]
        elif kind == 5:  # a token in
            data = data[:at] + rng.choice(HLO_TOKENS).encode() + data[at:]
        elif kind in (6, 7):  # a number changed
            numbers = [m.span() for m in re.finditer(rb"\d+", data)]
            if numbers:
                start, end = rng.choice(numbers)
                data = data[:start] + rng.choice(NUMBERS).encode() + data[end:]
        elif kind == 8:  # one bracket, brace or parenthesis out
            places = [m.start() for m in re.finditer(rb"[\[\]{}()]", data)]
            if places:
                place = rng.choice(places)
                data = data[:place] + data[place + 1:]
        else:  # one attribute's value given to another attribute
            values = [m.span(1) for m in re.finditer(rb"=(\{[^{}\n]*\}|[\w.\-\[\]<=]+)", data)]
            if len(values) > 1:
                (a, b), (c, d) = rng.sample(values, 2)
                if b <= c:
                    data = data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:]
    return data


def _fuzz_cases(seeds: list[Path], work: Path, indices: range) -> list[str]:
    """Run cases ``indices`` (each mutates one snapshot of one seed, chosen by its own seeded
    random stream); the failures, one line each."""
    import random
    import traceback

    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.dump import Dump, load_dump
    from hlo_doctor.dump.module import DumpModule
    from hlo_doctor.dump.snapshot import Snapshot
    from hlo_doctor.errors import InputError
    from hlo_doctor.fingerprint import occurrence_fingerprints
    from hlo_doctor.report import FORMATS, render
    from hlo_doctor.report.sarif import render_sarif
    from hlo_doctor.report.source import SourcePolicy
    from hlo_doctor.rules import discover

    registry = discover()  # the rules, discovered once for all the cases
    loaded = []
    for seed in seeds:
        copy = work / seed.parent.name / seed.name
        shutil.copytree(seed, copy)
        dump = load_dump(copy)
        dump.parse_all()
        for module in dump.modules:  # the metadata files are not mutated: read them once
            for cached in ("compile_options", "topology", "debug_options", "mlir", "_meshes"):
                getattr(module, cached)
        loaded.append(dump)
    failures = []
    sources = SourcePolicy.default()
    for index in indices:
        rng = random.Random(f"hlo-doctor fuzz {index}")
        dump = rng.choice(loaded)
        module = dump.modules[0]
        chosen = rng.randrange(len(module.snapshots))
        original = module.snapshots[chosen]
        data = _mutate(original.path.read_bytes(), rng)
        mutated = original.path.with_name(f"mutated-{index}-{original.path.name}")
        mutated.write_bytes(data)
        fresh = Snapshot(mutated, role=original.role, size=len(data), ordinal=original.ordinal,
                         pipeline=original.pipeline, after_pass=original.after_pass,
                         before_pass=original.before_pass, backend=original.backend, timestamp=original.timestamp)
        snapshots = [fresh if i == chosen else s for i, s in enumerate(module.snapshots)]
        case_module = DumpModule(module.id, module.name, snapshots, folder=module.folder,
                                 debug_options_path=module.debug_options_path, shardy_dumps=module.shardy_dumps,
                                 config_path=module.config_path, compile_dir=module.compile_dir, root=module.root)
        for cached in ("compile_options", "topology", "debug_options", "mlir", "_meshes"):
            case_module.__dict__[cached] = module.__dict__[cached]
        # html (the slowest to render) in one case of ten, the other formats in turn
        output_format = "html" if index % 10 == 9 else FORMATS[index % 10 % (len(FORMATS) - 1)]
        where = f"case {index} ({dump.path.parent.name}/{dump.path.name}, {original.label}, {output_format})"
        try:
            report = analyze_dump(Dump(dump.path, (case_module,), dump.run_record, dump.load_errors), jobs=1,
                                  registry=registry)
            if output_format == "sarif":  # as render() does, with the rules the analysis described
                render_sarif(report.findings, report.rule_info, fingerprints=occurrence_fingerprints(report.findings))
            else:
                render(report, output_format, color=False, width=100, sources=sources)
        except (InputError, ParseError) as error:  # exit 2, one line
            if "\n" in str(error) or "internal parser error" in str(error):
                failures.append(f"{where}: {str(error)[:300]!r}")
        except Exception as error:  # noqa: BLE001 - what the test looks for
            frame = traceback.extract_tb(error.__traceback__)[-1]
            failures.append(f"{where}: {type(error).__name__} at {frame.filename}:{frame.lineno}: {str(error)[:200]}")
        else:
            failures += [f"{where}: {f.message[:300]}" for f in report.findings if f.rule == "internal-error"]
            failures += [f"{where}: {e.message[:300]}" for e in report.errors if "internal parser error" in e.message]
        finally:
            mutated.unlink()
    return failures


def _fuzz_worker(arguments: tuple[list[Path], Path, range], results) -> None:  # noqa: ANN001
    import resource

    limit = 4 << 30  # a runaway case fails as a MemoryError here instead of taking the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    results.put(_fuzz_cases(*arguments))


@pytest.mark.skipif(not all((FIXTURES / seed).is_dir() for seed in ANALYSIS_SEEDS), reason="fixtures absent")
def test_mutated_dumps_give_a_report_or_one_error_line(tmp_path: Path) -> None:
    """2,000 cases with a fixed seed, shared by two forked processes (CI has two cores)."""
    import multiprocessing

    seeds = [FIXTURES / seed for seed in ANALYSIS_SEEDS]
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_fuzz_worker,
                               args=((seeds, tmp_path / str(n), range(n, CASES, WORKERS)), results))
               for n in range(WORKERS)]
    for worker in workers:
        worker.start()
    failures = [failure for _ in workers for failure in results.get(timeout=600)]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:20])
