"""Async data-parallel emulator: exactness against references, stale weights, DANA, SSGD."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxstale import data, delays, models
from jaxstale.asyncdp import (
    METHODS,
    AsyncEmulator,
    HParams,
    MethodSpec,
    as_spec,
    build_method,
    emulate_async,
    lr_warmup,
    register_method,
)

DS = data.load("digits")
SHAPE = tuple(DS.x_train.shape[1:])


def _model(seed=0, hidden=(16,)):
    return models.functional(
        models.create("mlp", input_shape=SHAPE, num_classes=10, seed=seed, hidden=hidden)
    )


def _stream(steps, batch_size=16, seed=0):
    idx = data.batch_indices(len(DS.x_train), batch_size=batch_size, num_steps=steps, seed=seed)
    return DS.x_train[idx], DS.y_train[idx]


def _leaves_equal(a, b):
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


# ----------------------------------------------------------------------------- M = 1


@pytest.mark.parametrize("loop", ["scan", "host"])
def test_one_worker_equals_synchronous_trainer(loop):
    from jaxstale import train

    steps, tx = 24, optax.sgd(0.05, momentum=0.9)
    ref = train.fit(
        "mlp",
        tx,
        DS,
        steps=steps,
        batch_size=16,
        seeds=1,
        eval_every=steps,
        loop=loop,
        model_kwargs={"hidden": (16,)},
        return_params=True,
    )[0]
    f = _model()
    xb, yb = _stream(steps)
    res = emulate_async(
        f.apply,
        tx,
        f.params,
        f.state,
        delays.round_robin(1, steps),
        xb,
        yb,
        loop=loop,
        x_test=DS.x_test,
        y_test=DS.y_test,
    )
    # Same operations in the same order -> bit for bit (see the emulator's module docstring).
    assert _leaves_equal(res.params, ref["params"]), _max_diff(res.params, ref["params"])
    assert res.final_test_accuracy == pytest.approx(ref["final_test_accuracy"])


@pytest.mark.slow  # make test ≤ 8 min with a margin: CI runs it in make test-slow
def test_one_worker_every_tau0_method_is_sgd_and_ssgd_too():
    steps = 16
    f = _model()
    xb, yb = _stream(steps)
    sched = delays.gamma_timed(1, steps, batch_size=16, seed=0)
    kw = dict(learning_rate=0.05, momentum=0.9)
    ref = emulate_async(f.apply, "sgd", f.params, f.state, sched, xb, yb, **kw)
    for name in ["ssgd", "dc-asgd-a", "gap-aware"]:  # the transforms' own tests cover the rest
        res = emulate_async(f.apply, name, f.params, f.state, sched, xb, yb, **kw)
        assert _max_diff(res.params, ref.params) < 1e-6, name


# ----------------------------------------------------------------------------- stale weights


def _recorder(steps):
    """A transform that stores every stale_params / staleness it receives, by update index."""

    def init(params):
        hist = jax.tree.map(lambda p: jnp.zeros((steps, *p.shape), p.dtype), params)
        return (jnp.zeros((), jnp.int32), hist, jnp.zeros((steps,), jnp.int32))

    def update(g, state, params=None, *, stale_params, staleness, **_):
        i, hist, taus = state
        hist = jax.tree.map(lambda h, p: h.at[i].set(p), hist, stale_params)
        return g, (i + 1, hist, taus.at[i].set(staleness))

    return optax.GradientTransformationExtraArgs(init, update)


@pytest.mark.parametrize("name", ["asgd", "sa-asgd", "dc-asgd-c", "dc-asgd-a", "gap-aware"])
def test_transform_sees_the_exact_version_t_minus_tau(name):
    steps, m = 14, 3
    f = _model()
    xb, yb = _stream(steps + m)
    sched = delays.gamma_timed(m, steps, batch_size=16, seed=1)
    assert sched.staleness.max() >= 2

    def build(hp):
        spec = build_method(name, hp)
        return spec._replace(tx=optax.chain(_recorder(steps), spec.tx))

    emu = AsyncEmulator(f.apply, build, m, momentum=0.9, loop="scan")
    state = emu.init(f.params, f.state, learning_rate=0.05)
    versions = [jax.tree.map(np.array, f.params)]  # kept separately: w_0, w_1, ...
    for t in range(steps):  # one update per call, same executable
        b = sched.batch[t : t + 1]
        state, _ = emu.run(state, xb[b], yb[b], sched.worker[t : t + 1], sched.staleness[t : t + 1])
        versions.append(jax.tree.map(np.array, state.params))
    _, hist, taus = state.opt_state[0]
    assert np.asarray(taus).tolist() == sched.staleness.tolist()
    for t in range(steps):
        seen = jax.tree.map(lambda h: np.asarray(h[t]), hist)
        assert _leaves_equal(seen, versions[sched.pulled[t]]), (name, t)
        if sched.pulled[t] != t:  # an off-by-one version would be caught here
            assert not _leaves_equal(seen, versions[t])


def test_asgd_matches_a_hand_written_reference():
    steps, m = 12, 4
    f = _model()
    xb, yb = _stream(steps + m)
    sched = delays.round_robin(m, steps)
    res = emulate_async(
        f.apply, "asgd", f.params, f.state, sched, xb, yb, learning_rate=0.1, loop="scan"
    )

    def loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(
            f.apply(p, f.state, x, True)[0], y
        ).mean()

    grad = jax.jit(jax.grad(loss))
    w = [f.params]
    for t in range(steps):  # w_{t+1} = w_t - lr * g(w_{t - tau}; batch t)
        g = grad(w[sched.pulled[t]], xb[sched.batch[t]], yb[sched.batch[t]])
        w.append(jax.tree.map(lambda p, gi: p - 0.1 * gi, w[t], g))
    assert _max_diff(res.params, w[-1]) < 1e-6


# ----------------------------------------------------------------------------- DANA, SSGD


def test_dana_lookahead_equals_the_formula_by_hand():
    # Quadratic loss 0.5*mean((x.w - y)^2) on a 2-vector: gradient by hand in numpy.
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(6, 4, 2)).astype(np.float32)
    ys = rng.normal(size=(6, 4)).astype(np.float32)
    apply = lambda p, s, x, train: (x @ p, s)
    mse = lambda out, y: 0.5 * jnp.mean((out - y) ** 2)
    lr, mu, m = 0.1, 0.9, 2
    sched = delays.round_robin(m, 6)
    emu = AsyncEmulator(apply, "dana", m, momentum=mu, loss_fn=mse, loop="scan")
    w0 = np.array([0.5, -0.25], np.float32)
    state = emu.init(jnp.asarray(w0), {}, learning_rate=lr)
    theta, v, sent = w0.astype(np.float64), np.zeros((m, 2)), np.stack([w0, w0]).astype(float)
    for t in range(6):
        i = sched.worker[t]
        x, y = xs[t].astype(float), ys[t].astype(float)
        g = x.T @ (x @ sent[i] - y) / len(y)  # gradient at the look-ahead worker i holds
        v[i] = mu * v[i] + g
        theta = theta - lr * v[i]
        sent[i] = theta - lr * mu * v.sum(0)  # θ̂ = θ − η μ Σ_j v^j
        state, _ = emu.run(
            state, xs[t : t + 1], ys[t : t + 1], sched.worker[t : t + 1], sched.staleness[t : t + 1]
        )
        np.testing.assert_allclose(np.asarray(state.params), theta, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(state.workers[i]), sent[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(state.velocity_sum), v.sum(0), rtol=1e-5, atol=1e-6)
    # t = 0 by hand: θ̂ = θ0 − η g − η μ g
    g0 = xs[0].T @ (xs[0] @ w0 - ys[0]) / 4
    assert np.allclose(sent[0], w0 - lr * g0 - lr * mu * g0, atol=1e-6) or m > 1


def test_dana_dc_compensates_against_the_lookahead():
    spec = build_method("dana-dc", HParams(0.1, 0.9, 4))
    assert spec.mode == "dana"
    g, w, stale = jnp.ones(3), jnp.zeros(3), jnp.full(3, 0.5)
    out, _ = spec.tx.update(g, spec.tx.init(w), w, stale_params=stale, staleness=3)
    assert not np.allclose(out, g)  # DC changed it ...
    same, _ = spec.tx.update(g, spec.tx.init(w), w, stale_params=w, staleness=3)
    assert np.array_equal(same, g)  # ... and is the identity at the worker's own weights


def _quadratic():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(8, 4, 2)).astype(np.float32)
    ys = rng.normal(size=(8, 4)).astype(np.float32)
    apply = lambda p, s, x, train: (x @ p, s)
    mse = lambda out, y: 0.5 * jnp.mean((out - y) ** 2)
    return xs, ys, apply, mse, np.array([0.5, -0.25], np.float32)


def test_ga_dana_with_one_worker_is_nesterov_sgd():
    """M = 1: the look-ahead a worker uses is the current one, the gap is 0, G = 1 exactly: DANA,
    i.e. Sutskever's NAG. By hand: with φ_t = θ_t − ημv_t (the look-ahead), DANA's
    v_{t+1} = μv_t + ∇f(φ_t), θ_{t+1} = θ_t − ηv_{t+1} gives φ_{t+1} = φ_t − η(∇f(φ_t) + μv_{t+1}):
    optax.sgd(η, μ, nesterov=True) on w = φ (its trace is v; v_0 = 0 so φ_0 = θ_0 = w_0)."""
    xs, ys, apply, mse, w0 = _quadratic()
    lr, mu, steps = 0.1, 0.9, 8
    out = {}
    for method in ("ga-dana", "dana"):
        emu = AsyncEmulator(apply, method, 1, momentum=mu, loss_fn=mse, loop="scan")
        state = emu.init(jnp.asarray(w0), {}, learning_rate=lr)
        out[method], _ = emu.run(state, xs, ys, np.zeros(steps), np.zeros(steps))
    for f in ("params", "workers", "velocity", "velocity_sum"):  # G = 1: bit for bit DANA
        assert _leaves_equal(getattr(out["ga-dana"], f), getattr(out["dana"], f)), f
    tx = optax.sgd(lr, momentum=mu, nesterov=True)
    w, o = jnp.asarray(w0), tx.init(jnp.asarray(w0))
    grad = jax.grad(lambda p, x, y: mse(x @ p, y))
    for t in range(steps):
        u, o = tx.update(grad(w, xs[t], ys[t]), o, w)
        w = optax.apply_updates(w, u)
    v = o[0].trace
    np.testing.assert_allclose(out["ga-dana"].workers[0], w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["ga-dana"].params, w + lr * mu * v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["ga-dana"].velocity_sum, v, rtol=1e-6, atol=1e-6)


def test_ga_dana_hand_computed_two_workers():
    """M = 2, round robin: Gap-Aware (lab statistic) against the current look-ahead, by hand."""
    xs, ys, apply, mse, w0 = _quadratic()
    lr, mu, m, gamma, eps = 0.1, 0.9, 2, 0.999, 1e-8
    sched = delays.round_robin(m, 6)
    emu = AsyncEmulator(apply, "ga-dana", m, momentum=mu, loss_fn=mse, loop="scan")
    state = emu.init(jnp.asarray(w0), {}, learning_rate=lr)
    theta, v, sent = w0.astype(np.float64), np.zeros((m, 2)), np.stack([w0, w0]).astype(float)
    trace, sq = np.zeros(2), np.zeros(2)  # GA: trace of its outputs, EMA of its square
    penalised = False
    for t in range(6):
        i = sched.worker[t]
        x, y = xs[t].astype(float), ys[t].astype(float)
        g = x.T @ (x @ sent[i] - y) / len(y)  # at the look-ahead worker i was sent
        now = theta - lr * mu * v.sum(0)  # the look-ahead a worker pulling now would get
        sq = gamma * sq + (1 - gamma) * trace**2
        c = lr * (np.sqrt(sq / (1 - gamma ** (t + 1))) + eps)
        gap = np.abs(now - sent[i])
        big_g = np.where(gap == 0, 1.0, 1.0 + gap / np.where(c == 0, 1.0, c))
        penalised |= bool((big_g > 1.01).any())
        g = g / big_g
        trace = mu * trace + g
        v[i] = mu * v[i] + g
        theta = theta - lr * v[i]
        sent[i] = theta - lr * mu * v.sum(0)
        state, _ = emu.run(
            state, xs[t : t + 1], ys[t : t + 1], sched.worker[t : t + 1], sched.staleness[t : t + 1]
        )
        np.testing.assert_allclose(np.asarray(state.params), theta, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(state.workers[i]), sent[i], rtol=1e-5, atol=1e-6)
    assert penalised  # the test could fail: GA acted


def test_ssgd_averages_m_gradients_at_the_same_weights():
    m, steps = 4, 8
    f = _model()
    xb, yb = _stream(steps)
    res = emulate_async(
        f.apply,
        "ssgd",
        f.params,
        f.state,
        delays.round_robin(m, steps),
        xb,
        yb,
        learning_rate=0.1,
        loop="scan",
    )
    assert len(res.losses) == steps // m  # equal samples: 1/M as many updates

    def loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(
            f.apply(p, f.state, x, True)[0], y
        ).mean()

    w, grad = f.params, jax.jit(jax.grad(loss))
    for r in range(steps // m):
        gs = [grad(w, xb[r * m + k], yb[r * m + k]) for k in range(m)]
        g = jax.tree.map(lambda *a: sum(a) / m, *gs)
        w = jax.tree.map(lambda p, gi: p - 0.1 * gi, w, g)
    assert _max_diff(res.params, w) < 1e-6


# ----------------------------------------------------------------------------- lanes, divergence


def test_lanes_share_one_executable_and_divergence_is_per_lane():
    steps = 20
    f = _model()
    xb, yb = _stream(steps + 8)
    scheds = [delays.gamma_timed(m, steps, batch_size=16, seed=0) for m in (1, 4, 4)]
    res = emulate_async(
        f.apply,
        "asgd",
        [f.params] * 3,
        [f.state] * 3,
        scheds,
        [xb] * 3,
        [yb] * 3,
        learning_rate=[0.05, 0.05, 1e30],
        momentum=0.9,
        x_test=DS.x_test,
        y_test=DS.y_test,
        eval_every=10,
    )
    assert [r.diverged for r in res] == [False, False, True]
    assert res[2].final_test_accuracy is None and res[2].diverged_step >= 1
    assert res[0].final_test_accuracy > 0.3
    # lanes are the runs one would get alone
    alone = emulate_async(
        f.apply, "asgd", f.params, f.state, scheds[1], xb, yb, learning_rate=0.05, momentum=0.9
    )
    assert _max_diff(alone.params, res[1].params) < 1e-5
    assert res[1].staleness.tolist() == scheds[1].staleness.tolist()


def test_warmup_schedule():
    s = lr_warmup(1.0, 4, 8)
    assert float(s(0)) == pytest.approx(0.25) and float(s(8)) == 1.0 and float(s(100)) == 1.0
    assert float(lr_warmup(0.3, 1, 5)(2)) == pytest.approx(0.3)
    assert lr_warmup(0.3, 4, 0) == 0.3
    with pytest.raises(ValueError):
        lr_warmup(0.3, 4, -1)
    for lr in (float("nan"), -0.1):  # were accepted (issue 51)
        with pytest.raises(ValueError, match=r"^lr_warmup: learning_rate must be"):
            lr_warmup(lr, 4, 10)
    assert float(jax.jit(lambda lr: lr_warmup(lr, 4, 8)(8))(0.5)) == 0.5  # traced: unchecked


def test_registry_and_validation():
    assert set(METHODS) >= {
        "sgd",
        "ssgd",
        "asgd",
        "sa-asgd",
        "dc-asgd-c",
        "dc-asgd-a",
        "gap-aware",
        "dana",
        "dana-dc",
        "ga-dana",
    }
    with pytest.raises(ValueError):
        register_method("asgd", lambda hp: optax.sgd(0.1))
    with pytest.raises(ValueError):
        build_method("nope", HParams(0.1, 0.0, 2))
    with pytest.raises(TypeError):
        as_spec("not a transform")
    with pytest.raises(ValueError):
        as_spec(MethodSpec(optax.sgd(0.1), mode="weird"))
    f = _model()
    with pytest.raises(ValueError):
        AsyncEmulator(f.apply, "asgd", 0)
    with pytest.raises(ValueError):
        emulate_async(
            f.apply, "asgd", f.params, f.state, delays.round_robin(2, 4), *_stream(4)
        )  # no learning rate for a named method
    with pytest.raises(ValueError):  # the stream is too short for the schedule
        emulate_async(
            f.apply,
            optax.sgd(0.1),
            f.params,
            f.state,
            delays.gamma_timed(4, 10, batch_size=4, seed=0),
            *_stream(5),
        )


def test_warmup_reaches_the_builders_learning_rate():
    # Linear model, linear loss: the gradient is constant, so the first update is -η_0·g.
    apply = lambda p, s, x, train: (x @ p, s)
    lin = lambda out, y: jnp.mean(out)
    x = np.ones((3, 1, 2), np.float32)
    w0 = jnp.zeros((2,), jnp.float32)
    for warm, expect in [(0, 0.4), (10, 0.1)]:  # η/M with M = 4 at step 0
        emu = AsyncEmulator(apply, "asgd", 4, warmup_steps=warm, loss_fn=lin, loop="scan")
        st = emu.init(w0, {}, learning_rate=0.4)
        st, _ = emu.run(st, x[:1], np.zeros((1, 1), np.float32), [0], [0])
        np.testing.assert_allclose(np.asarray(st.params), -expect * np.ones(2), rtol=1e-6)


def test_extra_args_and_model_state_hook_reach_the_method():
    steps = 10
    sched = delays.gamma_timed(3, steps, batch_size=4, seed=0)
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(steps + 3, 4, 2)).astype(np.float32)
    yb = rng.normal(size=(steps + 3, 4)).astype(np.float32)
    apply = lambda p, s, x, train: (x @ p, {"n": s["n"] * 2.0})
    mse = lambda out, y: jnp.mean((out - y) ** 2)
    names = ("worker", "worker_loss", "t_comm", "t_comp", "my_info")

    def recorder():
        def init(params):
            return {k: jnp.zeros((steps,), jnp.float32) for k in ("i", *names)}

        def update(g, state, params=None, **extra):
            i = state["i"][0].astype(jnp.int32)
            new = {k: state[k].at[i].set(jnp.asarray(extra[k], jnp.float32)) for k in names}
            return g, {**new, "i": state["i"] + 1.0}

        return optax.GradientTransformationExtraArgs(init, update)

    merge = lambda server, pulled, returned: jax.tree.map(lambda a: a + 1.0, server)
    spec = MethodSpec(optax.chain(recorder(), optax.sgd(0.01)), merge_model_state=merge)
    res = emulate_async(
        apply,
        spec,
        jnp.zeros((2,)),
        {"n": jnp.zeros(())},
        sched,
        xb,
        yb,
        loss_fn=mse,
        extra_args={"my_info": np.arange(steps, dtype=np.float32) * 10},
        loop="scan",
    )
    assert float(res.model_state["n"]) == steps  # the hook ran once per update
    emu = AsyncEmulator(apply, spec, 3, loss_fn=mse, loop="host")  # host loop: same facts
    st = emu.init(jnp.zeros((2,)), {"n": jnp.zeros(())})
    ex = {
        "t_comm": sched.start_time,
        "t_comp": sched.finish_time - sched.start_time,
        "my_info": np.arange(steps, dtype=np.float32) * 10,
    }
    st, losses = emu.run(st, xb[sched.batch], yb[sched.batch], sched.worker, sched.staleness, ex)
    rec = st.opt_state[0]
    np.testing.assert_array_equal(np.asarray(rec["worker"]), sched.worker)
    np.testing.assert_allclose(np.asarray(rec["t_comm"]), sched.start_time, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(rec["t_comp"]), sched.finish_time - sched.start_time, rtol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(rec["my_info"]), np.arange(steps) * 10)
    np.testing.assert_allclose(np.asarray(rec["worker_loss"]), np.asarray(losses), rtol=1e-6)
    np.testing.assert_allclose(res.losses, np.asarray(losses), rtol=1e-5)


# ----------------------------------------------------------------------------- model state


def _chain_depth(sched: delays.DelaySchedule) -> np.ndarray:
    """Server value after each update when every forward adds 1 to the copy its worker pulled."""
    n = np.zeros(sched.num_updates + 1)
    for t in range(sched.num_updates):
        n[t + 1] = n[sched.pulled[t]] + 1  # last writer wins: the stale copy overwrites
    return n[1:]


@pytest.mark.parametrize("loop", ["scan", "host"])
def test_each_worker_forwards_from_the_model_state_it_pulled(loop):
    steps = 12
    sched = delays.gamma_timed(3, steps, batch_size=4, seed=2)
    assert sched.staleness.max() >= 2  # stale copies really occur
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(steps + 3, 4, 2)).astype(np.float32)
    yb = rng.normal(size=(steps + 3, 4)).astype(np.float32)
    apply = lambda p, s, x, train: (x @ p, {"n": s["n"] + 1.0})
    mse = lambda out, y: jnp.mean((out - y) ** 2)
    # server value after every update, read through the loss-free state path
    depth = []
    emu = AsyncEmulator(apply, optax.sgd(0.01), 3, loss_fn=mse, loop=loop)
    st = emu.init(jnp.zeros((2,)), {"n": jnp.zeros(())})
    for t in range(steps):
        sl = slice(t, t + 1)
        b = sched.batch[sl]
        st, _ = emu.run(st, xb[b], yb[b], sched.worker[sl], sched.staleness[sl])
        depth.append(float(st.model_state["n"]))
    np.testing.assert_array_equal(depth, _chain_depth(sched))  # ordinary: last writer wins
    # every worker holds the state it pulled: the server's right after its last update
    last = {int(w): t for t, w in enumerate(sched.worker)}
    for w, t in last.items():
        assert float(st.worker_model_state["n"][w]) == depth[t]
    # a merge hook sees (server, pulled, returned): keeping the increments counts every update
    merge = lambda server, pulled, ret: jax.tree.map(
        lambda s, p, r: s + (r - p), server, pulled, ret
    )
    spec = MethodSpec(optax.sgd(0.01), merge_model_state=merge)
    res = emulate_async(
        apply, spec, jnp.zeros((2,)), {"n": jnp.zeros(())}, sched, xb, yb, loss_fn=mse, loop=loop
    )
    assert float(res.model_state["n"]) == steps


class _BNNet(nnx.Module):
    def __init__(self) -> None:
        self.bn = nnx.BatchNorm(3, momentum=0.9, rngs=nnx.Rngs(0))
        self.out = nnx.Linear(3, 2, rngs=nnx.Rngs(0))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.bn(x))


def test_ordinary_batch_norm_keeps_the_stale_copy_that_arrives_last():
    """Hand-computed: E_{t+1} = m·E_{pulled[t]} + (1 − m)·stat(batch_t), m = 0.9 (lr 0)."""
    f = models.functional(_BNNet())
    steps, m = 10, 0.9
    sched = delays.gamma_timed(3, steps, batch_size=8, seed=2)
    rng = np.random.default_rng(1)
    xb = (rng.normal(size=(steps + 3, 8, 3)) * [1.0, 2.0, 0.5] + [2.0, -1.0, 0.0]).astype(
        np.float32
    )
    yb = rng.integers(0, 2, (steps + 3, 8)).astype(np.int32)
    res = emulate_async(f.apply, "asgd", f.params, f.state, sched, xb, yb, learning_rate=0.0)
    mean = np.zeros((steps + 1, 3))
    var = np.ones((steps + 1, 3))
    for t in range(steps):
        xs = xb[sched.batch[t]].astype(np.float64)
        mean[t + 1] = m * mean[sched.pulled[t]] + (1 - m) * xs.mean(0)
        var[t + 1] = m * var[sched.pulled[t]] + (1 - m) * xs.var(0)
    got = nnx.to_pure_dict(res.model_state)["bn"]
    np.testing.assert_allclose(np.asarray(got["mean"]), mean[-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got["var"]), var[-1], rtol=1e-5, atol=1e-6)
    # not what a server-side EMA over every update would give
    fresh = np.zeros(3)
    for t in range(steps):
        fresh = m * fresh + (1 - m) * xb[sched.batch[t]].mean(0)
    assert np.max(np.abs(fresh - mean[-1])) > 1e-2
