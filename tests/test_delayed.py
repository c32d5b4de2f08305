"""Constant-delay training (jaxstale.delayed): hand-computed recursions, τ = 0 is the optimizer
itself, per-group delays, weight prediction, the asynchronous emulator's constant delay, lanes."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import delayed, delays, emulate_async, loop, models, train

LIN = lambda p, s, x, train: (x * p, s)
SQ = lambda out, y: jnp.mean((out - y) ** 2) / 2


def _steps(update, init, p, n, x=1.0, y=1.0):
    st, out = init(p), []
    for _ in range(n):
        p, st, _, _ = update(p, st, {}, jnp.asarray(x), jnp.asarray(y))
        out.append(float(p))
    return out


def _by_hand(tau, n, lr=0.3, predict=False):
    """w_{t+1} = w_t − lr·(w̃_t − 1), w̃_t = w_{max(t−τ,0)} (+ τ·(w_{t−τ} − w_{t−τ−1}))."""
    w = [0.0]
    for t in range(n):
        a = w[max(t - tau, 0)]
        if predict and t - tau >= 1:
            a = a + tau * (a - w[t - tau - 1])
        w.append(w[-1] - lr * (a - 1.0))
    return w[1:]


@pytest.mark.parametrize("tau", [0, 1, 3])
@pytest.mark.parametrize("predict", [False, True])
def test_sgd_with_a_constant_delay_is_the_hand_recursion(tau, predict):
    update, init = delayed.delayed_update(LIN, optax.sgd(0.3), tau, predict=predict, loss_fn=SQ)
    np.testing.assert_allclose(
        _steps(update, init, jnp.zeros(()), 12), _by_hand(tau, 12, predict=predict), rtol=1e-6
    )


def test_each_group_reads_its_own_delay():
    apply = lambda p, s, x, train: (x * p["a"] + x * p["b"], s)
    update, init = delayed.delayed_update(apply, optax.sgd(0.1), {"a": 2, "b": 0}, loss_fn=SQ)
    p = {"a": jnp.zeros(()), "b": jnp.zeros(())}
    st, hist = init(p), [(0.0, 0.0)]
    a, b = 0.0, 0.0
    for t in range(8):
        p, st, _, _ = update(p, st, {}, jnp.ones(()), jnp.ones(()))
        ga = hist[max(t - 2, 0)][0] + b - 1.0  # the output at (a_{t−2}, b_t)
        a, b = a - 0.1 * ga, b - 0.1 * ga
        hist.append((a, b))
        np.testing.assert_allclose([float(p["a"]), float(p["b"])], [a, b], rtol=1e-6)


def _mlp():
    f = models.functional(models.create("mlp", input_shape=(4, 4, 1), num_classes=3, seed=0))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4, 4, 1)).astype(np.float32)
    return f, x, rng.integers(0, 3, 64).astype(np.int32)


@pytest.mark.parametrize("predict", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_zero_delay_is_the_optimizer_itself_to_the_bit(predict):
    f, x, y = _mlp()
    tx = optax.adamw(3e-3, b2=0.95, weight_decay=0.1)
    idx = np.arange(64).reshape(8, 8)
    plain = train.executor(f.apply, tx, x, y, idx, loop="scan")
    late = delayed.executor(f.apply, tx, x, y, idx, delay=0, predict=predict)
    (a,) = loop.run(plain, f.params, f.state)
    (b,) = loop.run(late, f.params, f.state)
    np.testing.assert_array_equal(a.losses, b.losses)
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)


def test_a_constant_delay_is_the_asynchronous_emulators():
    f, x, y = _mlp()
    idx = np.arange(64).reshape(8, 8)
    (mine,) = loop.run(
        delayed.executor(f.apply, optax.sgd(0.1), x, y, idx, delay=3), f.params, f.state
    )
    theirs = emulate_async(
        f.apply, optax.sgd(0.1), f.params, f.state, delays.constant(3, 8), x[idx], y[idx]
    )
    np.testing.assert_allclose(mine.losses, theirs.losses, rtol=1e-6)
    jax.tree.map(
        lambda u, v: np.testing.assert_allclose(u, v, atol=1e-6), mine.params, theirs.params
    )


@pytest.mark.slow  # 6 s; the scalar model's lanes below stay in make test
def test_vmapped_lanes_at_their_own_rates_equal_runs_alone():
    f, x, y = _mlp()
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=1.0)
    idx = np.stack([np.arange(64).reshape(8, 8), np.arange(64)[::-1].reshape(8, 8)])
    stack = lambda *t: jax.tree.map(lambda *a: jnp.stack(a), *t)
    rates = {"learning_rate": [1e-3, 3e-3]}
    ex = delayed.executor(
        f.apply, tx, x, y, idx, delay=2, predict=True, vmap=True, hyperparams=rates
    )
    lanes = loop.run(ex, stack(f.params, f.params), stack(f.state, f.state))
    for j, lr in enumerate(rates["learning_rate"]):
        one = optax.inject_hyperparams(optax.adam)(learning_rate=lr)
        alone = delayed.executor(f.apply, one, x, y, idx[j], delay=2, predict=True)
        (res,) = loop.run(alone, f.params, f.state)
        np.testing.assert_allclose(lanes[j].losses, res.losses, rtol=1e-6)
    with pytest.raises(ValueError, match="has 1 values for 2 lanes"):
        delayed.executor(
            f.apply, tx, x, y, idx, delay=1, vmap=True, hyperparams={"learning_rate": [1]}
        )


def test_lanes_of_a_scalar_model_train_at_their_own_rates():
    x, y = np.ones(8, np.float32), np.ones(8, np.float32)
    idx = np.zeros((2, 6, 1), np.int32)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0)
    rates = {"learning_rate": [0.3, 0.1]}
    ex = delayed.executor(LIN, tx, x, y, idx, delay=1, loss_fn=SQ, vmap=True, hyperparams=rates)
    lanes = loop.run(ex, jnp.zeros(2), {})
    for res, lr in zip(lanes, rates["learning_rate"], strict=True):
        np.testing.assert_allclose(float(res.params), _by_hand(1, 6, lr=lr)[-1], rtol=1e-6)


def test_the_state_keeps_only_the_versions_it_needs():
    assert delayed.capacity(0) == 1 and delayed.capacity([3, 2, 1, 0]) == 4
    assert delayed.capacity(2, predict=True) == 4
    _, init = delayed.delayed_update(LIN, optax.sgd(0.1), delayed.stage_profile(1), loss_fn=SQ)
    assert init([jnp.ones((2, 3))]).versions.versions[0].shape == (1, 2, 3)


@pytest.mark.parametrize("delay", [-1, 1.5, True, [1, 2]])
def test_a_bad_delay_is_one_line(delay):
    with pytest.raises(ValueError, match="delayed_update: "):
        _, init = delayed.delayed_update(LIN, optax.sgd(0.1), delay, loss_fn=SQ)
        init(jnp.zeros(()))  # [1, 2]: one delay per group, but one parameter


def test_error_feedback_in_the_constant_delay_harness_is_the_hand_recursion():
    """SGD with error feedback at τ = 1: w_{t+1} = w_t + u_t + (u_t − u_{t−1}) from the second
    update, u_t = −lr·(w_{t−1} − 1), the harness giving the stale gradient."""
    import jaxstale

    tx = jaxstale.error_feedback(optax.sgd(0.3))
    update, init = delayed.delayed_update(LIN, tx, 1, loss_fn=SQ)
    w, prev = [0.0], 0.0
    for t in range(10):
        u = -0.3 * (w[max(t - 1, 0)] - 1.0)
        w.append(w[-1] + u + ((u - prev) if t else 0.0))
        prev = u
    np.testing.assert_allclose(_steps(update, init, jnp.zeros(()), 10), w[1:], rtol=1e-5)


@pytest.mark.slow  # 8 s; tests/transforms' basis-rotation tests stay in make test
def test_basis_rotation_trains_in_the_constant_delay_harness():
    import jaxstale

    f, x, y = _mlp()
    for tx in (jaxstale.basis_rotation(0.01, frequency=5), optax.adam(0.01)):
        update, init = delayed.delayed_update(f.apply, tx, 2)
        update = jax.jit(update)
        p, st, s = f.params, init(f.params), f.state
        first = None
        for _ in range(30):
            p, st, s, loss = update(p, st, s, x, y)
            first = float(loss) if first is None else first
        assert float(loss) < 0.7 * first
