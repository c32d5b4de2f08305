"""Learning-curve figures (matplotlib ``Figure`` objects, no pyplot or GUI backend needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["curves_figure"]


def _draw_curves(ax: Any, series: Mapping[str, Any], x: str, metric: str, log: bool) -> None:
    for label, runs in series.items():
        by_x: dict[float, list[float]] = {}
        for run in runs:
            for rec in run:
                v = rec.get(metric)
                if v is not None and math.isfinite(float(v)) and rec.get(x) is not None:
                    by_x.setdefault(float(rec[x]), []).append(float(v))
        if not by_x:
            continue
        xs = sorted(by_x)
        mean = [float(np.mean(by_x[k])) for k in xs]
        (line,) = ax.plot(xs, mean, label=label)
        if any(len(by_x[k]) > 1 for k in xs):
            lo = [min(by_x[k]) for k in xs]
            hi = [max(by_x[k]) for k in xs]
            ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    if log and ax.has_data():
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def curves_figure(
    series: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]
    | Mapping[str, Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]],
    *,
    x: str = "step",
    ys: Sequence[str] = ("train_loss", "test_accuracy"),
    title: str | None = None,
    logy: Sequence[str] = ("train_loss",),
) -> Any:
    """Learning curves: one panel per metric, one line (mean over seeds, min–max band) per label.

    Uses ``matplotlib.figure.Figure`` directly (no pyplot, no GUI backend needed).

    Args:
      series: label -> list (one per seed) of metric records (dicts with ``x`` and ``ys``); or,
        for a grid with one row of panels per group, group -> (label -> list of records).
        None/NaN values (diverged runs) are left out of the mean.
      x: the x-axis field.
      ys: the metrics, one panel (column) each.
      title: figure title.
      logy: metrics drawn on a log y-axis.

    Returns:
      A ``matplotlib.figure.Figure`` (pass it to :meth:`RunFolder.finish`).

    Example:
      >>> runs_ = [[{"step": 1, "train_loss": 2.0, "test_accuracy": 0.5},
      ...           {"step": 2, "train_loss": 1.0, "test_accuracy": 0.7}]]
      >>> fig = curves_figure({"mlp": {"lr=0.1": runs_}, "cnn": {"lr=0.1": runs_}})
      >>> len(fig.axes)
      4
    """
    from matplotlib.figure import Figure

    first = next(iter(series.values()), None)
    grouped = isinstance(first, Mapping)
    groups: Mapping[str, Any] = series if grouped else {"": series}
    fig = Figure(figsize=(4.8 * len(ys), 3.4 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(ys), squeeze=False)
    for r, (group, group_series) in enumerate(groups.items()):
        for c, metric in enumerate(ys):
            ax = axes[r][c]
            _draw_curves(ax, group_series, x, metric, metric in logy)
            if group:
                ax.set_title(f"{group}: {metric}", fontsize="medium")
        if axes[r][-1].get_legend_handles_labels()[0]:  # none when every run diverged at once
            axes[r][-1].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return fig
