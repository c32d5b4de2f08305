"""VersionBuffer: ring semantics, errors, jit/scan/vmap, donation and sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from jaxstale import VersionBuffer, enable_traced_checks


def tree(t):
    t = jnp.asarray(t, jnp.float32)
    return {"a": jnp.full((2,), t), "b": (jnp.full((3, 1), 10.0 * t, jnp.float32),)}


def value(tr):
    return float(tr["a"][0])


def test_create_push_get_ring_order():
    buf = VersionBuffer.create(tree(0), capacity=4)
    assert buf.versions["a"].shape == (4, 2) and buf.versions["b"][0].shape == (4, 3, 1)
    assert buf.head.dtype == jnp.int32 and buf.count.dtype == jnp.int32
    # before `capacity` pushes, unfilled slots hold the initial tree
    buf = buf.push(tree(1))
    assert [value(buf.get(t)) for t in range(4)] == [1.0, 0.0, 0.0, 0.0]
    for t in range(2, 7):
        buf = buf.push(tree(t))
    assert [value(buf.get(t)) for t in range(4)] == [6.0, 5.0, 4.0, 3.0]
    assert float(buf.get(2)["b"][0][1, 0]) == 40.0
    assert int(buf.count) == 6 and buf.capacity == 4
    assert value(buf.latest()) == 6.0


def test_capacity_one():
    buf = VersionBuffer.create(tree(0), capacity=1).push(tree(3))
    assert value(buf.get(0)) == 3.0


@pytest.mark.parametrize("tau", [4, 5, -1, np.int32(4), jnp.asarray(-2)])
def test_concrete_tau_out_of_range_raises(tau):
    buf = VersionBuffer.create(tree(0), capacity=4)
    with pytest.raises(ValueError, match=r"tau must be in \[0, 4\)"):
        buf.get(tau)


def test_bad_tau_types_and_capacity():
    buf = VersionBuffer.create(tree(0), capacity=2)
    with pytest.raises(TypeError):
        buf.get(1.0)
    with pytest.raises(ValueError):
        VersionBuffer.create(tree(0), capacity=0)
    with pytest.raises(TypeError):
        VersionBuffer.create(tree(0), capacity=2.0)


def test_push_wrong_structure_shape_dtype_raises():
    buf = VersionBuffer.create(tree(0), capacity=3)
    with pytest.raises(ValueError, match="structure"):
        buf.push({"a": jnp.zeros(2)})
    bad_shape = tree(1)
    bad_shape["a"] = jnp.zeros(3)
    with pytest.raises(ValueError, match=r"\['a'\].*shape"):
        buf.push(bad_shape)
    bad_dtype = tree(1)
    bad_dtype["a"] = jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match="dtype"):
        buf.push(bad_dtype)


def test_traced_tau_in_scan_and_checkify():
    def run(taus):
        def body(buf, xs):
            t, tau = xs
            buf = buf.push(tree(t))
            return buf, buf.get(tau)["a"][0]

        buf0 = VersionBuffer.create(tree(0), capacity=3)
        return jax.lax.scan(body, buf0, (jnp.arange(1, 7), taus))

    jitted = jax.jit(run)
    _, out = jitted(jnp.array([0, 1, 2, 2, 1, 0], jnp.int32))
    np.testing.assert_array_equal(out, [1.0, 1.0, 1.0, 2.0, 4.0, 6.0])
    # traced out-of-range tau: checkify reports it (traced checks on) ...
    before = enable_traced_checks()
    try:
        err, _ = jax.jit(checkify.checkify(run))(jnp.array([0, 1, 3, 0, 0, 0], jnp.int32))
        with pytest.raises(checkify.JaxRuntimeError, match="outside"):
            err.throw()
        err, _ = jax.jit(checkify.checkify(run))(jnp.array([0, 1, 2, 0, 0, 0], jnp.int32))
        err.throw()  # in range: no error
    finally:
        enable_traced_checks(before)
    # ... and without checkify it is clamped (never wraps round to a newer version)
    _, out = jitted(jnp.array([0, 9, -5, 0, 0, 0], jnp.int32))
    np.testing.assert_array_equal(out[:3], [1.0, 0.0, 3.0])


def test_vmap_over_buffers_and_taus():
    bufs = jax.vmap(lambda s: VersionBuffer.create({"w": s * jnp.ones(2)}, 3))(jnp.arange(2.0))
    bufs = jax.vmap(lambda b, s: b.push({"w": s * jnp.ones(2)}))(bufs, jnp.array([5.0, 7.0]))
    got = jax.vmap(lambda b, tau: b.get(tau)["w"][0])(bufs, jnp.array([0, 1]))
    np.testing.assert_array_equal(got, [5.0, 1.0])


def test_jit_donation_updates_in_place_and_no_recompile():
    calls = []

    def step(buf, x):
        calls.append(1)
        return buf.push({"w": buf.get(0)["w"] + x})

    f = jax.jit(step, donate_argnums=0)
    buf = VersionBuffer.create({"w": jnp.zeros(1000)}, capacity=4)
    ptr = buf.versions["w"].unsafe_buffer_pointer()
    buf = f(buf, 1.0)
    buf = f(buf, 1.0)
    assert len(calls) == 1
    assert buf.versions["w"].unsafe_buffer_pointer() == ptr  # updated in place
    assert float(buf.get(0)["w"][0]) == 2.0


def test_sharding_is_kept_on_trailing_dims():
    if jax.device_count() < 2:
        pytest.skip("needs >= 2 devices")
    mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.NamedSharding(mesh, jax.P("x", None))
    w = jax.device_put(jnp.arange(8.0).reshape(4, 2), spec)
    buf = VersionBuffer.create({"w": w}, capacity=3)
    assert buf.versions["w"].sharding.spec == jax.P(None, "x", None)
    buf = jax.jit(lambda b, t: b.push(t), donate_argnums=0)(buf, {"w": w + 1})
    assert buf.versions["w"].sharding.spec[1:] == ("x", None)
    got = jax.jit(lambda b: b.get(0))(buf)["w"]
    np.testing.assert_array_equal(got, np.arange(8.0).reshape(4, 2) + 1)


def test_nnx_variable_wrappers_are_the_same_weights():
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)  # Param variables
    buf = VersionBuffer.create(params, capacity=2)
    pure = nnx.as_pure(params)  # the same weights as plain arrays
    buf = buf.push(jax.tree.map(lambda x: x + 1, pure))
    got = buf.get(0)
    assert jax.tree.structure(got) == jax.tree.structure(params)
    np.testing.assert_array_equal(got["kernel"][...], pure["kernel"] + 1)
    with pytest.raises(ValueError, match="structure"):
        buf.push({"kernel": pure["kernel"]})
