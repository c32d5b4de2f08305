"""What a constant delay costs per step: ``jaxstale.delayed``'s step over the synchronous one.

For a GPT preset at the embedded corpus's context (64) and vocabulary (83), batch ``B``: the
synchronous AdamW step (``jaxstale.train.make_train_step``) and the delayed step
(``jaxstale.delayed.delayed_update``) at each delay ``τ``, stale and predicted, all jitted with
donated buffers. Timings are interleaved (every round times each variant once, in a rotating
order); the table gives the median step time, its ratio to the synchronous step measured in the
same rounds (median of the per-round ratios; target ≤ 1.2: the delay should cost a read of a
stored version, not a second model), and the bytes of the ``τ + 1`` (predicted ``τ + 2``)
stored versions, from the state's arrays.

Run: ``python benchmarks/delay_overhead.py [--quick] [--preset cpu] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/<name>.py` (make bench)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._timing import interleaved
from jaxstale import delayed, models, optimizers, train

CONTEXT, VOCAB = 64, 83


def variants(delays: list[int]) -> list[tuple[str, int, bool]]:
    """``(name, τ, predict)``: the synchronous step first, then each delay stale and predicted."""
    out = [("sync", 0, False)]
    for tau in delays:
        out += [(f"τ={tau} stale", tau, False), (f"τ={tau} predicted", tau, True)]
    return out


def build(preset: str, batch: int, tau: int, predict: bool, sync: bool) -> dict[str, Any]:
    """One variant's compiled step, its carry and the bytes of its stored versions."""
    model = models.create(f"gpt-{preset}", input_shape=(CONTEXT,), num_classes=VOCAB, seed=0)
    fn = models.functional(model)
    tx = optimizers.adamw(1e-3, 1000, warmup_steps=10)
    params = jax.tree.map(jnp.array, fn.params)
    if sync:
        step, opt = train.make_train_step(fn.apply, tx), tx.init(params)
        stored = 0
    else:
        update, init = delayed.delayed_update(fn.apply, tx, tau, predict=predict)
        step, opt = jax.jit(update, donate_argnums=(0, 1, 2)), init(params)
        stored = sum(a.nbytes for a in jax.tree.leaves(opt.versions.versions))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, VOCAB, (batch, CONTEXT)), jnp.int32)
    y = jnp.asarray(rng.integers(0, VOCAB, (batch, CONTEXT)), jnp.int32)
    carry = (params, opt, fn.state)
    *carry, loss = step(*carry, x, y)  # compiles; outside the timings
    jax.block_until_ready(loss)
    return {"step": step, "carry": tuple(carry), "x": x, "y": y, "stored": stored}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu", choices=["tiny", "cpu"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--delays", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per variant per round")
    parser.add_argument("--quick", action="store_true", help="tiny preset, τ = 2, 2 × 2 steps")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.delays, args.rounds, args.steps = "tiny", [2], 2, 2
    t_start = time.perf_counter()
    names = variants(args.delays)
    runs = {n: build(args.preset, args.batch_size, t, p, n == "sync") for n, t, p in names}
    times = interleaved(runs, args.rounds, args.steps)
    rows = []
    for n, tau, predict in names:
        ratio = statistics.median(a / b for a, b in zip(times[n], times["sync"], strict=True))
        ms = round(1e3 * statistics.median(times[n]), 1)
        row = {"variant": n, "tau": tau, "predict": predict, "step_ms": ms}
        rows.append(row | {"ratio": round(ratio, 2), "stored_mib": runs[n]["stored"] / 2**20})
    lines = [
        f"gpt-{args.preset}, AdamW, batch {args.batch_size} × context {CONTEXT}, "
        f"{jax.default_backend()}, jitted + donated; {args.rounds} interleaved rounds × "
        f"{args.steps} steps.",
        "",
        "| variant | step ms (median) | over sync (same rounds) | stored versions (MiB) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['variant']} | {r['step_ms']} | {r['ratio']:.2f} | {r['stored_mib']:.1f} |"
        for r in rows
    ]
    lines += ["", f"Total wall time {time.perf_counter() - t_start:.0f} s."]
    table = "\n".join(lines)
    print(table)
    if not args.quick:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "delay_overhead.md").write_text(table + "\n")
    return {"rows": rows, "table": table}


if __name__ == "__main__":
    main()
