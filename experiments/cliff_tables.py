"""delay_cliff's stability rule, tables and figures: which rates are stable at each delay
(:func:`stable_rates`, judged on validation against the method's best at d = 0), the largest
stable rate, the rate selected on validation, the paper-rate check, the validation grid; heat
maps of the validation metric and the largest stable rate against d. A language model's
``task`` reads losses in nats (lower is better) and leaves out the paper-rate check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxstale import tasks

from . import runs
from .common import title
from .reports import edge_notes, tuned_tables

CLAIM_LRS = (0.01, 0.001)  # Jain et al.'s two rates

# ----------------------------------------------------------------------------- stability


def _group(rows: Sequence[dict], method: str, d: int, lr: float) -> list[dict]:
    return [r for r in rows if r["method"] == method and r["delay"] == d and r["lr"] == lr]


def _val(per: Sequence[dict], chance_acc: float, task: tasks.Task | None = None) -> float:
    """Mean final validation metric of a group of seeds (accuracy; a text: loss), diverged
    seeds at chance (``chance_acc``: ``1 / C``, or ``log V`` nats)."""
    return runs.stats.score(per, tasks.or_default(task).final("val"), chance_acc)


def d0_reference(
    rows: Sequence[dict], method: str, chance_acc: float, task: tasks.Task | None = None
) -> tuple[float, float] | None:
    """The method's best mean validation metric at d = 0 over the grid (the highest accuracy,
    the lowest loss), and its rate (None: no d = 0 rows)."""
    rows = [r for r in rows if not r.get("extended")]  # the configured grid
    rates = sorted({r["lr"] for r in rows if r["method"] == method and r["delay"] == 0})
    sign = 1.0 if tasks.or_default(task).higher_is_better else -1.0
    scored = [(_val(_group(rows, method, 0, lr), chance_acc, task), lr) for lr in rates]
    return max(scored, key=lambda vl: (sign * vl[0], vl[1])) if scored else None


def _within(value: float, ref: float, tolerance: float, task: tasks.Task | None) -> bool:
    """``value`` is at most ``tolerance`` worse than ``ref``."""
    if tasks.or_default(task).higher_is_better:
        return value >= ref - tolerance - 1e-12
    return value <= ref + tolerance + 1e-12


def stable_rates(
    rows: Sequence[dict], *, tolerance: float, chance_acc: float, task: tasks.Task | None = None
) -> dict[tuple[str, int], list[float]]:
    """The stable learning rates of every (method, d), ascending.

    η is stable at d when no seed diverged at (d, η) and the seeds' mean *validation* accuracy
    there is ≥ the method's best d = 0 mean validation accuracy − ``tolerance``
    (:func:`d0_reference`); for a language model's ``task``, the mean validation loss is ≤ the
    best d = 0 loss + ``tolerance`` nats. Test data is never read; the rates an edge extension
    added (rows with ``extended``) are not part of the cliff.
    """
    rows = [r for r in rows if not r.get("extended")]
    out: dict[tuple[str, int], list[float]] = {}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for method in methods:
        ref = d0_reference(rows, method, chance_acc, task)
        mine = [r for r in rows if r["method"] == method]
        for d in sorted({r["delay"] for r in mine}):
            ok = []
            for lr in sorted({r["lr"] for r in mine if r["delay"] == d}):
                per = _group(rows, method, d, lr)
                if ref is None or any(r["diverged"] for r in per):
                    continue
                if _within(_val(per, chance_acc, task), ref[0], tolerance, task):
                    ok.append(lr)
            out[(method, d)] = ok
    return out


def largest_stable_lr(
    rows: Sequence[dict],
    method: str,
    d: int,
    *,
    tolerance: float,
    chance_acc: float,
    task: tasks.Task | None = None,
) -> float | None:
    """The largest stable grid rate of ``method`` at delay ``d`` (None: none is stable)."""
    kw = {"tolerance": tolerance, "chance_acc": chance_acc, "task": task}
    ok = stable_rates(rows, **kw).get((method, d), [])
    return max(ok) if ok else None


# ----------------------------------------------------------------------------- tables and plots


def _test_cell(per: Sequence[dict], task: tasks.Task | None = None) -> str:
    t = tasks.or_default(task)
    return runs.format_ci(
        [r.get(t.final("test")) for r in per],
        scale=t.scale,
        digits=t.digits,
        diverged=[bool(r["diverged"]) for r in per],
    )


def _words(task: tasks.Task | None, tol: float) -> dict[str, str]:
    """The metric's words in the tables: accuracy in % and points, a loss in nats."""
    if tasks.or_default(task).higher_is_better:
        return {
            "metric": "accuracy",
            "unit": "%",
            "label": "accuracy %",
            "stable": f"the mean validation accuracy is at most {100 * tol:g} points below",
            "ref": "≥",
        }
    return {
        "metric": "loss",
        "unit": "nats",
        "label": "loss (nats)",
        "stable": f"the mean validation loss is at most {tol:g} nats above",
        "ref": "≤",
    }


