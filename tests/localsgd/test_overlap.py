"""Synchronous DiLoCo with the outer exchange overlapped (jaxstale.localsgd.overlap): delayed and
eager updates against a hand-rolled loop; one eager worker is DiLoCo to the bit."""

import jax
import numpy as np
import optax
import pytest

from jaxstale.localsgd import asynchronous, executor, synchronous
from jaxstale.localsgd.quantize import exchange_mean
from jaxstale.losses import cross_entropy
from jaxstale.transforms.outer import outer_nesterov
from tests.localsgd.helpers import flat as _flat
from tests.localsgd.helpers import run as _run
from tests.localsgd.helpers import setup as _setup


def _reference(f, inner, outer, m, rounds, h, mode, xb, yb, exchange="fp32"):
    """Workers stepped one by one; the mean of round t applied at the end of round t + 1
    (delayed), or each worker's fresh share with the others' delayed one (eager)."""

    @jax.jit
    def one(p, s, x, y):
        g = jax.grad(lambda q: cross_entropy(f.apply(q, f.state, x, True)[0], y))(p)
        u, s = inner.update(g, s, p)
        return optax.apply_updates(p, u), s

    sub = lambda a, b: jax.tree.map(lambda x, y: x - y, a, b)
    theta = [f.params] * (m if mode == "eager" else 1)
    o = [outer.init(f.params)] * len(theta)
    ss = [inner.init(f.params)] * m
    zero = jax.tree.map(np.zeros_like, f.params)
    pending, own = zero, [zero] * m
    for r in range(rounds):
        deltas = []
        for w in range(m):
            x = theta[w if mode == "eager" else 0]
            start = x
            for n in range(h):
                b = (r * m + w) * h + n
                x, ss[w] = one(x, ss[w], xb[b], yb[b])
            deltas.append(sub(start, x))
        stacked = jax.tree.map(lambda *d: np.stack(d), *deltas)
        fresh = exchange_mean(stacked, exchange)
        if mode == "delayed":
            if r > 0:
                u, o[0] = outer.update(pending, o[0], theta[0])
                theta[0] = optax.apply_updates(theta[0], u)
        else:
            for w in range(m):
                mixed = jax.tree.map(
                    lambda d, p, q: d / m + (p - q / m), deltas[w], pending, own[w]
                )
                u, o[w] = outer.update(mixed, o[w], theta[w])
                theta[w] = optax.apply_updates(theta[w], u)
            own = deltas
        pending = fresh
    return jax.tree.map(lambda *t: np.mean(np.stack(t), axis=0), *theta)


@pytest.mark.parametrize("mode", ["delayed", "eager"])
def test_overlapped_outer_updates_match_a_hand_rolled_loop(mode):
    m, rounds, h = 3, 4, 2
    f, xb, yb = _setup(m * rounds * h)
    inner, outer = optax.adam(0.01), outer_nesterov(0.7, 0.9)
    got = _run(f, inner, outer, synchronous(m, rounds, h), xb, yb, outer_overlap=mode)
    want = _reference(f, inner, outer, m, rounds, h, mode, xb, yb)
    np.testing.assert_allclose(_flat(got.params), _flat(want), atol=2e-6)
    plain = _run(f, inner, outer, synchronous(m, rounds, h), xb, yb)
    assert np.abs(_flat(got.params) - _flat(plain.params)).max() > 1e-4  # not DiLoCo


@pytest.mark.slow  # the fp32 case runs in make test; the wire's rounding is the difference
def test_eager_updates_with_fp8_exchange_match_a_hand_rolled_loop():
    m, rounds, h = 2, 3, 2
    f, xb, yb = _setup(m * rounds * h)
    inner, outer = optax.sgd(0.1, momentum=0.9), outer_nesterov(0.7, 0.9)
    got = _run(f, inner, outer, synchronous(m, rounds, h), xb, yb, outer_overlap="eager",
               exchange="fp8")  # fmt: skip
    want = _reference(f, inner, outer, m, rounds, h, "eager", xb, yb, exchange="fp8")
    np.testing.assert_allclose(_flat(got.params), _flat(want), atol=2e-6)


def test_one_eager_worker_is_synchronous_diloco_to_the_bit():
    rounds, h = 4, 3
    f, xb, yb = _setup(rounds * h)
    inner, outer = optax.adam(0.01), outer_nesterov(0.7, 0.9)
    sched = synchronous(1, rounds, h)
    eager = _run(f, inner, outer, sched, xb, yb, outer_overlap="eager")
    plain = _run(f, inner, outer, sched, xb, yb)
    np.testing.assert_array_equal(_flat(eager.params), _flat(plain.params))
    np.testing.assert_array_equal(eager.losses, plain.losses)


@pytest.mark.slow  # three compiled programs
def test_overlapped_lanes_are_their_runs_alone():
    m, rounds, h = 2, 3, 2
    f, xb, yb = _setup(m * rounds * h)
    inner = optax.sgd(0.1)
    outer = optax.inject_hyperparams(optax.sgd)(learning_rate=0.7, momentum=0.9, nesterov=True)
    sched = synchronous(m, rounds, h)
    from jaxstale import loop

    stack = lambda t: jax.tree.map(lambda a: np.stack([a, a]), t)
    rates = {"outer": {"learning_rate": [0.5, 0.9]}}
    ex = executor(f.apply, inner, outer, sched, stack(xb), stack(yb), lanes=2,
                  hyperparams=rates, outer_overlap="eager")  # fmt: skip
    res = loop.run(ex, stack(f.params), stack(f.state))
    for lane, lr in enumerate((0.5, 0.9)):
        tx = optax.sgd(lr, momentum=0.9, nesterov=True)
        alone = _run(f, inner, tx, sched, xb, yb, outer_overlap="eager")
        np.testing.assert_allclose(_flat(res[lane].params), _flat(alone.params), atol=1e-6)


def test_bad_outer_overlaps_are_one_clear_line():
    f, xb, yb = _setup(8)
    tx = optax.sgd(0.1)
    with pytest.raises(ValueError, match="unknown outer_overlap 'late'"):
        executor(f.apply, tx, tx, synchronous(2, 2, 2), xb, yb, outer_overlap="late")
    with pytest.raises(ValueError, match="already applied as they come"):
        executor(f.apply, tx, tx, asynchronous(2, 2, 2, seed=0), xb, yb, outer_overlap="eager")
    with pytest.raises(ValueError, match="cannot combine with Streaming DiLoCo"):
        executor(f.apply, tx, tx, synchronous(2, 2, 2), xb, yb, fragments=1, overlap=0,
                 alpha=0.5, outer_overlap="delayed")  # fmt: skip
