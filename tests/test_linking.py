"""Linking snapshots: propagation keeps names; the partitioner renames and inserts."""

from pathlib import Path

import pytest

from hlo_doctor.dump import load_dump
from hlo_doctor.graph.linking import link_modules

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_seed_dot_to_partitioned_dot_and_all_gathers():
    module = load_dump(FIXTURES / "fsdp-activation-gather/jax-shardy-bad").modules[0]
    link = link_modules(module.after_propagation().module(), module.partitioned().module())
    assert link.realized_by(("main.0", "dot_general.0")) == [("main.0_spmd", "dot"), ("main.0_spmd", "all-gather")]
    assert link.realized_by(("main.0", "dot_general.1")) == [("main.0_spmd", "dot.1"), ("main.0_spmd", "all-gather.1")]
    assert link.origin_of(("main.0_spmd", "all-gather.1")) == (("main.0", "dot_general.1"),)
    assert link.matched(("main.0", "x.0")) == ("main.0_spmd", "param")
    assert link.matched(("main.0", "broadcast_in_dim.0")) == ("main.0_spmd", "broadcast_in_dim.4")
    assert link.is_inserted(("main.0_spmd", "partition-id"))


def test_gspmd_constraint_becomes_copy():
    module = load_dump(FIXTURES / "fsdp-activation-gather/jax-gspmd-fixed").modules[0]
    before = module.before_propagation().module()
    after = module.after_propagation().module()
    link = link_modules(before, after)
    assert link.matched(("main.1", "sharding_constraint.1")) == ("main.1", "copy")
    renamed = {k[1]: v[1] for k, v in link.forward.items() if k[1] != v[1]}
    assert renamed == {"sharding_constraint.1": "copy"}
    assert not link.inserted


def _fixture_modules():
    for folder in sorted(p.parent for p in FIXTURES.glob("*/*/expected_findings.json")):
        for module in load_dump(folder).modules:
            if module.after_propagation() is not None and module.partitioned() is not None:
                yield folder, module


# Known disagreement, tracked by test_whole_module_link_on_the_hf_1d_train_step below: in the
# 16-way tensor-parallel HF train step, link_modules pairs dot.750 (f32[64,64], 16-way) with dot.39
# (f32[256,64]) although its shard is dot.31 (f32[64,4]) (checked in the HLO).
_AMBIGUOUS = {"hf-1d-params-torch-xla"}
# Keras' train steps: the quick pairing leaves 3 attention dots unanswered (None, never a wrong op);
# a finding on one of them is named by the whole-module link instead.
_UNANSWERED = {"keras-layout-map", "keras-model-axis-across-hosts"}


@pytest.mark.xfail(strict=True, reason="link_modules mis-pairs same-shape dots of the 16-way HF train step")
def test_whole_module_link_on_the_hf_1d_train_step():
    from hlo_doctor.graph.linking import match_instructions

    dump = load_dump(FIXTURES / "hf-1d-params-torch-xla" / "torch_xla-bad")
    module = next(m for m in dump.modules if m.partitioned() is not None and m.after_propagation() is not None)
    a, b = module.after_propagation().module(), module.partitioned().module()
    link = link_modules(a, b)
    keys = [(c.name, i.name) for c, i in a.instructions() if i.opcode == "dot"]
    quick = match_instructions(a, b, keys)
    assert all(q is None or q == link.matched(k) for k, q in quick.items())


def test_quick_match_agrees_with_the_whole_module_link_on_every_fixture_dot():
    """match_instructions (used to name findings) gives link_modules' answer, or None, never another op."""
    from hlo_doctor.graph.linking import match_instructions

    compared = answered = windowed = 0
    link_misses: list = []
    for folder, module in _fixture_modules():
        a, b = module.after_propagation().module(), module.partitioned().module()
        keys = [(c.name, i.name) for c, i in a.instructions() if i.opcode in ("dot", "convolution")]
        link = link_modules(a, b)
        # TPU's partitioner turns some dots into windowed-einsum while loops
        # (windowed_dot_general_body_*, tpu-v4-llama bad): the quick match may not answer those.
        loops = any(c.name.startswith("windowed_dot_general") for c in b.computations)
        for key, quick in match_instructions(a, b, keys).items():
            compared += 1
            if quick is not None:
                answered += 1
                linked = link.matched(key)
                if folder.parent.name in _AMBIGUOUS and quick != linked:
                    link_misses.append((folder.name, key, quick, linked))
                    continue
                assert quick == linked, (folder, key)
            elif loops or folder.parent.name in _AMBIGUOUS | _UNANSWERED:
                windowed += 1
    assert compared > 100 and answered + windowed == compared and windowed < compared // 10
    assert len(link_misses) <= 12, link_misses  # all in the HF 1-D train step (see _AMBIGUOUS)

