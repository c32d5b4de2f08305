"""jaxstale.localsgd.mesh: every worker on its own device, equal to the one-device emulator."""

import jax
import numpy as np
import optax
import pytest

from jaxstale import loop
from jaxstale.data import Indexed
from jaxstale.localsgd import asynchronous, executor, synchronous
from jaxstale.localsgd import mesh as lmesh
from jaxstale.mesh import make_mesh
from jaxstale.transforms.outer import delayed_nesterov, outer_nesterov
from tests.localsgd.helpers import flat as _flat
from tests.localsgd.helpers import setup as _setup

# the root conftest.py gives the tests 8 host devices
needs8 = pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 host devices")


def _both(f, inner, outer, sched, xb, yb, d, **kw):
    (em,) = loop.run(executor(f.apply, inner, outer, sched, xb, yb, **kw), f.params, f.state)
    ex = lmesh.executor(f.apply, inner, outer, sched, xb, yb, mesh=make_mesh(d, "data"), **kw)
    (me,) = loop.run(ex, f.params, f.state, eval_every=2)
    return em, me


@needs8
@pytest.mark.parametrize(
    "d, kw",
    [
        (4, {"exchange": "fp32"}),
        pytest.param(4, {"exchange": "fp8"}, marks=pytest.mark.slow),
        # eager updates keep each worker's outer weights and state on its device
        (2, {"outer_overlap": "eager"}),
        pytest.param(2, {"outer_overlap": "delayed"}, marks=pytest.mark.slow),
    ],
    ids=["fp32", "fp8", "eager", "delayed"],
)
def test_synchronous_diloco_on_the_mesh_is_the_emulator(d, kw):
    sched = synchronous(4, 3, 3)
    f, xb, yb = _setup(sched.num_batches)
    em, me = _both(f, optax.adam(0.01), outer_nesterov(0.7, 0.9), sched, xb, yb, d, **kw)
    # the jobs agree to the bit (D = 1 is bit-identical); the devices' vmaps of other sizes
    # round the last bits of a few weights differently
    np.testing.assert_allclose(_flat(me.params), _flat(em.params), atol=5e-7)
    np.testing.assert_allclose(me.losses, em.losses, rtol=1e-6)


@needs8
def test_asynchronous_local_sgd_on_the_mesh_is_the_emulator():
    sched = asynchronous(
        4, 10, 3, seed=1, straggler_fraction=0.25, straggler_slowdown=3.0, dynamic=True
    )
    assert len(lmesh.local_rounds(sched)) < sched.num_updates  # arrivals run in parallel
    f, xb, yb = _setup(sched.num_batches)
    inner, outer = optax.sgd(0.05, momentum=0.9), delayed_nesterov(0.5, 0.9, 4)
    em, me = _both(f, inner, outer, sched, xb, yb, 2)
    np.testing.assert_allclose(_flat(me.params), _flat(em.params), atol=1e-6)
    np.testing.assert_allclose(me.losses, em.losses, rtol=1e-6)
    # an Indexed stream is materialised on the mesh: the same run
    idx = np.arange(sched.num_batches)[:, None] * 8 + np.arange(8)
    flat_x, flat_y = xb.reshape(-1, *xb.shape[2:]), yb.reshape(-1)
    xi, yi = Indexed(flat_x, idx), Indexed(flat_y, idx)
    ex = lmesh.executor(f.apply, inner, outer, sched, xi, yi, mesh=make_mesh(2, "data"))
    (ind,) = loop.run(ex, f.params, f.state, eval_every=2)
    np.testing.assert_array_equal(_flat(ind.params), _flat(me.params))
    with pytest.raises(ValueError, match=r"yb\.idx must index its 8 rows"):
        lmesh.executor(f.apply, inner, outer, sched, xi, Indexed(flat_y[:8], idx))


@needs8
@pytest.mark.parametrize(
    "overlap, alpha, exchange",
    [(1, 0.5, "fp32"), pytest.param(0, 0.0, "fp8", marks=pytest.mark.slow)],
)
def test_streaming_diloco_on_the_mesh_is_the_emulator(overlap, alpha, exchange):
    """Fragments with their own outer states, overlap and merge: the emulator's sync on the
    workers' devices (two hidden layers: three fragments of whole layers)."""
    sched = synchronous(4, 2, 6)
    f, xb, yb = _setup(sched.num_batches, hidden=(8, 8))
    kw = {"fragments": 3, "overlap": overlap, "alpha": alpha, "exchange": exchange}
    em, me = _both(f, optax.adam(0.01), outer_nesterov(0.7, 0.9), sched, xb, yb, 2, **kw)
    assert len(em.losses) == len(me.losses) == 2 * 3  # a step per fragment sync
    np.testing.assert_allclose(_flat(me.params), _flat(em.params), atol=5e-7)
    np.testing.assert_allclose(me.losses, em.losses, rtol=1e-6)


def test_a_mesh_that_does_not_divide_the_workers_is_one_clear_line():
    sched = synchronous(3, 1, 2)
    f, xb, yb = _setup(sched.num_batches)
    if jax.device_count() < 2:
        pytest.skip("needs 2 host devices")
    with pytest.raises(ValueError, match="2 'data' devices must divide the 3 workers"):
        lmesh.executor(f.apply, optax.sgd(0.1), optax.sgd(1.0), sched, xb, yb,
                       mesh=make_mesh(2, "data"))  # fmt: skip
