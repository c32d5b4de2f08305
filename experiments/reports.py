"""The tables and figure parts of the experiments' reports: a tuned sweep at the rate selected
on validation (:func:`tuned_tables`), rows at the selected knob (:func:`at_selected`), paired
seed-by-seed differences against a baseline (:func:`paired_table`) and every pair beyond noise in
words (:func:`pairs_text`), and test accuracy against a setting with intervals
(:func:`accuracy_vs`); where a selected rate sat at an edge of its grid, what the extension
did (:func:`edge_notes`).

Every table is a function of its rows: a resumed sweep writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxstale import tasks

from . import runs
from .grids import edge_state

__all__ = [
    "MIN_PAIRS",
    "accuracy_vs",
    "at_selected",
    "edge_notes",
    "metric_vs_figure",
    "paired_table",
    "pairs_text",
    "tuned_tables",
    "tuning_note",
]


def _fmt_lr(v: Any) -> str:
    if isinstance(v, list | tuple):
        return ", ".join(_fmt_lr(x) for x in v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def _fmt_rest(knob: Any, rest: tuple[Any, ...]) -> str:
    """The secondary fields of a joint knob in a grid row (empty where they do not apply)."""
    return ", ".join(
        f"{k} {_fmt_lr(v)}" for k, v in zip(knob[1:], rest, strict=True) if v is not None
    )


#: the reading of rows without a task: accuracy in % (:data:`jaxstale.tasks.DEFAULT`)
ACCURACY = tasks.DEFAULT


def _cell(task: tasks.Task | None) -> tuple[float, int]:
    """A table cell's ``(scale, digits)``: accuracy in % to 0.1, a loss in nats to 0.001."""
    t = tasks.or_default(task)
    return t.scale, t.digits


def _unique(values: Any) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def tuned_tables(
    rows: Sequence[dict[str, Any]],
    *,
    index: Sequence[str],
    columns: str | None,
    chance_acc: float,
    knob: str | Sequence[str] = "lr",
    col_label: Callable[[Any], str] = str,
    fmt_knob: Callable[[Any], str] | None = None,
    value: str = "final_test_accuracy",
    task: tasks.Task | None = None,
) -> tuple[str, str, str, dict[tuple[Any, ...], Any]]:
    """The three tables of a tuned sweep and the knob selected per (index…, column).

    Returns:
        ``(accuracy, time, grid, selected)``: ``value`` in % (mean ± 95 % CI, diverged
        fraction, ``@ <knob>``) at the knob selected on validation; updates to the target
        validation accuracy at that knob (median over seeds, ``[reached/seeds]``); the grid's
        mean final validation accuracy % per knob value (diverged seeds at chance) over the
        seeds the selection compared (a two-stage sweep's tuning seeds), which shows how sharp
        each optimum is; ``{(index…, column): knob}``. With a language model's ``task`` the
        metric is the loss in nats (lower is better; ``value`` its test field).
    """
    by = (*index, columns) if columns is not None else tuple(index)
    val = tasks.or_default(task).final("val")
    scale, digits = _cell(task)
    if task is not None and value == "final_test_accuracy":
        value = task.final("test")
    selected = runs.select(rows, by=by, knob=knob, value=val, chance=chance_acc)
    groups: dict[tuple[Any, ...], dict[Any, list[dict[str, Any]]]] = {}
    for r in rows:
        kv = runs.stats.knob_value(r, knob)
        groups.setdefault(tuple(r.get(k) for k in by), {}).setdefault(kv, []).append(r)
    fk = fmt_knob or _fmt_lr
    idx_vals = _unique(tuple(r.get(k) for k in index) for r in rows)
    cols = _unique(r.get(columns) for r in rows) if columns is not None else [None]
    knobs = _unique(runs.stats.knob_value(r, knob) for r in rows)
    many = len(knobs) > 1
    joint = not isinstance(knob, str)
    first_field = knob if isinstance(knob, str) else knob[0]
    firsts = _unique(r.get(first_field) for r in rows)
    if all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in firsts):
        firsts = sorted(firsts)  # rates added beyond a grid, or grids of several methods, in order

    def _rest(kv: Any) -> tuple[Any, ...]:
        return tuple(kv[1:]) if joint else ()

    def group(i: tuple[Any, ...], c: Any) -> tuple[Any, ...]:
        return (*i, c) if columns is not None else i

    acc, time_, grid = [], [], []
    for i in idx_vals:
        a_cells, t_cells = [], []
        for c in cols:
            g = group(i, c)
            if g not in selected:
                a_cells.append("–")
                t_cells.append("–")
                continue
            pick = groups[g][selected[g]]
            text = runs.format_ci(
                [r.get(value) for r in pick],
                scale=scale,
                digits=digits,
                diverged=[bool(r.get("diverged")) for r in pick],
            )
            a_cells.append(text + (f" @ {fk(selected[g])}" if many else ""))
            t_cells.append(runs.format_steps([r.get("updates_to_target") for r in pick]))
            # grid rows: one per value of the knob's secondary fields (e.g. LC-ASGD's λ),
            # columns: the first field's values (the learning rates)
            shared = runs.stats.shared_seeds(groups[g])  # the seeds the selection compared
            for rest in _unique(_rest(kv) for kv in groups[g]):
                g_cells = []
                for first in firsts:
                    kv = first if not joint else (first, *rest)
                    per = shared.get(kv)
                    if not per:
                        g_cells.append("–")
                        continue
                    sc = scale * runs.stats.score(per, val, chance_acc)
                    div = sum(bool(r.get("diverged")) for r in per)
                    mark = "**" if kv == selected[g] and many else ""
                    g_cells.append(
                        f"{mark}{sc:.{digits}f}{mark}"
                        + (f" [{div}/{len(per)} div.]" if div else "")
                    )
                label = [col_label(c)] if columns is not None else []
                extra = [_fmt_rest(knob, rest)] if joint else []
                grid.append([*map(str, i), *label, *extra, *g_cells])
        acc.append([*map(str, i), *a_cells])
        time_.append([*map(str, i), *t_cells])
    heads = [*index, *(col_label(c) for c in cols)] if columns is not None else [*index, "value"]
    gheads = [
        *index,
        *(["setting"] if columns is not None else []),
        *([", ".join(knob[1:])] if joint else []),
        *(f"{first_field} {_fmt_lr(k)}" for k in firsts),
    ]
    return (
        runs.markdown_table(heads, acc),
        runs.markdown_table(heads, time_),
        runs.markdown_table(gheads, grid),
        selected,
    )


