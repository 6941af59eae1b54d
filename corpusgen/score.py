"""Score hlo-doctor against the generated corpus: ``python corpusgen/score.py DIR``.

For every program folder of ``DIR`` (made by ``corpusgen/generate.py``) this
runs hlo-doctor on the plain dump, as a user would (``analyze`` with the
program's devices per host, no runner record), and compares:

- each collective's role with the oracle's (``truth.json``);
- the findings with the injected pathology: the expected rule must be
  reported (recall), and a clean program must get no warning;
- any other warning on an injected program is an unexpected finding.

It prints role agreement overall and by role, recall per pathology, the
false-positive rate on clean programs, every disagreement as one line (the
program, the instruction or rule, expected and got), and last one line::

    corpus: roles A/B (P%), recall C/D, false-positive programs E/F

Disagreements listed in ``--known`` (default ``corpusgen/known_disagreements.toml``),
each with its reason, are printed as known and do not fail the run; any other
makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corpusgen.oracle import (  # noqa: E402 - after the path above
    MATMUL_REPEAT_FLOOR,
    NATURAL,
    matmul_redundancy,
    natural_rules,
    reorder_rules,
    stray_traffic,
)

KNOWN = Path(__file__).with_name("known_disagreements.toml")
WARNING_SEVERITIES = frozenset({"warning", "error"})


@dataclass(frozen=True)
class Disagreement:
    program: str
    kind: str  # "role" | "missing-rule" | "unexpected-rule"
    subject: str  # the instruction, or the rule
    expected: str
    got: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.program}: {self.kind} {self.subject}: expected {self.expected}, got {self.got}" + (
            f" ({self.detail})" if self.detail else "")

    def matches(self, entry: dict[str, Any]) -> bool:
        fields = {"program": self.program, "kind": self.kind, "subject": self.subject,
                  "expected": self.expected, "got": self.got}
        return all(str(entry[key]) == value for key, value in fields.items() if key in entry)


@dataclass
class ProgramScore:
    name: str
    pathology: str | None
    expected_rules: list[str]
    expected_any: list[str]
    found_rules: list[str]
    roles_total: int
    roles_agreed: int
    by_role: Counter
    by_role_agreed: Counter
    disagreements: list[Disagreement]


def load_known(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("disagreement", [])
    for entry in entries:
        if not str(entry.get("reason", "")).strip():
            raise SystemExit(f"{path}: every known disagreement needs a reason: {entry}")
    return entries


def relabel(folder: Path) -> dict[str, Any]:
    """Rerun the oracle on a program's dump (after an oracle fix) and rewrite its truth."""
    from corpusgen.generate import _labels, partitioned_text
    from corpusgen.programs import Axis, ProgramSpec

    truth = json.loads((folder / "truth.json").read_text())
    if truth.get("framework") == "torch_xla":
        from corpusgen.torch_generate import relabel_torch

        truth["collectives"] = relabel_torch(folder, truth)
        (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
        return truth
    spec_json = dict(truth["spec"])
    spec_json["axes"] = [Axis(**a) for a in spec_json["axes"]]
    spec = ProgramSpec(**spec_json)
    truth["collectives"] = _labels(partitioned_text(folder / "dump"), spec, truth["registry"])
    (folder / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def score_program(folder: Path) -> ProgramScore:
    from hlo_doctor.analysis import analyze_dump
    from hlo_doctor.dump import load_dump
    from hlo_doctor.rules.context import AnalysisOptions, RuleContext
    from hlo_doctor.semantics.inventory import module_rows

    truth = json.loads((folder / "truth.json").read_text())
    dump = folder / "dump"
    per_host = truth.get("analyze_devices_per_host", truth.get("devices_per_host"))
    report = analyze_dump(dump, devices_per_host=per_host)
    found = sorted({f.rule for f in report.findings if str(getattr(f.severity, "value", f.severity)) in
                    WARNING_SEVERITIES})
    loaded = load_dump(dump)
    got_roles: dict[str, str] = {}
    for module in loaded.modules:
        ctx = RuleContext(loaded, module, AnalysisOptions(devices_per_host=per_host))
        if ctx.per_device is None:
            continue
        for row in module_rows(ctx.semantics):
            got_roles[row.instruction] = row.role
    name = folder.name
    disagreements: list[Disagreement] = []
    by_role: Counter = Counter()
    agreed_by_role: Counter = Counter()
    agreed = 0
    for collective in truth["collectives"]:
        expected = collective["role"]
        got = got_roles.get(collective["instruction"], "missing")
        by_role[expected] += 1
        if got == expected:
            agreed += 1
            agreed_by_role[expected] += 1
        else:
            disagreements.append(Disagreement(name, "role", collective["instruction"], expected, got,
                                              f"{collective['phase']}; oracle: {collective['why']}"))
    expected_rules = list(truth["expected_rules"])
    expected_any = list(truth.get("expected_any", []))
    pathology = truth["pathology"]
    tensor_axes = {name for name, role in truth.get("axis_roles", {}).items() if role == "tensor"}
    # the oracle's current judgement (the truth may be older): redundant compute the matmuls do not show
    # is none; batch traffic that is only a weight's or a lookup's is none
    if pathology == "natural-redundant-compute" and truth.get("framework", "jax") == "jax":
        matmuls = matmul_redundancy(dump, truth["spec"]["devices"])
        if matmuls is not None and matmuls < MATMUL_REPEAT_FLOOR:
            pathology = "natural-batch-traffic"
    if pathology == "natural-batch-traffic" and not stray_traffic(tensor_axes, truth["collectives"]):
        pathology, expected_any = None, []
    if pathology in NATURAL:  # the oracle's current rules for it (the truth may be older)
        expected_any = natural_rules(pathology, truth.get("axis_roles", {}), truth["collectives"])
    for rule in expected_rules:
        if rule not in found:
            disagreements.append(Disagreement(name, "missing-rule", rule, rule, ",".join(found) or "nothing",
                                              truth.get("effect", "")))
    if expected_any and not set(expected_any) & set(found):
        disagreements.append(Disagreement(name, "missing-rule", "|".join(expected_any), "one of them",
                                          ",".join(found) or "nothing", truth.get("effect", "")))
    allowed = set(truth.get("allowed_rules", [])) | set(reorder_rules(truth["collectives"]))
    for rule in found:
        if rule not in expected_rules and rule not in expected_any and rule not in allowed:
            detail = next((f.message[:160] for f in report.findings if f.rule == rule), "")
            disagreements.append(Disagreement(name, "unexpected-rule", rule, "nothing", rule, detail))
    return ProgramScore(name, pathology, expected_rules, expected_any, found, len(truth["collectives"]), agreed,
                        by_role, agreed_by_role, disagreements)


def _score_or_crash(folder: Path, relabel_first: bool) -> ProgramScore:
    """One program's score; a crash is a disagreement of its own, reported."""
    if relabel_first:
        relabel(folder)
    try:
        return score_program(folder)
    except Exception as error:  # noqa: BLE001 - reported as a disagreement
        return ProgramScore(folder.name, None, [], [], [], 0, 0, Counter(), Counter(),
                            [Disagreement(folder.name, "crash", type(error).__name__, "a report", str(error)[:200])])


def _recall(scores: list[ProgramScore]) -> tuple[Counter, Counter]:
    """Per pathology: the programs whose expected rules were all reported, and the programs."""
    recall: Counter = Counter()
    injected: Counter = Counter()
    for s in scores:
        if s.pathology:
            injected[s.pathology] += 1
            recall[s.pathology] += all(r in s.found_rules for r in s.expected_rules) and (
                not s.expected_any or bool(set(s.expected_any) & set(s.found_rules)))
    return recall, injected


def _summary(scores: list[ProgramScore]) -> str:
    """``roles A/B (P%), recall C/D, false-positive programs E/F``."""
    total = sum(s.roles_total for s in scores)
    agreed = sum(s.roles_agreed for s in scores)
    recall, injected = _recall(scores)
    clean = [s for s in scores if not s.pathology]
    false_positive = sum(1 for s in clean if s.found_rules)
    return (f"roles {agreed}/{total} ({_percent(agreed, total)}), recall {sum(recall.values())}/{sum(injected.values())}, "
            f"false-positive programs {false_positive}/{len(clean)}")


def _percent(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", nargs="+", help="folders made by corpusgen/generate.py (scored as one corpus)")
    parser.add_argument("--known", default=str(KNOWN), help="reviewed known disagreements (TOML)")
    parser.add_argument("--relabel", action="store_true", help="rerun the oracle on each dump first")
    parser.add_argument("--jobs", type=int, default=1, help="programs scored at once (processes)")
    options = parser.parse_args(argv)
    folders = [p.parent for corpus in options.corpus for p in sorted(Path(corpus).glob("*/truth.json"))]
    if not folders:
        print(f"score: no programs (*/truth.json) under {' '.join(options.corpus)}", file=sys.stderr)
        return 2
    known = load_known(Path(options.known))
    task = partial(_score_or_crash, relabel_first=options.relabel)
    if options.jobs > 1:
        with ProcessPoolExecutor(options.jobs) as pool:
            scores = list(pool.map(task, folders, chunksize=4))
    else:
        scores = [task(folder) for folder in folders]
    by_role: Counter = Counter()
    by_role_agreed: Counter = Counter()
    for s in scores:
        by_role.update(s.by_role)
        by_role_agreed.update(s.by_role_agreed)
    print(f"roles by oracle role ({len(scores)} programs):")
    for role, count in by_role.most_common():
        print(f"  {role:18} {by_role_agreed[role]:5}/{count:<5} {_percent(by_role_agreed[role], count)}")
    recall, injected = _recall(scores)
    print("recall by pathology:")
    for pathology, count in sorted(injected.items()):
        print(f"  {pathology:26} {recall[pathology]}/{count}")
    clean = [s for s in scores if not s.pathology]
    false_positive = [s for s in clean if s.found_rules]
    print(f"false positives: {len(false_positive)}/{len(clean)} clean programs get a warning")
    unknown = 0
    print("disagreements:")
    for folder, s in zip(folders, scores, strict=True):
        where = f"{folder.parent.name}/" if len(options.corpus) > 1 else ""
        for d in s.disagreements:
            reason = next((k["reason"] for k in known if d.matches(k)), None)
            if reason is None:
                unknown += 1
                print(f"  {where}{d.line()}")
            else:
                print(f"  known: {where}{d.line()} -- {reason}")
    print(f"{unknown} disagreements not in {options.known}")
    if len(options.corpus) > 1:
        for corpus in options.corpus:
            part = [s for folder, s in zip(folders, scores, strict=True) if folder.parent == Path(corpus)]
            print(f"  {corpus}: {_summary(part)}")
    print(f"corpus: {_summary(scores)}")
    return 1 if unknown else 0


if __name__ == "__main__":
    sys.exit(main())
