"""Pipeline split: stages compose to the full model bit for bit, share Variables, are balanced."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxstale import models
from jaxstale.models.staged import balanced_bounds

CASES = [("mlp", {"hidden": (32, 16, 16)}), ("cnn", {}), ("resnet20", {"width": 4})]


def _make(name, kwargs, shape=(8, 8, 1)):
    return models.create(name, input_shape=shape, num_classes=10, seed=1, **kwargs)


def _x(shape=(8, 8, 1), batch=4):
    return jax.random.uniform(jax.random.key(0), (batch, *shape))


def _compose(stages, x):
    for stage in stages:
        x = stage(x)
    return x


@pytest.mark.parametrize("num_stages", [1, 2, 4])
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_composed_stages_equal_model_exactly(name, kwargs, num_stages):
    model, x = _make(name, kwargs), _x()
    stages = models.split(model, num_stages)
    assert len(stages) == num_stages
    assert sum(len(s.blocks) for s in stages) == len(model.blocks)
    model.eval()
    np.testing.assert_array_equal(_compose(stages, x), model(x))
    model.train()  # train mode reaches the stages too (same block objects)
    before = jax.tree.map(jnp.copy, nnx.state(model, nnx.BatchStat))
    y_model = model(x)
    after_model = nnx.state(model, nnx.BatchStat)
    nnx.update(model, before)  # rewind the running averages, run the stages on the same state
    y_stages = _compose(stages, x)
    np.testing.assert_array_equal(y_stages, y_model)
    for a, b in zip(
        jax.tree.leaves(after_model), jax.tree.leaves(nnx.state(model, nnx.BatchStat)), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_stages_share_variables_with_model():
    model = _make("mlp", {"hidden": (32, 16)})
    stages = models.split(model, 3)
    assert [len(s.blocks) for s in stages] == [1, 1, 1]
    assert all(s.blocks[0] is model.blocks[i] for i, s in enumerate(stages))
    x = _x()
    model.blocks[2].linear.bias[...] = model.blocks[2].linear.bias[...] + 1.0
    np.testing.assert_array_equal(_compose(stages, x), model(x))


def _naive_max(counts, n):
    return max(sum(part) for part in np.array_split(np.asarray(counts), n))


@pytest.mark.parametrize(("name", "kwargs"), [*CASES, ("resnet20", {})])
def test_split_is_balanced(name, kwargs):
    model = _make(name, kwargs, shape=(28, 28, 1))
    counts = models.block_param_counts(model)
    for n in range(1, len(model.blocks) + 1):
        sizes = [models.param_count(s) for s in models.split(model, n)]
        assert sum(sizes) == sum(counts)
        assert max(sizes) <= _naive_max(counts, n)
        assert max(sizes) >= max(counts)


def test_resnet20_four_stages():
    model = models.create("resnet20", input_shape=(32, 32, 3), num_classes=10)
    stages = models.split(model, 4)
    assert [len(s.blocks) for s in stages] == [7, 1, 1, 2]
    # Naive 3/3/3/2 blocks would put 55552 + 2 * 73984 = 203520 parameters in one stage.
    assert max(models.param_count(s) for s in stages) == 74_634


def _brute_force(weights, k):
    best = None
    for cuts in itertools.combinations(range(1, len(weights)), k - 1):
        bounds = list(zip((0, *cuts), (*cuts, len(weights)), strict=True))
        sums = [sum(weights[i:j]) for i, j in bounds]
        key = (max(sums), sum(s * s for s in sums))
        if best is None or key < best[0]:
            best = (key, bounds)
    return best[0]


def test_balanced_bounds_is_optimal_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(60):
        n = int(rng.integers(1, 9))
        weights = [int(w) for w in rng.integers(0, 50, size=n)]
        for k in range(1, n + 1):
            bounds = balanced_bounds(weights, k)
            assert len(bounds) == k and bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(i < j for i, j in bounds)
            assert all(bounds[t][1] == bounds[t + 1][0] for t in range(k - 1))
            sums = [sum(weights[i:j]) for i, j in bounds]
            assert (max(sums), sum(s * s for s in sums)) == _brute_force(weights, k)


def test_split_is_deterministic():
    model = _make("resnet20", {"width": 4})
    a = [len(s.blocks) for s in models.split(model, 3)]
    b = [len(s.blocks) for s in models.split(model, 3)]
    assert a == b


@pytest.mark.parametrize("bad", [0, -1, 12, 2.0, True, None])
def test_split_bad_num_stages(bad):
    model = _make("resnet20", {"width": 4})
    with pytest.raises(ValueError, match="num_stages"):
        models.split(model, bad)


def test_split_needs_staged_model():
    with pytest.raises(TypeError, match="StagedModel"):
        models.split(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), 1)


def test_staged_model_needs_blocks():
    with pytest.raises(ValueError, match="at least one block"):
        models.StagedModel([])