#: the phrases of :func:`edge_notes`' lines (the claims report's "Grid edges" section,
#: :mod:`study.edges`, reads them back): its paragraph's heading, a selection
#: made interior, and the five ways a selection stays open — still at the edge after the
#: extensions, at an edge that was not extended, where every seed diverged, an extension an
#: interrupted run has yet to run, or a grid where no rate trained
EDGE_HEAD = "**Grid edges**"
NOW_INTERIOR = "now interior"
STILL_AT_EDGE = "still at the edge"
NOT_EXTENDED = "at the edge, not extended"
ALL_DIVERGED = "where every seed diverged"
PENDING = "extension pending"
UNTRAINED = "no rate trained"
EDGE_OPEN = (STILL_AT_EDGE, NOT_EXTENDED, ALL_DIVERGED, PENDING, UNTRAINED)


def edge_notes(
    rows: Sequence[dict[str, Any]],
    *,
    by: Sequence[str],
    grid: Sequence[float] | Callable[[tuple[Any, ...]], Sequence[float]],
    limit: int,
    chance_acc: float,
    knob: str | Sequence[str] = "lr",
    label: Callable[[tuple[Any, ...]], str] | None = None,
    task: tasks.Task | None = None,
) -> str:
    """What the grid-edge rule (:func:`experiments.grids.extend_grid`) did, one line per
    method × setting (group of ``by``) whose selected rate is or was at an edge of its grid:
    the rates added (mean final validation accuracy %, diverged seeds at chance), and whether
    the selection is now interior or still at the edge after ``limit`` extensions; a line that
    every selection is interior otherwise. Empty when every grid has one rate. A function of
    the rows."""
    grid_of = grid if callable(grid) else (lambda _g: grid)
    name = label or (lambda g: ", ".join(f"{k} {v}" for k, v in zip(by, g, strict=True)))
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    lines, states = [], []
    for g, per in groups.items():
        e = edge_state(per, grid_of(g), limit=limit, chance=chance_acc, knob=knob, task=task)
        states.append(e.state)
        where = "smallest" if e.side < 0 else "largest"
        sel = f"selected {_fmt_lr(e.selected)}"
        added = ", ".join(
            f"{_fmt_lr(x)} ({_best(per, x, knob, chance_acc, task)})" for x in e.added
        )
        if e.state == "untrained":
            how = f"lr {added} added downwards; " if added else f"(--extend-edges {limit}) "
            left = f"; {PENDING} (an interrupted run: re-run to finish)" if e.rate else ""
            lines.append(
                f"- {name(g)}: {how}**{UNTRAINED}** (every rate at chance on validation: the "
                f"grid brackets no optimum){left}."
            )
        elif added:
            state = {
                "interior": NOW_INTERIOR,
                "capped": f"**{STILL_AT_EDGE} after {limit} extension{'s' * (limit != 1)}** "
                f"(the grid's {where}; the optimum may lie beyond)",
                "diverged": f"at the grid's {where}, {ALL_DIVERGED}",
            }.get(e.state, f"{PENDING} (an interrupted run: re-run to finish)")
            lines.append(
                f"- grid extended: {name(g)}: lr {added} added (the selection was at the "
                f"edge); {sel}, {state}."
            )
        elif e.state == "capped":
            lines.append(
                f"- {NOT_EXTENDED} (--extend-edges {limit}): {name(g)}: {sel}, the grid's "
                f"{where}; the optimum may lie beyond."
            )
        elif e.state == "diverged":
            lines.append(f"- {NOT_EXTENDED}: {name(g)}: {sel}, the grid's {where}, {ALL_DIVERGED}.")
    if not states or all(s == "fixed" for s in states):
        return ""
    head = (
        f"{EDGE_HEAD} (--extend-edges {limit}: where the rate selected on validation is "
        "the grid's smallest or largest and trained, the next rate beyond it by the grid's "
        f"ratio at that end runs for that row only, up to {limit} per side; in parentheses the "
        f"mean validation {tasks.or_default(task).label}; summary.json marks those rows "
        '"extended")'
    )
    return "\n".join([head, *(lines or ["- every selected rate is interior to its grid."])])


