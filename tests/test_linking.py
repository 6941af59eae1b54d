"""Linking snapshots: propagation keeps names; the partitioner renames and inserts."""

from pathlib import Path

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
