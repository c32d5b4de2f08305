"""The asynchronous mesh executor: its rounds, its placement, and parity with the emulator.

Same model, data, seed and delay schedule: the master weights after T updates, the per-update
losses and the learning curve must agree (1e-5, float32). Fast tests: a few methods on 4 and 8
devices; the full matrix (every method, round-robin and gamma-timed workers, M = 4 and 8, and
8 workers on 4 devices) is marked slow.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec

from jaxstale import models
from jaxstale.asyncdp import AsyncMesh, async_rounds, emulate_async, method_names, run_async
from jaxstale.delays import constant, gamma_timed, round_robin
from jaxstale.mesh import make_mesh

T, B, TOL = 24, 4, 1e-5
_MODEL = models.create("mlp", input_shape=(4, 4, 1), num_classes=5, hidden=(12,))
_F = models.functional(_MODEL)
_RNG = np.random.default_rng(0)
_XB = _RNG.normal(size=(T, B, 4, 4, 1)).astype(np.float32)
_YB = _RNG.integers(0, 5, (T, B)).astype(np.int32)


def _schedule(kind: str, m: int):
    return round_robin(m, T) if kind == "round_robin" else gamma_timed(m, T, batch_size=B, seed=1)


def _parity(method: str, kind: str, m: int, devices: int) -> float:
    sched = _schedule(kind, m)
    kw = {
        "learning_rate": 0.1,
        "momentum": 0.9,
        "warmup_steps": 5,
        "x_test": _XB[0],
        "y_test": _YB[0],
        "eval_every": 10,
    }
    want = emulate_async(_F.apply, method, _F.params, _F.state, sched, _XB, _YB, **kw)
    mesh = make_mesh(devices, "data")
    got = run_async(_F.apply, method, _F.params, _F.state, sched, _XB, _YB, mesh=mesh, **kw)
    moved = float(jnp.max(jnp.abs(ravel_pytree(want.params)[0] - ravel_pytree(_F.params)[0])))
    assert moved > 1e-2
    np.testing.assert_allclose(got.losses, want.losses, atol=TOL)
    np.testing.assert_array_equal(got.staleness, want.staleness)
    assert [c["step"] for c in got.curve] == [c["step"] for c in want.curve]
    np.testing.assert_allclose(
        [c["test_accuracy"] for c in got.curve], [c["test_accuracy"] for c in want.curve]
    )
    assert got.diverged == want.diverged
    return float(jnp.max(jnp.abs(ravel_pytree(want.params)[0] - ravel_pytree(got.params)[0])))


@pytest.mark.parametrize(
    "method, kind, m",
    [
        pytest.param("dc-asgd-a", "round_robin", 4, marks=pytest.mark.slow),
        pytest.param("dana-dc", "gamma", 8, marks=pytest.mark.slow),  # 6 s
        ("ssgd", "round_robin", 4),
    ],
)
def test_async_parity_with_emulator(method, kind, m):
    assert _parity(method, kind, m, m) < TOL


def test_snapshots_live_on_their_workers_devices():
    ex = AsyncMesh(_F.apply, "asgd", 8, mesh=make_mesh(4, "data"))
    state = ex.init(_F.params, _F.state, learning_rate=0.1)
    state, losses = ex.run(state, round_robin(8, 8), _XB, _YB, 0, 8)
    assert losses.shape == (8,)
    leaf = jax.tree.leaves(state.workers)[0]
    assert leaf.shape[0] == 8 and leaf.sharding.spec == PartitionSpec("data")
    assert len(leaf.sharding.device_set) == 4
    f = models.functional(_BNNet())
    bn = AsyncMesh(f.apply, "asgd", 8, mesh=make_mesh(4, "data"))
    ms = jax.tree.leaves(bn.init(f.params, f.state, learning_rate=0.1).worker_model_state)[0]
    assert ms.shape[0] == 8 and ms.sharding.spec == PartitionSpec("data")
    # the server is replicated on every device
    assert jax.tree.leaves(state.params)[0].sharding.is_fully_replicated


class _BNNet(nnx.Module):
    def __init__(self) -> None:
        self.lin = nnx.Linear(16, 12, rngs=nnx.Rngs(0))
        self.bn = nnx.BatchNorm(12, momentum=0.9, rngs=nnx.Rngs(1))
        self.out = nnx.Linear(12, 5, rngs=nnx.Rngs(2))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.bn(self.lin(x.reshape(len(x), -1)))))


@pytest.mark.parametrize(
    "method", ["asgd", pytest.param("lc-asgd-async-bn", marks=pytest.mark.slow)]
)
def test_batch_norm_statistics_match_the_emulator(method):
    """Each worker's pulled BN copy lives on its device: running statistics are exact too."""
    f = models.functional(_BNNet())
    sched = _schedule("gamma", 4)
    kw = {"learning_rate": 0.1, "momentum": 0.9}
    want = emulate_async(f.apply, method, f.params, f.state, sched, _XB, _YB, **kw)
    mesh = make_mesh(4, "data")
    ex_got = run_async(f.apply, method, f.params, f.state, sched, _XB, _YB, mesh=mesh, **kw)
    assert _max_diff(want.params, ex_got.params) < TOL
    assert _max_diff(want.model_state, ex_got.model_state) < TOL
    assert _max_diff(want.model_state, f.state) > 1e-2  # the statistics moved