def tuning_note(cfg: dict[str, Any], task: tasks.Task | None = None) -> str:
    """The line a two-stage sweep's tables carry (``--tune-seeds``); empty otherwise. The
    selection metric is the task's (validation accuracy, or loss for a language model)."""
    k = cfg.get("tune_seeds")
    if not k:
        return ""
    n = cfg["seeds"]
    first = "seed 0" if k == 1 else f"seeds 0–{k - 1}"
    return (
        f"**Two-stage sweep** (--tune-seeds {k}): each rate grid (and its extensions) ran on "
        f"{first}, and the rate was selected on their validation "
        f"{tasks.or_default(task).metric} (the grid tables "
        f"show those seeds); the selected rate then ran on all {n} seeds, which every table "
        "at the selected rate reports."
    )


def _best(
    rows: Sequence[dict[str, Any]],
    lr: float,
    knob: Any,
    chance_acc: float,
    task: tasks.Task | None = None,
) -> str:
    """The best validation score % at rate ``lr`` over the knob's other fields, with its
    diverged seeds (as the grid table writes a cell)."""
    per: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        if r["lr"] == lr:
            per.setdefault(runs.stats.knob_value(r, knob), []).append(r)
    t = tasks.or_default(task)
    sign = 1.0 if t.higher_is_better else -1.0
    score = lambda k: runs.stats.score(per[k], t.final("val"), chance_acc)
    best = max(per, key=lambda k: sign * score(k))  # the first on ties
    sc = score(best)
    div = sum(bool(r.get("diverged")) for r in per[best])
    return f"{t.scale * sc:.{t.digits}f}" + (f" [{div}/{len(per[best])} div.]" if div else "")


