"""Loop trip counts (semantics/execution.py): a loop's bound over its step, never the bound alone.

The SPMD partitioner's windowed einsum loops (TPU) take two windows per trip: their induction
variable goes up by 2 to the bound, and XLA writes no ``known_trip_count`` on them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hlo_doctor.hlo import parse_module
from hlo_doctor.semantics.cost import module_flops
from hlo_doctor.semantics.execution import execution_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# Hand-written, in the form the partitioner writes a windowed einsum loop (a u32 induction
# variable at tuple element 1, compared LT against 8, stepped by 1 twice per trip, from 0).
_WINDOWED = """\
HloModule windowed, num_partitions=8

%cond (param: (f32[4,4], u32[])) -> pred[] {
  %param = (f32[4,4]{1,0}, u32[]) parameter(0)
  %i = u32[] get-tuple-element(%param), index=1
  %bound = u32[] constant(8)
  ROOT %lt = pred[] compare(%i, %bound), direction=LT
}

%body (param.1: (f32[4,4], u32[])) -> (f32[4,4], u32[]) {
  %param.1 = (f32[4,4]{1,0}, u32[]) parameter(0)
  %x = f32[4,4]{1,0} get-tuple-element(%param.1), index=0
  %i.1 = u32[] get-tuple-element(%param.1), index=1
  %one = u32[] constant(1)
  %d = f32[4,4]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %next = u32[] add(%i.1, %one)
  %next.1 = u32[] add(%next, %one)
  ROOT %out = (f32[4,4]{1,0}, u32[]) tuple(%d, %next.1)
}

ENTRY %main (a: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %zero = u32[] constant({start})
  %init = (f32[4,4]{1,0}, u32[]) tuple(%a, %zero)
  %loop = (f32[4,4]{1,0}, u32[]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[4,4]{1,0} get-tuple-element(%loop), index=0
}
"""


@pytest.mark.parametrize(("start", "trips"), [(0, 4), (2, 3), (7, 1)])
def test_windowed_loop_runs_its_bound_over_its_step(start, trips):
    module = parse_module(_WINDOWED.replace("{start}", str(start)))
    count = execution_counts(module)["body"]
    assert (count.count, count.known) == (trips, True)
    assert module_flops(module) == {"f32": 2 * 4 * 4 * 4 * trips}


def test_known_trip_count_wins():
    text = _WINDOWED.replace("{start}", "0").replace(
        "body=%body\n", 'body=%body, backend_config={"known_trip_count":{"n":"5"}}\n')
    assert execution_counts(parse_module(text))["body"].count == 5


@pytest.mark.parametrize(("folder", "devices"), [
    ("tpu-v4-llama/jax-v4_4x4x8-bad", 128),   # windowed einsum loops over a 32-way axis
    ("device-memory/jax-v5e_4x4-fixed", 16),  # and over an 8-way one
])
def test_per_device_flops_of_windowed_einsums_are_the_programs_over_its_devices(folder, devices):
    # No compute is replicated in these programs: each device does 1/devices of the matmul FLOPs
    # of the program before partitioning, the windowed einsums' loops included.
    (before,) = (FIXTURES / folder).glob("*.before_optimizations.txt")
    (partitioned,) = (FIXTURES / folder).glob("*spmd-partitioning*.txt")
    total = sum(module_flops(parse_module(before.read_text())).values())
    per_device = sum(module_flops(parse_module(partitioned.read_text())).values())
    assert any(" while(" in line and "windowed_dot_general" in line
               for line in partitioned.read_text().splitlines())
    assert per_device == pytest.approx(total / devices, rel=0.01)
