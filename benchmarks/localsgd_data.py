"""The local-SGD emulator's data: pre-batched copies against ``data.Indexed``, one run.

A DiLoCo-family group of the claims (``diloco-lookahead`` at 6,750 inner steps per worker:
the MNIST-1D MLP, ``M = 16`` asynchronous workers with momentum look-ahead, ``H = 10``, 4
outer rates x 3 tuning seeds = 12 vmapped lanes, mini-batches of 32) used to hand the emulator
every lane's mini-batches, ``x_train[idx]``: ``L x M·steps x B`` examples, written into one host
array and copied to the device. It was killed at 19.2 GB resident on a 24 GiB machine.
``data.Indexed(x_train, idx)`` hands it one copy of the examples and the indices; each inner
step gathers its mini-batch inside the jitted outer update (bit-identical).

Measured here, in one run: the bytes each form holds (exact), the peak resident memory of a
process that builds the group's executor and runs a few outer updates (each form in its own
process, ``ru_maxrss``), and the median time of an outer update, both forms interleaved in one
process.

Run: ``python benchmarks/localsgd_data.py [--steps 6750] [--lanes 12] [--out DIR]``; prints the
table and writes it to ``<--out>/localsgd_data.md`` (default ``benchmarks/results/``). The
default size needs about 14 GiB for the copy form.
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
from jaxstale import data, localsgd, loop, models, optimizers
from jaxstale.transforms.lookahead import momentum_lookahead

FORMS = forms.FORMS
BATCH, H, LRS = 32, 10, (0.3, 0.5, 0.7, 1.0)


def group(
    ds: data.Dataset, form: str, steps: int, lanes: int, m: int
) -> tuple[loop.Executor, Any, int]:
    """The executor of one ``async-lookahead`` group on ``ds`` (``form`` data), its first state
    after one outer update, and the bytes of the data it was handed."""
    scheds = [
        localsgd.asynchronous(m, (steps // H) * m, H, seed=s % 3, straggler_fraction=0.25,
                              straggler_slowdown=2.0)
        for s in range(lanes)
    ]  # fmt: skip
    nb = max(s.num_batches for s in scheds)
    idx = np.stack(
        [
            data.batch_indices(len(ds.x_train), batch_size=BATCH, num_steps=nb, seed=s % 3)
            for s in range(lanes)
        ]
    ).astype(np.int32)
    if form == "copy":  # as the experiment built them: one host array, then the device's copy
        xb = np.empty((lanes, nb, BATCH, *ds.x_train.shape[1:]), ds.x_train.dtype)
        yb = np.empty((lanes, nb, BATCH), ds.y_train.dtype)
        for i in range(lanes):
            np.take(ds.x_train, idx[i], axis=0, out=xb[i])
            np.take(ds.y_train, idx[i], axis=0, out=yb[i])
        held = xb.nbytes + yb.nbytes
    else:
        xb, yb = data.Indexed(ds.x_train, idx), data.Indexed(ds.y_train, idx)
        held = ds.x_train.nbytes + ds.y_train.nbytes + idx.nbytes
    f = models.functional(
        models.create("mlp", input_shape=ds.x_train.shape[1:], num_classes=ds.num_classes)
    )
    inner = optimizers.per_stage("sgd", 0.03, 0.9, steps)
    la = optax.inject_hyperparams(momentum_lookahead, static_args=("horizon",))
    outer = la(learning_rate=LRS[0], momentum=0.9, horizon=m - 1)
    hp = {"outer": {"learning_rate": [LRS[i % len(LRS)] for i in range(lanes)]}}
    ex = localsgd.executor(f.apply, inner, outer, scheds, xb, yb, lanes=lanes, hyperparams=hp)
    stack = lambda t: jax.tree.map(lambda a: np.stack([a] * lanes), t)
    state = ex.init(stack(f.params), stack(f.state))
    state, _ = ex.step(state, 0)
    return ex, state, held


def peak(form: str, steps: int, lanes: int, m: int) -> dict[str, Any]:
    """Builds ``form``'s group in this process and runs 20 outer updates: bytes and peak RSS."""
    return forms.peak(*group(data.load("mnist1d"), form, steps, lanes, m))


def interleaved(steps: int, lanes: int, m: int, reps: int, rounds: int) -> dict[str, float]:
    """Median ms per outer update of each form, timed in alternating blocks of ``rounds``."""
    ds = data.load("mnist1d")
    built = {f: group(ds, f, steps, lanes, m)[:2] for f in FORMS}
    return forms.interleaved(built, reps, rounds)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6750, help="inner steps per worker")
    p.add_argument("--lanes", type=int, default=12)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--out", default=None)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--peak", choices=FORMS, help=argparse.SUPPRESS)  # the child process
    a = p.parse_args(argv)
    for name in ("steps", "lanes", "workers", "reps", "rounds"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.peak:
        res = peak(a.peak, a.steps, a.lanes, a.workers)
        print(json.dumps(res))
        return json.dumps(res)
    if a.reps * a.rounds + 21 > (a.steps // H) * a.workers:
        p.error(f"--steps {a.steps} is too few for {a.reps} x {a.rounds} timed outer updates")
    size = ["--steps", str(a.steps), "--lanes", str(a.lanes), "--workers", str(a.workers)]
    peaks = forms.child_peaks(os.path.abspath(__file__), size)
    ms = interleaved(a.steps, a.lanes, a.workers, a.reps, a.rounds)
    rows = forms.table_rows(peaks, ms)
    head = ["data", "data held (MiB)", "peak RSS (MiB)", "ms / outer update", "vs copy"]
    cmd = " ".join(["python benchmarks/localsgd_data.py", *size])
    text = (
        f"`{cmd} --reps {a.reps} --rounds {a.rounds}`, backend {jax.default_backend()}, "
        f"{os.cpu_count()} CPU cores.\n\nMNIST-1D MLP, asynchronous local SGD with momentum "
        f"look-ahead, M = {a.workers}, H = {H}, {a.lanes} lanes x {a.steps:,} inner steps per "
        f"worker (mini-batches of {BATCH}); peak RSS of a process that builds the group and "
        f"runs 20 outer updates; median of {a.reps} x {a.rounds} outer updates (the forms "
        "alternate); same losses in both forms.\n\n" + markdown_table(head, rows)
    )
    print(text)
    if not a.no_write:
        write_result("localsgd_data", text, a.out)
    return text


if __name__ == "__main__":
    main()
