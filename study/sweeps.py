"""Figures of the main configurations, drawn from their committed rows: validation accuracy
against the learning rate per method (one panel per staleness level: is each selected rate
inside its grid?), and test accuracy against the staleness at one learning rate for every
method. Both are rebuilt with the report from ``study/claims/rows/`` (no run folder needed).
Matplotlib ``Figure`` objects only; legends beside the axes
(:func:`experiments.runs.finish_figure`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments import runs

from .core import Context, chance_if_needed, selected
from .figures import copy_figure, save_png

__all__ = ["ALT", "MAIN", "STALENESS", "rate_figure", "section", "staleness_figure", "sweep_rows"]

#: the configurations these figures are drawn for (with their learning curves, ``plot.png``)
MAIN = ("async", "pipeline")

#: the staleness variable of a run's rows -> its axis label
STALENESS = {
    "workers": "M, asynchronous workers",
    "stages": "N, pipeline stages",
    "delay": "d, delay in updates",
}

#: the alt text of each figure of the section, by file stem
ALT = {
    "val-vs-lr": "validation accuracy vs learning rate per method",
    "acc-vs-staleness": "test accuracy vs staleness at one rate",
    "plot": "learning curves at the selected rates",
}

_VAL, _TEST = "final_val_accuracy", "final_test_accuracy"


def sweep_rows(ctx: Context, name: str) -> tuple[list[dict[str, Any]], str | None]:
    """A run's rows with a method and a rate (of its first model when several were run, at
    momentum 0.9 when several momenta were) and its staleness variable (None: not a sweep these
    figures draw)."""
    rows = [r for r in ctx.rows(name) if "method" in r and "lr" in r]
    var = next((k for k in STALENESS if rows and all(k in r for r in rows)), None)
    models = list(dict.fromkeys(r["model"] for r in rows if "model" in r))
    if len(models) > 1:
        rows = [r for r in rows if r.get("model") == models[0]]
    moms = list(dict.fromkeys(r["momentum"] for r in rows if "momentum" in r))
    if moms:
        mu = 0.9 if 0.9 in moms else moms[0]
        rows = [r for r in rows if r.get("momentum") == mu]
    try:  # the configuration's method order: the styles of the experiment's own figures
        order = list(ctx.config(name).get("methods") or [])
    except (FileNotFoundError, KeyError, ValueError):
        order = []
    rank = {m: i for i, m in enumerate(order)}
    rows.sort(key=lambda r: rank.get(r["method"], len(rank)))
    return rows, var


def _best_lam(group: Sequence[dict[str, Any]], chance: float) -> list[dict[str, Any]]:
    """The rows of the λ (LC-ASGD) best on validation; every row when there is no λ."""
    lams = list(dict.fromkeys(r.get("lam") for r in group))
    if len(lams) < 2:
        return list(group)
    subs = {lam: [r for r in group if r.get("lam") == lam] for lam in lams}
    return subs[runs.stats.best(subs, _VAL, chance)]


def _levels(rows: Sequence[dict[str, Any]], var: str) -> list[Any]:
    return sorted({r[var] for r in rows})


def _xscale(ax: Any, xs: Sequence[float], ticks: bool = False) -> None:
    """A log axis (base 2 for counts; symlog with a 0); ``ticks``: one plain tick per value."""
    if xs and min(xs) > 0:
        ax.set_xscale("log", base=2 if all(float(x).is_integer() for x in xs) else 10)
    elif xs:
        ax.set_xscale("symlog", linthresh=1.0)
    if ticks and xs:
        ax.set_xticks(list(xs), [f"{x:g}" for x in xs], rotation=45 if len(xs) > 4 else 0)
        ax.minorticks_off()


def rate_figure(name: str, rows: list[dict[str, Any]], var: str, *, smoke: bool = False) -> Any:
    """Validation accuracy (%) against the learning rate, one line per method and one panel
    per staleness level; a diverged seed counts at chance (the selection's score); a star
    marks the rate selected on validation."""
    from matplotlib.figure import Figure

    levels = _levels(rows, var)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    chance = chance_if_needed(rows)
    fig = Figure(figsize=(2.0 + 3.6 * len(levels), 4.2), layout="constrained")
    axes = fig.subplots(1, len(levels), squeeze=False, sharey=True)[0]
    for ax, level in zip(axes, levels, strict=True):
        for m in methods:
            group = [r for r in rows if r["method"] == m and r[var] == level]
            if not group:
                continue
            lrs = sorted({r["lr"] for r in group})
            ys = [
                100
                * runs.stats.score(
                    _best_lam([r for r in group if r["lr"] == lr], chance), _VAL, chance
                )
                for lr in lrs
            ]
            style = runs.method_style(m, methods)
            (line,) = ax.plot(lrs, ys, label=m, **style)
            pick = selected(group)
            if pick and pick[0]["lr"] in lrs:
                y = ys[lrs.index(pick[0]["lr"])]
                ax.plot(pick[0]["lr"], y, marker="*", markersize=15, color=line.get_color(),
                        markeredgecolor="black", linestyle="none", zorder=5)  # fmt: skip
        if chance:
            ax.axhline(100 * chance, color="0.5", linestyle=":", linewidth=1)
        _xscale(ax, sorted({r["lr"] for r in rows}), ticks=True)
        symbol = STALENESS[var].split(",")[0]
        ax.set_title(f"{symbol} = {level:g}" if isinstance(level, float | int) else str(level))
        ax.set_xlabel("learning rate")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy (%)")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    axes[-1].legend(handles, labels, fontsize="small")
    title = (
        f"{name}: validation accuracy vs learning rate per method, one panel per "
        f"{STALENESS[var].split(',')[0]} (mean over seeds, a diverged seed at chance, "
        f"{100 * chance:.3g} % dotted; ★ the rate selected on validation)"
    )
    fig.suptitle("\n".join(textwrap.wrap(title, 120)), fontsize="medium")
    return runs.finish_figure(fig, smoke=smoke)


def _reference(methods: Sequence[str]) -> str:
    return next((m for m in ("sgd", "sync") if m in methods), methods[0])


def staleness_figure(
    name: str, rows: list[dict[str, Any]], var: str, *, smoke: bool = False
) -> Any:
    """Test accuracy (%, mean ± 95 % CI over the seeds that trained) against the staleness
    variable at one learning rate for every method: the rate selected on validation for the
    reference (1-worker SGD, else sync) over all its levels; None when it has no rate."""
    from matplotlib.figure import Figure

    methods = list(dict.fromkeys(r["method"] for r in rows))
    ref = _reference(methods)
    pick = selected([r for r in rows if r["method"] == ref])
    if not pick:
        return None
    lr = pick[0]["lr"]
    at = [r for r in rows if r["lr"] == lr]
    chance = chance_if_needed(rows)
    fig = Figure(figsize=(8.0, 4.6), layout="constrained")
    ax = fig.subplots()
    for m in methods:
        xs, ys, halves, lost = [], [], [], []
        for level in _levels([r for r in at if r["method"] == m], var):
            group = _best_lam([r for r in at if r["method"] == m and r[var] == level], chance)
            vals = [r.get(_TEST) for r in group if not r.get("diverged")]
            mean, half, n = runs.mean_ci(vals)
            if n == 0:
                lost.append(level)
                continue
            xs.append(level)
            ys.append(100 * mean)
            halves.append(100 * half if math.isfinite(half) else 0.0)
        style: dict[str, Any] = dict(runs.method_style(m, methods))
        if xs:
            runs.clipped_errorbar(ax, xs, ys, halves, label=m, capsize=3, **style)
        if lost:
            ax.plot(lost, [100 * chance] * len(lost), marker="x", color=style["color"],
                    linestyle="none", markersize=9)  # fmt: skip
    _xscale(ax, _levels(rows, var), ticks=True)
    ax.set_xlabel(STALENESS[var])
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    title = (
        f"{name}: test accuracy vs {STALENESS[var].split(',')[0]} at one learning rate for "
        f"every method ({lr:g}, selected on validation for {ref}); mean ± 95 % CI over the "
        "seeds that trained, × every seed diverged"
    )
    fig.suptitle("\n".join(textwrap.wrap(title, 90)), fontsize="medium")
    return runs.finish_figure(fig, smoke=smoke)


def section(
    ctx: Context,
    fig_dir: Path,
    figures_from: Callable[[str], Path | None],
    write: bool = True,
) -> list[str]:
    """The main configurations' section: validation accuracy vs rate, accuracy vs staleness at
    one rate (both drawn from the rows) and the experiment's learning curves (copied from the run
    folders under ``figures_from(configuration)``; None: the copy already beside the report).
    ``write`` False: the figures are built but not written (nor removed): the text alone."""
    lines = [
        "",
        '<a id="sweeps"></a>',
        "",
        "## Learning rates, staleness and learning curves",
        "",
        "The main configurations, drawn from the committed rows: validation accuracy against "
        "the learning rate per method (is each selected rate inside its grid?) and test "
        "accuracy against the staleness at one rate for every method; then the experiment's "
        "own learning curves (each method at its selected rate), copied from its run folder.",
    ]
    drawn = False
    for name in MAIN:
        made = []
        rows, var = sweep_rows(ctx, name) if ctx.has(name) else ([], None)
        for stem, make in (
            ("val-vs-lr", rate_figure),
            ("acc-vs-staleness", staleness_figure),
        ):
            path = fig_dir / f"{name}-{stem}.png"
            fig = make(name, rows, var, smoke=ctx.quick) if rows and var else None
            if fig is None:
                if path.exists() and write:
                    path.unlink()
                continue
            if write:
                fig_dir.mkdir(parents=True, exist_ok=True)
                save_png(fig, path)
            made.append((ALT[stem], path))
        curves = copy_figure(name, "plot", fig_dir, figures_from(name)) if ctx.has(name) else None
        made += [(ALT["plot"], curves)] if curves is not None else []
        if made:
            drawn = True
            lines += ["", f"### `{name}`"]
            lines += [f"\n![{name}: {alt}](claims/{p.name})" for alt, p in made]
    return lines if drawn else []
