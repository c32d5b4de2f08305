"""Pipeline runtime on a ``"stage"`` mesh: time per mini-batch and measured schedule efficiency.

For ``N = 2, 4, 8`` stages (one device each) this times, on the same MLP and mini-batches,

* **unsplit** — the whole model on one device: a plain jitted, donated SGD-momentum step;
* **naive model parallelism** — stages on different devices, one micro-batch, no overlap:
  GPipe with ``M = 1`` on the mesh;
* **GPipe** with ``M = 1, 2, 4, 8, 16`` micro-batches (the same mini-batch cut into ``M``
  parts), policy ``sync``;
* **asynchronous 1F1B** (PipeDream; policy ``stash``, one micro-batch = the mini-batch),

all through ``jaxstale.pipeline.make("mesh", ...)``, one jitted tick per host-loop iteration.
The variants of one ``N`` are timed interleaved (``--reps`` repetitions of ``--chunk`` rounds
each, in rotating order; one round = one mini-batch in the steady state): the table gives the
median time per mini-batch and the median of the per-repetition ratios to the unsplit step.

**Schedule efficiency** is measured on the devices: the executor state's ``busy`` counter (ticks
each device spent on F or B) read before and after the timed steady-state rounds, divided by
``N`` × their ticks (and over the whole run). Theory: GPipe ``M / (M + N − 1)`` (bubble
``(N − 1)/(M + N − 1)``); asynchronous 1F1B 1 in the steady state, ``nb / (nb + N − 1)`` over a
run of ``nb`` mini-batches. "ideal" is the time per mini-batch on ``N`` devices of their own
with balanced stages, F and B of equal length and free communication, relative to the unsplit
step: ``(M + N − 1) / (M · N)`` for GPipe, ``1 / N`` for 1F1B. The loss stage's forward is a
scheduled (busy) tick in which the mesh executor does nothing: it is fused into its backward.

On the CPU, ``--xla_force_host_platform_device_count=8`` emulates the devices (set here before
jax is imported, only when the user chose no platform other than the CPU and no jax GPU/TPU
plugin is installed); they share the machine's cores, so the pipeline cannot beat the unsplit
step here: the efficiency and the shape of the curve are the claim, the times context. On a GPU
backend the script says so and the times are GPU times (``N`` above the device count is
skipped).

Plot (``--plot PATH``; default ``<--out>/pipeline_runtime.png`` or
``benchmarks/results/pipeline_runtime.png``): left, time per mini-batch / unsplit step against
``M`` (log 2), measured (solid, one colour per ``N``) with the ideal bubble curve
``(M + N − 1)/(M·N)`` (dashed) and 1F1B (dotted); right, the measured efficiency (markers) on
the theory ``M / (M + N − 1)`` (lines).

Run: ``python benchmarks/pipeline_runtime.py [--quick] [--out DIR] [--plot PATH]``.

Results of the default run (2-core shared CPU, 8 emulated devices, N = 2, 4, 8):
``benchmarks/results/pipeline_runtime.md`` and ``.png``, quoted in docs/benchmarks.md.

References:
    Huang et al., "GPipe", NeurIPS 2019, arXiv:1811.06965 (bubble ``(N − 1)/(M + N − 1)``).
    Narayanan et al., "PipeDream", SOSP 2019 (1F1B steady state).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _host_devices

_host_devices.emulate()  # before jax is imported


import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from experiments.runs import markdown_table  # noqa: E402
from jaxstale import make_mesh, models, pipeline, schedules  # noqa: E402
from jaxstale.losses import cross_entropy  # noqa: E402

LR, MU = 0.01, 0.9
HERE = os.path.dirname(os.path.abspath(__file__))


def build_model(width: int, seed: int = 0) -> Any:
    """The MLP: ``width`` inputs, 8 hidden layers of ``width`` (ReLU), 10 classes: 9 blocks,
    split into ``N = 2, 4, 8`` stages of equal size (the last also holds the head)."""
    return models.create(
        "mlp", input_shape=(width, 1, 1), num_classes=10, hidden=(width,) * 8, seed=seed
    )


COLUMNS = (
    "N",
    "variant",
    "M",
    "ticks / mini-batch",
    "efficiency (measured)",
    "efficiency (theory)",
    "whole run (measured)",
    "whole run (theory)",
    "ms / mini-batch",
    "x unsplit",
    "ideal x unsplit",
)


class Unsplit:
    """The whole model on one device: a plain jitted, donated SGD-momentum step."""

    name = "unsplit (1 device)"

    def __init__(self, model: Any, xb: np.ndarray, yb: np.ndarray):
        f = models.functional(model)
        tx = optax.sgd(LR, MU)
        dev = jax.devices()[0]

        def step(p, o, x, y):
            lv, g = jax.value_and_grad(lambda p: cross_entropy(f.apply(p, f.state, x, True)[0], y))(
                p
            )
            u, o = tx.update(g, o, p)
            return optax.apply_updates(p, u), o, lv

        self.step = jax.jit(step, donate_argnums=(0, 1))
        p = jax.device_put(jax.tree.map(jnp.array, f.params), dev)
        self.state = [p, tx.init(p)]
        self.batches = [jax.device_put((x, y), dev) for x, y in zip(xb, yb, strict=True)]
        self.i = 0
        self.chunk(1)  # compile

    def chunk(self, k: int) -> tuple[float, int]:
        """``k`` steps; (seconds, mini-batches)."""
        t = time.perf_counter()
        for _ in range(k):
            p, o, _ = self.step(*self.state, *self.batches[self.i % len(self.batches)])
            self.state = [p, o]
            self.i += 1
        jax.block_until_ready(self.state)
        return time.perf_counter() - t, k


class OnMesh:
    """One pipeline run on the mesh, advanced chunk by chunk through its steady-state rounds."""

    def __init__(
        self,
        name: str,
        stages: list,
        sched: schedules.Schedule,
        policy: str,
        xb: np.ndarray,
        yb: np.ndarray,
        mesh: Any,
    ):
        self.name, self.n, self.m = name, sched.num_stages, sched.num_micro
        self.prog = pipeline.compile(sched, policy)
        tx = optax.sgd(LR, MU)
        self.ex = pipeline.make("mesh", stages, self.prog, None, tx, xb, yb, mesh=mesh, momentum=MU)
        self.state = self.ex.init([s.params for s in stages], [s.state for s in stages])
        valid = np.flatnonzero(self.prog.tables["valid"].all(axis=1))
        self.r, self.last = 0, int(valid[-1]) + 1  # steady state: rounds with no masked op
        self.advance(max(int(valid[0]), 1))  # warm-up rounds (the first compiles)
        self.busy0 = self.busy()
        self.r0 = self.r

    def busy(self) -> np.ndarray:
        """Ticks each device spent on F or B so far (read from the devices)."""
        return np.asarray(jax.device_get(self.state.busy)).reshape(-1)

    def advance(self, k: int) -> int:
        """Run ``k`` rounds; the mini-batches they completed."""
        done = 0
        for _ in range(k):
            self.state, stats = self.ex.step(self.state, self.r)
            done += int(np.sum(stats.updates))
            self.r += 1
        jax.block_until_ready(self.state)
        return done

    def chunk(self, k: int) -> tuple[float, int]:
        """``k`` steady-state rounds; (seconds, mini-batches)."""
        if self.r + k > self.last:
            raise RuntimeError(f"{self.name}: out of steady-state rounds")
        t = time.perf_counter()
        done = self.advance(k)
        return time.perf_counter() - t, done

    def finish(self) -> dict[str, int]:
        """Busy and all stage-ticks over the timed steady-state rounds, then over the whole run
        (the rest of the run is advanced untimed)."""
        busy = int((self.busy() - self.busy0).sum())
        ticks = self.n * (self.r - self.r0) * self.prog.period
        self.advance(self.prog.num_rounds - self.r)
        whole = int(self.busy().sum())
        return {
            "busy": busy,
            "stage_ticks": ticks,
            "run_busy": whole,
            "run_stage_ticks": self.n * self.prog.schedule.num_ticks,
        }


def _num_batches(make_sched, rounds: int, policy: str) -> int:
    """The fewest mini-batches whose run has ``rounds`` steady-state rounds after a warm-up."""
    nb = rounds + 1
    while True:
        valid = np.flatnonzero(pipeline.compile(make_sched(nb), policy).tables["valid"].all(axis=1))
        if len(valid) and valid[-1] + 1 - max(int(valid[0]), 1) >= rounds:
            return nb
        nb += 1


def bench_n(
    n: int, model: Any, micros: list[int], batch: int, reps: int, chunk: int, policy: str
) -> list[dict[str, Any]]:
    """Every variant for ``N = n``, timed interleaved; one row per variant."""
    stages = models.functional_stages(model, n)
    mesh = make_mesh(n, "stage")
    hw = (model.blocks[0].linear.in_features, 1, 1)
    need = reps * chunk
    nb_max = max(
        _num_batches(lambda nb: schedules.one_f_one_b(n, nb), need, policy),
        _num_batches(lambda nb: schedules.gpipe(n, nb, 1), need, "sync"),
    )
    rng = np.random.default_rng(n)
    xb = rng.normal(size=(nb_max, batch, *hw)).astype(np.float32)
    yb = rng.integers(0, 10, (nb_max, batch)).astype(np.int32)
    variants: list[Any] = [Unsplit(model, xb, yb)]
    for m in micros:
        nb = _num_batches(lambda nb, m=m: schedules.gpipe(n, nb, m), need, "sync")
        name = "naive MP (GPipe M=1)" if m == 1 else f"GPipe M={m}"
        variants.append(
            OnMesh(name, stages, schedules.gpipe(n, nb, m), "sync", xb[:nb], yb[:nb], mesh)
        )
    nb = _num_batches(lambda nb: schedules.one_f_one_b(n, nb), need, policy)
    variants.append(
        OnMesh(
            f"1F1B ({policy})",
            stages,
            schedules.one_f_one_b(n, nb),
            policy,
            xb[:nb],
            yb[:nb],
            mesh,
        )
    )
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for rep in range(reps):  # interleaved, rotating order: load drifts hit every variant alike
        for i in range(len(variants)):
            v = variants[(i + rep) % len(variants)]
            sec, done = v.chunk(chunk)
            times[v.name].append(sec / done)
    base = np.asarray(times[variants[0].name])
    rows = []
    for v in variants:
        t = np.asarray(times[v.name])
        row: dict[str, Any] = dict.fromkeys(COLUMNS, "-")
        row.update(
            N=n,
            variant=v.name,
            kind="unsplit",
            **{
                "ms / mini-batch": 1e3 * float(np.median(t)),
                "x unsplit": float(np.median(t / base)),
            },
        )
        row["ideal x unsplit"] = 1.0
        if isinstance(v, OnMesh):
            eff = v.finish()
            m, nb = v.m, v.prog.schedule.num_batches
            gpipe = v.prog.schedule.name == "gpipe"
            row["kind"] = v.prog.schedule.name
            row["M"] = m
            row["ticks / mini-batch"] = v.prog.period
            row.update(eff)
            row["efficiency (measured)"] = eff["busy"] / eff["stage_ticks"]
            row["efficiency (theory)"] = m / (m + n - 1) if gpipe else 1.0
            row["whole run (measured)"] = eff["run_busy"] / eff["run_stage_ticks"]
            row["whole run (theory)"] = m / (m + n - 1) if gpipe else nb / (nb + n - 1)
            row["ideal x unsplit"] = (m + n - 1) / (m * n) if gpipe else 1.0 / n
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""

    def fmt(c: str, v: Any) -> str:
        if not isinstance(v, float):
            return str(v)
        if c == "ms / mini-batch":
            return f"{v:.1f}"
        return f"{v:.3f}" if "efficiency" in c or "whole" in c else f"{v:.2f}"

    return markdown_table(COLUMNS, [[fmt(c, r[c]) for c in COLUMNS] for r in rows])


def tick_fit(rows: list[dict[str, Any]], n: int) -> tuple[float, float] | None:
    """Least-squares ``ms / mini-batch ≈ a · ticks / mini-batch + b`` over GPipe's ``M`` for
    ``N = n``: ``(a, b)``, the cost of a tick and of the rest (``None`` below 2 points)."""
    gp = [r for r in rows if r["N"] == n and r["kind"] == "gpipe"]
    if len({r["ticks / mini-batch"] for r in gp}) < 2:
        return None
    t = np.asarray([r["ticks / mini-batch"] for r in gp], float)
    y = np.asarray([r["ms / mini-batch"] for r in gp], float)
    a, b = np.polyfit(t, y, 1)
    return float(a), float(b)


def plot(rows: list[dict[str, Any]], path: str | None = None) -> Any:
    """Three panels: time per mini-batch / unsplit step against ``M`` with the ideal bubble
    curve; the measured efficiency on the theory; ms per mini-batch against ticks per
    mini-batch with the linear fit. A matplotlib ``Figure``, saved to ``path`` if given."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4))
    ax_t, ax_e, ax_k = fig.subplots(1, 3)
    ns = sorted({r["N"] for r in rows})
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    for i, n in enumerate(ns):
        c = palette[i % len(palette)]
        gp = sorted((r for r in rows if r["N"] == n and r["kind"] == "gpipe"), key=lambda r: r["M"])
        if not gp:
            continue
        ms = np.asarray([r["M"] for r in gp], float)
        mm = np.geomspace(ms.min(), ms.max(), 64)
        ax_t.plot(ms, [r["x unsplit"] for r in gp], "o-", color=c, label=f"N={n} GPipe, measured")
        ax_t.plot(
            mm, (mm + n - 1) / (mm * n), "--", color=c, lw=1, label=f"N={n} ideal (M+N-1)/(MN)"
        )
        for r in rows:
            if r["N"] == n and r["kind"] == "1f1b":
                ax_t.axhline(r["x unsplit"], color=c, ls=":", lw=1.2, label=f"N={n} 1F1B, measured")
        ax_e.plot(mm, mm / (mm + n - 1), "-", color=c, lw=1, label=f"N={n} theory M/(M+N-1)")
        ax_e.plot(
            ms, [r["efficiency (measured)"] for r in gp], "o", color=c, label=f"N={n} measured"
        )
        ticks = np.asarray([r["ticks / mini-batch"] for r in gp], float)
        ax_k.plot(
            ticks, [r["ms / mini-batch"] for r in gp], "o", color=c, label=f"N={n} GPipe M=1.."
        )
        fit = tick_fit(rows, n)
        if fit is not None:
            ax_k.plot(
                ticks,
                fit[0] * ticks + fit[1],
                "-",
                color=c,
                lw=1,
                label=f"N={n}: {fit[0]:.1f} ms/tick {fit[1]:+.0f} ms",
            )
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batches per mini-batch M")
        ax.grid(alpha=0.3)
    ax_t.axhline(1.0, color="black", lw=0.8)
    ax_t.set_yscale("log", base=2)
    ax_t.set_ylabel("time per mini-batch / unsplit step")
    ax_t.set_title(f"time per mini-batch on the mesh ({jax.default_backend()})")
    ax_t.legend(fontsize=6)
    ax_e.set_ylim(0, 1.05)
    ax_e.set_ylabel("busy stage-ticks / all stage-ticks")
    ax_e.set_title("schedule efficiency (busy counters)")
    ax_e.legend(fontsize=6)
    ax_k.set_xlabel("ticks per mini-batch 2(M+N-1)")
    ax_k.set_ylabel("ms per mini-batch")
    ax_k.set_title("cost per tick (GPipe)")
    ax_k.grid(alpha=0.3)
    ax_k.legend(fontsize=6)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: N=2, a tiny MLP")
    ap.add_argument("--stages", default=None, help="comma-separated N (default 2,4,8)")
    ap.add_argument("--micro", default=None, help="GPipe micro-batch counts (default 1,2,4,8,16)")
    ap.add_argument("--width", type=int, default=None, help="MLP width (default 512)")
    ap.add_argument("--batch", type=int, default=None, help="mini-batch size (default 512)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default 5)")
    ap.add_argument("--chunk", type=int, default=None, help="rounds per repetition (default 1)")
    ap.add_argument("--policy", default="stash", help="the 1F1B weight policy")
    ap.add_argument("--out", default=None, help="folder for the table, rows and plot")
    ap.add_argument("--plot", default=None, help="plot path (default <out>/pipeline_runtime.png)")
    args = ap.parse_args(argv)
    q = args.quick
    stages = [int(v) for v in (args.stages or ("2" if q else "2,4,8")).split(",")]
    micros = [int(v) for v in (args.micro or ("1,2,4" if q else "1,2,4,8,16")).split(",")]
    width = args.width or (64 if q else 512)
    batch = args.batch or (16 if q else 512)
    reps, chunk = args.reps or (2 if q else 5), args.chunk or 1
    if any(batch % m for m in micros):
        raise SystemExit(f"--batch {batch} must be divisible by every M in {micros}")
    backend, ndev = jax.default_backend(), jax.device_count()
    out_dir = args.out or os.path.join(HERE, "results")
    plot_path = args.plot or os.path.join(out_dir, "pipeline_runtime.png")
    t0 = time.perf_counter()
    model = build_model(width)
    rows: list[dict[str, Any]] = []
    skipped = [n for n in stages if n > ndev]
    for n in stages:
        if n <= ndev:
            rows += bench_n(n, model, micros, batch, reps, chunk, args.policy)
    md = table(rows)
    wall = time.perf_counter() - t0
    where = (
        f"{ndev} emulated CPU devices sharing {os.cpu_count()} cores"
        if backend == "cpu"
        else f"{ndev} {backend.upper()} device(s) ({jax.devices()[0].device_kind}): GPU times"
    )
    notes = [
        f"backend {backend}: {where}; MLP {width} -> 8 x {width} -> 10 "
        f"({models.param_count(model):,} parameters), mini-batch {batch}; "
        f"medians of {reps} interleaved repetitions of {chunk} round(s); total {wall:.0f} s"
    ]
    for n in sorted({r["N"] for r in rows}):
        fit = tick_fit(rows, n)
        if fit is not None:
            notes.append(
                f"N={n}: GPipe ms / mini-batch ≈ {fit[0]:.1f} ms × ticks {fit[1]:+.0f} ms "
                "(least squares over M)"
            )
    if skipped:
        hint = (
            " (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=8)" if backend == "cpu" else ""
        )
        notes.append(f"skipped N = {skipped}: more stages than the {ndev} device(s){hint}")
    print(md)
    print("\n" + "\n".join(notes))
    if rows:
        os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)
        plot(rows, plot_path)
        print(f"plot: {plot_path}")
    if args.out:
        with open(os.path.join(args.out, "pipeline_runtime.md"), "w") as f:
            f.write(md + "\n\n" + "\n".join(notes) + "\n")
        with open(os.path.join(args.out, "pipeline_runtime.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return {"rows": rows, "markdown": md, "notes": notes, "plot": plot_path, "seconds": wall}


if __name__ == "__main__":
    main()
