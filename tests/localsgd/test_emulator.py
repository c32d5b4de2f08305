"""jaxstale.localsgd.emulator against hand-rolled loops: synchronous DiLoCo, asynchronous local
SGD with dynamic local updates, the reductions to the inner optimizer, and the loop driver."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import loop, models
from jaxstale.localsgd import asynchronous, executor, synchronous
from jaxstale.losses import cross_entropy
from jaxstale.transforms.outer import delayed_nesterov, outer_nesterov, staleness_weight
from tests.localsgd.helpers import flat as _flat
from tests.localsgd.helpers import run as _run
from tests.localsgd.helpers import setup as _setup


def _inner_steps(f, tx, p, s, xb, yb, first, steps):
    """``steps`` plain inner steps from ``p`` (the reference, one jitted step at a time)."""

    @jax.jit
    def one(p, s, x, y):
        g = jax.grad(lambda q: cross_entropy(f.apply(q, f.state, x, True)[0], y))(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    for i in range(steps):
        p, s = one(p, s, xb[first + i], yb[first + i])
    return p, s


def test_one_worker_one_step_and_outer_sgd_at_rate_one_is_the_inner_optimizer():
    f, xb, yb = _setup(6)
    inner = optax.adam(0.01)
    res = _run(f, inner, optax.sgd(1.0), synchronous(1, 6, 1), xb, yb)
    want, _ = _inner_steps(f, inner, f.params, inner.init(f.params), xb, yb, 0, 6)
    np.testing.assert_allclose(_flat(res.params), _flat(want), atol=1e-6)
    assert res.losses.shape == (6,) and np.isfinite(res.losses).all()


@pytest.mark.slow  # make test keeps the reductions, DyLU and the rate-grid lanes
def test_synchronous_diloco_is_the_mean_pseudo_gradient_under_outer_nesterov():
    m, rounds, h = 3, 3, 4
    f, xb, yb = _setup(m * rounds * h)
    inner, outer = optax.adam(0.01), outer_nesterov(0.7, 0.9)
    sched = synchronous(m, rounds, h)
    res = _run(f, inner, outer, sched, xb, yb)
    theta, o = f.params, outer.init(f.params)
    states = [inner.init(f.params)] * m  # each worker's inner state persists
    for r in range(rounds):
        ends = []
        for w in range(m):
            p, states[w] = _inner_steps(f, inner, theta, states[w], xb, yb, (r * m + w) * h, h)
            ends.append(p)
        delta = jax.tree.map(lambda t, *ps: sum(t - p for p in ps) / m, theta, *ends)
        u, o = outer.update(delta, o, theta)
        theta = optax.apply_updates(theta, u)
    np.testing.assert_allclose(_flat(res.params), _flat(theta), atol=1e-5)


def test_asynchronous_local_sgd_with_dynamic_local_updates_and_delayed_nesterov():
    """Stragglers run shorter jobs (DyLU: masked inner steps); each arrival is one outer update
    of its own pseudo-gradient at its staleness; the worker restarts from the new weights."""
    sched = asynchronous(
        3, 9, 4, seed=0, straggler_fraction=0.34, straggler_slowdown=3.0, dynamic=True
    )
    assert sorted(set(sched.steps.tolist())) == [2, 4] and int(sched.staleness.max()) > 0
    f, xb, yb = _setup(sched.num_batches)
    inner = optax.sgd(0.05, momentum=0.9)
    outer = optax.chain(staleness_weight("polynomial"), delayed_nesterov(0.5, 0.9, 3))
    res = _run(f, inner, outer, sched, xb, yb)
    theta, o = f.params, outer.init(f.params)
    dispatch = [f.params] * 3
    states = [inner.init(f.params)] * 3
    for t in range(sched.num_updates):
        w, first, steps = int(sched.worker[t]), int(sched.first_batch[t]), int(sched.steps[t])
        p, states[w] = _inner_steps(f, inner, dispatch[w], states[w], xb, yb, first, steps)
        delta = jax.tree.map(jnp.subtract, dispatch[w], p)
        u, o = outer.update(delta, o, theta, staleness=int(sched.staleness[t]))
        theta = optax.apply_updates(theta, u)
        dispatch[w] = theta
    np.testing.assert_allclose(_flat(res.params), _flat(theta), atol=1e-5)


def test_the_loop_evaluates_and_local_sgd_trains():
    sched = synchronous(4, 12, 5)
    f, xb, yb = _setup(sched.num_batches, b=16)
    ex = executor(f.apply, optax.adam(0.01), outer_nesterov(0.7, 0.9), sched, xb, yb)
    (res,) = loop.run(
        ex,
        f.params,
        f.state,
        eval_every=4,
        eval_data=(xb[:4].reshape(-1, 4, 4, 1), yb[:4].reshape(-1)),
    )
    assert len(res.curve) == 3 and res.curve[-1]["step"] == 12
    assert res.losses[-1] < res.losses[0] and not res.diverged


def test_too_few_batches_is_one_clear_error():
    f, xb, yb = _setup(5)
    with pytest.raises(ValueError, match="the schedule consumes 8"):
        executor(f.apply, optax.sgd(0.1), optax.sgd(1.0), synchronous(2, 1, 4), xb, yb)


@pytest.mark.slow  # make test keeps the reductions, DyLU and the rate-grid lanes
def test_an_fp8_exchange_is_the_quantized_mean_and_stays_close():
    from jaxstale.localsgd.quantize import fp8_mean

    m, rounds, h = 2, 2, 3
    f, xb, yb = _setup(m * rounds * h)
    inner, outer = optax.sgd(0.1), optax.sgd(1.0)
    sched = synchronous(m, rounds, h)
    ex = executor(f.apply, inner, outer, sched, xb, yb, exchange="fp8")
    (res,) = loop.run(ex, f.params, f.state)
    theta, states = f.params, [inner.init(f.params)] * m
    for r in range(rounds):
        ends = []
        for w in range(m):
            p, states[w] = _inner_steps(f, inner, theta, states[w], xb, yb, (r * m + w) * h, h)
            ends.append(p)
        stacked = jax.tree.map(lambda t, *ps: jnp.stack([t - p for p in ps]), theta, *ends)
        theta = jax.tree.map(jnp.subtract, theta, fp8_mean(stacked))
    np.testing.assert_allclose(_flat(res.params), _flat(theta), atol=1e-5)
    full = _run(f, inner, outer, sched, xb, yb)
    gap = np.max(np.abs(_flat(res.params) - _flat(full.params)))
    assert 0 < gap < 0.05
    (four,) = loop.run(executor(f.apply, inner, outer, sched, xb, yb, exchange="fp4"),
                       f.params, f.state)  # fmt: skip
    assert gap < np.max(np.abs(_flat(four.params) - _flat(full.params))) < 0.5  # 1 mantissa bit
    with pytest.raises(ValueError, match="unknown exchange 'fp16'"):
        executor(f.apply, inner, outer, sched, xb, yb, exchange="fp16")


@pytest.mark.slow  # make test keeps the reductions, DyLU and the rate-grid lanes
def test_lanes_are_seeds_run_at_once_and_each_equals_its_run_alone():
    """Three seeds: their own worker timing, data and initial weights, vmapped."""
    scheds = [asynchronous(3, 6, 3, seed=s, straggler_fraction=0.34, straggler_slowdown=2.0,
                           dynamic=True) for s in range(3)]  # fmt: skip
    nb = max(s.num_batches for s in scheds)
    inits = [
        models.functional(
            models.create("mlp", input_shape=(4, 4, 1), num_classes=3, hidden=(8,), seed=s)
        )
        for s in range(3)
    ]
    rng = np.random.default_rng(5)
    xb = rng.normal(size=(3, nb, 8, 4, 4, 1)).astype(np.float32)
    yb = rng.integers(0, 3, (3, nb, 8)).astype(np.int32)
    inner, outer = optax.adam(0.01), delayed_nesterov(0.5, 0.9, 3)
    f = inits[0]
    ex = executor(f.apply, inner, outer, scheds, xb, yb, lanes=3)
    stack = lambda trees: jax.tree.map(lambda *a: np.stack(a), *trees)
    got = loop.run(ex, stack([g.params for g in inits]), stack([g.state for g in inits]))
    for s in range(3):
        alone = _run(inits[s], inner, outer, scheds[s], xb[s], yb[s])
        np.testing.assert_allclose(_flat(got[s].params), _flat(alone.params), atol=1e-6)
        np.testing.assert_allclose(got[s].losses, alone.losses, rtol=1e-5)
    with pytest.raises(ValueError, match="same workers, updates and kind"):
        executor(f.apply, inner, outer, [scheds[0], synchronous(3, 6, 3)], xb[:2], yb[:2], lanes=2)
    with pytest.raises(ValueError, match="expected a leading lane axis"):
        executor(f.apply, inner, outer, scheds[0], xb[0], yb[0], lanes=3)


def test_lanes_train_at_their_own_outer_and_inner_rates():
    """A rate grid as lanes: one compiled step, each lane equal to its run alone."""
    sched = synchronous(2, 3, 2)
    f, xb, yb = _setup(sched.num_batches)
    make = lambda lr, ilr: (
        optax.inject_hyperparams(optax.adam)(learning_rate=ilr),
        optax.inject_hyperparams(optax.sgd)(learning_rate=lr, momentum=0.9, nesterov=True),
    )
    inner, outer = make(0.7, 0.01)
    grid = [(0.3, 0.01), (0.7, 0.003)]
    hp = {
        "outer": {"learning_rate": [g[0] for g in grid]},
        "inner": {"learning_rate": [g[1] for g in grid]},
    }
    two = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    ex = executor(f.apply, inner, outer, sched, two(xb), two(yb), lanes=2, hyperparams=hp)
    got = loop.run(ex, two(f.params), two(f.state))
    for k, (lr, ilr) in enumerate(grid):
        alone = _run(f, *make(lr, ilr), sched, xb, yb)
        np.testing.assert_allclose(_flat(got[k].params), _flat(alone.params), atol=1e-6)
    assert np.max(np.abs(_flat(got[0].params) - _flat(got[1].params))) > 1e-3
    with pytest.raises(ValueError, match="pass lanes=L"):
        executor(f.apply, inner, outer, sched, xb, yb, hyperparams=hp)
    with pytest.raises(ValueError, match="3 values for 2 lanes"):
        bad = {"outer": {"learning_rate": [0.1, 0.2, 0.3]}}
        executor(f.apply, inner, outer, sched, two(xb), two(yb), lanes=2, hyperparams=bad)


def test_indexed_streams_are_bit_identical_to_their_gathered_copies():
    """Mini-batches as indices into one copy of the data (lanes share it, only the indices
    carry the lane axis): every lane equals the run on its pre-gathered stream bit for bit,
    asynchronous and streaming alike; bad indices are one clear error."""
    from jaxstale.data import Indexed, batch_indices

    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 3, 40).astype(np.int32)
    f, _, _ = _setup(1)
    inner, outer = optax.adam(0.01), delayed_nesterov(0.5, 0.9, 3)
    scheds = [asynchronous(3, 5, 2, seed=s, dynamic=True) for s in range(2)]
    nb = max(s.num_batches for s in scheds)
    idx = np.stack([batch_indices(40, batch_size=8, num_steps=nb, seed=s) for s in range(2)])
    two = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    ex = executor(f.apply, inner, outer, scheds, Indexed(x, idx), Indexed(y, idx), lanes=2)
    got = loop.run(ex, two(f.params), two(f.state))
    ref = loop.run(executor(f.apply, inner, outer, scheds, x[idx], y[idx], lanes=2),
                   two(f.params), two(f.state))  # fmt: skip
    for s in range(2):
        np.testing.assert_array_equal(_flat(got[s].params), _flat(ref[s].params))
        np.testing.assert_array_equal(got[s].losses, ref[s].losses)
        alone = _run(f, inner, outer, scheds[s], Indexed(x, idx[s]), Indexed(y, idx[s]))
        gathered = _run(f, inner, outer, scheds[s], x[idx[s]], y[idx[s]])
        np.testing.assert_array_equal(_flat(alone.params), _flat(gathered.params))
        np.testing.assert_allclose(_flat(got[s].params), _flat(alone.params), atol=1e-6)
    sync = synchronous(2, 3, 2)
    i0 = idx[0][: sync.num_batches]
    kw = {"fragments": 2, "overlap": 0, "alpha": 0.5}
    streamed = _run(f, inner, outer_nesterov(0.7, 0.9), sync, Indexed(x, i0), Indexed(y, i0), **kw)
    plain = _run(f, inner, outer_nesterov(0.7, 0.9), sync, x[i0], y[i0], **kw)
    np.testing.assert_array_equal(_flat(streamed.params), _flat(plain.params))
    with pytest.raises(ValueError, match="both be arrays or both be Indexed"):
        executor(f.apply, inner, outer, scheds[0], Indexed(x, idx[0]), y[idx[0]])
    with pytest.raises(ValueError, match=r"xb.idx must index its 40 rows: found -1"):
        executor(f.apply, inner, outer, scheds[0], Indexed(x, idx[0] - 1), Indexed(y, idx[0]))
    with pytest.raises(ValueError, match="expected a leading lane axis 2"):
        executor(f.apply, inner, outer, scheds, Indexed(x, idx[0]), Indexed(y, idx[0]), lanes=2)
