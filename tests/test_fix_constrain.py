"""The ``constrain`` and ``respec`` edits on small hand-written programs (not gallery programs)."""

from __future__ import annotations

import ast

from hlo_doctor.findings import SourceEdit
from tests.fix_cases import dedent, patched, refused

JAX = '''\
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def main():
    mesh = Mesh(devices, ("data", "model"))

    def mlp(x, w):
        out = x @ w  # the hidden layer
        return out @ w.T
'''

EDIT = SourceEdit("constrain", "jax", target="out", spec=(("data", "model"), None))


def test_jax_constraint_after_the_assignment_with_the_files_names():
    assert patched(JAX, EDIT, line=8) == JAX.replace(
        "        out = x @ w  # the hidden layer\n",
        "        out = x @ w  # the hidden layer\n"
        '        out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P(("data", "model"), None)))\n')


def test_target_defaults_to_the_variable_the_line_assigns():
    edit = SourceEdit("constrain", "jax", spec=(("data",), None))
    assert "out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P(\"data\", None)))" in patched(
        JAX, edit, line=8)


def test_imports_added_only_when_missing():
    program = dedent('''\
        """Docstring."""
        import numpy as np
        from jax import lax
        from jax.sharding import Mesh

        mesh = Mesh(np.array(devs), ('batch',))

        def f(x):
            y = x * 2
            return y
        ''')
    out = patched(program, SourceEdit("constrain", "jax", target="y", spec=(("batch",),)), line=9)
    assert "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n" in out
    assert "    y = lax.with_sharding_constraint(y, NamedSharding(mesh, P('batch')))\n" in out
    assert out.count("import") == 3  # nothing else added; the file's single quotes kept
    ast.parse(out)


def test_only_import_jax_spells_the_dotted_names():
    program = "import jax\n\nmesh = jax.make_mesh((4,), ('d',))\nh = f(x)\n"
    out = patched(program, SourceEdit("constrain", "jax", target="h", spec=(("d",),)), line=4)
    assert out.endswith("h = jax.lax.with_sharding_constraint(h, jax.sharding.NamedSharding(mesh, "
                        "jax.sharding.PartitionSpec('d')))\n")


def test_no_imports_at_all_adds_them():
    program = "mesh = Mesh(devs, ('d',))\nh = f(x)\n"
    out = patched(program, SourceEdit("constrain", "jax", target="h", spec=(("d",), None)), line=2)
    assert out.startswith("from jax.lax import with_sharding_constraint\n"
                          "from jax.sharding import NamedSharding, PartitionSpec as P\n")
    ast.parse(out)


def test_alias_respected():
    program = ("import jax\nfrom jax.sharding import NamedSharding as NS, PartitionSpec\n"
               "mesh = Mesh(devs, ('d',))\nh = f(x)\n")
    out = patched(program, SourceEdit("constrain", "jax", target="h", spec=(("d",), None)), line=4)
    assert out.endswith("h = jax.lax.with_sharding_constraint(h, NS(mesh, PartitionSpec('d', None)))\n")


def test_explicit_mesh_variable_and_a_multiline_statement():
    program = "import jax\nh = (x\n     + 1)\ny = h\n"
    edit = SourceEdit("constrain", "jax", target="h", spec=((("d",),)), mesh="the_mesh")
    out = patched(program, edit, line=3)
    assert out.splitlines()[3].startswith("h = jax.lax.with_sharding_constraint(h, jax.sharding.NamedSharding(the_mesh")


def test_refused_without_a_mesh_variable():
    program = "import jax\n\ndef f(x):\n    h = x + 1\n    return h\n"
    assert "no mesh variable" in refused(program, SourceEdit("constrain", "jax", target="h", spec=(None,)), line=4)


def test_refused_when_the_line_assigns_nothing():
    reason = refused(JAX, SourceEdit("constrain", "jax", target="h", spec=(None,)), line=9)
    assert reason.startswith("line 9 assigns no variable (return out @ w.T)")


def test_refused_when_the_line_assigns_another_variable():
    assert refused(JAX, SourceEdit("constrain", "jax", target="h", spec=(None,)), line=8) == \
        "line 8 assigns out, not h"


def test_applying_twice_is_a_refusal():
    once = patched(JAX, EDIT, line=8)
    assert "already constrained to that right after line 8" in refused(once, EDIT, line=8)


def test_a_constraint_to_another_layout_right_after_is_rewritten_not_doubled():
    program = JAX.replace("        return out @ w.T\n", "        out = jax.lax.with_sharding_constraint(out, hidden)\n"
                          "        return out @ w.T\n")
    out = patched(program, EDIT, line=8)
    assert out == program.replace("with_sharding_constraint(out, hidden)",
                                  'with_sharding_constraint(out, NamedSharding(mesh, P(("data", "model"), None)))')
    assert "already" in refused(out, EDIT, line=8)


TORCH = '''\
import numpy as np
import torch_xla.distributed.spmd as xs


class MLP(torch.nn.Module):
    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(h)


def main():
    mesh = xs.Mesh(np.arange(4), (4, 1), ("fsdp", "replica"))
    x = load()
    return MLP(mesh)(x)
'''


def test_torch_mark_sharding_uses_self_mesh_in_a_method():
    out = patched(TORCH, SourceEdit("constrain", "torch_xla", target="h", spec=(("fsdp", "replica"), None)),
                  line=11)
    assert '        h = self.fc1(x)\n        xs.mark_sharding(h, self.mesh, (("fsdp", "replica"), None))\n' in out


