"""The fix hlo-doctor prints works: applied to the program, recompiled, the finding is gone.

For every bad gallery program, ``tests/printed_fixes/<example>.<framework>.diff`` is a
hand-written patch that applies the fix the built-in rules print for its committed bad
fixture. The test checks that the patch *is* the printed fix (its added lines are lines
of the printed code, or, for advice that is not code, carry the printed value), applies
it to a copy of the gallery, recompiles the copy through the runner with the fixture's
own arguments (devices, partitioner, target, XLA flags), and analyzes the new dump: the
findings of the fixture's rules are gone and no new warning appears.

Programs whose libraries are not installed (the ``third-party`` extra: transformers,
flax, keras, equinox) are skipped; CI runs the JAX and torch_xla ones. ``tpu-v4-llama``'s
``communication-bound`` has no patch: its fix is a choice of parallelism strategy the
rule gives numbers for (``no_edit`` says so), and its fixed twin is that strategy.

Hand-written test data: the ``.diff`` files were written by hand against the gallery
programs (unified diffs, context lines must match exactly).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from hlo_doctor.analysis import analyze_dump
from hlo_doctor.examples.registry import PROGRAMS
from hlo_doctor.findings import Severity
from hlo_doctor.runner import run_example
from hlo_doctor.testing import builtin_rule_ids

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
PATCHES = Path(__file__).parent / "printed_fixes"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Case:
    example: str
    framework: str
    fixture: str  # under fixtures/
    partitioner: str | None = None
    target: str | None = None
    needs: tuple[str, ...] = ()  # modules the program imports beyond jax / torch_xla
    verbatim: bool = True  # the patch's added lines are the printed code; else it carries ``value``
    value: str | None = None
    # the rules whose findings the patch fixes (default: every rule the bad fixture expects); the
    # others' findings must then be expected of the fixed twin too
    rules: tuple[str, ...] = ()

    @property
    def patch(self) -> Path:
        return PATCHES / f"{self.example}.{self.framework}.diff"

    def __str__(self) -> str:
        return f"{self.example}-{self.framework}"


CASES = [
    Case("fsdp-activation-gather", "jax", "fsdp-activation-gather/jax-shardy-bad", "shardy"),
    Case("fsdp-activation-gather", "torch_xla", "fsdp-activation-gather/torch_xla-bad"),
    Case("non-batch-dim-sharding", "jax", "non-batch-dim-sharding/jax-gspmd-bad", "gspmd"),
    Case("non-batch-dim-sharding", "torch_xla", "non-batch-dim-sharding/torch_xla-bad"),
    Case("scan-lost-batch", "jax", "scan-lost-batch/jax-shardy-bad", "shardy"),
    # the batch lost at an embedding lookup: its result constrained to the tokens' sharding
    Case("embedding-lost-batch", "jax", "embedding-lost-batch/jax-shardy-bad", "shardy"),
    Case("replicated-large-param", "jax", "replicated-large-param/jax-gspmd-bad", "gspmd"),
    Case("cross-host-tp", "jax", "cross-host-tp/jax-gspmd-bad", "gspmd"),
    Case("transposed-mesh", "jax", "transposed-mesh/jax-gspmd-bad", "gspmd"),
    Case("reshard-churn", "jax", "reshard-churn/jax-gspmd-bad", "gspmd"),
    # constraints in turn: the printed layout written on each line that moved the value on
    Case("constraint-chain", "jax", "constraint-chain/jax-gspmd-bad", "gspmd"),
    Case("constraint-chain", "torch_xla", "constraint-chain/torch_xla-bad", verbatim=False, value="('data', None, None)"),
    # the batch lost in part at a loop's carry: the printed constraint, first in the loop body
    Case("scan-carry-features", "jax", "scan-carry-features/jax-shardy-bad", "shardy"),
    # the same split in another device order: the input's mark respecced (JAX: its spec literal, which the
    # printed device_put names the value of)
    Case("input-device-order", "jax", "input-device-order/jax-gspmd-bad", "gspmd", verbatim=False,
         value="('data', 'fsdp')"),
    Case("input-device-order", "torch_xla", "input-device-order/torch_xla-bad"),
    # advice that is not code: the patch writes the value the fix names
    Case("uneven-padding", "jax", "uneven-padding/jax-gspmd-bad", "gspmd", verbatim=False, value="50304"),
    Case("replicated-batch", "jax", "replicated-batch/jax-gspmd-bad", "gspmd", verbatim=False,
         value="('data', 'fsdp')"),
    # the printed fix is the constraint's respec (the edit hlo-doctor fix writes): the value it names
    Case("replicated-batch-regrouped", "jax", "replicated-batch-regrouped/jax-gspmd-bad", "gspmd", verbatim=False,
         value="('data', 'fsdp')"),
    Case("sync-collective", "jax", "sync-collective/jax-h100_2x8-bad", target="h100:2x8", needs=("jax_plugins",)),
    # memory per device: the printed code names what the HLO cannot (placeholders), so the patch
    # carries the value the fix names: the axes, the moments' sharding, the remat policy
    Case("device-memory", "jax", "device-memory/jax-v5e_4x4-bad", target="v5e:4x4", needs=("libtpu",),
         verbatim=False, value="('data', 'fsdp')"),
    Case("replicated-adamw-state", "jax", "replicated-adamw-state/jax-shardy-bad", "shardy", verbatim=False,
         value="p.sharding"),
    Case("zero1-adamw-state", "jax", "zero1-adamw-state/jax-shardy-bad", "shardy", verbatim=False,
         value="NamedSharding(mesh, P('data', None))"),
    Case("fsdp-gathered-weights", "jax", "fsdp-gathered-weights/jax-h100_2x8-bad", target="h100:2x8",
         needs=("jax_plugins",), verbatim=False, value="jax.checkpoint_policies.nothing_saveable",
         rules=("gathered-weights-held",)),  # communication-bound: both twins (see their expected findings)
    Case("flax-linen-rules", "jax", "flax-linen-rules/jax-shardy-bad", "shardy", needs=("flax", "optax")),
    Case("flax-nnx-partitioning", "jax", "flax-nnx-partitioning/jax-shardy-bad", "shardy", needs=("flax", "optax"),
         verbatim=False, value="kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ('fsdp', None))"),
    Case("keras-layout-map", "jax", "keras-layout-map/jax-shardy-bad", "shardy", needs=("keras", "keras_hub")),
    Case("keras-model-axis-across-hosts", "jax", "keras-model-axis-across-hosts/jax-shardy-bad", "shardy",
         needs=("keras", "keras_hub")),
    Case("equinox-filter-shard", "jax", "equinox-filter-shard/jax-shardy-bad", "shardy", needs=("equinox",)),
    Case("hf-1d-params-torch-xla", "torch_xla", "hf-1d-params-torch-xla/torch_xla-bad", needs=("transformers",)),
    Case("hf-fsdpv2-torch-xla", "torch_xla", "hf-fsdpv2-torch-xla/torch_xla-bad", needs=("transformers",),
         verbatim=False, value="('replica', 'fsdp')"),
]


def apply_unified_diff(diff: str, text: str) -> tuple[str, str]:
    """(the file the diff names, ``text`` with the diff applied); every context and removed line must match."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    position = 0
    name = ""
    diff_lines = diff.splitlines(keepends=True)
    index = 0
    while index < len(diff_lines):
        line = diff_lines[index]
        if line.startswith("+++ "):
            name = line[4:].strip().removeprefix("b/")
        match = _HUNK.match(line)
        index += 1
        if match is None:
            continue
        start = int(match.group(1)) - 1
        out.extend(lines[position:start])
        position = start
        while index < len(diff_lines) and diff_lines[index][:1] in (" ", "-", "+", "\n"):
            body = diff_lines[index]
            tag, content = (body[0], body[1:]) if body != "\n" else (" ", "\n")
            if tag in (" ", "-"):
                assert lines[position] == content, f"patch does not apply at line {position + 1}: {lines[position]!r}"
                position += 1
            if tag in (" ", "+"):
                out.append(content)
            index += 1
    out.extend(lines[position:])
    return name, "".join(out)


