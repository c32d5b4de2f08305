"""Delay models: exact staleness for constant / round-robin, statistics for gamma-timed workers."""

import numpy as np
import pytest

from jaxstale import delays


@pytest.mark.parametrize("m", [1, 2, 3, 8])
def test_round_robin_staleness_is_m_minus_1_after_warmup(m):
    s = delays.round_robin(m, 50)
    tau = s.staleness
    assert (tau[m - 1 :] == m - 1).all()
    assert tau[: m - 1].tolist() == list(range(m - 1))  # warm-up: computed at w_0
    assert s.worker.tolist() == [t % m for t in range(50)]
    assert (s.batch == np.arange(50)).all()


def test_round_robin_is_consistent_with_worker_pulls():
    # Replay the definition: worker i pulls version t + 1 after its update t.
    m, s = 4, delays.round_robin(4, 30)
    held = np.zeros(m, int)
    for t in range(30):
        i = s.worker[t]
        assert s.pulled[t] == held[i]
        held[i] = t + 1


@pytest.mark.parametrize("tau", [0, 1, 5])
def test_constant_delay_is_a_fifo_of_versions(tau):
    s = delays.constant(tau, 40)
    assert s.pulled.tolist() == [max(t - tau, 0) for t in range(40)]
    assert s.num_workers == tau + 1
    assert (s.pulled == delays.round_robin(tau + 1, 40).pulled).all()


@pytest.mark.parametrize("m", [4, 16])
def test_gamma_staleness_mean_near_m_minus_1(m):
    s = delays.gamma_timed(m, 4000, batch_size=32, seed=0)
    tau = s.staleness[4 * m :]  # after warm-up
    # Each worker applies about every M-th update: mean M-1, spread small (shape 100).
    assert abs(tau.mean() - (m - 1)) < 0.05 * m
    assert tau.std() > 0  # not round-robin
    assert s.counts().sum() == 4000
    assert s.counts()[np.argmax(s.counts())] > 0


def test_gamma_replay_and_batches_are_a_stream():
    s = delays.gamma_timed(5, 300, batch_size=8, seed=3)
    held = np.zeros(5, int)
    for t in range(300):
        assert s.pulled[t] == held[s.worker[t]]
        held[s.worker[t]] = t + 1
    assert len(set(s.batch.tolist())) == 300  # every applied gradient used its own batch
    assert s.batch.max() < 300 + 5


def test_gamma_is_seeded_and_m1_is_sequential():
    a = delays.gamma_timed(8, 200, batch_size=32, seed=1)
    b = delays.gamma_timed(8, 200, batch_size=32, seed=1)
    c = delays.gamma_timed(8, 200, batch_size=32, seed=2)
    assert (a.worker == b.worker).all() and not (a.worker == c.worker).all()
    one = delays.gamma_timed(1, 50, batch_size=32, seed=0)
    assert (one.staleness == 0).all() and (one.batch == np.arange(50)).all()


def test_stragglers_are_stale_more_often():
    s = delays.gamma_timed(
        8, 4000, batch_size=32, seed=0, straggler_fraction=0.25, straggler_slowdown=4.0
    )
    slow = np.isin(s.worker, [0, 1])
    # stragglers contribute fewer, much staler gradients
    assert slow.mean() < 0.1
    assert s.staleness[slow].mean() > 3 * s.staleness[~slow].mean()


@pytest.mark.parametrize(
    "call",
    [
        lambda: delays.constant(-1, 5),
        lambda: delays.round_robin(0, 5),
        lambda: delays.round_robin(2, 0),
        lambda: delays.gamma_timed(2, 5, batch_size=0, seed=0),
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, shape=-1.0),
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, straggler_fraction=1.5),
        lambda: delays.gamma_timed(2, 5, batch_size=4, seed=0, straggler_slowdown=0.5),
        lambda: delays.make_schedule("poisson", 2, 5),
        lambda: delays.make_schedule("constant", 2, 5, shape=3.0),
    ],
)
def test_bad_parameters_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_non_int_raises_type_error():
    with pytest.raises(TypeError):
        delays.round_robin(2.5, 10)


def test_every_constructor_returns_a_validated_schedule():
    for sched in (
        delays.constant(2, 6),
        delays.round_robin(3, 7),
        delays.gamma_timed(3, 50, batch_size=8, seed=0),
        delays.make_schedule("gamma", 2, 20, straggler_fraction=0.5, straggler_slowdown=3.0),
    ):
        assert sched.validate() is sched
