"""jaxstale.transforms.outer: DiLoCo's outer Nesterov, Delayed Nesterov, staleness weights and
CGAD on hand-computed sequences, their reductions (N = 1, c = 0 is Nesterov SGD; τ = 0 is Adam),
halos' rule on random arrivals, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale.transforms.outer import cgad, delayed_nesterov, outer_nesterov, staleness_weight


def _run(tx, deltas, params=None):
    state = tx.init(deltas[0] if params is None else params)
    step = jax.jit(lambda d, s: tx.update(d, s, staleness=jnp.int32(3)))
    out = []
    for d in deltas:
        u, state = step(d, state)
        out.append(u)
    return out, state


def test_delayed_nesterov_by_hand_with_momentum_activation():
    """N = 2, β = 0.5, c = 0.25, η = 1, Δ = 1, 2, 3, 4: the momentum moves at arrivals 2 and 4
    (m = 1.5, then 0.5·1.5 + 7/2 = 4.25); between them c·β·m acts."""
    tx = delayed_nesterov(1.0, beta=0.5, buffer_size=2, c=0.25)
    out, state = _run(tx, [jnp.array([d]) for d in (1.0, 2.0, 3.0, 4.0)])
    want = [-0.5, -(0.75 * 0.5 * 1.5 + 1.0), -(0.125 * 1.5 + 1.5), -(0.375 * 4.25 + 2.0)]
    np.testing.assert_allclose([float(u[0]) for u in out], want, rtol=1e-6)
    assert int(state.count) == 4 and float(state.buffer[0]) == 0.0
    assert float(state.momentum[0]) == pytest.approx(4.25)


def test_one_arrival_per_momentum_update_is_nesterov_sgd():
    rng = np.random.default_rng(0)
    tree = lambda: {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.ones(2)}
    deltas = [tree() for _ in range(6)]
    got, _ = _run(delayed_nesterov(0.7, beta=0.9), deltas)
    want, _ = _run(optax.sgd(0.7, momentum=0.9, nesterov=True), deltas)
    for g, w in zip(got, want, strict=True):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), g, w)
    nest, _ = _run(outer_nesterov(0.7, 0.9), deltas)
    for g, w in zip(nest, want, strict=True):
        jax.tree.map(np.testing.assert_array_equal, g, w)


def _halos_rule(deltas, lr, beta, n, c):
    """The rule as ALGORITHMS.md §10 states halos' DelayedNesterovOptimizer.step, in numpy."""
    m, acc, theta = np.zeros_like(deltas[0]), np.zeros_like(deltas[0]), np.zeros_like(deltas[0])
    for t, d in enumerate(deltas):
        acc = acc + d
        if (t + 1) % n == 0:
            m = beta * m + acc / n
            theta = theta - lr * ((1 - c * n + c) * beta * m + d / n)
            acc = np.zeros_like(acc)
        else:
            theta = theta - lr * (c * beta * m + d / n)
    return theta


@pytest.mark.parametrize("n, c", [(4, 0.0), (4, 0.1), (3, 0.5)])
def test_delayed_nesterov_follows_halos_rule_on_random_arrivals(n, c):
    rng = np.random.default_rng(n)
    deltas = [rng.normal(size=5).astype(np.float32) for _ in range(11)]
    tx = delayed_nesterov(0.3, beta=0.9, buffer_size=n, c=c)
    out, _ = _run(tx, [jnp.asarray(d) for d in deltas])
    theta = sum(np.asarray(u, np.float64) for u in out)
    np.testing.assert_allclose(theta, _halos_rule(deltas, 0.3, 0.9, n, c), rtol=1e-5, atol=1e-6)


def test_a_schedule_and_a_chain():
    sched = optax.linear_schedule(1.0, 0.0, 4)
    tx = optax.chain(optax.clip(10.0), delayed_nesterov(sched, beta=0.0))
    out, _ = _run(tx, [jnp.array([2.0])] * 4)
    assert [float(u[0]) for u in out] == pytest.approx([-2.0, -1.5, -1.0, -0.5])


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"buffer_size": 0}, "buffer_size must be >= 1"),
        ({"buffer_size": 2.0}, "buffer_size must be an int"),
        ({"beta": 1.0}, "beta must be in"),
        ({"c": -0.1}, "c must be in"),
        ({"c": 0.6, "buffer_size": 3}, "1 - c*N + c >= 0"),
        ({"learning_rate": -1.0}, "learning_rate must be in"),
    ],
)
def test_bad_hyperparameters_are_one_clear_error(kw, message):
    with pytest.raises(
        (ValueError, TypeError), match=message.replace("*", r"\*").replace("+", r"\+")
    ):
        delayed_nesterov(**{"learning_rate": 0.1, **kw})


def test_an_outer_optimizer_drives_an_nnx_model():
    """flax.nnx.Optimizer takes it: the pseudo-gradient takes the gradient's place."""
    from flax import nnx

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, delayed_nesterov(0.5, beta=0.9, buffer_size=2), wrt=nnx.Param)
    pure = lambda: jax.tree.map(np.array, nnx.as_pure(nnx.state(model, nnx.Param)))
    before = pure()
    delta = jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param))  # as nnx.grad gives it
    opt.update(model, delta, staleness=jnp.int32(1))
    moved = jax.tree.map(lambda a, b: a - b, pure(), before)
    for leaf in jax.tree.leaves(moved):
        np.testing.assert_allclose(leaf, -0.25)  # first arrival: -η·Δ/N


