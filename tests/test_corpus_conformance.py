"""Conformance of parse_module with XLA's own parser over ../shared/corpus/xla-hlo.

The corpus is read in place and never copied into this repository; the test
skips when it is absent. Each valid module must agree with its sidecar (what
jaxlib 0.10.2's C++ parser sees); each invalid one must parse or raise
ParseError, never another exception.
"""

from __future__ import annotations

import pytest

from hlo_doctor.hlo import ParseError, parse_module
from tests.corpus import CORPUS, compare_with_sidecar, corpus_files, load_sidecar

pytestmark = [
    pytest.mark.corpus,
    pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/xla-hlo is absent"),
]


def test_every_valid_module_agrees_with_xla() -> None:
    files = corpus_files("valid")
    assert len(files) > 7000
    failures: list[str] = []
    for path in files:
        text = path.read_text()
        try:
            module = parse_module(text, path=str(path))
        except ParseError as error:
            failures.append(f"{path.name}: {error}")
            continue
        sidecar = load_sidecar(path)
        why = compare_with_sidecar(module, text, sidecar)
        if why is not None:
            failures.append(f"{path.name}: {why}")
        if module.name != sidecar["module_name"]:
            failures.append(f"{path.name}: module name {module.name!r} vs {sidecar['module_name']!r}")
    rate = 100.0 * (len(files) - len(failures)) / len(files)
    print(f"\nvalid corpus: {len(files) - len(failures)}/{len(files)} agree with XLA ({rate:.2f}%)")
    assert not failures, "\n".join(failures[:20])


def test_invalid_modules_parse_or_raise_parse_error() -> None:
    files = corpus_files("invalid")
    assert files
    rejected = 0
    for path in files:
        text = path.read_text(errors="replace")
        try:
            parse_module(text, path=str(path))
        except ParseError as error:
            rejected += 1
            assert error.line >= 1 and error.col >= 1
            assert str(error).startswith(str(path))
    print(f"\ninvalid corpus: {rejected}/{len(files)} rejected with ParseError, the rest parsed")


def test_entry_computation_matches_xla() -> None:
    mismatches = []
    for path in corpus_files("valid")[::7]:
        sidecar = load_sidecar(path)
        module = parse_module(path.read_text(), path=str(path))
        names_in_text = sidecar["entry_computation"] in path.read_text()
        if names_in_text and module.entry_name != sidecar["entry_computation"]:
            mismatches.append((path.name, module.entry_name, sidecar["entry_computation"]))
    assert not mismatches, mismatches[:10]
