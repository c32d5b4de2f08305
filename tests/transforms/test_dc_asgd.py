"""DC-ASGD: hand-computed compensations (constant and adaptive λ) and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import DCASGDState, dc_asgd

G = {"a": jnp.array([2.0, 1.0, -3.0])}
W = {"a": jnp.array([1.0, 1.0, 2.0])}
W_BAK = {"a": jnp.array([0.0, 1.0, 0.0])}


def test_constant_lambda_hand_computed():
    tx = dc_asgd(lam=0.5)
    state = tx.init(W)
    assert state == DCASGDState(ms=None)
    out, state = tx.update(G, state, W, stale_params=W_BAK)
    # 2 + .5*4*1 = 4;  1 + 0 = 1;  -3 + .5*9*2 = 6
    np.testing.assert_array_equal(out["a"], [4.0, 1.0, 6.0])


def test_default_lambda_is_004():
    out, _ = dc_asgd().update(G, dc_asgd().init(W), W, stale_params=W_BAK)
    np.testing.assert_allclose(out["a"], [2 + 0.04 * 4, 1.0, -3 + 0.04 * 18], rtol=1e-6)


def test_adaptive_lambda_hand_computed():
    tx = dc_asgd(lam=2.0, adaptive=True, decay=0.5, eps=1e-30)  # ε > 0; negligible here
    state = tx.init(W)
    np.testing.assert_array_equal(state.ms["a"], [0.0, 0.0, 0.0])
    out, state = tx.update(G, state, W, stale_params=W_BAK)
    # MS = 0.5 g^2 (updated first), λ = 2 / sqrt(MS) = 2 sqrt(2)/|g|
    np.testing.assert_allclose(state.ms["a"], [2.0, 0.5, 4.5], rtol=1e-7)
    expect1 = [2 + 2 * np.sqrt(2) * 2 * 1, 1.0, -3 + 2 * np.sqrt(2) * 3 * 2]
    np.testing.assert_allclose(out["a"], expect1, rtol=1e-6)
    out, state = tx.update(G, state, W, stale_params=W_BAK)
    # MS = 0.5*0.5 g^2 + 0.5 g^2 = 0.75 g^2
    np.testing.assert_allclose(state.ms["a"], [3.0, 0.75, 6.75], rtol=1e-7)
    expect2 = [2 + 2 / np.sqrt(3.0) * 4 * 1, 1.0, -3 + 2 / np.sqrt(6.75) * 9 * 2]
    np.testing.assert_allclose(out["a"], expect2, rtol=1e-6)


def test_adaptive_eps():
    tx = dc_asgd(lam=1.0, adaptive=True, decay=0.0, eps=3.0)
    g, w, wb = jnp.array([1.0]), jnp.array([1.0]), jnp.array([0.0])
    out, _ = tx.update(g, tx.init(w), w, stale_params=wb)
    np.testing.assert_allclose(out, [1 + 1 / np.sqrt(1 + 3.0)], rtol=1e-7)


def test_sign_moves_towards_fresh_gradient():
    # f = w^2/2: g(w) = w, H = 1. Worker read w_bak = 1 (g = 1); weights are now w = 0.5
    # (fresh gradient 0.5). λ g^2 = 0.5 approximates H/2: the compensation halves the error.
    # (The sign-flipped Multiverso revision would give 1.25.)
    tx = dc_asgd(lam=0.5)
    out, _ = tx.update(
        jnp.array([1.0]), tx.init(jnp.zeros(1)), jnp.array([0.5]), stale_params=jnp.array([1.0])
    )
    assert abs(float(out[0]) - 0.5) < abs(1.0 - 0.5)
    np.testing.assert_allclose(out, [0.75])


def test_zero_gap_passes_gradient_bit_for_bit():
    g = {"a": jnp.array([1e-30, -7.3, 3.1e7])}
    for tx in (dc_asgd(), dc_asgd(2.0, adaptive=True)):
        out, _ = tx.update(g, tx.init(g), W, stale_params=W)
        assert np.asarray(out["a"]).tobytes() == np.asarray(g["a"]).tobytes()


def test_errors():
    tx = dc_asgd()
    state = tx.init(W)
    with pytest.raises(TypeError, match="stale_params"):
        tx.update(G, state, W)
    with pytest.raises(ValueError, match="needs params"):
        tx.update(G, state, None, stale_params=W)
    with pytest.raises(ValueError, match="same pytree structure"):
        tx.update(G, state, W, stale_params={"b": W["a"]})
    with pytest.raises(ValueError, match="shape"):
        tx.update(G, state, W, stale_params={"a": jnp.zeros(4)})


def test_chained_with_sgd_hand_computed():
    tx = optax.chain(dc_asgd(lam=0.5), optax.sgd(0.1))
    out, _ = tx.update(G, tx.init(W), W, stale_params=W_BAK)
    np.testing.assert_allclose(out["a"], [-0.4, -0.1, -0.6], rtol=1e-6)


def test_nnx_state_with_variables_as_stale_params():
    from flax import nnx

    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    stale = nnx.state(model, nnx.Param)  # Param variables, as a user would pass them
    params = nnx.as_pure(stale)
    params = jax.tree.map(lambda x: x + 1.0, params)
    grads = jax.tree.map(jnp.ones_like, params)
    tx = dc_asgd(lam=0.5)
    out, _ = tx.update(grads, tx.init(params), params, stale_params=stale)
    assert jax.tree.structure(out) == jax.tree.structure(grads)
    np.testing.assert_allclose(out["kernel"], np.full((2, 1), 1.5))


def test_one_ms_per_worker_hand_computed():
    # Workers 0, 1, 0 (m = 0.5, λ0 = 2). Gap w − w_bak = [1, 0, 2] throughout.
    tx = dc_asgd(lam=2.0, adaptive=True, decay=0.5, eps=1e-30, num_workers=2)
    state = tx.init(W)
    assert state.ms["a"].shape == (2, 3)
    g1, g2 = G, {"a": jnp.array([1.0, 2.0, 1.0])}
    out, state = tx.update(g1, state, W, stale_params=W_BAK, worker=jnp.int32(0))
    # MS_0 = 0.5 g1² = [2, .5, 4.5], λ = 2 / sqrt(MS_0); MS_1 untouched
    r2 = np.sqrt(2.0)
    np.testing.assert_allclose(out["a"], [2 + r2 * 4, 1.0, -3 + 2 * r2 / 3 * 9 * 2], rtol=1e-6)
    out, state = tx.update(g2, state, W, stale_params=W_BAK, worker=jnp.int32(1))
    # worker 1's own MS_1 = 0.5 g2² = [.5, 2, .5] (a shared MS would be [1.5, 2.25, 2.75])
    np.testing.assert_allclose(out["a"], [1 + 2 * r2, 2.0, 1 + 2 * r2 * 2], rtol=1e-6)
    out, state = tx.update(g2, state, W, stale_params=W_BAK, worker=0)
    # MS_0 = 0.5 [2, .5, 4.5] + 0.5 [1, 4, 1] = [1.5, 2.25, 2.75]
    np.testing.assert_allclose(out["a"], [1 + 2 / np.sqrt(1.5), 2.0, 1 + 4 / np.sqrt(2.75)])
    np.testing.assert_allclose(state.ms["a"], [[1.5, 2.25, 2.75], [0.5, 2.0, 0.5]], rtol=1e-7)


def test_one_worker_is_the_shared_ms_bit_for_bit():
    rng = np.random.default_rng(0)
    shared = dc_asgd(2.0, adaptive=True)
    single = dc_asgd(2.0, adaptive=True, num_workers=1)
    s_shared, s_single = shared.init(W), single.init(W)
    for _ in range(3):
        g = {"a": jnp.asarray(rng.standard_normal(3), jnp.float32)}
        a, s_shared = shared.update(g, s_shared, W, stale_params=W_BAK, worker=jnp.int32(0))
        b, s_single = single.update(g, s_single, W, stale_params=W_BAK, worker=jnp.int32(0))
        assert np.asarray(a["a"]).tobytes() == np.asarray(b["a"]).tobytes()
    assert np.asarray(s_shared.ms["a"]).tobytes() == np.asarray(s_single.ms["a"][0]).tobytes()


def test_per_worker_ms_traced_worker_in_jit_and_scan():
    tx = dc_asgd(2.0, adaptive=True, decay=0.5, num_workers=2)
    workers = jnp.array([0, 1, 0], jnp.int32)

    def body(state, w):
        out, state = tx.update(G, state, W, stale_params=W_BAK, worker=w)
        return state, out["a"]

    state, outs = jax.jit(lambda s: jax.lax.scan(body, s, workers))(tx.init(W))
    ref_state, ref = tx.init(W), []
    for w in (0, 1, 0):
        out, ref_state = tx.update(G, ref_state, W, stale_params=W_BAK, worker=w)
        ref.append(out["a"])
    np.testing.assert_allclose(outs, np.stack(ref), rtol=1e-6)
    np.testing.assert_allclose(state.ms["a"], ref_state.ms["a"], rtol=1e-6)
    # worker 1's row saw one gradient, worker 0's two: 0.5 g², 0.75 g²
    np.testing.assert_allclose(state.ms["a"][1], 0.5 * np.asarray(G["a"]) ** 2, rtol=1e-6)
    np.testing.assert_allclose(state.ms["a"][0], 0.75 * np.asarray(G["a"]) ** 2, rtol=1e-6)
