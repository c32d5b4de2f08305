"""async_workers' tables and figures: test metric at each method's rate selected on validation,
time to target, the validation grid, the paper's table for a preset; learning curves, the
metric against M, the staleness histogram."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from jaxstale import tasks

from . import runs
from .common import title
from .presets import paper_table
from .reports import accuracy_vs, edge_notes, tuned_tables, tuning_note

ONE_WORKER = ("sgd",)  # methods that only run with M = 1
KNOB, EDGE_BY = ("lr", "lam"), ("method", "workers", "momentum")  # tuned; its grid's rows


def _fmt_knob(v: Any) -> str:
    lr, lam = v
    return f"{lr:g}" if lam is None else f"{lr:g} (λ {lam:+g})"


def make_table(
    rows: list[dict], cfg: dict[str, Any], ds_chance: float, task: tasks.Task | None = None
) -> tuple[str, dict]:
    """The test metric at the rate selected on validation, time to target, the validation grid
    (``task``: a language model's, in nats)."""
    t = tasks.or_default(task)
    m_name, label = t.label.split()[0], t.label
    target = f"≥ {100 * cfg['target']:g} %" if t.higher_is_better else f"≤ {cfg['target']:g}"
    parts, selected = [], {}
    budget = f"{cfg['updates']} mini-batches ({cfg['updates'] * cfg['batch_size']} samples)"
    for mu in cfg["momentum"]:
        sub = [r for r in rows if r["momentum"] == mu]
        acc, ttime, grid, sel = tuned_tables(
            sub,
            index=("method",),
            columns="workers",
            chance_acc=ds_chance,
            knob=KNOB,
            col_label=lambda m: f"M={m}",
            fmt_knob=_fmt_knob,
            task=task,
        )
        selected.update({(*k, mu): v for k, v in sel.items()})
        head = (
            f"momentum {mu}, {cfg['delay']} delays, {cfg['model']} on {cfg['dataset']} "
            f"({_inputs(cfg, t)}; validation split for selection), equal samples: "
            f"{budget}; "
            f"{cfg['seeds']} seeds"
        )
        parts += [
            title(
                cfg,
                f"**Test {label} at each method's learning rate selected on validation "
                f"(mean ± 95 % CI over seeds that trained; [diverged/seeds]; @ selected lr), "
                f"{head}**",
            ),
            acc,
            f"**Updates until validation {m_name} {target} at the selected "
            f"rate (median over seeds; [reached/seeds]; SSGD: its own updates, M mini-batches "
            f"each), momentum {mu}**",
            ttime,
            f"**Validation {label} per learning rate (mean over seeds, diverged seeds at "
            f"chance; bold: selected), momentum {mu}**",
            grid,
        ]
        lim, lrs = cfg.get("extend_edges", 0), cfg["lrs"][str(mu)]
        edges = edge_notes(
            sub, by=EDGE_BY, grid=lrs, limit=lim, chance_acc=ds_chance, knob=KNOB, task=task
        )
        parts += [edges] if edges else []
    parts += [note] if (note := tuning_note(cfg, task)) else []
    if cfg.get("preset"):
        mu, one = max(cfg["momentum"]), lambda meth, m: (meth in ONE_WORKER) == (m == 1)
        pick = lambda meth, m: _selected_rows(rows, selected, meth, m, mu) if one(meth, m) else None
        parts.append(paper_table(cfg, pick))
    return "\n\n".join(parts) + "\n", selected


def _selected_rows(rows: list[dict], selected: dict, method: str, m: int, mu: float) -> list[dict]:
    pick = selected.get((method, m, mu))
    return [
        r
        for r in rows
        if r["method"] == method
        and r["workers"] == m
        and r["momentum"] == mu
        and (r["lr"], r["lam"]) == pick
    ]


def make_figures(
    rows: list[dict],
    selected: dict,
    metrics_of: Callable[[dict], list],
    cfg: dict,
    task: tasks.Task | None = None,
    levels: dict[str, float] | None = None,
) -> dict:
    """The learning curves per M (a text run's with its corpus's n-gram ``levels``) and the
    metric against M per momentum."""
    from matplotlib.figure import Figure

    t = tasks.or_default(task)
    figs: dict[str, Any] = {}
    mu_main = max(cfg["momentum"])
    # one row of panels per M, each method at its own selected rate (sgd: the M = 1 reference,
    # drawn in every row)
    grid: dict[str, dict[str, list]] = {}
    for m in cfg["workers"]:
        series: dict[str, list] = {}
        for method in cfg["methods"]:
            pick = _selected_rows(rows, selected, method, 1 if method in ONE_WORKER else m, mu_main)
            if pick:
                label = f"{method} (M=1, lr {pick[0]['lr']:g})" if method in ONE_WORKER else (
                    f"{method} (lr {pick[0]['lr']:g})"
                )  # fmt: skip
                series[label] = [metrics_of(r) or [] for r in pick]
        grid[f"M={m}"] = series
    figs["plot"] = runs.curves_figure(
        grid,
        x="epoch",
        ys=("train_loss", t.key("val")),
        methods=cfg["methods"],
        title=f"Curves at each method's rate selected on validation, momentum {mu_main}, "
        f"{cfg['delay']} delays",
        footer=_footer(cfg, t),
        levels=levels,
    )

    fig = Figure(figsize=(5.5 * len(cfg["momentum"]), 4), layout="constrained")
    axes = fig.subplots(1, len(cfg["momentum"]), squeeze=False)[0]
    for ax, mu in zip(axes, cfg["momentum"], strict=True):
        for method in cfg["methods"]:
            if method in ONE_WORKER:  # one worker: a horizontal line, not a point
                pick = _selected_rows(rows, selected, method, 1, mu)
                accs = [r[t.final("test")] for r in pick if not r["diverged"]]
                mean, _, n = runs.mean_ci(accs)
                if n:
                    ax.axhline(
                        t.scale * mean, color="k", ls="--", lw=1, label=f"{method} (1 worker)"
                    )
                continue
            points = [(m, _selected_rows(rows, selected, method, m, mu)) for m in cfg["workers"]]
            accuracy_vs(ax, points, method, runs.method_style(method, cfg["methods"]), task)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cfg["workers"], [str(m) for m in cfg["workers"]])
        ax.set_xlabel("workers M")
        ax.set_ylabel(f"test {t.label} at the selected lr (x: all diverged)")
        ax.set_title(f"momentum {mu}")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="small")
    runs.add_footer(fig, _footer(cfg, t))  # below the axis labels, never over them
    figs["accuracy_vs_workers"] = fig

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