def _max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


#: every registered method (a method added with register_method is parity-tested too)
_METHODS = list(method_names())


@pytest.mark.slow
@pytest.mark.parametrize("m, devices", [(4, 4), (8, 8), (8, 4)])
@pytest.mark.parametrize("kind", ["round_robin", "gamma"])
@pytest.mark.parametrize("method", _METHODS)
def test_async_parity_all(method, kind, m, devices):
    if method == "ssgd" and kind == "gamma":
        pytest.skip("SSGD has synchronous rounds: no delay model")
    diff = _parity(method, kind, m, devices)
    print(f"async {method} {kind} M={m} D={devices}: max|diff| = {diff:.3g}")
    assert diff < TOL


def test_async_rounds():
    # round-robin / constant delay: rounds of exactly M updates, one per worker
    assert async_rounds(round_robin(4, 12)) == [(0, 4), (4, 8), (8, 12)]
    assert async_rounds(constant(3, 8)) == [(0, 4), (4, 8)]
    assert async_rounds(round_robin(8, 16)) == [(0, 8), (8, 16)]
    assert async_rounds(round_robin(4, 12), cuts=[6]) == [(0, 4), (4, 6), (6, 10), (10, 12)]
    s = gamma_timed(8, 200, batch_size=16, seed=3)
    rounds = async_rounds(s)
    assert rounds[0][0] == 0 and rounds[-1][1] == 200
    for (_, z), (a2, _) in itertools.pairwise(rounds):
        assert z == a2
    for a, z in rounds:
        w = s.worker[a:z]
        assert len(set(w.tolist())) == len(w)  # no worker twice: every gradient is independent
        # each update's snapshot was final before the round: the worker's previous update < a
        for t in range(a, z):
            prev = np.nonzero(s.worker[:t] == s.worker[t])[0]
            assert prev.size == 0 or prev[-1] < a


def test_mesh_executor_rejects_a_wrong_mesh():
    apply = lambda p, s, x, train: (x.reshape(len(x), -1) @ p, s)
    with pytest.raises(ValueError, match="axis named 'data'"):
        AsyncMesh(apply, "asgd", 4, mesh=make_mesh(4, "stage"))


def test_ssgd_on_a_data_axis_that_does_not_divide_m():
    """D ∤ M: the devices also compute gradients of zero padding mini-batches, dropped before
    the server's average (the same run as the emulator's; needed for M < processes)."""
    sched = round_robin(4, T)
    kw = {"learning_rate": 0.1, "momentum": 0.9}
    want = emulate_async(_F.apply, "ssgd", _F.params, _F.state, sched, _XB, _YB, **kw)
    mesh = make_mesh(3, "data")
    got = run_async(_F.apply, "ssgd", _F.params, _F.state, sched, _XB, _YB, mesh=mesh, **kw)
    np.testing.assert_allclose(got.losses, want.losses, atol=TOL)
    assert _max_diff(want.params, got.params) < TOL
