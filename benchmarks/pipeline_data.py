"""The pipeline emulator's data: pre-batched copies against ``data.Indexed``, one run.

A pipeline group of the claims (``pipeline`` at 27,000 updates: the MNIST-1D MLP of width 128,
``N = 8``, 4 rates x 3 tuning seeds = 12 vmapped lanes, mini-batches of 32) used to hand the
emulator every lane's mini-batches, ``x_train[idx]``: ``L x steps x B`` examples, held as the
list of copies, their stack and the device array. ``data.Indexed(x_train, idx)`` hands it one
copy of the examples and the indices; the round gathers its micro-batches (bit-identical).

Measured here, in one run: the bytes each form holds (exact), the peak resident memory of a
process that builds the group's executor and runs a few rounds (each form in its own process,
``ru_maxrss``), and the median time of a round, both forms interleaved in one process.

Run: ``python benchmarks/pipeline_data.py [--steps 27000] [--lanes 12] [--out DIR]``; prints
the table and writes it to ``<--out>/pipeline_data.md`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np
import optax

from benchmarks import _data_forms as forms
from benchmarks._results import write as write_result
from experiments.runs import markdown_table
from jaxstale import data, loop, models, pipeline, schedules

FORMS = forms.FORMS
BATCH, WIDTH, LR = 32, 128, 0.01


def group(
    ds: data.Dataset, form: str, steps: int, lanes: int, n: int
) -> tuple[loop.Executor, Any, int]:
    """The executor of one vanilla group on ``ds`` (MNIST-1D; ``form`` data), its first carry
    after one round, and the bytes of the data it was handed."""
    nx = len(ds.x_train)
    idx = np.stack(
        [
            data.batch_indices(nx, batch_size=BATCH, num_steps=steps, seed=s % 3)
            for s in range(lanes)
        ]
    )
    if form == "copy":
        pairs = [(ds.x_train[i], ds.y_train[i]) for i in idx]  # as the experiment built them
        xb, yb = (np.stack([p[j] for p in pairs]) for j in (0, 1))
        held = xb.nbytes + yb.nbytes
    else:
        xb, yb = data.Indexed(ds.x_train, idx), data.Indexed(ds.y_train, idx)
        held = ds.x_train.nbytes + ds.y_train.nbytes + idx.nbytes
    m = models.create(
        "mlp", input_shape=ds.x_train.shape[1:], num_classes=10, hidden=(WIDTH,) * (n - 1)
    )
    stages = models.functional_stages(m, n)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=LR, momentum=0.9)
    sched = schedules.one_f_one_b(n, steps)
    hp = {"learning_rate": [LR] * lanes}
    ex = pipeline.make(
        "emulate", stages, sched, "vanilla", tx, xb, yb, lanes=lanes, hyperparams=hp, momentum=0.9
    )
    stack = lambda t: jax.tree.map(lambda a: np.stack([a] * lanes), t)
    carry = ex.init([stack(s.params) for s in stages], [stack(s.state) for s in stages])
    carry, _ = ex.step(carry, 0)
    return ex, carry, held


def peak(form: str, steps: int, lanes: int, n: int) -> dict[str, Any]:
    """Builds ``form``'s group in this process and runs 20 rounds: its bytes and peak RSS."""
    return forms.peak(*group(data.load("mnist1d"), form, steps, lanes, n))


def interleaved(steps: int, lanes: int, n: int, reps: int, rounds: int) -> dict[str, float]:
    """Median ms per round of each form, timed in alternating blocks of ``rounds``."""
    ds = data.load("mnist1d")
    built = {f: group(ds, f, steps, lanes, n)[:2] for f in FORMS}
    return forms.interleaved(built, reps, rounds)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=27000)
    p.add_argument("--lanes", type=int, default=12)
    p.add_argument("--stages", type=int, default=8)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--out", default=None)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--peak", choices=FORMS, help=argparse.SUPPRESS)  # the child process
    a = p.parse_args(argv)
    for name in ("steps", "lanes", "stages", "reps", "rounds"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.peak:
        res = peak(a.peak, a.steps, a.lanes, a.stages)
        print(json.dumps(res))
        return json.dumps(res)
    if a.reps * a.rounds + 21 > a.steps:
        p.error(f"--steps {a.steps} is too few for {a.reps} x {a.rounds} timed rounds")
    size = ["--steps", str(a.steps), "--lanes", str(a.lanes), "--stages", str(a.stages)]
    peaks = forms.child_peaks(os.path.abspath(__file__), size)
    ms = interleaved(a.steps, a.lanes, a.stages, a.reps, a.rounds)
    rows = forms.table_rows(peaks, ms)
    head = ["data", "data held (MiB)", "peak RSS (MiB)", "ms / round", "vs copy"]
    cmd = " ".join(["python benchmarks/pipeline_data.py", *size])
    text = (
        f"`{cmd} --reps {a.reps} --rounds {a.rounds}`, backend {jax.default_backend()}, "
        f"{os.cpu_count()} CPU cores.\n\nMNIST-1D MLP (width {WIDTH}), N = {a.stages}, vanilla "
        f"1F1B, {a.lanes} lanes x {a.steps:,} mini-batches of {BATCH}; peak RSS of a process "
        f"that builds the group and runs 20 rounds; median of {a.reps} x {a.rounds} rounds "
        "(the forms alternate); same losses in both forms.\n\n" + markdown_table(head, rows)
    )
    print(text)
    if not a.no_write:
        write_result("pipeline_data", text, a.out)
    return text


if __name__ == "__main__":
    main()
