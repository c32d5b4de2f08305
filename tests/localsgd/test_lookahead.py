"""Momentum look-ahead in the local-SGD executors: asynchronous workers pull the look-ahead
point (against a hand-rolled loop), horizon 0 is outer Nesterov to the bit, the mesh equals the
emulator, and a synchronous run refuses it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale import loop
from jaxstale.localsgd import asynchronous, executor, synchronous
from jaxstale.localsgd import mesh as lmesh
from jaxstale.mesh import make_mesh
from jaxstale.transforms.lookahead import lookahead_point, momentum_lookahead
from jaxstale.transforms.outer import outer_nesterov
from tests.localsgd.helpers import flat as _flat
from tests.localsgd.helpers import run as _run
from tests.localsgd.helpers import setup as _setup
from tests.localsgd.test_emulator import _inner_steps

needs8 = pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 host devices")


def _sched():
    return asynchronous(3, 9, 3, seed=2, straggler_fraction=0.34, straggler_slowdown=2.0)


def test_asynchronous_workers_pull_the_look_ahead_point():
    sched = _sched()
    assert int(sched.staleness.max()) > 0
    f, xb, yb = _setup(sched.num_batches)
    inner, outer = optax.sgd(0.05, momentum=0.9), momentum_lookahead(0.7, 0.9, horizon=2)
    res = _run(f, inner, outer, sched, xb, yb)
    theta, o = f.params, outer.init(f.params)
    dispatch, states = [f.params] * 3, [inner.init(f.params)] * 3
    for t in range(sched.num_updates):
        w, first, steps = int(sched.worker[t]), int(sched.first_batch[t]), int(sched.steps[t])
        p, states[w] = _inner_steps(f, inner, dispatch[w], states[w], xb, yb, first, steps)
        delta = jax.tree.map(jnp.subtract, dispatch[w], p)  # from where the worker started
        u, o = outer.update(delta, o, theta, staleness=int(sched.staleness[t]))
        theta = optax.apply_updates(theta, u)
        dispatch[w] = lookahead_point(theta, o)
    np.testing.assert_allclose(_flat(res.params), _flat(theta), atol=1e-5)
    # and it is not outer Nesterov: the pull points moved the run
    plain = _run(f, inner, outer_nesterov(0.7, 0.9), sched, xb, yb)
    assert np.abs(_flat(plain.params) - _flat(res.params)).max() > 1e-4


def test_horizon_zero_is_asynchronous_outer_nesterov_to_the_bit():
    sched = _sched()
    f, xb, yb = _setup(sched.num_batches)
    inner = optax.adam(0.01)
    a = _run(f, inner, momentum_lookahead(0.7, 0.9, horizon=0), sched, xb, yb)
    b = _run(f, inner, outer_nesterov(0.7, 0.9), sched, xb, yb)
    np.testing.assert_array_equal(_flat(a.params), _flat(b.params))
    np.testing.assert_array_equal(a.losses, b.losses)


def test_a_synchronous_run_refuses_it_in_one_line():
    sched = synchronous(2, 2, 2)
    f, xb, yb = _setup(sched.num_batches)
    ex = executor(f.apply, optax.sgd(0.1), momentum_lookahead(0.7, 0.9, 1), sched, xb, yb)
    with pytest.raises(ValueError, match="momentum_lookahead's pull point is for asynchronous"):
        ex.init(f.params, f.state)


@needs8
def test_on_the_mesh_it_is_the_emulator():
    sched = asynchronous(4, 10, 3, seed=1, straggler_fraction=0.25, straggler_slowdown=3.0)
    f, xb, yb = _setup(sched.num_batches)
    inner, outer = optax.sgd(0.05, momentum=0.9), momentum_lookahead(0.5, 0.9, horizon=3)
    (em,) = loop.run(executor(f.apply, inner, outer, sched, xb, yb), f.params, f.state)
    ex = lmesh.executor(f.apply, inner, outer, sched, xb, yb, mesh=make_mesh(2, "data"))
    (me,) = loop.run(ex, f.params, f.state)
    np.testing.assert_allclose(_flat(me.params), _flat(em.params), atol=1e-6)
    np.testing.assert_allclose(me.losses, em.losses, rtol=1e-6)
    sync = synchronous(4, 1, 3)
    with pytest.raises(ValueError, match="pull point is for asynchronous"):
        ex = lmesh.executor(f.apply, inner, outer, sync, xb, yb, mesh=make_mesh(2, "data"))
        ex.init(f.params, f.state)
