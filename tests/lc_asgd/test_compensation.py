"""lc_asgd: λ = 0 is ASGD bit for bit; the scale is ∇(ℓ_m + λℓ_delay); optax conformance."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale.delays import round_robin
from jaxstale.lc_asgd import (
    LCASGDState,
    ar_loss_predictor,
    constant_steps,
    delay_loss,
    lc_asgd,
    lc_asgd_stats,
    rnn_loss_predictor,
)

M, STEPS = 4, 20
ETA, MU = 0.05, 0.9
SCHED = round_robin(M, STEPS)


def init_params():
    return {"a": jnp.array([1.0, -2.0, 0.5]), "b": {"c": jnp.array([[0.3, 1.0], [2.0, -1.5]])}}


def loss_fn(params, i):
    sq = lambda p: jnp.sum((p - 0.1 * i) ** 2)
    return 0.5 * (sq(params["a"]) + sq(params["b"]["c"])) + 1.0


def run_chain(tx, stale_by=1):
    """20 scan steps of delayed gradients through ``tx``; returns the params trajectory."""
    params = init_params()

    def body(carry, x):
        params, prev, state = carry
        i, w, tau = x
        loss, g = jax.value_and_grad(loss_fn)(prev, i)
        upd, state = tx.update(g, state, params, worker_loss=loss, worker=w, staleness=tau)
        new = optax.apply_updates(params, upd)
        return (new, params if stale_by else new, state), new

    xs = (
        jnp.arange(STEPS, dtype=jnp.float32),
        jnp.asarray(SCHED.worker),
        jnp.asarray(SCHED.staleness),
    )
    carry = (params, params, tx.init(params))
    return jax.jit(lambda c: jax.lax.scan(body, c, xs))(carry)


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("predictor", ["ar", pytest.param("rnn", marks=pytest.mark.slow)])
def test_lambda_zero_is_asgd_bit_for_bit(predictor):
    lp = ar_loss_predictor() if predictor == "ar" else rnn_loss_predictor(hidden=4, window=3)
    lc = optax.chain(lc_asgd(0.0, num_workers=M, loss_predictor=lp), optax.sgd(ETA, MU))
    (_, _, state), traj = run_chain(lc)
    _, ref = run_chain(optax.sgd(ETA, MU))
    assert_trees_equal(traj, ref)
    assert isinstance(state[0], LCASGDState) and int(state[0].count) == STEPS


def test_traced_lambda_zero_is_asgd_bit_for_bit():
    # λ injected as a traced hyper-parameter: the multiply by exactly 1.0 leaves g unchanged
    inj = optax.inject_hyperparams(lambda lam: lc_asgd(lam, num_workers=M))(lam=0.0)
    _, traj = run_chain(optax.chain(inj, optax.sgd(ETA, MU)))
    _, ref = run_chain(optax.sgd(ETA, MU))
    assert_trees_equal(traj, ref)


def test_nonzero_lambda_changes_the_trajectory():
    _, traj = run_chain(optax.chain(lc_asgd(0.2, num_workers=M), optax.sgd(ETA, MU)))
    _, ref = run_chain(optax.sgd(ETA, MU))
    assert not np.allclose(np.asarray(traj["a"]), np.asarray(ref["a"]))


@pytest.mark.parametrize("clip", [pytest.param(False, marks=pytest.mark.slow), True])
def test_scale_is_the_gradient_of_loss_plus_lambda_delay_loss(clip):
    """g̃ = ∇_w(ℓ_m(w) + λ·ℓ_delay(ℓ_m(w))) with ℓ_delay from the predictor's rollout."""
    lam, k = 0.3, 3.0
    lp = ar_loss_predictor(1)
    tx = lc_asgd(lam, num_workers=M, loss_predictor=lp, horizon=8, clip_sensitivity=clip)
    upd = jax.jit(tx.update)
    state = tx.init(None)
    params = init_params()
    ell0 = loss_fn(params, 0.0)
    seq = [float(ell0)]
    for _ in range(8):  # an AR(1) sequence ℓ ← 0.5 + 0.9 ℓ ending at ℓ_m: sensitivities 0.9^j
        seq.insert(0, (seq[0] - 0.5) / 0.9)
    for i, h in enumerate(seq[:-1]):
        _, state = upd({"a": jnp.ones(3)}, state, worker_loss=h, worker=i % M, staleness=0)
    ls_after = jax.jit(lp.update)(state.loss_state, ell0)

    def objective(p):
        ell = loss_fn(p, 0.0)
        preds = lp.rollout(ls_after, ell, 8)
        return ell + lam * jnp.sum(preds[:3])  # k = 3: the next three predicted losses

    want = jax.grad(objective)(params)
    g = jax.grad(loss_fn)(params, 0.0)
    got, new_state = upd(g, state, worker_loss=ell0, worker=1, staleness=2, predicted_steps=k)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5)
    np.testing.assert_allclose(float(new_state.scale), 1 + lam * (0.9 + 0.81 + 0.729), rtol=1e-4)


