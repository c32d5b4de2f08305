"""Mesh pipeline executor vs single-device emulator: time per mini-batch and schedule efficiency.

For ``N = 2, 4, 8`` stages on emulated CPU devices (``--xla_force_host_platform_device_count``,
set here before jax is imported) this runs the same MLP, data and schedule through

* the mesh executor (``jaxstale.pipeline.make("mesh", ...)``) — one device per stage,
  ``shard_map`` + ``ppermute``, one jitted tick per host-loop iteration, and
* the emulator (``jaxstale.pipeline.make("emulate", ...)``) — everything on one device, one
  jitted round per iteration; both run the same compiled program,

and reports the wall time per mini-batch of each (after a warm-up run that compiles) and the
**schedule efficiency** measured on the mesh: busy stage-ticks (F or B, counted on the devices)
over all stage-ticks, against the theory — GPipe ``M / (M + N − 1)`` (the bubble), asynchronous
1F1B ``→ 1`` in the steady state (reported over the whole run, whose warm-up and cool-down cost
``N − 1`` ticks each, and over the steady-state window from stage 0's first backward to its
last forward).

On the CPU the emulated devices share the machine's cores, so the mesh executor cannot be faster
than the emulator here: the efficiency figures are the claim, the times are context (on GPUs
each stage gets its own device).

Run: ``python benchmarks/mesh_pipeline.py [--stages 2,4,8] [--micro 4] [--batches 4]``.

References:
    Huang et al., "GPipe", NeurIPS 2019 (bubble fraction ``(N − 1)/(M + N − 1)``).
    Narayanan et al., "PipeDream", SOSP 2019 (1F1B steady state).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import argparse
import time

import jax
import numpy as np
import optax

from jaxstale import make_mesh, models, pipeline, schedules


def steady_efficiency(s: schedules.Schedule) -> float:
    """Busy fraction from stage 0's first backward to its last forward (1F1B's steady state)."""
    t0 = int(s.micro_bwd_tick[0, 0, 0])
    t1 = int(s.micro_fwd_tick[-1, -1, 0]) + 1
    if t1 <= t0:
        return float("nan")
    return float((s.table[t0:t1] != 0).mean())


def _run(ex, stages) -> object:
    """One whole run of an executor, round by round; returns the final state."""
    state = ex.init([st.params for st in stages], [st.state for st in stages])
    for r in range(ex.num_rounds):
        state, _stats = ex.step(state, r)
    jax.block_until_ready(state)
    return state


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    fn()
    return time.perf_counter() - t


def bench(n: int, micro: int, batches: int, mb: int, reps: int) -> list[dict]:
    """Both schedules for one ``N``; returns one row per schedule."""
    model = models.create("mlp", input_shape=(8, 8, 1), num_classes=10, hidden=(64,) * 7)
    stages = models.functional_stages(model, n)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * micro, mb, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 10, (batches * micro, mb)).astype(np.int32)
    tx, mesh = optax.sgd(0.05, momentum=0.9), make_mesh(n, "stage")
    rows = []
    for name, policy in (("gpipe", "sync"), ("1f1b", "vanilla")):
        if name == "gpipe":
            s = schedules.gpipe(n, batches, micro)
            xb = x.reshape(batches, micro * mb, 8, 8, 1)
            yb = y.reshape(batches, micro * mb)
            theory = micro / (micro + n - 1)
        else:
            s = schedules.one_f_one_b(n, batches * micro)
            xb, yb = x, y
            theory = 1.0
        on_mesh = pipeline.make("mesh", stages, s, policy, tx, xb, yb, mesh=mesh)
        emulated = pipeline.make("emulate", stages, s, policy, tx, xb, yb)
        busy = np.asarray(_run(on_mesh, stages).busy)  # compiles; busy ticks counted on devices
        t_mesh = min(_timed(lambda: _run(on_mesh, stages)) for _ in range(reps))
        _run(emulated, stages)  # compiles
        t_emu = min(_timed(lambda: _run(emulated, stages)) for _ in range(reps))
        rows.append(
            {
                "N": n,
                "schedule": name,
                "M": s.num_micro,
                "mini-batches": s.num_batches,
                "ticks": s.num_ticks,
                "mesh ms/mini-batch": 1e3 * t_mesh / 2 / s.num_batches,
                "emulator ms/mini-batch": 1e3 * t_emu / 2 / s.num_batches,
                "efficiency (measured)": float(busy.sum()) / (n * s.num_ticks),
                "steady-state (measured)": steady_efficiency(s) if name == "1f1b" else "-",
                "theory": theory,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", default="2,4,8", help="comma-separated N values")
    ap.add_argument("--micro", type=int, default=4, help="GPipe micro-batches per mini-batch M")
    ap.add_argument("--batches", type=int, default=4, help="GPipe mini-batches")
    ap.add_argument("--mb", type=int, default=16, help="micro-batch size")
    ap.add_argument("--reps", type=int, default=1, help="timed repetitions (min)")
    args = ap.parse_args(argv)
    ns = [int(v) for v in args.stages.split(",")]
    if max(ns) > jax.device_count():
        raise SystemExit(f"need {max(ns)} devices, have {jax.device_count()}")
    t0 = time.perf_counter()
    rows = []
    for n in ns:
        rows += bench(n, args.micro, args.batches, args.mb, args.reps)
    md = table(rows)
    print(md)
    print(
        f"\n{jax.device_count()} {jax.devices()[0].platform} devices sharing "
        f"{os.cpu_count()} cores; MLP 64-wide x 8 layers; 1F1B mini-batch = one micro-batch of "
        f"{args.mb}, GPipe mini-batch = {args.micro} x {args.mb}; "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    return md


if __name__ == "__main__":
    main()
