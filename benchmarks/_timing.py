"""Interleaved step timings for the GPT benchmarks: every round times each variant once, in a
rotating order, so load on the machine falls on all variants alike."""

from __future__ import annotations

import time
from typing import Any

import jax


def interleaved(runs: dict[str, dict[str, Any]], rounds: int, steps: int) -> dict[str, list[float]]:
    """Seconds per step, per round, of each variant of ``runs``: ``{"step", "carry", "x",
    "y"}`` with ``step(*carry, x, y) -> (*carry, loss)`` (donating its carry, which is updated
    in place in ``runs``)."""
    names = list(runs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for k in range(rounds):
        for n in names[k % len(names) :] + names[: k % len(names)]:
            r = runs[n]
            t0 = time.perf_counter()
            for _ in range(steps):
                *carry, loss = r["step"](*r["carry"], r["x"], r["y"])
                r["carry"] = tuple(carry)
            jax.block_until_ready(loss)
            times[n].append((time.perf_counter() - t0) / steps)
    return times
