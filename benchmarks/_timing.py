"""Interleaved step timings for the GPT benchmarks: every round times each variant once, in a
rotating order, so load on the machine falls on all variants alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax


def rotating(
    calls: dict[str, Callable[[], Any]], rounds: int, steps: int
) -> dict[str, list[float]]:
    """Wall seconds per call of each of ``calls`` (zero-argument callables), per round: every
    round calls each ``steps`` times, in an order rotated by one each round, and waits for the
    last call's result (:func:`jax.block_until_ready`; a value that is no JAX array is
    returned as it is)."""
    names = list(calls)
    times: dict[str, list[float]] = {n: [] for n in names}
    for k in range(rounds):
        for n in names[k % len(names) :] + names[: k % len(names)]:
            t0 = time.perf_counter()
            got = None
            for _ in range(steps):
                got = calls[n]()
            jax.block_until_ready(got)
            times[n].append((time.perf_counter() - t0) / steps)
    return times


def interleaved(runs: dict[str, dict[str, Any]], rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step, per round, of each variant of ``runs``: ``{"step", "carry", "x",
    "y"}`` with ``step(*carry, x, y) -> (*carry, loss)`` (donating its carry, which is updated
    in place in ``runs``), timed by :func:`rotating`."""

    def call(r: dict[str, Any]) -> Callable[[], Any]:
        def one() -> Any:
            *carry, loss = r["step"](*r["carry"], r["x"], r["y"])
            r["carry"] = tuple(carry)
            return loss

        return one

    return rotating({n: call(r) for n, r in runs.items()}, rounds, steps)
