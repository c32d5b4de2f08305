"""jaxstale.localsgd.schedule: synchronous rounds and asynchronous arrivals as data."""

import numpy as np
import pytest

from jaxstale.localsgd import asynchronous, synchronous


def test_synchronous_rounds_give_each_worker_its_own_batches():
    s = synchronous(3, 4, 5)
    assert s.num_updates == 4 and s.synchronous and s.staleness.tolist() == [0] * 4
    assert (
        s.worker.tolist() == [0, 1, 2] * 4
        and s.pulled.tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    )
    assert s.first_batch.tolist() == list(range(0, 60, 5)) and s.num_batches == 60
    assert s.wall_time == 20.0


def test_asynchronous_arrivals_pull_at_arrival_and_use_batches_in_start_order():
    s = asynchronous(4, 40, 6, seed=1)
    assert s.num_updates == 40 and not s.synchronous
    last = {}
    for t in range(40):  # a worker's next job starts from the version after its arrival
        w = int(s.worker[t])
        assert s.pulled[t] == last.get(w, -1) + 1 if w in last else s.pulled[t] == 0
        last[w] = t
    assert np.all(np.diff(s.finish_time) >= 0) and np.all(s.start_time <= s.finish_time)
    firsts = sorted(
        zip(s.start_time, s.worker, s.first_batch, strict=True)
    )  # batches follow start order
    assert [int(f) for *_, f in firsts] == sorted(int(f) for f in s.first_batch)
    assert set(np.diff(sorted(s.first_batch.tolist()))) == {6}
    assert abs(float(s.staleness[8:].mean()) - 3.0) < 0.5  # about M − 1


def test_stragglers_arrive_less_often_and_dylu_shortens_their_jobs():
    kw = {"seed": 0, "straggler_fraction": 0.25, "straggler_slowdown": 4.0}
    plain = asynchronous(4, 60, 8, **kw)
    counts = np.bincount(plain.worker, minlength=4)
    assert counts[0] < counts[1:].min() / 2  # worker 0 is the straggler
    dylu = asynchronous(4, 60, 8, dynamic=True, **kw)
    assert set(dylu.steps[dylu.worker == 0].tolist()) == {2}
    assert set(dylu.steps[dylu.worker != 0].tolist()) == {8} and dylu.inner_steps == 8
    assert np.bincount(dylu.worker, minlength=4)[0] > counts[0]  # it arrives as often as others
    assert dylu.name == "dylu"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: synchronous(0, 1, 1), "num_workers must be >= 1"),
        (lambda: synchronous(1, 1, 0), "inner_steps must be >= 1"),
        (lambda: asynchronous(2, 3, 1, seed=0, straggler_slowdown=0.5), "straggler_slowdown"),
        (lambda: asynchronous(2, 3, 1, seed=-1), "seed must be >= 0"),
    ],
)
def test_bad_input_is_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_synchronous_round_waits_for_its_slowest_worker():
    plain = synchronous(4, 5, 10)
    timed = synchronous(4, 5, 10, seed=0, straggler_fraction=0.25, straggler_slowdown=3.0)
    for k in ("worker", "pulled", "first_batch", "steps"):  # the times change nothing else
        assert np.array_equal(getattr(plain, k), getattr(timed, k))
    assert plain.wall_time == 50.0
    assert 5 * 10 * 3 * 0.9 < timed.wall_time < 5 * 10 * 3 * 1.1  # the straggler's pace
    rounds = timed.finish_time.reshape(5, 4)
    assert np.all(rounds == rounds[:, :1]) and np.all(np.diff(rounds[:, 0]) > 0)
    with pytest.raises(ValueError, match="straggler_slowdown"):
        synchronous(4, 5, 10, seed=0, straggler_slowdown=0.5)