def make_table(
    rows: list[dict], cfg: dict[str, Any], chance_acc: float, task: tasks.Task | None = None
) -> tuple[str, dict[tuple[str, int], list[float]], dict]:
    """The tables (markdown), the stable rates and the rates selected on validation (a
    language model's ``task``: losses in nats, lower is better, no paper-rate check)."""
    tol = cfg["tolerance"]
    t, w = tasks.or_default(task), _words(task, tol)
    stable = stable_rates(rows, tolerance=tol, chance_acc=chance_acc, task=task)
    top = max(cfg["lrs"])
    setting = (
        f"momentum {cfg['momentum']}, {cfg['model']} on {cfg['dataset']} (standardised; "
        f"validation split for every decision), batch {cfg['batch_size']}, {cfg['steps']} "
        f"updates, {cfg['seeds']} seeds"
    )
    dcols = [f"d={d}" for d in cfg["delays"]]

    body, refs = [], []
    for method in cfg["methods"]:
        ref = d0_reference(rows, method, chance_acc, task)
        if ref is not None:
            bound = ref[0] - tol if t.higher_is_better else ref[0] + tol
            refs.append(
                f"{method}: {t.scale * ref[0]:.{t.digits}f} {w['unit']} at lr {ref[1]:g} → "
                f"stable means {w['ref']} {t.scale * bound:.{t.digits}f} {w['unit']}"
            )
        cells = []
        for d in cfg["delays"]:
            ok = stable.get((method, d), [])
            if not ok:
                cells.append("none")
                continue
            lr = max(ok)
            mark = "≥ " if lr == top else ""
            cells.append(f"{mark}{lr:g}: {_test_cell(_group(rows, method, d, lr), task)}")
        body.append([method, *cells])
    stable_md = runs.markdown_table(["method", *dcols], body)

    acc, ttime, _, selected = tuned_tables(
        rows,
        index=("method",),
        columns="delay",
        chance_acc=chance_acc,
        col_label=lambda d: f"d={d}",
        value=t.final("test"),
        task=task,
    )

    claim = []
    if "asgd" in cfg["methods"] and t.higher_is_better:  # the paper's rates are MNIST's
        for lr in CLAIM_LRS:
            if lr in cfg["lrs"]:
                claim.append(
                    [
                        f"asgd, lr {lr:g}",
                        *(_test_cell(_group(rows, "asgd", d, lr)) for d in cfg["delays"]),
                    ]
                )
    claim_md = runs.markdown_table(["", *dcols], claim) if claim else ""
    lim = cfg.get("extend_edges", 0)
    by, lrs = ("method", "delay"), cfg["lrs"]
    edges = edge_notes(rows, by=by, grid=lrs, limit=lim, chance_acc=chance_acc, task=task)

    grid = []
    for method in cfg["methods"]:
        for d in cfg["delays"]:
            cells = []
            for lr in cfg["lrs"]:
                per = _group(rows, method, d, lr)
                if not per:
                    cells.append("–")
                    continue
                div = sum(bool(r["diverged"]) for r in per)
                text = f"{t.scale * _val(per, chance_acc, task):.{t.digits}f}"
                text = f"**{text}**" if lr in stable.get((method, d), []) else text
                cells.append(text + (f" [{div}/{len(per)} div.]" if div else ""))
            grid.append([method, str(d), *cells])
    grid_md = runs.markdown_table(["method", "delay d", *(f"lr {lr:g}" for lr in cfg["lrs"])], grid)

    parts = [
        title(
            cfg,
            f"**Largest stable learning rate per delay d, with its test {w['label']} "
            f"(mean ± 95 % CI over seeds). Stable at d: no seed diverged and "
            f'{w["stable"]} the method\'s best at d = 0; "≥": the top of the grid, the cliff '
            f"lies beyond it. {setting}**",
        ),
        stable_md,
        f"Best d = 0 validation {w['metric']} (the reference): " + "; ".join(refs) + ".",
        f"**Test {w['label']} at the rate selected on validation per (method, d) "
        f"(mean ± 95 % CI over seeds that trained; [diverged/seeds]; @ selected lr), "
        f"{setting}**",
        acc,
        f"**Updates until the validation {w['metric']} first reaches "
        f"{t.scale * cfg['target']:g} {w['unit']} at the selected rate (median over seeds; "
        f"[reached/seeds])**",
        ttime,
        *([edges] if edges else []),
    ]
    if claim_md:
        parts += [
            "**Claim check (Jain et al.: at lr 0.01 d = 0 trains and d ≥ 4 diverges; at lr "
            "0.001 every d ≤ 8 trains): ASGD's test accuracy % at the paper's rates (mean ± 95 % "
            "CI over seeds that trained; [diverged/seeds])**",
            claim_md,
        ]
    parts += [
        f"**Validation {w['label']} per (method, d, lr) (mean over seeds, diverged "
        f"seeds at chance; bold: stable)**",
        grid_md,
    ]
    return "\n\n".join(parts) + "\n", stable, selected


