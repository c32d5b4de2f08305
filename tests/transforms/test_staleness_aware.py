"""Staleness-aware: g / max(τ, 1), per-stage staleness, and the staleness-dependent schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import StalenessSchedule, staleness_aware, staleness_schedule

G = {"s0": jnp.array([1.0, -3.0]), "s1": {"w": jnp.array([[6.0]])}}


@pytest.mark.parametrize(("tau", "divisor"), [(0, 1), (1, 1), (3, 3)])
def test_divides_by_staleness(tau, divisor):
    tx = staleness_aware()
    out, _ = tx.update(G, tx.init(G), staleness=tau)
    np.testing.assert_array_equal(out["s0"], np.asarray(G["s0"]) / divisor)
    np.testing.assert_array_equal(out["s1"]["w"], np.asarray(G["s1"]["w"]) / divisor)
    if divisor == 1:
        assert np.asarray(out["s0"]).tobytes() == np.asarray(G["s0"]).tobytes()


def test_traced_and_per_stage_staleness():
    tx = staleness_aware()
    f = jax.jit(lambda g, tau: tx.update(g, tx.init(g), staleness=tau)[0])
    out = f(G, {"s0": jnp.int32(2), "s1": jnp.int32(3)})
    np.testing.assert_array_equal(out["s0"], [0.5, -1.5])
    np.testing.assert_array_equal(out["s1"]["w"], [[2.0]])
    with pytest.raises(ValueError, match="prefix"):
        tx.update(G, tx.init(G), staleness={"s0": 1})


def test_missing_staleness_raises():
    tx = staleness_aware()
    with pytest.raises(TypeError, match="staleness"):
        tx.update(G, tx.init(G))
    with pytest.raises(TypeError, match="staleness"):
        chained = optax.chain(staleness_aware(), optax.sgd(0.1))
        chained.update(G, chained.init(G))


def test_staleness_schedule_through_inject_hyperparams():
    sched = staleness_schedule(lambda count: 0.1 * (count + 1), power=0.5)
    assert isinstance(sched, StalenessSchedule)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=sched, momentum=0.0)
    params = jnp.array([1.0])
    state = tx.init(params)
    np.testing.assert_allclose(state.hyperparams["learning_rate"], 0.1)
    lrs = []
    for tau in (4, 0, 9):
        upd, state = tx.update(jnp.array([1.0]), state, params, staleness=tau, other=1)
        lrs.append(float(state.hyperparams["learning_rate"]))
        np.testing.assert_allclose(upd, [-lrs[-1]], rtol=1e-6)
    # η(t) / max(τ,1)^0.5 at counts 0, 1, 2
    np.testing.assert_allclose(lrs, [0.1 / 2, 0.2, 0.3 / 3], rtol=1e-6)
    # without a staleness argument the schedule is the base rate
    _, state = tx.update(jnp.array([1.0]), state, params)
    np.testing.assert_allclose(state.hyperparams["learning_rate"], 0.4, rtol=1e-6)
    with pytest.raises(ValueError):
        staleness_schedule(0.1, power=-1.0)


def test_staleness_schedule_jits_without_recompiling():
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=staleness_schedule(0.5))
    traces = []

    def step(params, state, tau):
        traces.append(1)
        upd, state = tx.update(jnp.ones_like(params), state, params, staleness=tau)
        return optax.apply_updates(params, upd), state

    step = jax.jit(step)
    params, state = jnp.zeros(1), tx.init(jnp.zeros(1))
    for tau in (1, 2, 5):
        params, state = step(params, state, jnp.int32(tau))
    assert len(traces) == 1
    np.testing.assert_allclose(params, [-(0.5 + 0.25 + 0.1)], rtol=1e-6)
