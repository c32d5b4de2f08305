"""Weight prediction: SpecTrain and NAG coefficients, the Nesterov look-ahead, horizons."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import (
    WeightPredictionState,
    dc_asgd,
    find_weight_prediction_state,
    predict_weights,
    weight_prediction,
)

PARAMS = {"s0": {"w": jnp.array([1.0, -2.0])}, "s1": jnp.array([[0.5]])}
GRADS = {"s0": {"w": jnp.array([0.5, 1.0])}, "s1": jnp.array([[-2.0]])}


def one_step(tx, params=PARAMS, grads=GRADS):
    state = tx.init(params)
    upd, state = tx.update(grads, state, params)
    return optax.apply_updates(params, upd), upd, state


def test_wrapper_is_the_inner_optimizer_and_remembers_its_update():
    inner = optax.adam(0.1)
    tx = weight_prediction(inner)
    state, inner_state = tx.init(PARAMS), inner.init(PARAMS)
    for _ in range(3):
        upd, state = tx.update(GRADS, state, PARAMS)
        ref, inner_state = inner.update(GRADS, inner_state, PARAMS)
        for a, b in zip(jax.tree.leaves(upd), jax.tree.leaves(ref), strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        for a, b in zip(jax.tree.leaves(state.last_update), jax.tree.leaves(ref), strict=True):
            np.testing.assert_array_equal(a, b)
    assert isinstance(state, WeightPredictionState) and int(state.count) == 3


def test_spectrain_hand_computed():
    params, _, state = one_step(weight_prediction(optax.sgd(0.1, momentum=0.9)))
    pred = predict_weights(params, state, 3)
    # Δw = -0.1 g; params = PARAMS - 0.1 g; pred = params - 0.3 g
    np.testing.assert_allclose(pred["s0"]["w"], [1.0 - 0.4 * 0.5, -2.0 - 0.4 * 1.0], rtol=1e-6)
    np.testing.assert_allclose(pred["s1"], [[0.5 + 0.4 * 2.0]], rtol=1e-6)


@pytest.mark.parametrize(
    ("mu", "steps", "coef"),
    [(0.5, 0, 0.0), (0.5, 1, 0.5), (0.5, 3, 0.875), (0.9, 2, 1.71), (0.0, 3, 0.0)],
)
def test_nesterov_geometric_coefficient(mu, steps, coef):
    params, upd, state = one_step(weight_prediction(optax.sgd(1.0)))
    pred = predict_weights(params, state, steps, rule="nesterov", momentum=mu)
    for p, u, q in zip(*(jax.tree.leaves(t) for t in (params, upd, pred)), strict=True):
        np.testing.assert_allclose(q, p + coef * u, rtol=1e-6, atol=1e-7)


def test_nag_one_step_is_nesterov_lookahead_of_optax_sgd():
    eta, mu = 0.05, 0.9
    inner = optax.sgd(eta, momentum=mu)
    tx = weight_prediction(inner)
    params, state = PARAMS, tx.init(PARAMS)
    for k in range(5):
        grads = jax.tree.map(lambda g: g * (k + 1.0) + params_sum(params), GRADS)
        upd, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, upd)
    v = state.inner_state[0].trace  # optax trace: v <- mu v + g; update = -eta v
    lookahead = jax.tree.map(lambda w, vv: w - eta * mu * vv, params, v)
    pred = predict_weights(params, state, 1, rule="nesterov", momentum=mu)
    for a, b in zip(jax.tree.leaves(pred), jax.tree.leaves(lookahead), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # and SpecTrain's s-step prediction is w - s η v
    pred3 = predict_weights(params, state, 3)
    for a, w, vv in zip(*(jax.tree.leaves(t) for t in (pred3, params, v)), strict=True):
        np.testing.assert_allclose(a, w - 3 * eta * vv, rtol=1e-6, atol=1e-7)


def params_sum(params):
    return sum(jnp.sum(x) for x in jax.tree.leaves(params))


def test_steps_zero_is_exact_and_per_stage_horizons():
    params, _, state = one_step(weight_prediction(optax.sgd(0.3)))
    for rule, mom in (("spectrain", None), ("nesterov", 0.9)):
        pred = predict_weights(params, state, 0, rule=rule, momentum=mom)
        for a, b in zip(jax.tree.leaves(pred), jax.tree.leaves(params), strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    pred = predict_weights(params, state, {"s0": 2, "s1": 0})
    np.testing.assert_allclose(
        pred["s0"]["w"], params["s0"]["w"] - 0.6 * GRADS["s0"]["w"], rtol=1e-6
    )
    np.testing.assert_array_equal(pred["s1"], params["s1"])
    # traced per-stage horizons under jit
    f = jax.jit(lambda p, s, st: predict_weights(p, s, st))
    pred = f(params, state, {"s0": jnp.int32(0), "s1": jnp.int32(1)})
    np.testing.assert_array_equal(pred["s0"]["w"], params["s0"]["w"])
    np.testing.assert_allclose(pred["s1"], params["s1"] - 0.3 * GRADS["s1"], rtol=1e-6)


def test_state_found_inside_a_chain():
    tx = optax.chain(dc_asgd(), weight_prediction(optax.sgd(0.1)))
    state = tx.init(PARAMS)
    upd, state = tx.update(GRADS, state, PARAMS, stale_params=PARAMS)
    assert find_weight_prediction_state(state) is state[1]
    pred = predict_weights(PARAMS, state, 1)
    np.testing.assert_allclose(pred["s1"], PARAMS["s1"] + upd["s1"], rtol=1e-6)


def test_errors():
    params, _, state = one_step(weight_prediction(optax.sgd(0.1)))
    with pytest.raises(ValueError, match="momentum"):
        predict_weights(params, state, 1, rule="nesterov")
    with pytest.raises(ValueError, match="rule"):
        predict_weights(params, state, 1, rule="adam")
    with pytest.raises(ValueError, match="prefix"):
        predict_weights(params, state, {"s0": 1})
    with pytest.raises(ValueError, match="WeightPredictionState"):
        predict_weights(params, optax.sgd(0.1).init(params), 1)
    with pytest.raises(ValueError, match="structure"):
        predict_weights({"s0": params["s0"]}, state, 1)
    with pytest.raises(TypeError, match="integer"):
        predict_weights(params, state, 1.5)
    with pytest.raises(ValueError, match=r"steps must be in \[0, inf\), got -1"):
        predict_weights(params, state, {"s0": 1, "s1": -1})


def test_nnx_params_keep_their_structure():
    from flax import nnx

    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, weight_prediction(optax.sgd(0.5)), wrt=nnx.Param)
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.zeros((1, 2)))))(model)  # d/d bias = 1
    opt.update(model, grads)
    params = nnx.state(model, nnx.Param)
    pred = predict_weights(params, opt.opt_state, 2)
    assert jax.tree.structure(pred) == jax.tree.structure(params)
    np.testing.assert_allclose(pred["bias"][...], params["bias"][...] - 1.0, rtol=1e-6)


def _adam_steps(tx, steps=4):
    """A few steps on fixed, varying gradients; returns (weights before the last, after, state)."""
    params, state = PARAMS, tx.init(PARAMS)
    for k in range(steps):
        grads = jax.tree.map(lambda g, k=k: g * (1.0 + 0.5 * k) - 0.3 * k, GRADS)
        prev = params
        upd, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, upd)
    return prev, params, state


def _pipeoptim(params, adam_state, s, lr, b1, b2, eps=1e-8):
    """PipeOptim's load_predicted_weights (official code), in float64: the moments and step
    count after the last applied step, W − s·(lr/(1−β1^t))·m / (sqrt(v)/sqrt(1−β2^t) + ε)."""
    t = int(adam_state.count)
    step_size = lr / (1 - b1**t)
    return jax.tree.map(
        lambda w, m, v: (
            np.asarray(w, np.float64)
            - s
            * step_size
            * np.asarray(m, np.float64)
            / (np.sqrt(np.asarray(v, np.float64)) / np.sqrt(1 - b2**t) + eps)
        ),
        params,
        adam_state.mu,
        adam_state.nu,
    )


@pytest.mark.parametrize("s", [1, 3])
def test_spectrain_rule_on_adam_is_pipeoptims_prediction(s):
    """optax.adam: W + s·Δw_last is PipeOptim's W − s·η·m̂_t/(sqrt(v̂_t) + ε) (bias corrections of
    the last step t, no new gradient): equal up to float rounding."""
    lr, b1, b2 = 0.01, 0.9, 0.999
    _, params, state = _adam_steps(weight_prediction(optax.adam(lr, b1, b2)))
    want = _pipeoptim(params, state.inner_state[0], s, lr, b1, b2)
    got = predict_weights(params, state, s)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
    # the next step's bias corrections (t + 1) would be a different, wrong prediction
    t = int(state.inner_state[0].count)
    c = (1 - b1 ** (t + 1)) / (1 - b1**t) * np.sqrt((1 - b2**t) / (1 - b2 ** (t + 1)))
    assert abs(c - 1) > 1e-3


def test_spectrain_rule_on_adamw_adds_the_decay_pipeoptim_leaves_out():
    """optax.adamw: Δw_last includes the decoupled decay −η·λ·w_{t−1}; PipeOptim's prediction
    does not. The difference is exactly s·η·λ·w_{t−1} (relative size ~λ·|w|)."""
    lr, b1, b2, lam, s = 0.01, 0.9, 0.999, 0.1, 2
    prev, params, state = _adam_steps(weight_prediction(optax.adamw(lr, b1, b2, weight_decay=lam)))
    want = _pipeoptim(params, state.inner_state[0], s, lr, b1, b2)
    got = predict_weights(params, state, s)
    for a, b, w in zip(*(jax.tree.leaves(x) for x in (got, want, prev)), strict=True):
        np.testing.assert_allclose(np.asarray(a) - b, -s * lr * lam * np.asarray(w), atol=1e-6)
        assert np.abs(np.asarray(a) - b).max() > 1e-4  # a real difference here


def test_pipemare_rule_hand_computed():
    """δ ← γδ + (1 − γ)Δw; ŵ = w − s·δ. sgd(1): Δw = −1, −2; γ = 0.5: δ = −0.5, −1.25;
    w = −3; s = 2: ŵ = −3 + 2.5 = −0.5."""
    tx = weight_prediction(optax.sgd(1.0), velocity_decay=0.5)
    w = jnp.array([0.0])
    state = tx.init(w)
    for g in (1.0, 2.0):
        upd, state = tx.update(jnp.array([g]), state, w)
        w = optax.apply_updates(w, upd)
    assert float(state.velocity[0]) == -1.25 and float(w[0]) == -3.0
    assert float(predict_weights(w, state, 2, rule="pipemare")[0]) == -0.5
    assert predict_weights(w, state, 0, rule="pipemare").tobytes() == w.tobytes()
    # without velocity_decay there is no δ (and no extra memory)
    plain = weight_prediction(optax.sgd(1.0))
    assert plain.init(w).velocity is None
    with pytest.raises(ValueError, match="velocity_decay"):
        predict_weights(w, plain.init(w), 1, rule="pipemare")
    with pytest.raises(ValueError, match="velocity_decay"):
        weight_prediction(optax.sgd(1.0), velocity_decay=1.0)