def _inputs(cfg: dict[str, Any], t: tasks.Task) -> str:
    """What the inputs are: standardised images, or a text's next-character windows."""
    if t.higher_is_better:
        return f"standardize={cfg['standardize']}"
    return "next token" if cfg["dataset"] == "tokens" else "next character"


def _footer(cfg: dict[str, Any], t: tasks.Task) -> str:
    return (
        f"{cfg['model']} on {cfg['dataset']} ({_inputs(cfg, t)}), batch "
        f"{cfg['batch_size']}, {cfg['updates']} mini-batches, {cfg['seeds']} seeds, lr grid "
        f"{cfg['lrs']}, {cfg['delay']} delays" + (" — SMOKE RUN (--quick)" if cfg["quick"] else "")
    )


def staleness_counts(rows: list[dict], m: int) -> np.ndarray | None:
    """Staleness histogram of one method's asynchronous runs with M workers (summed over seeds
    at one learning rate: the schedule does not depend on the rate)."""
    ref = rows_async_ref(rows)
    lr0 = next((r["lr"] for r in rows if r["method"] == ref), None)
    total: np.ndarray | None = None
    for r in rows:
        if r["workers"] != m or r["method"] != ref or r["lr"] != lr0 or r.get("delay") == "sync":
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
    return "asgd" if "asgd" in names or not names else sorted(names)[0]
