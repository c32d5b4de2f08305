"""Functional form: apply == module call, batch-stat state in train/eval mode, grads, scan carry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstale import losses, models

CASES = [
    ("mlp", {"hidden": (32, 16)}),
    ("cnn", {}),
    # ResNet-20 compiles for 10-30 s per case: make test-slow (its batch-norm tests stay here)
    pytest.param("resnet20", {"width": 4}, marks=pytest.mark.slow, id="resnet20-kwargs2"),
]


def _make(name="resnet20", kwargs=None):
    kwargs = {"width": 4} if kwargs is None else kwargs
    return models.create(name, input_shape=(8, 8, 1), num_classes=10, seed=2, **kwargs)


def _x(batch=4, seed=0):
    return jax.random.uniform(jax.random.key(seed), (batch, 8, 8, 1))


def _leaves(tree):
    return [np.asarray(a) for a in jax.tree.leaves(tree)]


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_apply_equals_module_call(name, kwargs):
    model, x = _make(name, kwargs), _x()
    f = models.functional(model)
    y_eval, state_eval = f.apply(f.params, f.state, x, False)
    model.eval()
    np.testing.assert_array_equal(y_eval, model(x))
    _assert_trees_equal(state_eval, f.state)
    y_train, _ = f.apply(f.params, f.state, x, True)
    model.train()
    np.testing.assert_array_equal(y_train, model(x))


def test_state_is_empty_without_batch_norm():
    f = models.functional(_make("mlp", {"hidden": (8,)}))
    assert jax.tree.leaves(f.state) == []
    assert len(jax.tree.leaves(f.params)) == 4


def test_resnet_train_mode_updates_batch_stats():
    model, x = _make(), _x()
    f = models.functional(model)
    before = _leaves(f.state)
    _, new_state = f.apply(f.params, f.state, x, True)
    assert jax.tree.structure(new_state) == jax.tree.structure(f.state)
    changed = [not np.array_equal(a, b) for a, b in zip(before, _leaves(new_state), strict=True)]
    assert all(changed)  # every BN's mean and var moved
    # Inputs and the original module are untouched (apply is pure).
    for a, b in zip(before, _leaves(f.state), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before, _leaves(nnx.state(model, nnx.BatchStat)), strict=True):
        np.testing.assert_array_equal(a, b)
    # The stem's running mean follows mu <- 0.9 mu + 0.1 mean_B(conv(x)) (mu starts at 0).
    stem_conv = np.asarray(model.blocks[0].conv(x))
    new_mean = np.asarray(new_state["blocks"][0]["bn"]["mean"][...])
    np.testing.assert_allclose(new_mean, 0.1 * stem_conv.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-7)


def test_resnet_eval_mode_keeps_batch_stats_and_uses_them():
    model, x = _make(), _x()
    f = models.functional(model)
    _, state1 = f.apply(f.params, f.state, x, True)
    y_a, state2 = f.apply(f.params, state1, x, False)
    _assert_trees_equal(state2, state1)
    y_b, _ = f.apply(f.params, f.state, x, False)  # different running stats, different output
    assert not np.array_equal(np.asarray(y_a), np.asarray(y_b))
    # Eval mode is per-example: the output for one example does not depend on the batch.
    y_one, _ = f.apply(f.params, state1, x[:1], False)
    np.testing.assert_allclose(y_one, y_a[:1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_grads_flow_through_apply_under_jit(name, kwargs):
    model, x = _make(name, kwargs), _x(8)
    labels = jnp.arange(8) % 10
    f = models.functional(model)

    def loss(params, state):
        logits, new_state = f.apply(params, state, x, True)
        return losses.cross_entropy(logits, labels), new_state

    (value, new_state), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(f.params, f.state)
    assert np.isfinite(float(value))
    assert jax.tree.structure(grads) == jax.tree.structure(f.params)
    assert jax.tree.structure(new_state) == jax.tree.structure(f.state)
    for g in _leaves(grads):
        assert np.all(np.isfinite(g)) and np.any(g != 0)
    # Same as the eager value (jit may fuse differently: close, not bitwise).
    logits_eager, _ = f.apply(f.params, f.state, x, True)
    np.testing.assert_allclose(value, losses.cross_entropy(logits_eager, labels), rtol=1e-5)


def test_state_carries_through_scan():
    model = _make()
    f = models.functional(model)
    xs = jnp.stack([_x(4, seed=s) for s in range(3)])

    def body(state, x):
        y, state = f.apply(f.params, state, x, True)
        return state, y

    final, ys = jax.lax.scan(body, f.state, xs)
    state = f.state
    for t in range(3):
        y, state = f.apply(f.params, state, xs[t], True)
        np.testing.assert_allclose(ys[t], y, rtol=1e-5, atol=1e-5)
    for a, b in zip(_leaves(final), _leaves(state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_stages", [1, 2, 4])
def test_functional_stages_compose_to_apply_exactly(num_stages):
    model, x = _make(), _x()
    full = models.functional(model)
    stages = models.functional_stages(model, num_stages)
    assert len(stages) == num_stages
    for train in (False, True):
        y_full, state_full = full.apply(full.params, full.state, x, train)
        h, stage_states = x, []
        for s in stages:
            h, st = s.apply(s.params, s.state, h, train)
            stage_states.append(st)
        np.testing.assert_array_equal(h, y_full)
        # The stages' states, in order, are exactly the model's state.
        flat = [a for st in stage_states for a in _leaves(st)]
        for a, b in zip(flat, _leaves(state_full), strict=True):
            np.testing.assert_array_equal(a, b)
    assert sum(len(jax.tree.leaves(s.params)) for s in stages) == len(jax.tree.leaves(full.params))


@pytest.mark.slow  # make test ≤ 8 min: CI runs it in make test-slow
def test_apply_train_flag_is_static_under_jit():
    f = models.functional(_make())
    apply = jax.jit(f.apply, static_argnums=3, donate_argnums=1)
    state = jax.tree.map(jnp.copy, f.state)
    _, state = apply(f.params, state, _x(), True)
    _, state = apply(f.params, state, _x(seed=1), True)  # donated state is carried
    y, _ = apply(f.params, state, _x(), False)
    assert y.shape == (4, 10)