def at_selected(
    rows: Sequence[dict[str, Any]],
    selected: dict[tuple[Any, ...], Any],
    *,
    by: Sequence[str],
    knob: str | Sequence[str] = "lr",
) -> list[dict[str, Any]]:
    """The rows run at their group's selected knob value: ``selected`` as returned by
    :func:`tuned_tables` (or :func:`experiments.runs.select`) over the fields ``by``
    (``(*index, columns)`` for :func:`tuned_tables`)."""
    out = []
    for r in rows:
        g = tuple(r.get(k) for k in by)
        if g in selected and runs.stats.knob_value(r, knob) == selected[g]:
            out.append(r)
    return out


#: the fewest seeds (pairs) a paired difference must have to be called beyond noise
MIN_PAIRS = 3


def _fmt_diff(
    mean: float, half: float, n: int, seeds: int, scale: float, digits: int = 1
) -> tuple[str, bool]:
    if n == 0:
        return "no pair", False
    if n == 1 or not np.isfinite(half):
        return f"{scale * mean:+.{digits}f} (1 pair)", False
    # two pairs can agree to the test example by chance (accuracies are quantised): an
    # interval of width 0 from them says nothing, so "beyond noise" needs three pairs
    beyond = abs(mean) > half and n >= MIN_PAIRS
    text = f"{scale * mean:+.{digits}f} ± {scale * half:.{digits}f}"
    text = f"**{text}** beyond noise" if beyond else text
    return text + (f" ({n}/{seeds} pairs)" if n < seeds else ""), beyond


