"""Cost of local SGD's outer step against a job's H inner steps (issue 24: ≤ 5 % at H = 50).

One asynchronous arrival of the local-SGD emulator (``jaxstale.localsgd.executor``: the worker's
``H`` inner steps from its pulled weights, the pseudo-gradient, the outer update, the worker's
new dispatch point) against the same ``H`` inner steps alone (one jitted ``lax.scan`` of the
inner optimizer, nothing else), on the same model and mini-batches, interleaved (process CPU
time, median of the rounds' ratios with the interquartile range). The difference is what the
outer step costs: Δ, the outer optimizer (Delayed Nesterov, DiLoCo's outer Nesterov), the
copies into the worker's slots, and the schedule's bookkeeping.

Run: ``python benchmarks/localsgd_outer.py [--quick] [--out DIR]``; prints a markdown table and,
unless ``--quick``, writes it to ``<--out>/localsgd_outer.md`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks._results import write as write_result
from experiments.runs import markdown_table
from jaxstale import localsgd, loop, models
from jaxstale.losses import cross_entropy
from jaxstale.transforms.outer import delayed_nesterov, outer_nesterov

TARGET = 0.05


def _model(name: str) -> tuple[Any, tuple[int, ...], int, int]:
    if name == "mlp":
        f = models.functional(models.create("mlp", input_shape=(8, 8, 1), num_classes=10))
        return f, (8, 8, 1), 10, 32
    f = models.functional(models.create(name, input_shape=(64,), num_classes=83))
    return f, (64,), 83, 16


def _data(shape: tuple, classes: int, batch: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if shape == (64,):
        x = rng.integers(0, classes, (nb, batch, *shape)).astype(np.int32)
        return x, rng.integers(0, classes, (nb, batch, 64)).astype(np.int32)
    x = rng.normal(size=(nb, batch, *shape)).astype(np.float32)
    return x, rng.integers(0, classes, (nb, batch)).astype(np.int32)


def bench(name: str, h: int, outer: str, rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-round seconds of one arrival and of ``h`` inner steps alone."""
    f, shape, classes, batch = _model(name)
    m, arrivals = 4, rounds + 2
    sched = localsgd.asynchronous(m, arrivals, h, seed=0)
    xb, yb = _data(shape, classes, batch, sched.num_batches)
    inner = optax.adam(1e-3)
    tx = delayed_nesterov(0.7, 0.9, m) if outer == "delayed nesterov" else outer_nesterov()
    ex = localsgd.executor(f.apply, inner, tx, sched, xb, yb)
    state = ex.init(f.params, f.state)
    xs, ys = jnp.asarray(xb[:h]), jnp.asarray(yb[:h])

    def steps(p: Any, s: Any) -> tuple[Any, Any]:
        def body(c: tuple, xy: tuple) -> tuple:
            p, s = c
            g = jax.grad(lambda q: cross_entropy(f.apply(q, f.state, xy[0], True)[0], xy[1]))(p)
            u, s = inner.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        return jax.lax.scan(body, (p, s), (xs, ys))[0]

    alone = loop.jit(steps, donate_argnums=(0, 1))
    carry = jax.tree.map(lambda a: jnp.array(a, copy=True), (f.params, inner.init(f.params)))
    state, _ = ex.step(state, 0)  # compile both
    carry = alone(*carry)
    jax.block_until_ready(carry)
    t_arrival, t_alone = [], []
    for r in range(1, rounds + 1):
        t0 = time.process_time()
        state, _ = ex.step(state, r)  # ex.step reads the loss back: the arrival is done
        t_arrival.append(time.process_time() - t0)
        t0 = time.process_time()
        carry = alone(*carry)
        jax.block_until_ready(carry)
        t_alone.append(time.process_time() - t0)
    return np.asarray(t_arrival), np.asarray(t_alone)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="H = 10, few rounds (a smoke run)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--out", default=None, help="folder for the .md (not with --quick)")
    args = p.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 9)
    hs = [10] if args.quick else [10, 50]
    cases = [("mlp", "delayed nesterov"), ("gpt-tiny", "delayed nesterov")]
    cases += [] if args.quick else [("mlp", "outer nesterov"), ("gpt-cpu", "delayed nesterov")]
    rows = []
    for name, outer in cases:
        for h in hs:
            arrival, alone = bench(name, h, outer, rounds)
            over = arrival / alone - 1.0
            lo, mid, hi = np.percentile(over, [25, 50, 75])
            rows.append(
                [
                    name,
                    outer,
                    str(h),
                    f"{1e3 * np.median(alone):.2f}",
                    f"{1e3 * np.median(arrival):.2f}",
                    f"**{100 * mid:+.1f} %** ({100 * lo:+.1f} to {100 * hi:+.1f})",
                    "yes" if mid <= TARGET else "no",
                ]
            )
    head = ["model", "outer optimizer", "H", "H inner steps ms", "one arrival ms"]
    head += ["outer step / H inner steps", f"≤ {100 * TARGET:g} %"]
    text = "\n".join(
        [
            f"### Local SGD's outer step against a job's H inner steps (Adam inside, M = 4, "
            f"{jax.default_backend()}; process CPU time, medians of {rounds} interleaved rounds; "
            "interquartile range in brackets)\n",
            markdown_table(head, rows),
        ]
    )
    print(text)
    if not args.quick:
        write_result("localsgd_outer", text, args.out)
    return text


if __name__ == "__main__":
    main()
