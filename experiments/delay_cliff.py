"""Delay cliff: the largest stable learning rate shrinks as a constant gradient delay grows.

Question (Jain et al., ICLR 2018 workshop; ALGORITHMS.md §8): with SGD + momentum 0.9 and every
gradient exactly ``d`` updates stale (``w_{t+1} = w_t − η·v_t``, ``v_t = μ v_{t−1} + g(w_{t−d})``),
which learning rates still train? Their LeNet-5/MNIST result: at η = 0.01, d = 0 reaches ≈ 99.2 %
but d ≥ 4 diverges; at η = 0.001 all d ≤ 8 train. We reproduce the shape of that cliff on the
embedded dataset, and measure how far each mitigation (staleness-aware lr, DC-ASGD-a, Gap-Aware)
moves it.

Setting: constant delay ``d ∈ {0, 1, 2, 4, 8, 16}`` (``jaxstale.delays.constant``; the first
``d`` gradients are taken at ``w_0``) × a log-spaced learning-rate grid, the digits MLP, batch
32, momentum 0.9, a fixed number of updates. One executable per method serves every (d, lr,
seed) lane. A learning rate is *stable* at delay d if it trains at d = 0 (within
``--tolerance``, 10 points, of the method's best d = 0 accuracy), no seed diverged at d, and the
final test accuracy at d is at most ``--tolerance`` below the same method and lr at d = 0
(a slower but sound run is stable; the cliff is a collapse towards chance, 10 %).

Outputs (run folder): summary.json rows (method, delay, lr, seed, final_test_accuracy,
diverged, ...), table.md (per method: the largest stable learning rate for each d, then the
accuracy grid), plot.png (heat maps of final accuracy: delay × learning rate, one panel per
method; "x" = a seed diverged).

Run: ``python -m experiments.delay_cliff [--quick] [--out DIR] [--methods a,b] [--lrs ...]``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from jaxstale import asyncdp, data, runs

from .common import lanes_for, make_delay, run_row, seed_mode

EXPERIMENT = "delay_cliff"
DEFAULT_METHODS = ("asgd", "sa-asgd", "dc-asgd-a", "gap-aware")
KEY = ("method", "delay", "lr", "seed")


def config_from_args(args: Any) -> dict[str, Any]:
    quick = bool(args.quick)
    methods = args.methods.split(",") if args.methods else list(DEFAULT_METHODS)
    unknown = [m for m in methods if m not in asyncdp.METHODS]
    if unknown:
        raise SystemExit(
            f"unknown method(s) {unknown}; registered: {', '.join(asyncdp.method_names())}"
        )
    lrs = [float(v) for v in args.lrs.split(",")] if args.lrs else None
    dl = [int(v) for v in args.delays.split(",")] if args.delays else None
    if dl and min(dl) < 0:
        raise SystemExit(f"delays must be >= 0, got {dl}")
    return {
        "dataset": args.dataset,
        "model": (args.model or ["mlp"])[0],
        "model_kw": {},
        "methods": methods,
        "delays": dl or [0, 1, 2, 4, 8, 16],
        "lrs": lrs or ([0.003, 0.01, 0.03, 0.1] if quick else [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]),
        "seeds": args.seeds or (1 if quick else 2),
        "batch_size": 32,
        "steps": args.steps or (300 if quick else 450),
        "momentum": args.momentum,
        "tolerance": args.tolerance,
        "seed_mode": args.seed_mode,
    }


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    method = keys[0]["method"]
    b, steps = cfg["batch_size"], cfg["steps"]
    spe = len(ds.x_train) // b
    t0 = time.perf_counter()
    scheds = [make_delay("constant", k["delay"] + 1, steps, batch_size=b, seed=0) for k in keys]
    apply, ps, ss, xs, ys = lanes_for(
        ds,
        cfg["model"],
        cfg["model_kw"],
        b,
        [(k["seed"], s) for k, s in zip(keys, scheds, strict=True)],
    )
    res = asyncdp.run(
        apply,
        method,
        ps,
        ss,
        scheds,
        xs,
        ys,
        learning_rate=[k["lr"] for k in keys],
        momentum=cfg["momentum"],
        x_test=ds.x_test,
        y_test=ds.y_test,
        eval_every=max(1, steps // 5),
        vmap=seed_mode(cfg["model"], cfg["seed_mode"]),
    )
    wall = (time.perf_counter() - t0) / len(keys)
    extra = {"momentum": cfg["momentum"], "model": cfg["model"], "batch_size": b, "wall_s": wall}
    return [run_row(r, spe, {**extra, "epochs": steps / spe}) for r in res]


def _acc(rows: list[dict], method: str, d: int, lr: float) -> list[Any]:
    return [
        r["final_test_accuracy"]
        for r in rows
        if r["method"] == method and r["delay"] == d and r["lr"] == lr
    ]


def _mean(vals: list[Any]) -> float | None:
    ok = [v for v in vals if v is not None]
    return float(np.mean(ok)) if ok and len(ok) == len(vals) else None


def largest_stable_lr(rows: list[dict], cfg: dict[str, Any], method: str, d: int) -> float | None:
    """The largest grid lr that trains without delay and still trains with delay ``d``.

    A grid lr *trains without delay* if the method's mean final accuracy at ``(d = 0, η)`` is
    within ``tolerance`` of its best over the grid; it is *stable at d* if, in addition, no
    seed diverged at ``(d, η)`` and the mean accuracy there is at most ``tolerance`` below
    ``(d = 0, η)``: the delay, not the lr, is what fails (at d = 0 every τ = 0-identity method
    is plain SGD).
    """
    d0 = min(cfg["delays"])
    base = {lr: _mean(_acc(rows, method, d0, lr)) for lr in cfg["lrs"]}
    best = max((v for v in base.values() if v is not None), default=None)
    if best is None:
        return None
    ok = []
    for lr in cfg["lrs"]:
        ref, m = base[lr], _mean(_acc(rows, method, d, lr))
        if ref is None or m is None or ref < best - cfg["tolerance"]:
            continue
        if m >= ref - cfg["tolerance"]:
            ok.append(lr)
    return max(ok) if ok else None


def make_table(rows: list[dict], cfg: dict[str, Any]) -> str:
    head = (
        f"**Largest stable learning rate (trains at d = 0, and the final test accuracy at d is "
        f"at most {100 * cfg['tolerance']:.0f} points below d = 0), momentum {cfg['momentum']}, "
        f"{cfg['model']} on {cfg['dataset']}, {cfg['steps']} updates**"
    )
    body = []
    for method in cfg["methods"]:
        cells = []
        for d in cfg["delays"]:
            lr = largest_stable_lr(rows, cfg, method, d)
            cells.append("none" if lr is None else f"{lr:g}")
        body.append([method, *cells])
    t1 = runs.markdown_table(["method", *(f"d={d}" for d in cfg["delays"])], body)
    body = []
    for method in cfg["methods"]:
        for d in cfg["delays"]:
            cells = [
                runs.format_mean_std(_acc(rows, method, d, lr), scale=100.0, digits=1)
                for lr in cfg["lrs"]
            ]
            body.append([method, d, *cells])
    t2 = runs.markdown_table(["method", "delay d", *(f"lr={lr:g}" for lr in cfg["lrs"])], body)
    return f"{head}\n\n{t1}\n\n**Final test accuracy % (mean ± std over seeds)**\n\n{t2}\n"


def make_figure(rows: list[dict], cfg: dict[str, Any]) -> Any:
    from matplotlib.figure import Figure

    n = len(cfg["methods"])
    fig = Figure(figsize=(3.6 * n + 1, 3.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    im = None
    for ax, method in zip(axes, cfg["methods"], strict=True):
        grid = np.full((len(cfg["delays"]), len(cfg["lrs"])), np.nan)
        for i, d in enumerate(cfg["delays"]):
            for j, lr in enumerate(cfg["lrs"]):
                m = _mean(_acc(rows, method, d, lr))
                grid[i, j] = np.nan if m is None else 100 * m
        im = ax.imshow(grid, origin="lower", cmap="viridis", vmin=0, vmax=100, aspect="auto")
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                v = grid[i, j]
                text, color = ("x", "red") if np.isnan(v) else (f"{v:.0f}", "w" if v < 60 else "k")
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
        ax.set_xticks(range(len(cfg["lrs"])), [f"{lr:g}" for lr in cfg["lrs"]], rotation=45)
        ax.set_yticks(range(len(cfg["delays"])), [str(d) for d in cfg["delays"]])
        ax.set_xlabel("learning rate")
        ax.set_ylabel("delay d")
        ax.set_title(method if method != "asgd" else "asgd (no mitigation)")
    if im is not None:
        fig.colorbar(im, ax=list(axes), label="final test accuracy %")
    fig.suptitle(f"Delay cliff: momentum {cfg['momentum']}, {cfg['steps']} updates")
    return fig


def parser() -> Any:
    p = runs.cli_parser(__doc__.splitlines()[0])
    p.add_argument("--methods", default=None, help="comma-separated method names")
    p.add_argument("--lrs", default=None, help="comma-separated learning rates")
    p.add_argument("--delays", default=None, help="comma-separated delays d")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--tolerance", type=float, default=0.10, help="stable: acc >= acc(d=0) - tol")
    p.add_argument("--seed-mode", default="auto", choices=("auto", "vmap", "sequential"))
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the sweep (resuming finished cells); returns ``{"rows", "paths", "table"}``."""
    t0 = time.perf_counter()
    args = parser().parse_args(argv)
    cfg = config_from_args(args)
    ds = data.load(cfg["dataset"])
    run = runs.RunFolder(EXPERIMENT, cfg, out=args.out)
    keys = [
        {"method": m, "delay": d, "lr": lr, "seed": s}
        for m in cfg["methods"]
        for d in cfg["delays"]
        for lr in cfg["lrs"]
        for s in range(cfg["seeds"])
    ]
    rows = run.run_grouped(
        keys, lambda ks: _run_group(cfg, ds, ks), vary=("delay", "lr", "seed"), desc=EXPERIMENT
    )
    table = make_table(rows, cfg)
    paths = run.report(table, {"plot": make_figure(rows, cfg)}, num_runs=len(rows), started=t0)
    return {"rows": rows, "paths": paths, "table": table}


if __name__ == "__main__":
    main()