def _code_lines(code: str | None) -> set[str]:
    return {line.split("  #")[0].strip() for line in (code or "").splitlines() if line.strip()
            and not line.strip().startswith("#")}


def _added_lines(diff: str) -> list[str]:
    return [line[1:].split("  #")[0].strip() for line in diff.splitlines()
            if line.startswith("+") and not line.startswith("+++") and line[1:].strip()]


def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_printed_fix_removes_the_finding(case: Case, tmp_path: Path) -> None:
    for module in case.needs:
        if not _available(module):
            pytest.skip(f"{case.example} needs {module} (the third-party extra)")
    fixture = FIXTURES / case.fixture
    expected = json.loads((fixture / "expected_findings.json").read_text())["findings"]
    targeted = set(case.rules) or {f["rule"] for f in expected}
    assert targeted, f"{case.fixture} expects no finding: nothing to fix"
    before = analyze_dump(fixture, select=builtin_rule_ids())
    printed = [f for f in before.findings if f.rule in targeted and f.suggestion is not None]
    assert printed
    diff = case.patch.read_text()
    added = [line for line in _added_lines(diff) if not line.startswith(("import ", "from "))]  # what the code needs
    if case.verbatim:
        codes = set().union(*(_code_lines(getattr(f.suggestion, case.framework)) for f in printed))
        assert added and all(line in codes for line in added), (added, codes)
    else:
        texts = " ".join(f"{f.suggestion.summary} {getattr(f.suggestion, case.framework)}" for f in printed)
        assert case.value in texts, (case.value, texts)
        assert any(case.value.replace("'", '"') in line or case.value in line for line in added), added

    programs = tmp_path / "programs"
    shutil.copytree(PROGRAMS, programs, ignore=shutil.ignore_patterns("__pycache__"))
    name, patched = apply_unified_diff(diff, (programs / Path(_name_of(diff)).name).read_text())
    (programs / name).write_text(patched)
    run = run_example(case.example, framework=case.framework, variant="bad", dump_dir=tmp_path / "dump",
                      partitioner=case.partitioner, target=case.target, script=programs / name, timeout=600)
    after = analyze_dump(run.dump_dir, select=builtin_rule_ids())
    assert not after.errors, after.errors
    left = [f"{f.rule}: {f.message}" for f in after.findings if f.rule in targeted]
    assert not left, left
    # A finding the fixed twin (the recipe the family documents) also has is no new problem of the
    # fix: hf-1d-params' fixed twin, the expert's recipe, keeps its o_proj non-batch-dim dots.
    twin = fixture.parent / fixture.name.replace("-bad", "-fixed")
    accepted = {f["rule"] for f in json.loads((twin / "expected_findings.json").read_text())["findings"]} \
        if (twin / "expected_findings.json").is_file() else set()
    new = [f"{f.rule}: {f.message}" for f in after.findings
           if f.severity is not Severity.INFO and f.rule not in accepted]
    assert not new, new


def _name_of(diff: str) -> str:
    return next(line[4:].strip().removeprefix("b/") for line in diff.splitlines() if line.startswith("+++ "))


def test_every_bad_gallery_program_has_a_patch_or_a_reason() -> None:
    """Each example whose bad fixture expects findings is a case here, but tpu-v4-llama (see the module doc)."""
    examples = {p.parent.parent.name for p in FIXTURES.glob("*/*-bad/expected_findings.json")
                if json.loads(p.read_text())["findings"]}
    assert examples - {c.example for c in CASES} == {"tpu-v4-llama"}
    assert all(c.patch.is_file() for c in CASES)


def test_the_patch_applier_is_strict() -> None:
    """Hand-written: a patch whose context does not match the file fails instead of landing elsewhere."""
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,3 @@\n a = 1\n+b = 2\n c = 3\n"
    assert apply_unified_diff(diff, "a = 1\nc = 3\n") == ("x.py", "a = 1\nb = 2\nc = 3\n")
    with pytest.raises(AssertionError):
        apply_unified_diff(diff, "a = 0\nc = 3\n")