def test_sensitivity_clipping_bounds_an_explosive_fit():
    lp = ar_loss_predictor(1)
    seq = [0.1]
    for _ in range(8):  # ℓ ← 1.5 ℓ: an explosive fit, sensitivities 1.5^j
        seq.append(1.5 * seq[-1])
    state = jax.jit(lambda xs: jax.lax.scan(lambda s, y: (lp.update(s, y), None), lp.init(), xs))(
        jnp.asarray(seq)
    )[0]
    _, exact = delay_loss(lp, state, seq[-1], 3, 8, clip_sensitivity=False)
    _, clipped = delay_loss(lp, state, seq[-1], 3, 8)
    np.testing.assert_allclose([exact, clipped], [1.5 + 2.25 + 3.375, 3.0], rtol=1e-4)


@pytest.mark.slow  # make test ≤ 8 min: CI runs it in make test-slow
def test_steps_source_predicted_true_or_given():
    g = {"a": jnp.ones(2)}
    kw = dict(worker_loss=1.0, worker=0, staleness=5)
    lp = ar_loss_predictor(1)  # untrained: persistence, scale = 1 + λ k
    for tx, extra, want in [
        (lc_asgd(0.25, num_workers=3, loss_predictor=lp), {}, 2.0),  # prior: M − 1
        (lc_asgd(0.25, num_workers=3, loss_predictor=lp, use_true_staleness=True), {}, 5.0),
        (
            lc_asgd(0.25, num_workers=3, loss_predictor=lp, step_predictor=constant_steps(1.5)),
            {},
            1.5,
        ),
        (lc_asgd(0.25, num_workers=3, loss_predictor=lp), {"predicted_steps": 4}, 4.0),
    ]:
        u, s = jax.jit(lambda g, s, tx=tx, extra=extra: tx.update(g, s, **kw, **extra))(
            g, tx.init(g)
        )
        assert float(s.steps) == want
        np.testing.assert_allclose(np.asarray(u["a"]), 1 + 0.25 * want, rtol=1e-6)


def test_staleness_is_tracked_from_worker_ids():
    # without the `staleness` extra arg the transform counts versions itself
    tx = lc_asgd(0.0, num_workers=M)
    g = {"a": jnp.ones(1)}

    @jax.jit
    def run(worker, staleness):
        def body(s, x):
            kw = {"worker": x[0]} if staleness is None else {"worker": x[0], "staleness": x[1]}
            return tx.update(g, s, worker_loss=1.0, **kw)[1], None

        xs = (worker, worker if staleness is None else staleness)
        return jax.lax.scan(body, tx.init(None), xs)[0]

    stats = lc_asgd_stats(run(jnp.asarray(SCHED.worker), None))
    assert stats["updates"] == STEPS and stats["step_mae"] > 0
    given = lc_asgd_stats(run(jnp.asarray(SCHED.worker), jnp.asarray(SCHED.staleness)))
    assert given == stats


