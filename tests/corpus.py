"""Shared helpers for tests that read ../shared/corpus/xla-hlo (never copied here)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CORPUS = SHARED / "corpus" / "xla-hlo"

_NAME_IN_TEXT = re.compile(r"[\w.\-]+")


def corpus_files(folder: str) -> list[Path]:
    directory = CORPUS / folder
    return sorted(directory.glob("*.hlo")) if directory.is_dir() else []


def compare_with_sidecar(module, text: str, sidecar: dict) -> str | None:
    """None when ``module`` agrees with XLA's view in ``sidecar``, else why not.

    Where every sidecar name appears in the text, computation names and each
    computation's set of (name, opcode, operands) must match. Where XLA renamed
    or created names, the opcode multiset and the computation count must match.
    """
    ours = [
        (c.name, {(i.name, i.opcode, tuple(i.operands)) for i in c.instructions})
        for c in module.computations
    ]
    theirs = [
        (c["name"], {(n, o, tuple(ops)) for n, o, ops in c["instructions"]})
        for c in sidecar["computations"]
    ]
    words = set(_NAME_IN_TEXT.findall(text))
    sidecar_names = {c["name"] for c in sidecar["computations"]} | {
        n for c in sidecar["computations"] for n, _, _ in c["instructions"]
    }
    if sidecar_names <= words:
        if [n for n, _ in ours] != [n for n, _ in theirs] and sorted(n for n, _ in ours) != sorted(
            n for n, _ in theirs
        ):
            return f"computations differ: {[n for n, _ in ours]} vs {[n for n, _ in theirs]}"
        by_name = dict(ours)
        for name, instructions in theirs:
            if by_name.get(name) != instructions:
                extra = sorted(by_name.get(name, set()) - instructions)[:3]
                missing = sorted(instructions - by_name.get(name, set()))[:3]
                return f"computation {name}: extra {extra} missing {missing}"
        return None
    if len(ours) != len(theirs):
        return f"computation count {len(ours)} vs {len(theirs)}"
    our_ops = Counter(i.opcode for c in module.computations for i in c.instructions)
    their_ops = Counter(o for c in sidecar["computations"] for _, o, _ in c["instructions"])
    if our_ops != their_ops:
        return f"opcodes differ: +{dict(our_ops - their_ops)} -{dict(their_ops - our_ops)}"
    return None


def load_sidecar(hlo: Path) -> dict:
    return json.loads(hlo.with_suffix(".json").read_text())
