"""Loss predictors on synthetic sequences with known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstale.lc_asgd import ar_loss_predictor, delay_loss, rnn_loss_predictor

H = 6


def feed(lp, seq):
    """Observe ``seq`` with one jitted scan; return the state."""

    def body(s, y):
        return lp.update(s, y), None

    return jax.jit(lambda xs: jax.lax.scan(body, lp.init(), xs)[0])(jnp.asarray(seq, jnp.float32))


@pytest.mark.parametrize("order", [1, 2, 4])
@pytest.mark.parametrize(("a", "b"), [(2.3, -0.02), (0.5, 0.1)])
def test_linear_trend_is_predicted_exactly(order, a, b):
    lp = ar_loss_predictor(order)
    t = np.arange(40)
    s = feed(lp, a + b * t)
    preds = np.asarray(jax.jit(lp.rollout, static_argnums=2)(s, a + b * 39, H))
    # exact in exact arithmetic; float32's rounding compounds over the H-step rollout (2.7e-5
    # at h = 6 for a = 2.3 when XLA:CPU compiles at -O0, as make test does: conftest.py)
    np.testing.assert_allclose(preds, a + b * (40 + np.arange(H)), atol=5e-5)


def test_wrong_model_is_not_exact():
    # guard: the exactness above is not trivially true (a quadratic is not an AR(1) + bias)
    lp = ar_loss_predictor(1)
    t = np.arange(40.0)
    s = feed(lp, 0.01 * (t - 20) ** 2)
    preds = np.asarray(lp.rollout(s, 0.01 * 19**2, H))
    assert np.abs(preds - 0.01 * (20 + np.arange(H) - 20 + 20) ** 2).max() > 1e-2


def test_ar1_coefficients_are_recovered():
    # ℓ_{t+1} = 0.3 + 0.8 ℓ_t: the fit is exact, so are the rollout and its slope a^j
    seq = [2.0]
    for _ in range(15):
        seq.append(0.3 + 0.8 * seq[-1])
    lp = ar_loss_predictor(1, forget=0.95)
    s = feed(lp, seq)
    np.testing.assert_allclose(np.asarray(s.coef), [0.3, 0.8], atol=1e-4)
    value, slope = jax.jit(lambda s: delay_loss(lp, s, 1.0, 3, horizon=H))(s)
    # ℓ̂_1 = 1.1, ℓ̂_2 = 1.18, ℓ̂_3 = 1.244; slope = .8 + .64 + .512
    np.testing.assert_allclose([value, slope], [3.524, 1.952], rtol=5e-4)


def test_no_data_is_persistence():
    lp = ar_loss_predictor(3)
    np.testing.assert_allclose(np.asarray(lp.rollout(lp.init(), 1.7, 4)), 1.7)


def test_delay_loss_weights_integer_fractional_and_clipped_k():
    lp = ar_loss_predictor(1)
    s = lp.init()  # persistence: every ℓ̂_j = ℓ, ∂ℓ̂_j/∂ℓ = 1
    f = jax.jit(lambda k: delay_loss(lp, s, 2.0, k, horizon=4))
    for k, want in [(0, 0.0), (1, 1.0), (3, 3.0), (2.5, 2.5), (9, 4.0), (-1, 0.0)]:
        value, slope = f(jnp.float32(k))
        np.testing.assert_allclose([value, slope], [2.0 * want, want], rtol=1e-6)


@pytest.mark.slow  # make test ≤ 8 min: CI runs it in make test-slow
def test_rnn_starts_at_persistence_and_learns_a_trend():
    lp = rnn_loss_predictor(hidden=8, window=4, learning_rate=3e-2)
    rollout = jax.jit(lp.rollout, static_argnums=2)
    s0 = feed(lp, [2.0])
    np.testing.assert_allclose(np.asarray(rollout(s0, 2.0, 3)), 2.0, rtol=1e-6)
    seq = 2.0 - 0.01 * np.arange(300)
    s = feed(lp, seq)
    pred = float(rollout(s, seq[-1], 1)[0])
    truth, persistence = seq[-1] - 0.01, seq[-1]
    assert abs(pred - truth) < 0.5 * abs(persistence - truth)


def test_bad_arguments():
    with pytest.raises(ValueError, match="order"):
        ar_loss_predictor(0)
    with pytest.raises(TypeError, match="order"):
        ar_loss_predictor(2.0)
    with pytest.raises(ValueError, match="forget"):
        ar_loss_predictor(2, forget=1.5)
    with pytest.raises(ValueError, match="horizon"):
        delay_loss(ar_loss_predictor(), ar_loss_predictor().init(), 1.0, 2, horizon=0)
    with pytest.raises(ValueError, match="learning_rate"):
        rnn_loss_predictor(learning_rate=0.0)
