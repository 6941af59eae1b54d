"""Where a program writes a spec's axes (``hlo_doctor.program.spec_sites``), and the ``axes`` and
in-place ``constrain`` edits, on small hand-written programs (not compiler output)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from hlo_doctor.findings import SourceEdit
from hlo_doctor.program.spec_sites import axes_site, parameter_axes_site, spec_site
from tests.fix_cases import patched, refused

PROGRAM = '''\
import jax
from jax.sharding import NamedSharding, PartitionSpec as P


def main(bad):
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
    batch = "fsdp" if bad else ("data", "fsdp")
    specs = {"table": P(), "residual": P(batch, None, None), "heads": P(batch, None, None, None)}

    def constrain(x, kind):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, specs[kind]))

    tokens = jax.ShapeDtypeStruct((16, 128), jnp.int32, sharding=NamedSharding(mesh, P(batch, None)))
    rows = NamedSharding(mesh, P("x", None))
    cols = NamedSharding(mesh, P(None, "x"))
    layouts = [rows, cols] if bad else [rows]
    y = jax.lax.with_sharding_constraint(x, layouts[i % len(layouts)])
'''


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_axes_found_through_a_dict_of_specs_and_a_conditional(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    path = _write(tmp_path, PROGRAM)
    site = axes_site(path, 11, 0, ("fsdp",))
    assert site is not None
    assert (site.line, site.text, site.variable) == (7, '"fsdp"', "batch")
    assert parameter_axes_site(path, "tokens", 0, ("fsdp",)) == site  # the input reads the same literal
    assert axes_site(path, 11, 0, ("model",)) is None  # no literal writes those axes


def test_axes_of_a_name_read_anywhere_but_as_that_entry_are_not_offered(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    path = _write(tmp_path, PROGRAM + "    print(batch)\n")
    assert axes_site(path, 11, 0, ("fsdp",)) is None
    path = _write(tmp_path, PROGRAM + "    w = P(None, batch)\n")
    assert axes_site(path, 11, 0, ("fsdp",)) is None


def test_spec_found_through_a_list_subscript(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the program helpers read only files of the current project
    path = _write(tmp_path, PROGRAM)
    assert spec_site(path, 17, (None, ("x",))).line == 15
    assert spec_site(path, 17, (("x",), None)).line == 14


def test_axes_edit_rewrites_the_branch_that_writes_the_old_axes():
    edit = SourceEdit("axes", "jax", spec=(("data", "fsdp"),), old_spec=(("fsdp",),), details={"variable": "batch"})
    out = patched(PROGRAM, edit, line=7)
    assert out.splitlines()[6] == '    batch = ("data", "fsdp") if bad else ("data", "fsdp")'
    assert "already writes" in refused(out, edit, line=7)
    other = SourceEdit("axes", "jax", spec=(("data", "fsdp"),), old_spec=(("fsdp",),), details={"variable": "mesh"})
    assert "does not assign mesh" in refused(PROGRAM, other, line=7)


def test_constraint_rewritten_in_place():
    edit = SourceEdit("constrain", "jax", spec=(("x",), None), details={"position": "in-place"})
    out = patched(PROGRAM, edit, line=17)
    assert out.splitlines()[16] == '    y = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("x", None)))'
    assert "already constrains" in refused(out, edit, line=17)
    assert "not one sharding constraint" in refused(PROGRAM, edit, line=16)


def test_torch_mark_rewritten_in_place():
    program = 'import torch_xla.distributed.spmd as xs\n\nxs.mark_sharding(h, mesh, specs[i % 2])\n'
    edit = SourceEdit("constrain", "torch_xla", spec=(("fsdp",), None), details={"position": "in-place"})
    assert patched(program, edit, line=3).splitlines()[2] == 'xs.mark_sharding(h, mesh, ("fsdp", None))'
