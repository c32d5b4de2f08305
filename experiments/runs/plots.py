"""Learning-curve figures and per-method styles (``Figure`` objects, no pyplot or GUI needed).

Every method keeps one colour × line style × marker combination (:func:`method_style`) across
all figures of a run, so a reader can follow it from figure to figure; ten colours alone would
give two of eleven methods the same colour.
"""

from __future__ import annotations

import hashlib
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "AXIS_LABELS",
    "NUM_STYLES",
    "SMOKE_MARK",
    "add_footer",
    "axis_label",
    "clipped_errorbar",
    "curves_figure",
    "draw_levels",
    "finish_figure",
    "method_style",
]

# matplotlib's "tab10" colours, in order
_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_LINESTYLES = ("-", "--", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")

#: Number of distinct styles: index ``i`` gets colour ``i % 10``, line style ``(i // 10) % 3``
#: and marker ``i % 7``, all distinct for ``i < 210``.
NUM_STYLES = len(_COLORS) * len(_LINESTYLES) * len(_MARKERS)


def _style_at(i: int) -> dict[str, str]:
    i %= NUM_STYLES
    return {
        "color": _COLORS[i % len(_COLORS)],
        "linestyle": _LINESTYLES[(i // len(_COLORS)) % len(_LINESTYLES)],
        "marker": _MARKERS[i % len(_MARKERS)],
    }


def method_style(name: str, names: Sequence[str] | None = None) -> dict[str, str]:
    """The colour, line style and marker of a method, the same in every figure of a run.

    Given the run's full list of method names, the i-th distinct name gets style ``i``: the
    first 210 names (:data:`NUM_STYLES`) all get distinct combinations, the first ten distinct
    colours, the first 30 distinct colour × line style pairs. Without a list (or for a name
    outside it) the style is chosen by a hash of the name: deterministic across processes,
    distinct from the listed names' styles, but two unlisted names may share one.

    Args:
      name: the method name (e.g. ``"dc-asgd-a"``).
      names: the run's method names in their order (e.g. ``cfg["methods"]``); duplicates are
        ignored.

    Returns:
      ``{"color": hex colour, "linestyle": ..., "marker": ...}``, keyword arguments of
      ``Axes.plot``.

    Example:
      >>> method_style("asgd", ["sgd", "asgd"])
      {'color': '#ff7f0e', 'linestyle': '-', 'marker': 's'}
      >>> method_style("sgd") == method_style("sgd")
      True
      >>> names = [f"m{i}" for i in range(30)]
      >>> pairs = {(s["color"], s["linestyle"]) for s in map(method_style, names, [names] * 30)}
      >>> len(pairs)
      30
    """
    order = list(dict.fromkeys(names or ()))
    if name in order:
        return _style_at(order.index(name))
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    free = NUM_STYLES - len(order)
    return _style_at(len(order) + h % free if free > 0 else h)


def _method_of(label: str) -> str:
    """The method name of a series label: the part before any ``" ("`` suffix."""
    return label.split(" (", 1)[0]


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _mean_curve(runs: Sequence[Sequence[Mapping[str, Any]]], x: str, metric: str) -> Any:
    """``(xs, mean, lo, hi, spread)`` over the runs' finite values, or None if there are none."""
    by_x: dict[float, list[float]] = {}
    for run in runs:
        for rec in run:
            v: Any = rec.get(metric)
            if _finite(v) and rec.get(x) is not None:
                by_x.setdefault(float(rec[x]), []).append(float(v))
    if not by_x:
        return None
    xs = sorted(by_x)
    mean = [float(np.mean(by_x[k])) for k in xs]
    lo = [min(by_x[k]) for k in xs]
    hi = [max(by_x[k]) for k in xs]
    return xs, mean, lo, hi, any(len(by_x[k]) > 1 for k in xs)


def _series_styles(
    labels: Sequence[str],
    methods: Sequence[str] | None,
    styles: Mapping[str, Mapping[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """A style per label: its method's style; later labels of the same method vary it."""
    names = list(methods) if methods is not None else [_method_of(lb) for lb in labels]
    seen: dict[str, int] = {}
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        method = _method_of(label)
        style: dict[str, Any] = method_style(method, names)
        k = seen.get(method, 0)
        seen[method] = k + 1
        if k:  # e.g. "asgd (M=4)" and "asgd (M=16)": same colour, other line and marker
            ls = _LINESTYLES[(_LINESTYLES.index(style["linestyle"]) + k) % len(_LINESTYLES)]
            mk = _MARKERS[(_MARKERS.index(style["marker"]) + k) % len(_MARKERS)]
            style = {**style, "linestyle": ls, "marker": mk}
        for key in (method, label):
            if styles and key in styles:
                style = {**style, **styles[key]}
        out[label] = style
    return out


#: readable axis names of the metric records' fields (accuracies are drawn in %)
AXIS_LABELS: dict[str, str] = {
    "step": "update (mini-batch)",
    "epoch": "epoch",
    "train_loss": "training loss (cross-entropy)",
    "val_accuracy": "validation accuracy %",
    "test_accuracy": "test accuracy %",
    "train_accuracy": "training accuracy %",
    "val_loss": "validation loss (nats/token)",
    "test_loss": "test loss (nats/token)",
}

#: the mark every figure of a ``--quick`` run carries (:func:`finish_figure`)
SMOKE_MARK = "SMOKE RUN (--quick): a wiring check on a tiny budget, not a result"


def axis_label(field: str) -> str:
    """The axis name of a metric field (:data:`AXIS_LABELS`, else the field with spaces)."""
    return AXIS_LABELS.get(field, field.replace("_", " "))


def _scale(metric: str) -> float:
    return 100.0 if metric.endswith("accuracy") else 1.0


def clipped_errorbar(
    ax: Any, xs: Any, ys: Any, half: Any, *, low: float = 0.0, high: float = 100.0, **kw: Any
) -> Any:
    """``ax.errorbar`` of ``ys ± half`` with the interval clipped to ``[low, high]`` (a
    percentage cannot leave [0, 100] %, whatever a t interval over a few seeds says)."""
    y = np.asarray(ys, dtype=float)
    e = np.asarray(half, dtype=float)
    below = np.clip(np.minimum(e, y - low), 0.0, None)
    above = np.clip(np.minimum(e, high - y), 0.0, None)
    return ax.errorbar(xs, y, yerr=np.vstack([below, above]), **kw)


def finish_figure(fig: Any, *, smoke: bool = False) -> Any:
    """Makes a figure ready to print: every legend outside its axes (to the right, so it hides
    no data) and, for a smoke run, :data:`SMOKE_MARK` above everything. Idempotent; called by
    :meth:`~experiments.runs.RunFolder.finish` on every figure it saves.

    Example:
      >>> from matplotlib.figure import Figure
      >>> fig = Figure(); ax = fig.subplots(); _ = ax.plot([0, 1], label="a"); _ = ax.legend()
      >>> fig = finish_figure(fig, smoke=True)
      >>> bool(ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted()).x0 > 1)
      True
      >>> [t.get_text() for t in fig.texts] == [SMOKE_MARK]
      True
    """
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        anchor = legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted())
        if anchor.x0 >= 1.0:  # already beside the axes
            continue
        texts = [t.get_text() for t in legend.get_texts()]
        handles, labels = ax.get_legend_handles_labels()
        if labels != texts:
            handles = list(legend.legend_handles)
        size = legend.get_texts()[0].get_fontsize() if texts else None
        legend.remove()
        ax.legend(
            handles,
            texts,
            fontsize=size,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
        )
    if smoke and not any(t.get_gid() == "smoke" for t in fig.texts):
        fig.text(
            0.5, 1.0, SMOKE_MARK, ha="center", va="bottom", color="#b00000",
            fontweight="bold", gid="smoke",
        )  # fmt: skip
    return fig


def _draw_panel(
    ax: Any,
    series: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    styles: Mapping[str, Mapping[str, Any]],
    x: str,
    metric: str,
    log: bool,
    levels: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Draws one panel; returns label -> (handle, xs, mean) of the series it drew."""
    drawn: dict[str, Any] = {}
    if levels and _held_out_loss(metric):
        draw_levels(ax, levels)
    for j, (label, runs) in enumerate(series.items()):
        curve = _mean_curve(runs, x, metric)
        if curve is None:
            continue
        xs, mean, lo, hi, spread = curve
        k = _scale(metric)  # accuracies in %, the tables' unit
        mean, lo, hi = ([k * v for v in vals] for vals in (mean, lo, hi))
        step = max(1, math.ceil(len(xs) / 8))
        # Identical curves must both stay visible: later series are drawn on top, thinner and
        # with smaller markers placed at other points, so the earlier one shows around them.
        (line,) = ax.plot(
            xs,
            mean,
            label=label,
            linewidth=2.6 - 0.45 * (j % 4),
            markersize=7.5 - 1.2 * (j % 4),
            markevery=(j % step, step),
            zorder=2 + 0.01 * j,
            **styles[label],
        )
        if spread:
            ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color(), linewidth=0)
        drawn[label] = (line, xs, mean)
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(metric))
    if log and drawn:
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    ax.grid(alpha=0.3)
    if not drawn:
        has_records = any(len(run) for runs in series.values() for run in runs)
        note = "all runs diverged" if has_records else "no runs"
        ax.text(
            0.5,
            0.5,
            note,
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="0.35",
            fontsize="large",
            style="italic",
        )
    return drawn


def _held_out_loss(metric: str) -> bool:
    return metric.endswith("loss") and ("val" in metric or "test" in metric)


def draw_levels(ax: Any, levels: Mapping[str, float]) -> None:
    """Reference levels (e.g. a corpus's n-gram losses) as dotted grey lines across ``ax``,
    each named at the axis's right edge."""
    for name, v in levels.items():
        ax.axhline(v, color="0.45", linestyle=":", linewidth=1.1, zorder=1)
        ax.annotate(
            name, (1.0, v), xycoords=("axes fraction", "data"), xytext=(-2, 2),
            textcoords="offset points", ha="right", va="bottom", fontsize=7, color="0.35",
        )  # fmt: skip


def _legend(
    ax: Any,
    series: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]],
    styles: Mapping[str, Mapping[str, Any]],
    panels: Sequence[Mapping[str, Any]],
) -> None:
    """One legend per row, beside its last panel, with every series of the row.

    A series that drew nothing says why (all its runs diverged / it has no runs); a series whose
    curves equal an earlier one's in every panel says so (``= other``): both stay visible, and
    the reader knows that the overlap is real.
    """
    from matplotlib.lines import Line2D

    handles, texts = [], []
    labels = list(series)
    for i, label in enumerate(labels):
        mine = [p[label] for p in panels if label in p]
        if not mine:
            has_records = any(len(run) for run in series[label])
            proxy = Line2D([], [], **styles[label])
            handles.append(proxy)
            texts.append(f"{label}: " + ("all runs diverged" if has_records else "no runs"))
            continue
        same = None
        for other in labels[:i]:
            if all(
                other in p
                and label in p
                and p[other][1] == p[label][1]
                and np.array_equal(p[other][2], p[label][2])
                for p in panels
                if label in p or other in p
            ):
                same = other
                break
        handles.append(mine[-1][0])
        texts.append(f"{label} (= {same})" if same else label)
    if any(panels):  # a row where nothing drew has its notes; a legend would only repeat them
        ax.legend(
            handles,
            texts,
            fontsize="small",
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
        )


def add_footer(fig: Any, footer: str, fontsize: float = 7.0) -> None:
    """Adds ``footer`` in small print below the panels, growing the figure to make room."""
    width_in = fig.get_figwidth()
    chars = max(40, int(width_in * 72 / (0.6 * fontsize)))
    lines = [w for para in footer.splitlines() for w in (textwrap.wrap(para, chars) or [""])]
    height_in = len(lines) * 1.35 * fontsize / 72 + 0.12
    fig.set_figheight(fig.get_figheight() + height_in)
    frac = height_in / fig.get_figheight()
    fig.get_layout_engine().set(rect=(0.0, frac, 1.0, 1.0 - frac))
    fig.text(
        0.01,
        frac - 0.04 * frac,
        "\n".join(lines),
        ha="left",
        va="top",
        fontsize=fontsize,
        color="0.3",
        gid="footer",
    )


def plain_log_ticks(axis: Any) -> None:
    """Label a log axis's ticks as plain numbers (``3``, ``0.05``), not ``3×10⁰``: a loss that
    spans less than a decade is read off its minor ticks, which matplotlib's default labels in
    scientific notation. Which ticks get a label is matplotlib's own choice (its minor
    thresholds), only their text changes."""
    from matplotlib import ticker

    axis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def curves_figure(
    series: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]
    | Mapping[str, Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]],
    *,
    x: str = "step",
    ys: Sequence[str] = ("train_loss", "test_accuracy"),
    title: str | None = None,
    logy: Sequence[str] = ("train_loss",),
    methods: Sequence[str] | None = None,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    footer: str | None = None,
    levels: Mapping[str, float] | None = None,
) -> Any:
    """Learning curves: one panel per metric, one line (mean over seeds, min–max band) per label.

    Each series is styled by its method (the label's part before any ``" ("``, so
    ``"asgd (M=16)"`` is ``asgd``) with :func:`method_style`; pass the run's method list as
    ``methods`` so a method looks the same in every figure. Identical curves stay visible (the
    later one is drawn thinner on top, markers at other points) and the legend marks them
    ``(= other)``. A panel in which nothing could be drawn says so inside it: ``"all runs
    diverged"`` (runs recorded, no finite value) or ``"no runs"``; the legend names the series
    that drew nothing. Uses ``matplotlib.figure.Figure`` directly (no pyplot, no GUI backend).

    Args:
      series: label -> list (one per seed) of metric records (dicts with ``x`` and ``ys``); or,
        for a grid with one row of panels per group, group -> (label -> list of records).
        None/NaN values (diverged runs) are left out of the mean.
      x: the x-axis field.
      ys: the metrics, one panel (column) each.
      title: figure title.
      logy: metrics drawn on a log y-axis.
      methods: the run's full list of method names, for styles that are stable across figures
        (default: the methods of this figure's labels, in first-seen order).
      styles: label or method name -> ``Axes.plot`` keyword arguments overriding the style
        (e.g. ``{"sgd": {"color": "k"}}``; a label's entry wins over its method's).
      footer: small print at the bottom of the figure, e.g. the config summary (wrapped to the
        figure's width).
      levels: reference levels drawn as named dotted lines on every held-out loss panel (a
        corpus's n-gram losses, :func:`jaxstale.text.reference_losses`).

    Returns:
      A ``matplotlib.figure.Figure`` (pass it to :meth:`RunFolder.finish`).

    Example:
      >>> runs_ = [[{"step": 1, "train_loss": 2.0, "test_accuracy": 0.5},
      ...           {"step": 2, "train_loss": 1.0, "test_accuracy": 0.7}]]
      >>> fig = curves_figure({"mlp": {"sgd": runs_}, "cnn": {"sgd": runs_}}, footer="lr 0.1")
      >>> len(fig.axes)
      4
      >>> fig = curves_figure({"sgd": [[{"step": 1, "train_loss": None}]]}, ys=("train_loss",))
      >>> [t.get_text() for t in fig.axes[0].texts]
      ['all runs diverged']
    """
    from matplotlib.figure import Figure

    first = next(iter(series.values()), None)
    grouped = isinstance(first, Mapping)
    groups: Mapping[str, Any] = series if grouped else {"": series}
    labels = list(dict.fromkeys(lb for g in groups.values() for lb in g))
    style_of = _series_styles(labels, methods, styles)
    fig = Figure(figsize=(4.8 * len(ys) + 1.6, 3.4 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(ys), squeeze=False)
    for r, (group, group_series) in enumerate(groups.items()):
        panels = []
        for c, metric in enumerate(ys):
            ax = axes[r][c]
            panels.append(
                _draw_panel(ax, group_series, style_of, x, metric, metric in logy, levels)
            )
            if group:
                ax.set_title(f"{group}: {axis_label(metric)}", fontsize="medium")
        _legend(axes[r][-1], group_series, style_of, panels)
    if title:
        fig.suptitle(title)
    if footer:
        add_footer(fig, footer)
    return fig