def paired_table(
    rows: Sequence[dict[str, Any]],
    *,
    index: Sequence[str],
    compare: str,
    baseline: Any,
    columns: str,
    col_label: Callable[[Any], str] = str,
    value: str = "final_test_accuracy",
    pair: str = "seed",
    scale: float = 100.0,
    task: tasks.Task | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Paired differences ``x − baseline`` of every value ``x`` of the field ``compare`` (e.g.
    each method against ``"vanilla"``), per ``index`` group and ``columns`` value, with a 95 %
    t interval over the seeds (:func:`experiments.runs.paired_difference`; seeds where either run
    diverged are left out), marked *beyond noise* when the interval excludes 0.

    Pass the rows at each group's selected rate (:func:`at_selected`): every method is then
    compared at its own tuned rate, seed against seed (a seed fixes the initial weights and the
    data order).

    Returns:
        ``(markdown table, findings)``: one table row per ``(index…, "x − baseline")``, one
        column per ``columns`` value, cells ``+1.2 ± 0.8`` (scaled by ``scale``; bold with
        "beyond noise" when the interval excludes 0; ``(k/n pairs)`` when seeds were left out);
        findings: one dict per cell with ``index`` (tuple), ``column``, ``a`` (``x``), ``b``
        (``baseline``), ``mean``, ``half``, ``n`` and ``beyond``. A language model's ``task``:
        its test loss in nats (``value`` and ``scale`` follow it).
    """
    digits = 1
    if task is not None:
        scale, digits = _cell(task)
        value = task.final("test") if value == "final_test_accuracy" else value
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((*(r.get(k) for k in index), r.get(compare), r.get(columns)), []).append(
            r
        )
    idx_vals = _unique(tuple(r.get(k) for k in index) for r in rows)
    others = [v for v in _unique(r.get(compare) for r in rows) if v != baseline]
    cols = _unique(r.get(columns) for r in rows)
    body, findings = [], []
    for i in idx_vals:
        for other in others:
            cells = []
            for c in cols:
                a, b = groups.get((*i, other, c)), groups.get((*i, baseline, c))
                if not a or not b:
                    cells.append("–")
                    continue
                mean, half, n = runs.paired_difference(a, b, value=value, pair=pair)
                seeds = len({r.get(pair) for r in a} & {r.get(pair) for r in b})
                text, beyond = _fmt_diff(mean, half, n, seeds, scale, digits)
                cells.append(text)
                findings.append(
                    {"index": i, "column": c, "a": other, "b": baseline, "mean": mean,
                     "half": half, "n": n, "beyond": beyond}
                )  # fmt: skip
            body.append([*map(str, i), f"{other} − {baseline}", *cells])
    heads = [*index, compare, *(col_label(c) for c in cols)]
    return runs.markdown_table(heads, body), findings


def pairs_text(findings: list[dict[str, Any]], task: tasks.Task | None = None) -> str:
    """Which pairs differ beyond noise, per index and column, in words (``findings`` of
    :func:`paired_table`, one call per baseline): the better first (a higher accuracy, ``>``;
    a lower loss, ``<``)."""
    t = tasks.or_default(task)
    up, op = t.higher_is_better, ">" if t.higher_is_better else "<"
    lines = []
    for i in {f["index"]: None for f in findings}:
        for c in {f["column"]: None for f in findings if f["index"] == i}:
            cell = [f for f in findings if f["index"] == i and f["column"] == c]
            beyond = []
            for f in cell:
                if not f["beyond"]:
                    continue
                first = (f["mean"] > 0) == up  # f["a"] is the better
                a, b = (f["a"], f["b"]) if first else (f["b"], f["a"])
                m, h = t.scale * abs(f["mean"]), t.scale * f["half"]
                beyond.append(f"{a} {op} {b} by {m:.{t.digits}f} ± {h:.{t.digits}f}")
            within = sum(not f["beyond"] and f["n"] >= MIN_PAIRS for f in cell)
            few = sum(f["n"] < MIN_PAIRS for f in cell)
            text = "; ".join(beyond) if beyond else "none"
            lines.append(
                f"- {', '.join(map(str, i))}, N={c}: beyond noise: {text}. "
                f"{within} of {len(cell)} pairs within noise"
                + (f"; {few} with fewer than {MIN_PAIRS} seeds trained in both" if few else "")
                + "."
            )
    return "\n".join(lines)


def accuracy_vs(
    ax: Any,
    points: Sequence[tuple[Any, Sequence[dict[str, Any]]]],
    label: str,
    style: dict[str, Any],
    task: tasks.Task | None = None,
) -> list[float]:
    """Draws one method's test accuracy % against a setting on ``ax``: at each ``(x, rows)`` the
    mean over the seeds that trained with its 95 % interval (clipped to [0, 100] %), an ``x`` at
    0 where every seed diverged; returns the means drawn (%). A language model's ``task``:
    its test loss in nats, the ``x`` at chance (``log V``)."""
    t = tasks.or_default(task)
    xs, ys, es, xd = [], [], [], []
    for x, pick in points:
        mean, half, n = runs.mean_ci([r[t.final("test")] for r in pick if not r["diverged"]])
        if n:
            xs.append(x)
            ys.append(t.scale * mean)
            es.append(t.scale * half if np.isfinite(half) else 0.0)
        elif pick:
            xd.append(x)
    if xs and t.higher_is_better:
        runs.clipped_errorbar(ax, xs, ys, es, capsize=3, label=label, **style)
    elif xs:
        ax.errorbar(xs, ys, yerr=es, capsize=3, label=label, **style)
    at = 0.0 if t.higher_is_better else t.chance
    if xd:  # labelled where no point carries the method's name
        ax.plot(xd, [at] * len(xd), "x", color=style["color"], label=None if xs else label)
    return ys


def metric_vs_figure(
    picked: Sequence[dict[str, Any]],
    *,
    panel: str,
    x: str,
    methods: Sequence[str],
    xlabel: str,
    task: tasks.Task | None = None,
    levels: dict[str, float] | None = None,
) -> Any:
    """One panel per value of the field ``panel``: each method's test metric against the field
    ``x`` (log₂ axis) at its selected rate (``picked``: :func:`at_selected`'s rows), with 95 %
    intervals (:func:`accuracy_vs`); ``levels`` (a corpus's n-gram losses) drawn as lines."""
    from matplotlib.figure import Figure

    t = tasks.or_default(task)
    names = _unique(r[panel] for r in picked)
    fig = Figure(figsize=(5.5 * max(len(names), 1), 4), layout="constrained")
    axes = fig.subplots(1, max(len(names), 1), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=False):
        xs = sorted({r[x] for r in picked if r[panel] == name})
        for method in methods:
            at = lambda v: [r for r in picked if (r[panel], r[x], r["method"]) == (name, v, method)]
            style = runs.method_style(method, methods)
            accuracy_vs(ax, [(v, at(v)) for v in xs], method, style, t)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"test {t.label} at the selected lr (x: all diverged)")
        ax.set_title(str(name))
        if levels:
            runs.draw_levels(ax, levels)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    return fig
