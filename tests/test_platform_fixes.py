"""A fix speaks the platform's and the framework's language: no GPU flag for a TPU dump, no
torch_xla code for a JAX program, no JAX code for a torch_xla one (issue 27)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hlo_doctor import analyze_dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TPU_TOPOLOGY = FIXTURES / "fsdp-activation-gather" / "jax-v4_2x2x1-bad" / "module_0000.jit_mlp.cl_933746096"

# Hand-written: a scheduled module whose all-gather encloses no computation although a dot that
# neither feeds it nor reads it could hide it (the form XLA's optimized modules take). The
# topology beside it is a real v4 one (from a fixture), so the dump is a TPU dump.
_EXPOSED = """\
HloModule jit_step, is_scheduled=true, num_partitions=4

ENTRY %main (a: f32[1024,1024], b: f32[256,1024]) -> (f32[1024,1024], f32[1024,1024]) {
  %a = f32[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %ags = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(%b), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %agd = f32[1024,1024]{1,0} all-gather-done(%ags)
  %d = f32[1024,1024]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%agd, %d)
}
"""


def _tpu_dump(tmp_path: Path, debug_options: str = "") -> Path:
    folder = tmp_path / "tpu"
    (folder / "module_0000.jit_step.cl_1").mkdir(parents=True)
    shutil.copy(TPU_TOPOLOGY / "topology.textproto", folder / "module_0000.jit_step.cl_1")
    (folder / "module_0000.jit_step.cl_1.after_optimizations.txt").write_text(_EXPOSED)
    if debug_options:
        (folder / "module_0000.jit_step.cl_1.debug_options").write_text(debug_options)
    return folder


@pytest.mark.parametrize("debug_options", ["", "xla_gpu_disable_async_collectives: ALLGATHER\n"])
def test_sync_collective_on_tpu_names_the_tpu_scheduler_flag_and_blames_no_gpu_flag(tmp_path, debug_options):
    # A GPU flag left in XLA_FLAGS does nothing on a TPU: the schedule is to blame, not the flag.
    (finding,) = analyze_dump(_tpu_dump(tmp_path, debug_options), select=["sync-collective"]).findings
    assert finding.evidence["cause"] == "schedule"
    suggestion = finding.suggestion
    assert suggestion is not None
    for code in (suggestion.jax, suggestion.torch_xla):
        assert code is not None and "xla_gpu" not in code
        assert 'os.environ["LIBTPU_INIT_ARGS"]' in code and "--xla_tpu_enable_latency_hiding_scheduler=true" in code
    assert "xla_gpu" not in finding.message


@pytest.mark.parametrize(("folder", "framework"), [
    ("fsdp-activation-gather/torch_xla-bad", "torch_xla"),
    ("hf-fsdpv2-torch-xla/torch_xla-bad", "torch_xla"),
    ("fsdp-activation-gather/jax-shardy-bad", "jax"),
])
@pytest.mark.parametrize("output_format", ["markdown", "github", "text"])
def test_reports_give_the_fix_in_the_dumps_framework_only(folder, framework, output_format):
    from hlo_doctor.report import render

    report = analyze_dump(FIXTURES / folder)
    assert {m.framework for m in report.modules if m.key in {f.module for f in report.findings}} == {framework}
    fixes = [f.suggestion for f in report.findings if f.suggestion is not None]
    assert fixes and all(s.jax and s.torch_xla and s.jax != s.torch_xla for s in fixes)  # the premise
    out = render(report, output_format, color=False, width=200)
    for suggestion in fixes:
        ours, other = (suggestion.torch_xla, suggestion.jax) if framework == "torch_xla" else \
            (suggestion.jax, suggestion.torch_xla)
        assert ours is not None and other is not None
        mine = [line.strip() for line in ours.splitlines() if line.strip()]
        theirs = [line.strip() for line in other.splitlines() if line.strip() and line.strip() not in ours]
        assert theirs  # the other framework's code has lines of its own
        assert all(line in out for line in mine[:1])
        assert not any(line in out for line in theirs)
