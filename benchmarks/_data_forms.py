"""What the data-form benchmarks share (``pipeline_data``, ``localsgd_data``): an executor
handed pre-batched copies (``"copy"``) or ``data.Indexed`` (``"indexed"``), measured for its
peak memory (each form in its own child process) and its step time (both forms interleaved
in one process)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any

import jax
import numpy as np

FORMS = ("copy", "indexed")


def peak(ex: Any, state: Any, held: int, steps: int = 20) -> dict[str, Any]:
    """Runs ``steps`` more steps of ``ex`` from ``state`` (its first step done): the bytes of
    data it was handed, this process's peak RSS and the last step's mean loss."""
    for r in range(1, steps + 1):
        state, stats = ex.step(state, r)
    jax.block_until_ready(state)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"held": held, "rss": rss, "loss": float(np.mean(stats.loss))}


def interleaved(built: dict[str, tuple[Any, Any]], reps: int, rounds: int) -> dict[str, float]:
    """Median ms per step of each form's ``(executor, state after its first step)``, timed in
    alternating blocks of ``rounds``."""
    runs = {f: [ex, state, 1] for f, (ex, state) in built.items()}
    times: dict[str, list[float]] = {f: [] for f in runs}
    for _ in range(reps):
        for f, run in runs.items():
            ex, state, r = run
            t0 = time.perf_counter()
            for _ in range(rounds):
                state, _ = ex.step(state, r)
                r += 1
            jax.block_until_ready(state)
            times[f].append((time.perf_counter() - t0) / rounds * 1e3)
            run[1], run[2] = state, r
    return {f: float(np.median(v)) for f, v in times.items()}


def child_peaks(script: str, size: list[str]) -> dict[str, dict[str, Any]]:
    """Each form's :func:`peak`, measured by ``script --peak FORM`` in a process of its own;
    raises when a child fails or the two forms' losses differ."""
    peaks = {}
    for f in FORMS:
        cmd = [sys.executable, script, *size, "--peak", f]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"the {f} child failed:\n{out.stderr[-2000:]}")
        peaks[f] = json.loads(out.stdout.strip().splitlines()[-1])
    if peaks["copy"]["loss"] != peaks["indexed"]["loss"]:
        raise AssertionError(f"the two forms' losses differ: {peaks}")
    return peaks


def table_rows(peaks: dict[str, dict[str, Any]], ms: dict[str, float]) -> list[list[str]]:
    """Per form: data held and peak RSS (MiB), ms per step and the ratio to ``copy``."""
    mib = lambda b: f"{b / 2**20:,.1f}"
    return [
        [f, mib(peaks[f]["held"]), mib(peaks[f]["rss"]), f"{ms[f]:.2f}",
         f"{ms[f] / ms['copy']:.2f}x"]
        for f in FORMS
    ]  # fmt: skip
