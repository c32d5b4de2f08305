"""Async workers: how test error degrades with the number of asynchronous workers, per method.

Question: with M workers pushing gradients to a parameter server, each gradient is about M − 1
updates stale (gamma-timed workers, ALGORITHMS.md §1). How much does plain ASGD lose as M grows,
and how much do the mitigations recover — SSGD (synchronous, no staleness), the staleness-aware
learning rate, DC-ASGD (constant and adaptive λ), Gap-Aware, DANA and DANA-DC?

Setting: :func:`jaxstale.asyncdp.run` (exact emulation, or the mesh executor), digits + MLP by
default, batch 32, SGD with momentum 0.9 and without momentum, 3 seeds. **Budget = samples**:
every method sees the same number of mini-batches (``epochs`` passes over the training set);
ASGD-type methods apply one update per mini-batch, SSGD applies one update per M mini-batches
(``1/M`` as many updates, effective batch ``M·B``), as in the DC-ASGD paper's per-epoch
comparison. A seed fixes the initial weights, the data order and the worker timing, so all
methods and worker counts see
the same data stream. ``sgd`` is the 1-worker reference; at M = 1 every other method reduces to
it (except DANA, which then is Nesterov-like momentum). Methods (``method`` in summary.json):
sgd, ssgd, asgd, sa-asgd, dc-asgd-c, dc-asgd-a, gap-aware, dana, dana-dc, plus any name added
with :func:`jaxstale.asyncdp.register_method` and passed with ``--methods``.

Speed: one executable per (method, momentum) serves every worker count and seed (the
emulator's traced hyper-parameters and fixed snapshot capacity), lanes run vmapped (MLP) or
sequentially (conv models on the CPU); SSGD compiles once per M.

Outputs (run folder): summary.json rows (method, workers, momentum, seed, lr, delay,
final_test_accuracy, final_test_error, diverged, diverged_step, mean_staleness, max_staleness,
staleness_counts, updates, epochs, ...), table.md (rows = methods, columns = M, cells = test
error % mean ± std and, in brackets, the change vs 1-worker SGD; "diverged" when every seed
diverged — the DC-ASGD / LC-ASGD papers' layout), plot.png (learning curves),
error_vs_workers.png, staleness_hist.png, staleness.json (staleness counts per M).
The learning curves are drawn at M = 16 (or the largest M run), momentum 0.9 (the largest).

Run: ``python -m experiments.async_workers [--quick] [--out DIR] [--methods a,b] [--delay D]``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxstale import asyncdp, data, delays, runs

from .common import lanes_for, make_delay, run_row, seed_mode

EXPERIMENT = "async_workers"
DEFAULT_METHODS = (
    "sgd",
    "ssgd",
    "asgd",
    "sa-asgd",
    "dc-asgd-c",
    "dc-asgd-a",
    "gap-aware",
    "dana",
    "dana-dc",
    "lc-asgd",
    "lc-asgd-async-bn",
)
ONE_WORKER = ("sgd",)  # methods that only run with M = 1
KEY = ("method", "workers", "momentum", "seed")  # the fields of a cell key


# ----------------------------------------------------------------------------- the experiment


def config_from_args(args: Any) -> dict[str, Any]:
    quick = bool(args.quick)
    methods = args.methods.split(",") if args.methods else list(DEFAULT_METHODS)
    unknown = [m for m in methods if m not in asyncdp.METHODS]
    if unknown:
        raise SystemExit(
            f"unknown method(s) {unknown}; registered: {', '.join(asyncdp.method_names())}"
        )
    workers = [int(w) for w in args.workers.split(",")] if args.workers else None
    momenta = [float(m) for m in args.momentum.split(",")] if args.momentum else None
    return {
        "dataset": args.dataset,
        "model": (args.model or ["mlp"])[0],
        "model_kw": {},
        "methods": methods,
        "workers": workers or ([1, 4, 16] if quick else [1, 4, 8, 16, 32]),
        "momentum": momenta or ([0.9] if quick else [0.0, 0.9]),
        "lr": {"0.9": args.lr, "other": args.lr_no_momentum},
        "seeds": args.seeds or 3,
        "batch_size": args.batch_size,
        "epochs": args.epochs or (8 if quick else 12),
        "steps": args.steps,
        "delay": args.delay,
        "straggler_fraction": args.straggler_fraction,
        "straggler_slowdown": args.straggler_slowdown,
        "warmup_epochs": args.warmup_epochs,
        "seed_mode": args.seed_mode,
        "executor": args.executor,
    }


def lr_for(cfg: dict[str, Any], momentum: float) -> float:
    return float(cfg["lr"]["0.9"] if momentum > 0 else cfg["lr"]["other"])


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    keys = []
    for mu in cfg["momentum"]:
        for method in cfg["methods"]:
            for m in cfg["workers"]:
                if method in ONE_WORKER and m != 1:
                    continue
                for seed in range(cfg["seeds"]):
                    keys.append({"method": method, "workers": m, "momentum": mu, "seed": seed})
    return keys


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    """All pending cells of one (method, momentum): one emulate_async call (per M for SSGD)."""
    method, mu = keys[0]["method"], keys[0]["momentum"]
    b = cfg["batch_size"]
    spe = len(ds.x_train) // b
    updates = cfg["steps"] or cfg["epochs"] * spe
    lr = lr_for(cfg, mu)
    is_sync = _mode(method, lr, mu) == "sync"
    parts = (
        [[k for k in keys if k["workers"] == m] for m in sorted({k["workers"] for k in keys})]
        if is_sync
        else [keys]
    )
    out: dict[int, tuple[dict, list]] = {}
    for part in parts:
        t0 = time.perf_counter()
        scheds = [
            make_delay(
                cfg["delay"],
                k["workers"],
                updates,
                batch_size=b,
                seed=k["seed"],
                straggler_fraction=cfg["straggler_fraction"],
                straggler_slowdown=cfg["straggler_slowdown"],
            )
            for k in part
        ]
        apply, ps, ss, xs, ys = lanes_for(
            ds,
            cfg["model"],
            cfg["model_kw"],
            b,
            [(k["seed"], s) for k, s in zip(part, scheds, strict=True)],
        )
        res = asyncdp.run(
            apply,
            method,
            ps,
            ss,
            scheds,
            xs,
            ys,
            learning_rate=lr,
            momentum=mu,
            warmup_steps=cfg["warmup_epochs"] * spe,
            x_test=ds.x_test,
            y_test=ds.y_test,
            eval_every=spe,
            vmap=seed_mode(cfg["model"], cfg["seed_mode"]),
            executor=cfg["executor"],
        )
        wall = (time.perf_counter() - t0) / len(part)
        for k, r in zip(part, res, strict=True):
            extra = {
                "lr": lr,
                "delay": cfg["delay"],
                "batch_size": b,
                "epochs": updates / spe,
                "model": cfg["model"],
                "dataset": cfg["dataset"],
                "warmup_epochs": cfg["warmup_epochs"],
                "wall_s": wall,
            }
            if is_sync:
                extra["delay"] = "sync"
            out[id(k)] = run_row(r, spe, extra)
    return [out[id(k)] for k in keys]


def _mode(method: str, lr: float, mu: float) -> str:
    return asyncdp.build_method(method, asyncdp.HParams(lr, mu, 1)).mode


# ----------------------------------------------------------------------------- table and plots


def _errors(rows: list[dict], method: str, m: int, mu: float) -> list[Any]:
    return [
        r["final_test_error"]
        for r in rows
        if r["method"] == method and r["workers"] == m and r["momentum"] == mu
    ]


def make_table(rows: list[dict], cfg: dict[str, Any]) -> str:
    """Test error % (mean ± std over seeds) per method and M, with the change vs 1-worker SGD."""
    parts = []
    budget = f"{cfg['steps']} batches" if cfg["steps"] else f"{cfg['epochs']} epochs"
    for mu in cfg["momentum"]:
        ref_vals = [v for v in _errors(rows, "sgd", 1, mu) if v is not None]
        ref = float(np.mean(ref_vals)) if ref_vals else None
        body = []
        for method in cfg["methods"]:
            cells = []
            for m in cfg["workers"]:
                vals = _errors(rows, method, m, mu)
                if not vals:
                    cells.append("–")
                    continue
                text = runs.format_mean_std(vals, scale=100.0, digits=1)
                ok = [v for v in vals if v is not None and math.isfinite(v)]
                if ok and ref is not None and not (method == "sgd" and m == 1):
                    text += f" ({100 * (np.mean(ok) - ref):+.1f})"
                cells.append(text)
            body.append([method, *cells])
        title = (
            f"**Test error % (mean ± std over {cfg['seeds']} seeds; in brackets: change vs "
            f"1-worker SGD), momentum {mu}, lr {lr_for(cfg, mu)}, {cfg['delay']} delays, "
            f"{cfg['model']} on {cfg['dataset']}, equal samples ({budget})**"
        )
        parts.append(
            title
            + "\n\n"
            + runs.markdown_table(["method", *(f"M={m}" for m in cfg["workers"])], body)
        )
    return "\n\n".join(parts) + "\n"


def make_figures(rows: list[dict], metrics_of: Callable[[dict], list], cfg: dict) -> dict:
    from matplotlib.figure import Figure

    figs: dict[str, Any] = {}
    mu_main = max(cfg["momentum"])
    m_big = 16 if 16 in cfg["workers"] else max(cfg["workers"])  # where methods differ most
    series: dict[str, list] = {}
    for r in rows:
        if r["momentum"] != mu_main:
            continue
        if r["workers"] == m_big or (r["method"] in ONE_WORKER and r["workers"] == 1):
            label = r["method"] if r["method"] in ONE_WORKER else f"{r['method']} (M={m_big})"
            series.setdefault(label, []).append(metrics_of(r) or [])
    figs["plot"] = runs.curves_figure(
        series,
        x="epoch",
        ys=("train_loss", "test_accuracy"),
        title=f"Learning curves, momentum {mu_main}, {cfg['delay']} delays",
    )

    fig = Figure(figsize=(5.5 * len(cfg["momentum"]), 4), layout="constrained")
    axes = fig.subplots(1, len(cfg["momentum"]), squeeze=False)[0]
    for ax, mu in zip(axes, cfg["momentum"], strict=True):
        for method in cfg["methods"]:
            xs, ys, xd = [], [], []
            for m in cfg["workers"]:
                vals = [v for v in _errors(rows, method, m, mu) if v is not None]
                if vals:
                    xs.append(m)
                    ys.append(100 * float(np.mean(vals)))
                elif _errors(rows, method, m, mu):
                    xd.append(m)
            if method in ONE_WORKER and ys:
                ax.axhline(ys[0], color="k", ls="--", lw=1, label=f"{method} (1 worker)")
                continue
            (line,) = ax.plot(xs, ys, marker="o", label=method)
            if xd:
                ax.plot(xd, [100] * len(xd), "x", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers M")
        ax.set_ylabel("final test error % (x: diverged)")
        ax.set_title(f"momentum {mu}")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="small")
    figs["error_vs_workers"] = fig

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for m in cfg["workers"]:
        counts = staleness_counts(rows, m)
        if counts is not None and m > 1:
            ax.bar(np.arange(len(counts)), counts / counts.sum(), alpha=0.5, label=f"M={m}")
    ax.set_xlabel("staleness τ of an applied gradient")
    ax.set_ylabel("fraction of updates")
    ax.set_title(f"Staleness ({cfg['delay']} delays, asynchronous methods)")
    ax.legend(fontsize="small")
    figs["staleness_hist"] = fig
    return figs


def staleness_counts(rows: list[dict], m: int) -> np.ndarray | None:
    """Staleness histogram of all asynchronous runs with M workers (summed over seeds)."""
    total: np.ndarray | None = None
    for r in rows:
        if r["workers"] != m or r.get("delay") == "sync" or r["method"] != rows_async_ref(rows):
            continue
        c = np.asarray(r["staleness_counts"])
        if total is None:
            total = c
        else:
            n = max(len(total), len(c))
            total = np.pad(total, (0, n - len(total))) + np.pad(c, (0, n - len(c)))
    return total


def rows_async_ref(rows: list[dict]) -> str:
    """The method whose schedules the histogram shows (asgd if present)."""
    names = {r["method"] for r in rows if r.get("delay") != "sync"}
    return "asgd" if "asgd" in names else sorted(names)[0]


# ----------------------------------------------------------------------------- main


def parser() -> Any:
    p = runs.cli_parser(__doc__.splitlines()[0])
    p.add_argument("--methods", default=None, help="comma-separated method names (registered)")
    p.add_argument("--workers", default=None, help="comma-separated worker counts M")
    p.add_argument("--momentum", default=None, help="comma-separated momenta (default 0,0.9)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate with momentum")
    p.add_argument(
        "--lr-no-momentum", type=float, default=0.1, help="learning rate without momentum"
    )
    p.add_argument("--epochs", type=int, default=None, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--delay", default="gamma", choices=delays.DELAY_MODELS)
    p.add_argument("--straggler-fraction", type=float, default=0.0)
    p.add_argument("--straggler-slowdown", type=float, default=1.0)
    p.add_argument("--warmup-epochs", type=int, default=0, help="lr warm-up from lr/M (DANA: 5)")
    p.add_argument("--seed-mode", default="auto", choices=("auto", "vmap", "sequential"))
    p.add_argument(
        "--executor",
        default="emulate",
        choices=asyncdp.EXECUTORS,
        help="emulate: one device (exact emulation); mesh: workers on a 'data' device axis "
        "(same results). On a CPU, emulate devices with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=8",
    )
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the sweep (resuming finished cells); returns ``{"rows", "paths", "table"}``."""
    t0 = time.perf_counter()
    args = parser().parse_args(argv)
    cfg = config_from_args(args)
    ds = data.load(cfg["dataset"])
    run = runs.RunFolder(EXPERIMENT, cfg, out=args.out)
    keys = _cells(cfg)
    rows = run.run_grouped(
        keys, lambda ks: _run_group(cfg, ds, ks), vary=("seed", "workers"), desc=EXPERIMENT
    )
    table = make_table(rows, cfg)
    figs = make_figures(rows, lambda r: run.metrics({k: r[k] for k in KEY}), cfg)
    counts = {
        str(m): c.tolist() for m in cfg["workers"] if (c := staleness_counts(rows, m)) is not None
    }
    runs.atomic_write_text(run.path / "staleness.json", json.dumps(counts) + "\n")
    paths = run.report(table, figs, num_runs=len(rows), started=t0)
    return {"rows": rows, "paths": paths, "table": table}


if __name__ == "__main__":
    main()
