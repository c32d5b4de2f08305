"""The claims report's own figures: one forest plot per comparative claim.

A forest plot shows the paired differences a claim's verdict reads (:class:`Evidence`): the
declared primary (highlighted, on top), the declared secondaries and the set-up checks (every
secondary when the claim declares none), as the mean
over seeds with its 95 % t interval, every seed's own difference as a dot, the zero line and
the paper's effect rescaled to this task. Differences are oriented so that positive is the
claimed direction; a trend (points per doubling) gets its own panel, since its unit differs.
Matplotlib ``Figure`` objects only (no pyplot); legends beside the axes
(:func:`experiments.runs.finish_figure`).
"""

from __future__ import annotations

import io
import math
import shutil
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from experiments import runs

from .core import Claim, Evidence
from .decisions import partition
from .verdicts import Diff

__all__ = ["COLORS", "copy_figure", "forest_figure", "forest_items", "save_png", "x_range"]

#: colour of a difference by what it shows (beyond noise for / against the claim, within noise)
COLORS = {"for": "#1f77b4", "against": "#d62728", "within": "#7f7f7f"}
_EXPECTED = "#ff7f0e"
_PRIMARY_BAND = "#fff2cc"


def forest_items(ev: Evidence, declared: tuple[str, ...] | None = None) -> list[tuple[str, Diff]]:
    """The differences a forest plot shows, ``(label, diff)``: the primary first (label
    ``"primary"``), then every secondary in the judge's order — or, given the claim's
    ``declared`` list, only the declared secondaries and the set-up checks (what the verdict
    and its line read; exploratory comparisons are in the evidence text)."""
    out: list[tuple[str, Diff]] = [] if ev.primary is None else [("primary", ev.primary)]
    secondary = ev.secondary
    if declared:
        kept, _, checks = partition(secondary, declared)
        secondary = {k: v for k, v in secondary.items() if k in kept or k in checks}
    out += [(label, d) for label, diffs in secondary.items() for d in diffs]
    return out


def _kind(d: Diff) -> str:
    return "for" if d.sign > 0 else "against" if d.sign < 0 else "within"


def _tick(label: str, d: Diff, first: bool) -> str:
    """A row's label: the group's label on its first row only (a line separates groups)."""
    if label == "primary":
        text = f"PRIMARY: {d.name()}"
    else:
        text = f"{label}: {d.name()}" if first else d.name()
    return "\n".join(textwrap.wrap(text, 58)) or text


def x_range(items: list[tuple[str, Diff]], expected: float | None) -> tuple[float, float]:
    """A panel's x-limits, scaled to the primary's region (issue 53): zero, the primary's whole
    interval and the expected effect, widened to the other rows' means that lie within twice
    that span of it, padded by a fifth; a row's mean, interval or seeds beyond are cut at the
    edge with an arrow and the cut mean written there (a 3-seed secondary can lie ten times
    further out and flatten every other row, the primary included)."""
    core = [0.0]
    for label, d in items:
        if label == "primary" and d.n and math.isfinite(d.half):
            core += [d.scale * (d.mean - d.half), d.scale * (d.mean + d.half)]
        elif label == "primary" and d.n:
            core.append(d.scale * d.mean)
    if expected is not None and math.isfinite(expected) and items:
        core.append(items[0][1].scale * expected)
    lo, hi = min(core), max(core)
    span = max(hi - lo, 1e-3 * max(1.0, abs(lo), abs(hi)))
    means = [d.scale * d.mean for _, d in items if d.n]
    xs = [*core, *(m for m in means if lo - 2 * span <= m <= hi + 2 * span)]
    lo, hi = min(xs), max(xs)
    pad = max(0.2 * (hi - lo), 1e-3 * max(1.0, abs(lo), abs(hi)))
    return lo - pad, hi + pad


def _draw(ax: Any, items: list[tuple[str, Diff]], expected: float | None) -> None:
    """One panel (one unit): rows top to bottom in ``items``' order."""
    n = len(items)
    left, right = x_range(items, expected)
    ticks = []
    for i, (label, d) in enumerate(items):
        y = n - 1 - i
        primary = label == "primary"
        first = i == 0 or items[i - 1][0] != label
        if first and i:
            ax.axhline(y + 0.5, color="0.6", linewidth=0.8, zorder=1)
        ticks.append((y, _tick(label, d, first), primary))
        if primary:
            ax.axhspan(y - 0.45, y + 0.45, color=_PRIMARY_BAND, zorder=0)
        if d.values:
            vals = d.scale * np.asarray(d.values, dtype=float)
            jitter = np.linspace(-0.18, 0.18, len(vals)) if len(vals) > 1 else np.zeros(1)
            ax.scatter(vals, y + jitter, s=9, color="0.45", alpha=0.55, linewidths=0, zorder=2)
        if d.n == 0:
            ax.text(0, y, " no seed where both trained", va="center", fontsize="small",
                    color="0.35", style="italic")  # fmt: skip
            continue
        color = COLORS[_kind(d)]
        half = d.scale * d.half if math.isfinite(d.half) else None
        ax.errorbar(
            d.scale * d.mean, y, xerr=half, fmt="D" if primary else "o", color=color,
            markersize=9 if primary else 6, markeredgecolor="black" if primary else color,
            elinewidth=2.8 if primary else 1.6, capsize=5 if primary else 3, zorder=4,
        )  # fmt: skip
        if d.dropped and d.itt:
            ax.plot(d.scale * float(np.mean(d.itt)), y, marker="o", markersize=8, zorder=3,
                    markerfacecolor="none", markeredgecolor=color, linestyle="none")  # fmt: skip
        ends = [d.scale * v for v in d.values]
        if half is not None:
            ends += [d.scale * d.mean - half, d.scale * d.mean + half]
        for edge, marker, beyond in ((left, "<", min(ends, default=0.0) < left),
                                     (right, ">", max(ends, default=0.0) > right)):  # fmt: skip
            if beyond:  # the interval or a seed reaches past the axis: cut there
                ax.plot(edge, y, marker=marker, color=color, markersize=7, clip_on=False,
                        linestyle="none", zorder=5)  # fmt: skip
        m = d.scale * d.mean
        if not left <= m <= right:  # the mean itself is off the axis: say where it is
            out = m > right
            ax.annotate(f"{m:+.{d.digits}f}", (right if out else left, y), color=color,
                        xytext=(-9 if out else 9, 7), textcoords="offset points",
                        ha="right" if out else "left", fontsize="x-small")  # fmt: skip
    ax.set_xlim(left, right)
    ax.axvline(0.0, color="black", linewidth=1.0, zorder=1)
    if expected is not None and math.isfinite(expected):
        ax.axvline(
            items[0][1].scale * expected, color=_EXPECTED, linestyle="--", linewidth=1.6, zorder=1
        )
    ax.set_yticks([y for y, _, _ in ticks], [t for _, t, _ in ticks], fontsize="small")
    for label, (_, _, primary) in zip(ax.get_yticklabels(), ticks, strict=True):
        if primary:
            label.set_fontweight("bold")
    ax.set_ylim(-0.6, n - 0.4)
    ax.grid(axis="x", alpha=0.3)


