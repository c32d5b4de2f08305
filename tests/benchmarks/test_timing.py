"""benchmarks/_timing.py: every variant timed each round, in a rotating order; a step's
carry threaded through its calls."""

import jax.numpy as jnp

from benchmarks import _timing


def test_rotating_calls_each_variant_steps_times_a_round_in_a_rotating_order():
    order = []
    calls = {n: (lambda n=n: order.append(n)) for n in ("a", "b", "c")}
    times = _timing.rotating(calls, rounds=3, steps=2)
    assert {n: len(t) for n, t in times.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for ts in times.values() for t in ts)
    firsts = order[::6]  # each round: 3 variants × 2 steps
    assert firsts == ["a", "b", "c"]


def test_interleaved_threads_each_steps_carry():
    step = lambda w, x, y: (w + x, jnp.sum(w))
    runs = {"s": {"step": step, "carry": (jnp.zeros(2),), "x": jnp.ones(2), "y": None}}
    times = _timing.interleaved(runs, rounds=2, steps=3)
    assert len(times["s"]) == 2
    assert runs["s"]["carry"][0].tolist() == [6.0, 6.0]