def test_staleness_weights_by_hand_and_fresh_arrivals_pass_unchanged():
    d = {"a": jnp.array([2.0, -4.0]), "b": jnp.array([1.0])}
    poly = staleness_weight("polynomial", power=0.5, scale=0.5)  # asyncdiloco's at K = 4
    got, _ = poly.update(d, poly.init(d), staleness=8)
    np.testing.assert_allclose(got["a"], [2.0 * 0.5 / 3.0, -4.0 * 0.5 / 3.0], rtol=1e-6)
    expo = staleness_weight("exponential", alpha=0.5)
    got, _ = expo.update(d, expo.init(d), staleness={"a": 2, "b": 0})  # a prefix per sub-tree
    np.testing.assert_allclose(got["a"], np.array([2.0, -4.0]) * np.exp(-1.0), rtol=1e-6)
    for tx in (staleness_weight("polynomial"), expo):
        fresh, _ = jax.jit(lambda d, tx=tx: tx.update(d, tx.init(d), staleness=0))(d)
        jax.tree.map(np.testing.assert_array_equal, fresh, d)  # bit for bit


def test_adam_decay_is_adam_on_weighted_arrivals():
    """CGAD's "Adam-Decay" baseline: the weight enters Adam's moments, so a stale arrival moves
    the first moment by w(τ)·Δ (Adam's first step is sign-like and would hide it)."""
    tx = optax.chain(staleness_weight("exponential", alpha=1.0), optax.adam(0.1))
    d = jnp.array([1.0])
    state = tx.init(d)
    _, state = tx.update(d, state, staleness=2)
    mu = state[1][0].mu
    np.testing.assert_allclose(mu, 0.1 * np.exp(-2.0), rtol=1e-6)  # (1 − β1)·w·Δ


def test_cgad_gate_by_hand():
    """w(τ) = γ(τ)e^{−ατ}, γ = ½(1 + cos(πτ/τ_c)) before the cutoff and 0 from it on."""
    tx = staleness_weight("cgad", alpha=0.2, cutoff=6.0)
    d = jnp.array([3.0])
    for tau, gate in [
        (0, 1.0),
        (1, 0.5 * (1 + np.cos(np.pi / 6))),
        (3, 0.5),
        (5, 0.5 * (1 + np.cos(5 * np.pi / 6))),
        (6, 0.0),
        (40, 0.0),
    ]:
        got, _ = tx.update(d, tx.init(d), staleness=tau)
        np.testing.assert_allclose(got, 3.0 * gate * np.exp(-0.2 * tau), rtol=1e-6, atol=0)


def test_cgad_is_adam_when_fresh_and_moves_its_moments_by_the_weight():
    key = jax.random.split(jax.random.key(0), 5)
    deltas = [{"w": jax.random.normal(k, (3, 2)), "b": jax.random.normal(k, (2,))} for k in key]
    tx, adam = cgad(0.01, alpha=0.3, cutoff=4.0), optax.adam(0.01)
    s, a = tx.init(deltas[0]), adam.init(deltas[0])
    step = jax.jit(lambda d, s, tau: tx.update(d, s, staleness=tau))
    plain = jax.jit(adam.update)
    for d in deltas:  # the weight is exactly 1: only XLA's fusion may round the last bit apart
        (u, s), (v, a) = step(d, s, jnp.int32(0)), plain(d, a)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=0), u, v)
    mu = s[1][0].mu
    _, s2 = step(deltas[0], s, jnp.int32(2))
    expect = jax.tree.map(
        lambda m, d: 0.9 * m + 0.1 * 0.5 * np.exp(-0.6) * d, mu, deltas[0]
    )  # γ(2) = ½ at τ_c = 4
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5), s2[1][0].mu, expect)
    u, s3 = step(deltas[1], s, jnp.int32(4))  # past the cutoff: the moments only decay
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, 0.9 * y, rtol=1e-6), s3[1][0].mu, mu)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"rule": "cosine"}, "unknown rule 'cosine'"),
        ({"rule": "cgad", "cutoff": 0.0}, "cutoff must be in"),
        ({"power": -1.0}, "power must be in"),
        ({"alpha": float("nan")}, "alpha must be in"),
        ({"scale": 0.0}, "scale must be in"),
    ],
)
def test_bad_weights_are_one_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        staleness_weight(**kw)
    tx = staleness_weight()
    d = jnp.ones(1)
    with pytest.raises(ValueError, match="staleness must be in"):
        tx.update(d, tx.init(d), staleness=-1)


def test_delayed_nesterov_takes_injected_hyperparameters_in_a_jitted_step():
    tx = optax.inject_hyperparams(delayed_nesterov, static_args=("buffer_size",))(
        learning_rate=0.5, beta=0.9, buffer_size=2
    )
    plain = delayed_nesterov(0.5, 0.9, 2)
    x = jnp.ones(3)
    s, p = tx.init(x), plain.init(x)
    step = jax.jit(lambda d, s: tx.update(d, s, x, staleness=1))
    for k in range(4):
        d = jnp.full(3, float(k + 1))
        (u, s), (v, p) = step(d, s), plain.update(d, p, x)
        np.testing.assert_allclose(u, v, rtol=1e-6)


@pytest.mark.parametrize(
    ("call", "where"),
    [  # accepted before, while delayed_nesterov refused the same (issue 51's user reports)
        (lambda: outer_nesterov(-0.7), "outer_nesterov"),
        (lambda: outer_nesterov(float("nan")), "outer_nesterov"),
        (lambda: cgad(-0.01), "cgad"),
    ],
)
def test_a_negative_or_nan_outer_rate_is_one_clear_line(call, where):
    with pytest.raises(ValueError, match=rf"^{where}: learning_rate must be in \[0, inf\)"):
        call()
