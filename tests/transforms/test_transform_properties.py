"""Seeded random sweep over pytrees, gaps and delays, against float64 NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import (
    VersionBuffer,
    dc_asgd,
    gap_aware,
    predict_weights,
    staleness_aware,
    weight_prediction,
)

SEEDS = range(5)


def random_tree(rng, depth=0):
    """A random nest of dicts/tuples/lists with float32 leaves of 0 to 2 dimensions."""
    if depth >= 2 or rng.random() < 0.3:
        shape = tuple(int(n) for n in rng.integers(1, 4, size=rng.integers(0, 3)))
        return rng.standard_normal(shape).astype(np.float32)
    n = int(rng.integers(1, 4))
    kind = rng.integers(0, 3)
    children = [random_tree(rng, depth + 1) for _ in range(n)]
    if kind == 0:
        return {f"k{i}": c for i, c in enumerate(children)}
    return tuple(children) if kind == 1 else list(children)


def perturb(rng, tree):
    """A copy of ``tree`` with about half of the coordinates moved (the others exactly equal)."""

    def leaf(x):
        moved = rng.random(x.shape) < 0.5
        return np.where(moved, x + rng.standard_normal(x.shape).astype(np.float32), x)

    return jax.tree.map(leaf, tree)


def leaves64(tree):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def as_jnp(tree):
    return jax.tree.map(jnp.asarray, tree)


@pytest.mark.parametrize("seed", SEEDS)
def test_gradient_transforms_match_references(seed):
    rng = np.random.default_rng(seed)
    w = random_tree(rng)
    stale = perturb(rng, w)
    grads = [
        jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), w) for _ in range(2)
    ]
    lam, decay, eta = float(rng.uniform(0.01, 2)), float(rng.uniform(0, 0.99)), 0.1
    tau = int(rng.integers(0, 6))
    W, S = leaves64(w), leaves64(stale)
    gap = [a - b for a, b in zip(W, S, strict=True)]

    txs = {
        "dc": dc_asgd(lam),
        "dca": dc_asgd(lam, adaptive=True, decay=decay),
        "ga": gap_aware(eta, decay=decay, momentum=0.5, statistic="raw"),
        "ga_lab": gap_aware(eta, decay=decay, momentum=0.5),
        "sa": staleness_aware(),
    }
    states = {k: tx.init(as_jnp(w)) for k, tx in txs.items()}
    ms = [np.zeros_like(x) for x in W]
    v = [np.zeros_like(x) for x in W]
    u = [np.zeros_like(x) for x in W]
    v_lab = [np.zeros_like(x) for x in W]
    m_lab = [np.zeros_like(x) for x in W]  # the trace of the lab reading's own outputs
    for t, g in enumerate(grads, start=1):
        G = leaves64(g)
        outs = {}
        for k, tx in txs.items():
            extra = {"staleness": tau} if k == "sa" else {"stale_params": as_jnp(stale)}
            out, states[k] = tx.update(as_jnp(g), states[k], as_jnp(w), **extra)
            assert jax.tree.structure(out) == jax.tree.structure(g)
            outs[k] = leaves64(out)
        ms = [decay * m + (1 - decay) * x**2 for m, x in zip(ms, G, strict=True)]
        u = [0.5 * a + x for a, x in zip(u, G, strict=True)]
        v = [decay * a + (1 - decay) * b**2 for a, b in zip(v, u, strict=True)]
        v_lab = [decay * a + (1 - decay) * b**2 for a, b in zip(v_lab, m_lab, strict=True)]
        for i, x in enumerate(G):
            np.testing.assert_allclose(
                outs["dc"][i], x + lam * x * x * gap[i], rtol=2e-5, atol=1e-6
            )
            lam_t = lam / np.sqrt(ms[i] + 1e-7)
            np.testing.assert_allclose(
                outs["dca"][i], x + lam_t * x * x * gap[i], rtol=2e-4, atol=1e-5
            )
            c = eta * (np.sqrt(v[i] / (1 - decay**t)) + 1e-8)
            ga = outs["ga"][i]
            np.testing.assert_allclose(ga, x / (1 + np.abs(gap[i]) / c), rtol=2e-4, atol=1e-6)
            c_lab = eta * (np.sqrt(v_lab[i] / (1 - decay**t)) + 1e-8)
            ga_lab = x / (1 + np.abs(gap[i]) / c_lab)
            np.testing.assert_allclose(outs["ga_lab"][i], ga_lab, rtol=2e-4, atol=1e-6)
            m_lab[i] = 0.5 * m_lab[i] + ga_lab
            assert np.all(np.abs(ga) <= np.abs(x)) and np.all(np.sign(ga) == np.sign(x))
            np.testing.assert_allclose(outs["sa"][i], x / max(tau, 1), rtol=1e-6)
            # coordinates that did not move: the gradient passes through exactly
            still = gap[i] == 0
            for k in ("dc", "dca", "ga", "ga_lab"):
                np.testing.assert_array_equal(outs[k][i][still], x[still])
            if tau <= 1:
                np.testing.assert_array_equal(outs["sa"][i], x)


@pytest.mark.parametrize("seed", SEEDS)
def test_predict_weights_matches_reference(seed):
    rng = np.random.default_rng(100 + seed)
    w = as_jnp(random_tree(rng))
    mu = float(rng.choice([0.0, 0.5, 0.9, 0.99]))
    tx = weight_prediction(optax.sgd(0.1, momentum=0.9))
    state = tx.init(w)
    for _ in range(2):
        upd, state = tx.update(jax.tree.map(lambda x: jnp.sin(x) + 1.0, w), state, w)
        w = jax.tree.map(lambda a, b: a + b, w, upd)
    W, D = leaves64(w), leaves64(state.last_update)
    for steps in (0, 1, int(rng.integers(2, 8))):
        spec = leaves64(predict_weights(w, state, steps))
        nest = leaves64(predict_weights(w, state, steps, rule="nesterov", momentum=mu))
        coef = sum(mu**i for i in range(1, steps + 1))
        for a, b, x, d in zip(spec, nest, W, D, strict=True):
            np.testing.assert_allclose(a, x + steps * d, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(b, x + coef * d, rtol=1e-5, atol=1e-6)
            if steps == 0:
                np.testing.assert_array_equal(a, x)
                np.testing.assert_array_equal(b, x)


@pytest.mark.parametrize("seed", SEEDS)
def test_version_buffer_matches_a_list_model(seed):
    rng = np.random.default_rng(200 + seed)
    capacity = int(rng.integers(1, 6))
    base = random_tree(rng)
    history = [base]
    buf = VersionBuffer.create(as_jnp(base), capacity)
    for _ in range(int(rng.integers(0, 3 * capacity))):
        history.append(jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype), base))
        buf = buf.push(as_jnp(history[-1]))
    assert int(buf.count) == len(history) - 1
    for tau in range(capacity):
        want = history[max(len(history) - 1 - tau, 0)]
        for a, b in zip(jax.tree.leaves(buf.get(tau)), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b)
        traced = jax.jit(lambda b, t: b.get(t))(buf, jnp.int32(tau))
        for a, b in zip(jax.tree.leaves(traced), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        buf.get(capacity)
