"""The pytest plugin, tested with pytester in a fresh process (JAX must start with N devices)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TEST_FILE = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()[:8]).reshape(8), ("model",))


def logits(x, w):
    return x @ w


def arguments(vocab):
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(mesh, P(None, None)))
    w = jax.ShapeDtypeStruct((256, vocab), jnp.float32, sharding=NamedSharding(mesh, P(None, None)))
    return x, w


def constrained(vocab):
    def f(x, w):
        return jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P(None, "model")))
    return f


def test_divisible_vocab_is_clean(hlo_doctor):
    hlo_doctor.check_jax(constrained(50304), *arguments(50304), devices=8).assert_clean()


def test_uneven_vocab_fails(hlo_doctor):
    hlo_doctor.check_jax(constrained(50257), *arguments(50257), devices=8).assert_clean()


def test_uneven_vocab_is_found(hlo_doctor):
    hlo_doctor.check_jax(constrained(50257), *arguments(50257), devices=8).assert_finds("uneven-sharding-padding")
'''


@pytest.mark.slow
def test_plugin_gates_a_jitted_function(pytester: pytest.Pytester) -> None:
    pytest.importorskip("jax")
    pytester.makepyfile(test_graphs=TEST_FILE)
    result = pytester.runpytest_subprocess("--hlo-doctor-devices=8", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*test_uneven_vocab_fails*",
        "*hlo-doctor: 1 finding in the compiled graph*",
        "*uneven-sharding-padding*",
        "*50257*",
    ])