def make_figures(
    rows: list[dict],
    cfg: dict[str, Any],
    stable: dict,
    chance_acc: float,
    task: tasks.Task | None = None,
) -> dict[str, Any]:
    """The heat maps of the validation metric (delay × rate per method) and the largest stable
    rate against d. A loss's colour scale runs from the best cell to ``log V`` (the uniform
    model), reversed so that better is brighter, as for an accuracy."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    t, w = tasks.or_default(task), _words(task, cfg["tolerance"])
    figs: dict[str, Any] = {}
    n = len(cfg["methods"])
    fig = Figure(figsize=(3.6 * n + 1, 3.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    im = None
    for ax, method in zip(axes, cfg["methods"], strict=True):
        grid = np.full((len(cfg["delays"]), len(cfg["lrs"])), np.nan)
        div = np.zeros_like(grid, dtype=bool)
        for i, d in enumerate(cfg["delays"]):
            for j, lr in enumerate(cfg["lrs"]):
                per = _group(rows, method, d, lr)
                if per:
                    grid[i, j] = t.scale * _val(per, chance_acc, task)
                    div[i, j] = any(r["diverged"] for r in per)
        if t.higher_is_better:
            lims = {"cmap": "viridis", "vmin": 0, "vmax": 100}
        else:
            low = float(np.nanmin(grid)) if np.isfinite(grid).any() else 0.0
            lims = {"cmap": "viridis_r", "vmin": min(low, chance_acc), "vmax": chance_acc}
        im = ax.imshow(grid, origin="lower", aspect="auto", **lims)
        mid = (lims["vmin"] + lims["vmax"]) / 2
        for i, d in enumerate(cfg["delays"]):
            for j, lr in enumerate(cfg["lrs"]):
                v = grid[i, j]
                if np.isnan(v):
                    continue
                text = (f"{v:.0f}" if t.higher_is_better else f"{v:.2f}") + (
                    "x" if div[i, j] else ""
                )
                dark = v < mid if t.higher_is_better else v > mid
                color = "w" if dark else "k"
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
                if lr in stable.get((method, d), []):
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
        ax.set_xticks(range(len(cfg["lrs"])), [f"{lr:g}" for lr in cfg["lrs"]], rotation=45)
        ax.set_yticks(range(len(cfg["delays"])), [str(d) for d in cfg["delays"]])
        ax.set_xlabel("learning rate")
        ax.set_ylabel("delay d")
        ax.set_title(method if method != "asgd" else "asgd (no mitigation)")
    if im is not None:
        fig.colorbar(im, ax=list(axes), label=f"mean final validation {w['label']}")
    within = (
        f"{100 * cfg['tolerance']:g} points" if t.higher_is_better else f"{cfg['tolerance']:g} nats"
    )
    fig.suptitle(
        f"Delay cliff: momentum {cfg['momentum']}, {cfg['steps']} updates, {cfg['seeds']} seeds "
        f"(red frame: stable, within {within} of the best d = 0; x: a seed diverged)"
    )
    figs["plot"] = fig

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    xs = np.array([max(d, 0.5) for d in cfg["delays"]])  # d = 0 drawn at 0.5 on the log axis
    mid = (n - 1) / 2
    for i, method in enumerate(cfg["methods"]):
        ys = [max(stable.get((method, d), []), default=np.nan) for d in cfg["delays"]]
        shift = 2 ** (0.06 * (i - mid))  # methods side by side: equal values stay visible
        ax.plot(xs * shift, ys, label=method, **runs.method_style(method, cfg["methods"]))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(d) for d in cfg["delays"]])
    ax.set_yticks(cfg["lrs"], [f"{lr:g}" for lr in cfg["lrs"]])
    ax.minorticks_off()
    ax.set_xlabel("constant delay d")
    ax.set_ylabel("largest stable learning rate (grid)")
    ax.axhline(max(cfg["lrs"]), color="grey", ls=":", lw=1)
    ax.set_title("Largest stable lr (dotted: grid top; gaps: none stable)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    figs["stable_lr"] = fig
    return figs
