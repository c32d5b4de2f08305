"""Async-BN vs ordinary batch-norm: whose running statistics does the server evaluate with?

Question (LC-ASGD, Li et al. ICPP 2020; ALGORITHMS.md §7): in asynchronous data parallelism each
worker pulls the server's batch-norm running statistics with its weights, advances its copy with
its mini-batch and pushes it back with the gradient. With *ordinary BN* the server keeps
whatever arrives (last writer wins), so the statistics it evaluates with are an EMA along a chain
of stale copies that lags the weights by about ``M`` times the model's window. *Async-BN*
(``lc-asgd-async-bn``) instead merges each worker's batch statistics into the server's own EMA
(decay ``d``). How much test error does each policy cost as ``M`` grows, next to the statistics
the final weights really produce?

Setting: :func:`jaxstale.asyncdp.run` (exact emulation; workers hold their own
snapshots of the weights *and* of the statistics), ResNet-20 (batch-norm, option-A shortcuts)
on the embedded digits by default, gamma-timed workers, batch 32, SGD without momentum at lr
0.1, 8 epochs, 3 seeds. Methods: ``lc-asgd`` (ordinary BN) and ``lc-asgd-async-bn`` at decay
``d = 1 − m = 0.1`` (the default) and the other ``--decays``. In training mode a forward pass
normalises with its batch's own statistics, so gradients never read the running statistics: all
policies train **the same weights** (bit for bit, recorded as ``params_checksum``), and the
table isolates the statistics. The reference row *recomputed* evaluates those weights with the
statistics of the whole training set at the final weights (precise BN,
:func:`jaxstale.asyncdp.recompute_batch_stats`) — what any running-statistics policy
approximates.

Outputs (run folder): summary.json rows (method, decay, workers, seed, final_test_error,
final_test_error_recomputed, params_checksum, diverged, staleness, ...), table.md (rows =
policies + recomputed, columns = M, test error % mean ± std, in brackets the excess over the
recomputed statistics), plot.png (test error vs M per policy), curves.png (test error per epoch
at the largest M).

Run: ``python -m experiments.async_bn [--quick] [--out DIR] [--workers 1,4,8,16]
[--decays 0.02,0.3]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxstale import asyncdp, data, delays, loop, runs
from jaxstale.asyncdp.methods import LC_BN_MOMENTUM as BN_MOMENTUM
from jaxstale.asyncdp.methods import build_lc_asgd, build_lc_asgd_async_bn

from .common import lanes_for, make_delay, run_row, seed_mode

EXPERIMENT = "async_bn"
KEY = ("method", "decay", "workers", "seed")
DEFAULT_DECAY = round(1.0 - BN_MOMENTUM, 6)  # the default decay of lc-asgd-async-bn


def config_from_args(args: Any) -> dict[str, Any]:
    quick = bool(args.quick)
    workers = [int(w) for w in args.workers.split(",")] if args.workers else None
    decays = [float(d) for d in args.decays.split(",")] if args.decays else None
    if workers and min(workers) < 1:
        raise SystemExit(f"worker counts must be >= 1, got {workers}")
    all_decays = [
        DEFAULT_DECAY,
        *(decays if decays is not None else ([] if quick else [0.02, 0.3])),
    ]
    if any(not 0.0 < d <= 1.0 for d in all_decays):
        raise SystemExit(f"decays must be in (0, 1], got {all_decays}")
    return {
        "dataset": args.dataset,
        "model": (args.model or ["resnet20"])[0],
        "model_kw": {},
        "workers": workers or ([1, 16] if quick else [1, 4, 8, 16]),
        "decays": list(dict.fromkeys(all_decays)),
        "lr": args.lr,
        "momentum": args.momentum,
        "lam": args.lam,
        "seeds": args.seeds or (1 if quick else 3),
        "batch_size": args.batch_size,
        "epochs": args.epochs or (4 if quick else 8),
        "steps": args.steps,
        "delay": args.delay,
        "executor": args.executor,
    }


def _policies(cfg: dict[str, Any]) -> list[tuple[str, float | None]]:
    return [("lc-asgd", None), *(("lc-asgd-async-bn", d) for d in cfg["decays"])]


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"method": method, "decay": decay, "workers": m, "seed": seed}
        for method, decay in _policies(cfg)
        for m in cfg["workers"]
        for seed in range(cfg["seeds"])
    ]


def _builder(cfg: dict[str, Any], decay: float | None) -> Callable[[Any], Any]:
    lam = cfg["lam"]
    if decay is None:
        return lambda hp: build_lc_asgd(hp, lam=lam)
    return lambda hp: build_lc_asgd_async_bn(hp, lam=lam, decay=decay, momentum=BN_MOMENTUM)


def _checksum(params: Any) -> float:
    return float(sum(np.abs(np.asarray(p, np.float64)).sum() for p in jax.tree.leaves(params)))


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    """All pending cells of one policy: one emulator call (one compile) for every M and seed."""
    t0 = time.perf_counter()
    b = cfg["batch_size"]
    spe = len(ds.x_train) // b
    updates = cfg["steps"] or cfg["epochs"] * spe
    scheds = [
        make_delay(cfg["delay"], k["workers"], updates, batch_size=b, seed=k["seed"]) for k in keys
    ]
    apply, ps, ss, xs, ys = lanes_for(
        ds,
        cfg["model"],
        cfg["model_kw"],
        b,
        [(k["seed"], s) for k, s in zip(keys, scheds, strict=True)],
    )
    if not any(np.size(leaf) for leaf in jax.tree.leaves(ss[0])):
        raise SystemExit(f"model {cfg['model']!r} has no batch-norm statistics to compare")
    res = asyncdp.run(
        apply,
        _builder(cfg, keys[0]["decay"]),
        ps,
        ss,
        scheds,
        xs,
        ys,
        learning_rate=cfg["lr"],
        momentum=cfg["momentum"],
        x_test=ds.x_test,
        y_test=ds.y_test,
        eval_every=spe,
        vmap=seed_mode(cfg["model"], "auto"),
        executor=cfg["executor"],
    )
    wall = (time.perf_counter() - t0) / len(keys)
    out = []
    for r in res:
        row, metrics = run_row(
            r,
            spe,
            {
                "lr": cfg["lr"],
                "lam": cfg["lam"],
                "delay": cfg["delay"],
                "batch_size": b,
                "epochs": updates / spe,
                "model": cfg["model"],
                "dataset": cfg["dataset"],
                "wall_s": wall,
            },
        )
        row["final_test_error_recomputed"] = None
        row["params_checksum"] = None
        if not r.diverged:
            fresh = asyncdp.recompute_batch_stats(
                apply, r.params, r.model_state, ds.x_train, momentum=BN_MOMENTUM
            )
            acc = float(loop.accuracy(apply, r.params, fresh, ds.x_test, ds.y_test)[0])
            row["final_test_error_recomputed"] = 1.0 - acc
            row["params_checksum"] = _checksum(r.params)
        out.append((row, metrics))
    return out


# ----------------------------------------------------------------------------- table and plots


def _label(method: str, decay: float | None) -> str:
    return "lc-asgd (ordinary BN)" if decay is None else f"lc-asgd-async-bn (d={decay:g})"


def _vals(rows: list[dict], method: str, decay: float | None, m: int, field: str) -> list[Any]:
    return [
        r[field]
        for r in rows
        if r["method"] == method and r["decay"] == decay and r["workers"] == m
    ]


def make_table(rows: list[dict], cfg: dict[str, Any]) -> str:
    """Test error % per policy and M (mean ± std over seeds), excess over recomputed statistics."""
    body = []
    ref = {}
    for m in cfg["workers"]:
        vals = [
            v
            for v in _vals(rows, "lc-asgd", None, m, "final_test_error_recomputed")
            if v is not None
        ]
        ref[m] = float(np.mean(vals)) if vals else None
    for method, decay in _policies(cfg):
        cells = []
        for m in cfg["workers"]:
            vals = _vals(rows, method, decay, m, "final_test_error")
            text = runs.format_mean_std(vals, scale=100.0, digits=1) if vals else "–"
            ok = [v for v in vals if v is not None]
            if ok and ref[m] is not None:
                text += f" ({100 * (np.mean(ok) - ref[m]):+.1f})"
            cells.append(text)
        body.append([_label(method, decay), *cells])
    body.append(
        [
            "recomputed statistics (same weights)",
            *(
                runs.format_mean_std(
                    _vals(rows, "lc-asgd", None, m, "final_test_error_recomputed"), scale=100.0
                )
                for m in cfg["workers"]
            ),
        ]
    )
    budget = f"{cfg['steps']} updates" if cfg["steps"] else f"{cfg['epochs']} epochs"
    title = (
        f"**Test error % with the server's batch-norm statistics (mean ± std over {cfg['seeds']} "
        f"seeds; in brackets: excess over statistics recomputed at the final weights), "
        f"{cfg['model']} on {cfg['dataset']}, {cfg['delay']} delays, lr {cfg['lr']}, momentum "
        f"{cfg['momentum']}, λ {cfg['lam']}, {budget}**"
    )
    header = ["batch-norm policy", *(f"M={m}" for m in cfg["workers"])]
    paired = []
    for method, decay in _policies(cfg)[1:]:
        cells = []
        for m in cfg["workers"]:
            diffs = paired_differences(rows, decay, m)
            wins = sum(d > 0 for d in diffs)
            cells.append(
                f"{runs.format_mean_std(diffs, scale=1.0)} ({wins}/{len(diffs)})" if diffs else "–"
            )
        paired.append([_label(method, decay), *cells])
    note = (
        "**Paired by seed (same weights): ordinary-BN error − Async-BN error, points, mean ± std; "
        "in brackets: seeds where Async-BN is lower**"
    )
    return (
        title
        + "\n\n"
        + runs.markdown_table(header, body)
        + "\n\n"
        + note
        + "\n\n"
        + runs.markdown_table(header, paired)
        + "\n"
    )


def paired_differences(rows: list[dict], decay: float, m: int) -> list[float]:
    """Per seed (both finished): 100 × (ordinary-BN error − Async-BN error at ``decay``)."""
    ordinary = {
        r["seed"]: r["final_test_error"]
        for r in rows
        if r["method"] == "lc-asgd" and r["workers"] == m
    }
    out = []
    for r in rows:
        if r["method"] == "lc-asgd-async-bn" and r["decay"] == decay and r["workers"] == m:
            a, b = ordinary.get(r["seed"]), r["final_test_error"]
            if a is not None and b is not None:
                out.append(100.0 * (a - b))
    return out


def make_figures(rows: list[dict], metrics_of: Callable[[dict], list], cfg: dict) -> dict:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    lines = [(_label(m, d), m, d, "final_test_error") for m, d in _policies(cfg)]
    lines.append(("recomputed statistics", "lc-asgd", None, "final_test_error_recomputed"))
    for label, method, decay, field in lines:
        xs, ys = [], []
        for m in cfg["workers"]:
            ok = [v for v in _vals(rows, method, decay, m, field) if v is not None]
            if ok:
                xs.append(m)
                ys.append(100 * float(np.mean(ok)))
        ax.plot(xs, ys, marker="o", ls="--" if field.endswith("recomputed") else "-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers M")
    ax.set_ylabel("final test error %")
    ax.set_title(f"Batch-norm statistics under asynchrony ({cfg['model']}, {cfg['dataset']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    m_big = max(cfg["workers"])
    series: dict[str, list] = {}
    for r in rows:
        if r["workers"] == m_big:
            series.setdefault(_label(r["method"], r["decay"]), []).append(metrics_of(r) or [])
    curves = runs.curves_figure(
        series,
        x="epoch",
        ys=("test_accuracy",),
        title=f"Test accuracy with the server's statistics, M={m_big}",
    )
    return {"plot": fig, "curves": curves}


# ----------------------------------------------------------------------------- main


def parser() -> Any:
    p = runs.cli_parser(__doc__.splitlines()[0])
    p.add_argument("--workers", default=None, help="comma-separated worker counts M")
    p.add_argument(
        "--decays",
        default=None,
        help=f"extra Async-BN decays besides d = 1 − m = {DEFAULT_DECAY} (default 0.02,0.3)",
    )
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--lam", type=float, default=0.1, help="LC-ASGD's λ (the same for all)")
    p.add_argument("--epochs", type=int, default=None, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--delay", default="gamma", choices=delays.DELAY_MODELS)
    p.add_argument("--executor", default="emulate", choices=asyncdp.EXECUTORS)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison (resuming finished cells); returns ``{"rows", "paths", "table"}``."""
    t0 = time.perf_counter()
    args = parser().parse_args(argv)
    cfg = config_from_args(args)
    ds = data.load(cfg["dataset"])
    run = runs.RunFolder(EXPERIMENT, cfg, out=args.out)
    rows = run.run_grouped(
        _cells(cfg), lambda ks: _run_group(cfg, ds, ks), vary=("seed", "workers"), desc=EXPERIMENT
    )
    table = make_table(rows, cfg)
    figs = make_figures(rows, lambda r: run.metrics({k: r[k] for k in KEY}), cfg)
    paths = run.report(table, figs, num_runs=len(rows), started=t0)
    return {"rows": rows, "paths": paths, "table": table}


if __name__ == "__main__":
    main()