def test_torch_mark_sharding_in_main_adds_the_xs_import_when_missing():
    program = TORCH.replace("import torch_xla.distributed.spmd as xs\n", "from torch_xla.distributed.spmd import Mesh\n")
    program = program.replace("xs.Mesh(", "Mesh(")
    out = patched(program, SourceEdit("constrain", "torch_xla", target="x", spec=(("fsdp",), None)), line=17)
    assert "import torch_xla.distributed.spmd as xs\n" in out
    assert '    x = load()\n    xs.mark_sharding(x, mesh, ("fsdp", None))\n' in out


# -- respec --------------------------------------------------------------------------------------
RESPEC = '''\
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(devs, ("fsdp",))
w = NamedSharding(mesh, P()) if bad else NamedSharding(mesh, P("fsdp", None))
both = (NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P("fsdp", None)))
xs.mark_sharding(t, mesh, (None, "fsdp"))
'''


def test_respec_rewrites_the_spec_that_matches():
    out = patched(RESPEC, SourceEdit("respec", "jax", target="w", old_spec=(), spec=(None, ("fsdp",))), line=3)
    assert out.splitlines()[2] == 'w = NamedSharding(mesh, P(None, "fsdp")) if bad else NamedSharding(mesh, P("fsdp", None))'


def test_respec_a_mark_sharding_tuple():
    out = patched(RESPEC, SourceEdit("respec", "torch_xla", target="t", old_spec=(None, ("fsdp",)),
                                     spec=(("fsdp",), None)), line=5)
    assert out.splitlines()[4] == 'xs.mark_sharding(t, mesh, ("fsdp", None))'


def test_respec_refused_when_ambiguous_or_absent():
    # P("fsdp") and P("fsdp", None) are the same spec for a matrix: two candidates
    assert "ambiguous" in refused(RESPEC, SourceEdit("respec", "jax", old_spec=(("fsdp",), None), spec=(None,)),
                                  line=4)
    assert "no partition spec on line 3 reads (None, \"fsdp\")" in refused(
        RESPEC, SourceEdit("respec", "jax", old_spec=(None, ("fsdp",)), spec=(("x",),)), line=3)
    assert "writes no literal partition spec" in refused(
        RESPEC, SourceEdit("respec", "jax", old_spec=(), spec=(None,)), line=2)


def test_respec_twice_is_a_refusal():
    edit = SourceEdit("respec", "jax", target="w", old_spec=(), spec=(None, ("fsdp",)))
    once = patched(RESPEC, edit, line=3)
    assert "already writes" in refused(once, edit, line=3)


def test_a_parenthesized_import_keeps_one_name_a_line():
    program = ("import jax\nfrom jax.sharding import (\n    Mesh,\n    NamedSharding,\n)\n\n"
               "mesh = Mesh(devs, ('d',))\nh = f(x)\n")
    out = patched(program, SourceEdit("constrain", "jax", target="h", spec=(("d",), None)), line=8)
    assert out.startswith("import jax\nfrom jax.sharding import (\n    Mesh,\n    NamedSharding,\n"
                          "    PartitionSpec as P,\n)\n")


CALL = '''\
import torch_xla.distributed.spmd as xs


def main():
    mesh = xs.Mesh(ids, (2, 8), ("replica", "fsdp"))
    # one step
    loss = model(input_ids=input_ids, labels=labels).loss
'''


def test_marks_before_the_model_call_keep_its_comment_above_them():
    edits = [SourceEdit("constrain", "torch_xla", target=t, spec=(("replica", "fsdp"), None),
                        details={"position": "before"}) for t in ("input_ids", "labels")]
    out = patched(CALL, *edits, line=7)
    assert out.splitlines()[5:9] == ["    # one step",
                                     '    xs.mark_sharding(input_ids, mesh, (("replica", "fsdp"), None))',
                                     '    xs.mark_sharding(labels, mesh, (("replica", "fsdp"), None))',
                                     "    loss = model(input_ids=input_ids, labels=labels).loss"]
    assert "does not use tokens" in refused(CALL, SourceEdit("constrain", "torch_xla", target="tokens", spec=(None,),
                                                             details={"position": "before"}), line=7)


def test_constraint_as_the_function_starts_after_its_docstring():
    program = ('import jax\n\n\ndef main():\n    mesh = jax.make_mesh((8,), ("data",))\n\n'
               '    def model(params, tokens):\n        """The model."""\n        return forward(params, tokens)\n')
    edit = SourceEdit("constrain", "jax", target="tokens", spec=(("data",), None), details={"position": "function-start"})
    out = patched(program, edit, line=7)
    assert out.splitlines()[7:10] == [
        '        """The model."""',
        '        tokens = jax.lax.with_sharding_constraint(tokens, jax.sharding.NamedSharding(mesh, '
        'jax.sharding.PartitionSpec("data", None)))',
        "        return forward(params, tokens)"]
    assert "already constrained" in refused(out, edit, line=7)
    assert "has no parameter x" in refused(program, SourceEdit("constrain", "jax", target="x", spec=(None,),
                                                               details={"position": "function-start"}), line=7)
    assert "defines no function" in refused(program, edit, line=5)


def test_torch_alias_of_spmd_and_windows_line_endings_kept():
    program = TORCH.replace("import torch_xla.distributed.spmd as xs", "import torch_xla.distributed.spmd as spmd")
    program = program.replace("xs.Mesh(", "spmd.Mesh(").replace("\n", "\r\n")
    out = patched(program, SourceEdit("constrain", "torch_xla", target="x", spec=(("fsdp",), None)), line=17)
    assert '    x = load()\r\n    spmd.mark_sharding(x, mesh, ("fsdp", None))\r\n' in out
    assert "\n" not in out.replace("\r\n", "")
