"""Streaming DiLoCo against a hand-rolled loop: fragments synchronised in turn, each with its own
outer state, the overlap τ and the α merge; P = 1, τ = 0, α = 0 is synchronous DiLoCo."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import loop, models
from jaxstale.localsgd import asynchronous, executor, synchronous
from jaxstale.localsgd.streaming import fragment_ids
from jaxstale.losses import cross_entropy
from jaxstale.transforms.outer import outer_nesterov
from tests.localsgd.helpers import flat as _flat
from tests.localsgd.helpers import run as _run
from tests.localsgd.helpers import setup


def _setup(nb, b=8):
    return setup(nb, b, hidden=(8, 8))


def _reference(f, inner, outer, m, rounds, h, frag, tau, alpha, xb, yb):
    """Replicas stepped one by one; fragment k mod P snapshotted at (k+1)H/P − τ, merged at
    (k+1)H/P; one outer state per fragment, over that fragment's leaves."""

    @jax.jit
    def one(p, s, x, y):
        g = jax.grad(lambda q: cross_entropy(f.apply(q, f.state, x, True)[0], y))(p)
        u, s = inner.update(g, s, p)
        return optax.apply_updates(p, u), s

    treedef = jax.tree.structure(f.params)
    p_count = max(frag) + 1
    length = h // p_count
    g = jax.tree.leaves(f.params)
    pick = lambda leaves, q: [x for x, i in zip(leaves, frag, strict=True) if i == q]
    states = [outer.init(pick(g, q)) for q in range(p_count)]
    xs = [f.params] * m
    ss = [inner.init(f.params)] * m
    for k in range(rounds * p_count):
        r, q = divmod(k, p_count)
        for n in range(length + 1):  # the snapshot and outer step after length − τ steps
            if n == length - tau:
                snap = [jax.tree.leaves(x) for x in xs]
                delta = [sum(gl - s[i] for s in snap) / m for i, gl in enumerate(g)]
                u, states[q] = outer.update(pick(delta, q), states[q], pick(g, q))
                it = iter(u)
                g = [gl + next(it) if i == q else gl for gl, i in zip(g, frag, strict=True)]
            for w in range(m if n < length else 0):
                b = (r * m + w) * h + q * length + n
                xs[w], ss[w] = one(xs[w], ss[w], xb[b], yb[b])
        for w in range(m):
            leaves = jax.tree.leaves(xs[w])
            leaves = [alpha * x + (1 - alpha) * gl if i == q else x
                      for x, gl, i in zip(leaves, g, frag, strict=True)]  # fmt: skip
            xs[w] = jax.tree.unflatten(treedef, leaves)
    return jax.tree.unflatten(treedef, g)


def test_fragments_are_whole_layers_balanced_by_size_or_given_per_tensor():
    f, _, _ = _setup(1)
    assert fragment_ids(f.params, 1) == [0] * 6
    assert fragment_ids(f.params, 3) == [0, 0, 1, 1, 2, 2]
    assert fragment_ids(f.params, [1, 1, 0, 0, 1, 1]) == [1, 1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match=r"fragments must be in 1..3"):
        fragment_ids(f.params, 4)
    with pytest.raises(ValueError, match="one id per weight tensor"):
        fragment_ids(f.params, [0, 2, 0, 0, 0, 0])


def test_one_fragment_without_overlap_is_synchronous_diloco():
    m, rounds, h = 2, 3, 4
    f, xb, yb = _setup(m * rounds * h)
    inner, outer = optax.adam(0.01), outer_nesterov(0.7, 0.9)
    sched = synchronous(m, rounds, h)
    plain = _run(f, inner, outer, sched, xb, yb)
    one = _run(f, inner, outer, sched, xb, yb, fragments=1)
    np.testing.assert_allclose(_flat(one.params), _flat(plain.params), atol=1e-6)
    np.testing.assert_allclose(one.losses, plain.losses, rtol=1e-5)


