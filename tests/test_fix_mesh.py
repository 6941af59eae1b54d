"""The ``mesh`` edit on small hand-written programs (not gallery programs)."""

from __future__ import annotations

from hlo_doctor.findings import SourceEdit
from tests.fix_cases import patched, refused


def _mesh(**details) -> SourceEdit:
    return SourceEdit("mesh", "jax", details=details)


def test_make_mesh_axes_reordered_with_their_sizes():
    program = "import jax\nmesh = jax.make_mesh((2, 4), ('tp', 'dp'))\n"
    assert patched(program, _mesh(axis_names=("dp", "tp"), shape=(4, 2)), line=2) == \
        "import jax\nmesh = jax.make_mesh((4, 2), ('dp', 'tp'))\n"


def test_mesh_of_a_reshape_keeps_symbolic_sizes():
    program = 'mesh = Mesh(devices.reshape(2, n // 2), ("tp", "dp"))\n'
    assert patched(program, _mesh(axis_names=("dp", "tp"), shape=(4, 2)), line=1) == \
        'mesh = Mesh(devices.reshape(n // 2, 2), ("dp", "tp"))\n'


def test_new_shape_for_literal_sizes():
    program = "mesh = Mesh(np.array(devs).reshape((4, 2)), ('data', 'model'))\n"
    assert patched(program, _mesh(shape=(2, 4)), line=1) == \
        "mesh = Mesh(np.array(devs).reshape((2, 4)), ('data', 'model'))\n"


def test_host_major_removes_the_transpose():
    program = 'mesh = Mesh(devices.reshape(2, 4).T, ("dp", "tp"))\n'
    assert patched(program, _mesh(device_order="host-major"), line=1) == \
        'mesh = Mesh(devices.reshape(4, 2), ("dp", "tp"))\n'
    program = 'mesh = Mesh(np.transpose(devices.reshape(2, 4), (1, 0)), ("dp", "tp"))\n'
    assert patched(program, _mesh(device_order="host-major"), line=1) == \
        'mesh = Mesh(devices.reshape(4, 2), ("dp", "tp"))\n'


def test_xs_mesh_and_keras_device_mesh():
    program = "import torch_xla.distributed.spmd as xs\nmesh = xs.Mesh(ids, (8, 2), ('tp', 'dp'))\n"
    assert patched(program, _mesh(axis_names=("dp", "tp")), line=2).endswith("xs.Mesh(ids, (2, 8), ('dp', 'tp'))\n")
    program = 'mesh = keras.distribution.DeviceMesh((4, 2), ["model", "batch"], devices=devices)\n'
    assert patched(program, _mesh(axis_names=("batch", "model"), shape=(2, 4)), line=1) == \
        'mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], devices=devices)\n'
    program = "mesh = DeviceMesh(shape=(4, 2), axis_names=('model', 'batch'))\n"
    assert patched(program, _mesh(axis_names=("batch", "model")), line=1) == \
        "mesh = DeviceMesh(shape=(2, 4), axis_names=('batch', 'model'))\n"


def test_hybrid_mesh_permutes_both_shapes():
    program = "mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=('tp', 'dp'))\n"
    assert patched(program, _mesh(axis_names=("dp", "tp")), line=1) == \
        "mesh = xs.HybridMesh(ici_mesh_shape=(4, 1), dcn_mesh_shape=(1, 2), axis_names=('dp', 'tp'))\n"


def test_refusals():
    assert "builds no mesh" in refused("x = 1\n", _mesh(axis_names=("a",)), line=1)
    assert "not a literal tuple" in refused("mesh = jax.make_mesh(shape, ('a', 'b'))\n",
                                            _mesh(axis_names=("b", "a")), line=1)
    assert "not transposed" in refused("mesh = Mesh(devices.reshape(4, 2), ('a', 'b'))\n",
                                       _mesh(device_order="host-major"), line=1)
    assert "not a literal tuple of strings" in refused("mesh = jax.make_mesh((2, 2), names)\n",
                                                       _mesh(axis_names=("b", "a")), line=1)


def test_applying_twice_is_a_refusal():
    program = "mesh = jax.make_mesh((4, 2), ('dp', 'tp'))\n"
    assert "already as asked" in refused(program, _mesh(axis_names=("dp", "tp"), shape=(4, 2)), line=1)


def test_create_device_mesh_sizes_and_the_names_move_together():
    program = "mesh = Mesh(mesh_utils.create_device_mesh((2, 4)), ('tp', 'dp'))\n"
    assert patched(program, _mesh(axis_names=("dp", "tp")), line=1) == \
        "mesh = Mesh(mesh_utils.create_device_mesh((4, 2)), ('dp', 'tp'))\n"


def test_a_wrong_permutation_is_refused():
    program = "mesh = jax.make_mesh((2, 4), ('tp', 'dp'))\n"
    assert "does not take" in refused(program, _mesh(axis_names=("dp", "tp"), permutation=(0, 1)), line=1)
