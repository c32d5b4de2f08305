"""jaxstale.transforms.lookahead: outer Nesterov's updates bit for bit, the pull point on
hand-computed cases, its reductions (s = 0, μ = 0, s = 1) and bad input."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale.transforms.lookahead import (
    MomentumLookaheadState,
    lookahead_point,
    momentum_lookahead,
    uses_lookahead,
)
from jaxstale.transforms.outer import outer_nesterov


def _deltas(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {
            "w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=2), jnp.float32),
        }
        for _ in range(n)
    ]


@pytest.mark.parametrize("horizon", [0, 1, 5])
def test_the_updates_are_outer_nesterov_bit_for_bit(horizon):
    la, ref = momentum_lookahead(0.7, 0.9, horizon), outer_nesterov(0.7, 0.9)
    ds = _deltas()
    s_la, s_ref = la.init(ds[0]), ref.init(ds[0])
    for d in ds:
        u_la, s_la = la.update(d, s_la, staleness=3)
        u_ref, s_ref = ref.update(d, s_ref, staleness=3)
        for k in d:
            np.testing.assert_array_equal(np.asarray(u_la[k]), np.asarray(u_ref[k]))


def test_the_pull_point_on_a_hand_computed_case():
    """η = 0.1, μ = 0.5, s = 3: after Δ = 2 then Δ = 1, b = 1 + 0.5·2 = 2; the point lies
    η·b·(μ + μ² + μ³) = 0.1·2·0.875 = 0.175 behind θ."""
    tx = momentum_lookahead(0.1, momentum=0.5, horizon=3)
    theta = jnp.array([1.0])
    st = tx.init(theta)
    for d in (2.0, 1.0):
        u, st = tx.update(jnp.array([d]), st)
        theta = optax.apply_updates(theta, u)
    # θ: 1 − 0.1·(2 + 1) = 0.7, then 0.7 − 0.1·(1 + 0.5·2) = 0.5
    assert float(theta[0]) == pytest.approx(0.5)
    assert float(st.momentum[0]) == pytest.approx(2.0)
    assert float(st.reach) == pytest.approx(0.0875)
    assert float(lookahead_point(theta, st)[0]) == pytest.approx(0.5 - 0.175)


def test_horizon_zero_and_no_momentum_pull_the_weights_themselves():
    theta = {"w": jnp.arange(3.0)}
    for tx in (momentum_lookahead(0.7, 0.9, 0), momentum_lookahead(0.7, 0.0, 4)):
        st = tx.init(theta)
        _, st = tx.update({"w": jnp.ones(3)}, st)
        np.testing.assert_array_equal(np.asarray(lookahead_point(theta, st)["w"]), np.arange(3.0))


def test_horizon_one_is_nesterovs_own_look_ahead():
    tx = momentum_lookahead(0.3, 0.8, 1)
    theta = jnp.array([2.0, -1.0])
    st = tx.init(theta)
    _, st = tx.update(jnp.array([1.0, 4.0]), st)
    want = theta - 0.3 * 0.8 * st.momentum
    np.testing.assert_allclose(np.asarray(lookahead_point(theta, st)), np.asarray(want), rtol=1e-6)


def test_a_schedule_and_injected_rates_set_the_reach_and_the_point_is_found_in_a_chain():
    inj = optax.inject_hyperparams(momentum_lookahead, static_args=("horizon",))
    tx = optax.chain(optax.identity(), inj(learning_rate=0.5, momentum=0.5, horizon=2))
    theta = jnp.array([0.0])
    st = tx.init(theta)
    assert uses_lookahead(st) and not uses_lookahead(outer_nesterov().init(theta))
    _, st = tx.update(jnp.array([1.0]), st)
    # b = 1, r = 0.5·(0.5 + 0.25)
    assert float(lookahead_point(theta, st)[0]) == pytest.approx(-0.375)
    sched = momentum_lookahead(optax.constant_schedule(0.2), 0.5, 1)
    s2 = sched.init(theta)
    _, s2 = sched.update(jnp.array([1.0]), s2)
    assert float(s2.reach) == pytest.approx(0.1)


def test_without_a_lookahead_state_the_weights_pass_and_two_are_refused():
    theta = jnp.ones(2)
    assert lookahead_point(theta, optax.sgd(0.1).init(theta)) is theta
    st = momentum_lookahead(0.1).init(theta)
    assert isinstance(st, MomentumLookaheadState)
    with pytest.raises(ValueError, match="holds 2 MomentumLookaheadStates"):
        lookahead_point(theta, (st, st))


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"horizon": -1}, "horizon"),
        ({"horizon": 1.5}, "horizon"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": -0.1}, "momentum"),
        ({"learning_rate": -0.1}, "learning_rate"),
    ],
)
def test_bad_hyper_parameters_are_one_clear_error(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        momentum_lookahead(**{"learning_rate": 0.7, **kw})
