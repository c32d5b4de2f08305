"""The one asynchronous server: :class:`AsyncServer`, held by both executors, and the typed
hyper-parameters its state carries (:class:`ServerHParams`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxstale.asyncdp import AsyncEmulator, AsyncMesh, AsyncServer, AsyncState, ServerHParams
from jaxstale.asyncdp.server import async_update, build_spec, init_state, worker_gradient
from jaxstale.delays import round_robin
from jaxstale.mesh import make_mesh

_APPLY = lambda p, s, x, train: (x @ p, s)


def test_both_executors_hold_the_same_server():
    emu = AsyncEmulator(_APPLY, "dana", 4, momentum=0.9, warmup_steps=3)
    mesh = AsyncMesh(_APPLY, "dana", 4, mesh=make_mesh(4, "data"), momentum=0.9, warmup_steps=3)
    assert isinstance(emu.server, AsyncServer)
    assert emu.server == mesh.server  # one method, one capacity: one server
    assert (emu.mode, mesh.mode, emu.server.capacity) == ("dana", "dana", 4)
    # 3 workers on 2 devices: the mesh's capacity is M rounded up, the method's mode learnt at M
    odd = AsyncMesh(_APPLY, "ssgd", 3, mesh=make_mesh(2, "data"))
    assert (odd.capacity, odd.server.capacity, odd.num_workers, odd.mode) == (4, 4, 3, "sync")


@pytest.mark.parametrize("executor", ["emulate", "mesh"])
def test_the_state_carries_typed_hyperparameters(executor):
    if executor == "emulate":
        ex = AsyncEmulator(_APPLY, "asgd", 4, vmap=True)
        params = jnp.zeros((2, 3, 2))
        st = ex.init(params, {}, learning_rate=np.array([0.1, 0.2]), num_workers=np.array([4, 2]))
        lead: tuple[int, ...] = (2,)
    else:
        ex = AsyncMesh(_APPLY, "asgd", 4, mesh=make_mesh(4, "data"))
        st = ex.init(jnp.zeros((3, 2)), {}, learning_rate=0.1)
        lead = ()
    assert isinstance(st, AsyncState) and isinstance(st.hparams, ServerHParams)
    assert st.hparams.learning_rate.dtype == jnp.float32 and st.hparams.learning_rate.shape == lead
    assert st.hparams.num_workers.dtype == jnp.int32 and st.hparams.num_workers.shape == lead


def test_server_hparams_from_a_mapping():
    typed = ServerHParams.concrete(0.1, 4)
    assert (typed.learning_rate.dtype, typed.num_workers.dtype) == (np.float32, np.int32)
    assert ServerHParams.of(typed) is typed
    assert ServerHParams.of({"learning_rate": 0.1, "num_workers": 4}) == ServerHParams(0.1, 4)
    lanes = ServerHParams.concrete(0.1, [4, 2], (2,))
    np.testing.assert_array_equal(lanes.learning_rate, np.float32([0.1, 0.1]))
    # the functions keep taking the mapping (as before the typed tuple), their state is typed
    srv = AsyncServer.create("asgd", 2)
    hp = {"learning_rate": np.float32(0.1), "num_workers": np.int32(2)}
    spec = build_spec(srv.build, hp, 0.0, 0, 2)
    assert spec.mode == srv.spec(ServerHParams.of(hp)).mode == "async"
    st = init_state(spec, jnp.zeros(3), {}, 2, hp)
    assert st.hparams == ServerHParams(hp["learning_rate"], hp["num_workers"])


def test_server_methods_are_the_functions():
    """``AsyncServer.update`` is :func:`async_update` with the method of the state's
    hyper-parameters: the same numbers, bit for bit."""
    srv = AsyncServer.create("dc-asgd-a", 2, momentum=0.9, warmup_steps=2)
    x = np.random.default_rng(0).normal(size=(4, 3, 3)).astype(np.float32)
    y = np.zeros((4, 3), np.int32)
    st = srv.init(jnp.ones((3, 2)), {}, ServerHParams.concrete(0.1, 2))
    ref = st
    sched = round_robin(2, 4)
    for t in range(4):
        w, tau = jnp.int32(sched.worker[t]), jnp.int32(sched.staleness[t])
        pulled = srv.pulled(st, w)
        g = worker_gradient(_APPLY, None, *pulled, x[t], y[t])
        st = jax.jit(srv.update)(st, w, tau, {}, g, pulled)
        spec = build_spec(srv.build, ref.hparams, 0.9, 2, 2)
        ref = jax.jit(async_update, static_argnums=0)(spec, ref, w, tau, {}, g, pulled)
        np.testing.assert_array_equal(st.params, ref.params)
    assert int(st.step) == 4


def test_create_checks_like_the_executors():
    with pytest.raises(ValueError, match=r"^AsyncEmulator: momentum"):
        AsyncEmulator(_APPLY, "asgd", 2, momentum=1.5)
    with pytest.raises(ValueError, match=r"^AsyncMesh: momentum"):
        AsyncMesh(_APPLY, "asgd", 2, mesh=make_mesh(2, "data"), momentum=-0.1)
    with pytest.raises(ValueError, match="warmup_steps"):
        AsyncServer.create("asgd", 2, warmup_steps=-1)
    with pytest.raises(ValueError, match="unknown method"):
        AsyncServer.create("no-such-method", 2)
    with pytest.raises(ValueError, match="capacity"):
        AsyncServer.create(optax.sgd(0.1)).init(jnp.zeros(2), {}, ServerHParams(0.1, 1))
    assert AsyncServer.create(optax.sgd(0.1)).mode == "async"