def test_extra_args_jit_and_no_recompilation():
    tx = optax.chain(lc_asgd(0.1, num_workers=M), optax.sgd(ETA, MU))
    traces = []

    def step(params, state, loss, w, tau):
        traces.append(1)
        g = jax.grad(loss_fn)(params, 0.0)
        upd, state = tx.update(
            g, state, params, worker_loss=loss, worker=w, staleness=tau, stale_params=params
        )
        return optax.apply_updates(params, upd), state

    step = jax.jit(step)
    params = init_params()
    state = tx.init(params)
    for t in range(3):
        params, state = step(params, state, jnp.float32(2.0 - t), jnp.int32(t), jnp.int32(t))
    assert len(traces) == 1
    with pytest.raises(TypeError, match="worker_loss"):
        tx.update(jax.grad(loss_fn)(params, 0.0), state, params, worker=0)


@pytest.mark.parametrize("lam", [0.0, 0.1])
def test_converges_on_delayed_quadratic(lam):
    tx = optax.chain(lc_asgd(lam, num_workers=M), optax.sgd(0.1))
    params = init_params()
    sched = round_robin(M, 150)

    def body(carry, x):
        params, snaps, state = carry
        w, tau = x
        stale = jax.tree.map(lambda a: a[w], snaps)
        loss, g = jax.value_and_grad(loss_fn)(stale, 0.0)
        upd, state = tx.update(g, state, params, worker_loss=loss, worker=w, staleness=tau)
        params = optax.apply_updates(params, upd)
        snaps = jax.tree.map(lambda a, p: a.at[w].set(p), snaps, params)
        return (params, snaps, state), loss

    snaps = jax.tree.map(lambda p: jnp.broadcast_to(p, (M, *p.shape)), params)
    xs = (jnp.asarray(sched.worker), jnp.asarray(sched.staleness))
    (params, _, state), losses = jax.jit(lambda c: jax.lax.scan(body, c, xs))(
        (params, snaps, tx.init(params))
    )
    assert float(loss_fn(params, 0.0)) < 1.0 + 1e-4  # the minimum is 1.0
    assert np.isfinite(np.asarray(losses)).all()
    assert lc_asgd_stats(state)["step_mae"] < 0.5  # round-robin: M − 1 after the warm-up


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_workers"):
        lc_asgd(0.1, num_workers=jnp.int32(3))
    with pytest.raises(ValueError, match="horizon"):
        lc_asgd(0.1, num_workers=2, horizon=0)
    with pytest.raises(TypeError, match="loss_predictor"):
        lc_asgd(0.1, num_workers=2, loss_predictor=object())
    with pytest.raises(ValueError, match="max_scale"):
        lc_asgd(0.1, num_workers=2, max_scale=0.0)
    tx = lc_asgd(0.1, num_workers=2, use_true_staleness=True)
    with pytest.raises(TypeError, match="staleness"):
        tx.update({"a": jnp.ones(1)}, tx.init(None), worker_loss=1.0)


@pytest.mark.parametrize("predictor", ["ar", "rnn"])
def test_init_state_has_no_aliased_buffers_so_it_can_be_donated(predictor):
    lp = ar_loss_predictor() if predictor == "ar" else rnn_loss_predictor(hidden=2, window=2)
    tx = optax.chain(lc_asgd(0.1, num_workers=M, loss_predictor=lp), optax.sgd(ETA, MU))
    leaves = jax.tree.leaves(tx.init(init_params()))
    ptrs = [leaf.unsafe_buffer_pointer() for leaf in leaves]
    assert len(set(ptrs)) == len(ptrs)
    again = jax.tree.leaves(tx.init(init_params()))  # nothing shared with a closure constant
    assert not set(ptrs) & {leaf.unsafe_buffer_pointer() for leaf in again}