def _legend(fig: Any, expected: float | None, primary: Diff, itt: bool) -> None:
    """One legend for the figure, below the panels (a short top panel cannot hold it, and the
    title spans the width)."""
    from matplotlib.lines import Line2D

    def mark(color: str, marker: str = "o", **kw: Any) -> Line2D:
        return Line2D([], [], color=color, marker=marker, linestyle="none", **kw)

    handles = [
        mark("white", "D", markeredgecolor="black", markersize=8),
        mark(COLORS["for"]),
        mark(COLORS["against"]),
        mark(COLORS["within"]),
        mark("0.45", markersize=4, alpha=0.6),
    ]
    texts = [
        "primary (declared before the numbers;\ncoloured as the others)",
        "beyond noise alone, for the claim",
        "beyond noise alone, against the claim",
        "within noise (95 % interval covers 0)",
        "one seed's paired difference",
    ]
    handles.append(mark("0.3", ">", markersize=7))
    texts.append("interval, seeds or mean beyond the axis\n(cut; an off-axis mean written there)")
    if itt:
        handles.append(mark("0.3", markerfacecolor="none", markersize=8))
        texts.append("intention to treat (diverged seeds at chance)")
    if expected is not None and math.isfinite(expected):
        handles.append(Line2D([], [], color=_EXPECTED, linestyle="--"))
        value = f"{primary.scale * expected:.2g}"
        unit = primary.unit[:-1] if value == "1" and primary.unit == "points" else primary.unit
        texts.append(f"expected effect: {value} {unit}\n(the paper's, rescaled)")
    fig.legend(handles, texts, fontsize="small", loc="outside lower center", ncols=3)


def forest_figure(claim: Claim, ev: Evidence, *, smoke: bool = False) -> Any:
    """The forest plot of a comparative claim's evidence (a matplotlib ``Figure``), or None
    when the judge returned no primary (its cells were not run)."""
    from matplotlib.figure import Figure

    if ev.primary is None:
        return None
    items = forest_items(ev, claim.secondaries)
    expected = claim.expected_points(ev.primary, ev)
    units = list(dict.fromkeys(d.unit for _, d in items))
    groups = [[(label, d) for label, d in items if d.unit == u] for u in units]
    height = max(3.6, 1.9 + 0.5 * len(items) + 0.6 * len(units))
    fig = Figure(figsize=(12.0, height), layout="constrained")
    axes = fig.subplots(len(units), 1, squeeze=False, height_ratios=[len(g) for g in groups])
    itt = any(d.dropped and d.itt for _, d in items)
    for ax, unit, group in zip(axes[:, 0], units, groups, strict=True):
        mine = expected if unit == ev.primary.unit else None
        _draw(ax, group, mine)
        metric = "accuracy" if group[0][1].scale == 100 else "loss"
        ax.set_xlabel(f"paired difference of test {metric}, {unit} (positive = as claimed)")
    _legend(fig, expected, ev.primary, itt)
    title = (
        f"{claim.id}: {claim.title} — the paired differences the verdict reads (primary "
        "highlighted, declared secondaries, set-up checks): mean over seeds with its 95 % t "
        "interval, one dot per seed, zero line, the paper's effect rescaled to this task"
    )
    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize="medium")
    return runs.finish_figure(fig, smoke=smoke)


def save_png(fig: Any, path: Path) -> Path:
    """Writes ``fig`` as a PNG atomically (the same bytes for the same figure: no date in it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return runs.atomic_write_bytes(path, buf.getvalue())


def copy_figure(run_name: str, stem: str, fig_dir: Path, figures_from: Path | None) -> Path | None:
    """An experiment's figure beside the report (``<run>-<stem>.png``): copied from
    ``figures_from``'s run folder (a stale copy removed when the run has none); None: no copy."""
    dst = fig_dir / f"{run_name}-{stem}.png"
    if figures_from is not None:
        src = figures_from / run_name / f"{stem}.png"
        if src.exists():
            fig_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        elif dst.exists():
            dst.unlink()  # a copy of an earlier run's figure: not this report's
    return dst if dst.exists() else None
