"""Async-BN: EMA merge of batch statistics, hand-computed; vs ordinary last-writer-wins BN."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxstale.asyncdp.bn import (
    async_bn_update,
    batch_stats_from_update,
    merge_batch_stats,
    ordinary_bn_update,
)


class Net(nnx.Module):
    def __init__(self):
        self.lin = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(2, momentum=0.9, rngs=nnx.Rngs(0))
        self.bn2 = nnx.BatchNorm(2, momentum=0.9, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.bn2(self.bn(self.lin(x)))


def stats(mean1, var1, mean2, var2):
    bs = lambda v: nnx.BatchStat(jnp.asarray(v, jnp.float32))
    return nnx.State(
        {"bn": {"mean": bs(mean1), "var": bs(var1)}, "bn2": {"mean": bs(mean2), "var": bs(var2)}}
    )


def values(state):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(state))


def test_merge_hand_computed():
    server = stats([0.0, 1.0], [1.0, 2.0], [4.0, -2.0], [0.5, 0.5])
    worker = stats([2.0, 3.0], [3.0, 6.0], [0.0, 2.0], [1.5, 2.5])
    out = values(merge_batch_stats(server, worker, 0.25))  # E ← 0.75 E + 0.25 x
    np.testing.assert_allclose(out["bn"]["mean"], [0.5, 1.5])
    np.testing.assert_allclose(out["bn"]["var"], [1.5, 3.0])
    np.testing.assert_allclose(out["bn2"]["mean"], [3.0, -1.0])
    np.testing.assert_allclose(out["bn2"]["var"], [0.75, 1.0])
    merged = merge_batch_stats(server, worker, 0.25)
    assert isinstance(merged["bn"]["mean"], nnx.BatchStat)  # structure kept
    assert jax.tree.structure(merged) == jax.tree.structure(server)
    # d = 1: the worker's values; d = 0: the server's
    np.testing.assert_array_equal(
        values(merge_batch_stats(server, worker, 1.0))["bn"]["var"], [3, 6]
    )
    np.testing.assert_array_equal(
        values(merge_batch_stats(server, worker, 0.0))["bn"]["var"], [1, 2]
    )


def test_merge_on_plain_pytrees_and_under_jit():
    out = jax.jit(merge_batch_stats)(
        {"m": jnp.array([1.0, 3.0])}, {"m": jnp.array([3.0, 1.0])}, 0.5
    )
    np.testing.assert_allclose(np.asarray(out["m"]), [2.0, 2.0])


def test_only_batch_stats_are_merged():
    server = nnx.State({"mean": nnx.BatchStat(jnp.array(0.0)), "n": nnx.Variable(jnp.array(1))})
    worker = nnx.State({"mean": nnx.BatchStat(jnp.array(4.0)), "n": nnx.Variable(jnp.array(7))})
    out = merge_batch_stats(server, worker, 0.5)
    assert float(out["mean"][...]) == 2.0 and int(out["n"][...]) == 7  # others: the worker's


def test_batch_statistics_recovered_from_an_nnx_batchnorm_update():
    model = Net()
    bstats = jax.tree.map(jnp.copy, nnx.state(model, nnx.BatchStat))  # a copy, not views
    x = jax.random.normal(jax.random.key(0), (16, 3)) * 2.0 + 1.0
    model.train()
    h = model.lin(x)
    model(x)
    updated = nnx.state(model, nnx.BatchStat)
    batch = values(batch_stats_from_update(bstats, updated, 0.9))
    np.testing.assert_allclose(batch["bn"]["mean"], np.asarray(h.mean(0)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batch["bn"]["var"], np.asarray(h.var(0)), rtol=1e-4, atol=1e-5)


def test_fresh_worker_with_decay_one_minus_momentum_equals_ordinary_bn():
    server = stats([0.5, -1.0], [1.0, 2.0], [0.0, 0.0], [1.0, 1.0])
    batch = stats([2.0, 1.0], [4.0, 0.5], [1.0, -1.0], [2.0, 3.0])
    updated = merge_batch_stats(server, batch, 0.1)  # what BatchNorm(momentum=0.9) returns
    a = values(async_bn_update(server, server, updated, decay=0.1, momentum=0.9))
    o = values(ordinary_bn_update(server, server, updated))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(o), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_stale_worker_ordinary_overwrites_async_keeps_other_updates():
    # the server moved from E=0 to E=1 (other workers) while this worker held E=0
    pulled = {"mean": jnp.float32(0.0)}
    server = {"mean": jnp.float32(1.0)}
    updated = {"mean": jnp.float32(0.2)}  # momentum 0.9, batch mean 2.0
    ordinary = ordinary_bn_update(server, pulled, updated)
    merged = async_bn_update(server, pulled, updated, decay=0.1, momentum=0.9)
    assert float(ordinary["mean"]) == np.float32(0.2)  # the other workers' progress is lost
    np.testing.assert_allclose(float(merged["mean"]), 0.9 * 1.0 + 0.1 * 2.0, rtol=1e-6)


def test_recompute_batch_stats_is_the_data_sets_statistics_whatever_the_running_state():
    from jaxstale import models
    from jaxstale.asyncdp.bn import recompute_batch_stats

    f = models.functional(Net())
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(64, 3)) * [1.0, 3.0, 0.5] + [1.0, -2.0, 4.0]).astype(np.float32)
    h = x @ np.asarray(nnx.to_pure_dict(f.params)["lin"]["kernel"]) + np.asarray(
        nnx.to_pure_dict(f.params)["lin"]["bias"]
    )
    h = h.astype(np.float64)
    z = (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-5)  # bn in training mode (scale 1, bias 0)
    for state in (f.state, stats([5.0, 5.0], [9.0, 9.0], [-3.0, 1.0], [0.1, 7.0])):
        got = values(recompute_batch_stats(f.apply, f.params, state, x, momentum=0.9))
        np.testing.assert_allclose(got["bn"]["mean"], h.mean(0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["bn"]["var"], h.var(0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["bn2"]["mean"], z.mean(0), atol=1e-4)
        np.testing.assert_allclose(got["bn2"]["var"], z.var(0), rtol=1e-3, atol=1e-4)