@pytest.mark.parametrize("tau, alpha", [(0, 0.0), (1, 0.5)])
def test_streaming_diloco_is_the_hand_rolled_fragment_schedule(tau, alpha):
    m, rounds, h, p = 2, 2, 6, 3
    f, xb, yb = _setup(m * rounds * h)
    inner, outer = optax.sgd(0.1, momentum=0.9), outer_nesterov(0.7, 0.9)
    sched = synchronous(m, rounds, h)
    res = _run(f, inner, outer, sched, xb, yb, fragments=p, overlap=tau, alpha=alpha)
    assert res.losses.shape == (rounds * p,)
    frag = fragment_ids(f.params, p)
    want = _reference(f, inner, outer, m, rounds, h, frag, tau, alpha, xb, yb)
    np.testing.assert_allclose(_flat(res.params), _flat(want), atol=2e-5)


def test_a_sync_moves_only_its_own_fragment():
    """One outer state per fragment: with momentum, syncing fragment 1 leaves fragment 0's
    global weights where fragment 0's own last sync put them (torchft's trap avoided)."""
    m, h, p = 2, 4, 2
    f, xb, yb = _setup(m * 2 * h)
    sched = synchronous(m, 2, h)
    ex = executor(f.apply, optax.sgd(0.1), outer_nesterov(0.7, 0.9), sched, xb, yb, fragments=p)
    st = ex.init(f.params, f.state)
    frag = fragment_ids(f.params, p)
    history = []
    for k in range(4):
        st, _ = ex.step(st, k)
        history.append([np.asarray(x) for x in jax.tree.leaves(st["theta"])])
    for k in range(1, 4):
        for i, q in enumerate(frag):
            moved = not np.array_equal(history[k][i], history[k - 1][i])
            assert moved == (q == k % p), (k, i)


def test_streaming_settings_out_of_range_are_one_clear_line():
    f, xb, yb = _setup(16)
    sched = synchronous(2, 2, 4)
    tx = optax.sgd(0.1)
    cases = [
        ({"fragments": 3}, "inner_steps 4 must be a multiple of fragments 3"),
        ({"fragments": 2, "overlap": 2}, r"overlap must be in 0..1"),
        ({"alpha": 1.5}, r"alpha must be in \[0, 1\]"),
        ({"overlap": 0.5}, "overlap must be an int"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            executor(f.apply, tx, tx, sched, xb, yb, **kw)
    async_sched = asynchronous(2, 4, 2, seed=0)
    with pytest.raises(ValueError, match="asynchronous schedule would ignore them"):
        executor(f.apply, tx, tx, async_sched, xb, yb, fragments=2)


def test_models_with_batch_norm_are_refused_before_training():
    f = models.functional(models.create("resnet20", input_shape=(8, 8, 1), num_classes=3))
    xb = np.zeros((4, 2, 8, 8, 1), np.float32)
    yb = np.zeros((4, 2), np.int32)
    ex = executor(f.apply, optax.sgd(0.1), optax.sgd(1.0), synchronous(1, 2, 2), xb, yb)
    with pytest.raises(ValueError, match="running statistics would be dropped"):
        ex.init(f.params, f.state)


@pytest.mark.slow  # make test keeps the reference schedule and the reductions
def test_streaming_lanes_are_seeds_each_equal_to_its_run_alone():
    m, rounds, h = 2, 2, 4
    f, xb, yb = _setup(m * rounds * h)
    sched = synchronous(m, rounds, h)
    inner, outer = optax.adam(0.01), outer_nesterov(0.7, 0.9)
    two = lambda t: jax.tree.map(lambda a: np.stack([a, a * 0.5]), t)
    ys = np.stack([yb, yb])
    ex = executor(f.apply, inner, outer, sched, two(xb), ys, lanes=2, fragments=2,
                  overlap=1, alpha=0.5, exchange="fp8")  # fmt: skip
    got = loop.run(ex, two(f.params), two(f.state))
    for k in range(2):
        fk = f._replace(params=jax.tree.map(lambda a: a * (1, 0.5)[k], f.params))
        xk = xb * (1, 0.5)[k]
        alone = _run(fk, inner, outer, sched, xk, yb, fragments=2, overlap=1, alpha=0.5,
                     exchange="fp8")  # fmt: skip
        np.testing.assert_allclose(_flat(got[k].params), _flat(alone.params), atol=1e-6)
    assert jnp.isfinite(_flat(got[1].params)).all()
