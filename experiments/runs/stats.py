"""Honest summaries of seeds: confidence intervals, diverged fractions, selection on validation.

The experiments' tables follow three rules, implemented here once:

* a cell is the **mean with a 95 % confidence interval** over the seeds that trained
  (Student's t: ``x̄ ± t_{0.975, n−1}·s/√n``), and the **fraction of diverged seeds** is written
  in the cell, never folded silently into the mean (:func:`mean_ci`, :func:`format_ci`);
* a tuned knob (the learning rate, LC-ASGD's λ) is **selected on the validation split**, per
  method and setting, by the mean final validation accuracy over seeds with a diverged seed
  counted at chance accuracy (:func:`select`); the table then reports the *test* accuracy at
  the selected value (:func:`tuned_table`);
* **time to accuracy** is the number of updates until the validation accuracy first reaches a
  target (:func:`time_to_accuracy`), reported as the median over seeds with how many reached it.

Example:
    >>> rows = [{"method": "a", "lr": lr, "seed": s, "final_val_accuracy": v,
    ...          "final_test_accuracy": v - 0.01, "diverged": False}
    ...         for lr, vals in ((0.1, (0.90, 0.92)), (0.01, (0.95, 0.97)))
    ...         for s, v in enumerate(vals)]
    >>> select(rows, by=("method",), knob="lr")
    {('a',): 0.01}
    >>> format_ci([0.94, 0.96])
    '95.0 ± 12.7'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxstale.tasks import higher_is_better

__all__ = [
    "best",
    "format_ci",
    "format_steps",
    "knob_value",
    "mean_ci",
    "paired_difference",
    "runner_up",
    "score",
    "select",
    "shared_seeds",
    "time_to_accuracy",
    "tuned_table",
]


def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is not None and math.isfinite(float(v)):
            out.append(float(v))
    return out


def mean_ci(values: Iterable[Any], level: float = 0.95) -> tuple[float, float, int]:
    r"""Mean and confidence-interval half-width of the finite values (None/NaN are left out).

    .. math:: \bar x \pm t_{(1+\text{level})/2,\;n-1}\; s / \sqrt{n}

    with ``s`` the sample standard deviation (ddof 1). One value has an undefined interval
    (``nan``); no value gives ``(nan, nan, 0)``.

    Args:
        values: numbers, None or NaN for diverged runs.
        level: the confidence level, in (0, 1).

    Returns:
        ``(mean, half_width, n)``.

    Raises:
        ValueError: ``level`` outside (0, 1).

    Example:
        >>> m, h, n = mean_ci([1.0, 2.0, 3.0, None])
        >>> round(m, 3), round(h, 3), n
        (2.0, 2.484, 3)
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    ok = _finite(values)
    n = len(ok)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(np.mean(ok))
    if n == 1:
        return mean, math.nan, 1
    from scipy import stats

    half = float(stats.t.ppf((1.0 + level) / 2.0, n - 1) * np.std(ok, ddof=1) / math.sqrt(n))
    return mean, half, n


def format_ci(
    values: Sequence[Any],
    *,
    scale: float = 100.0,
    digits: int = 1,
    diverged: Sequence[bool] | None = None,
) -> str:
    """``mean ± 95 % CI`` of the runs that trained, with the diverged fraction when any diverged.

    Args:
        values: one value per seed (None/NaN: diverged).
        scale: multiplier (100: fractions to percent).
        digits: decimals.
        diverged: per-seed divergence flags (default: the value is None or not finite).

    Returns:
        e.g. ``"97.3 ± 0.4"``, ``"97.3 ± 0.4 [1/5 div.]"``, ``"diverged [5/5]"`` or ``"–"``
        (no runs).

    Example:
        >>> format_ci([0.97, 0.975, None])
        '97.2 ± 3.2 [1/3 div.]'
        >>> format_ci([None, None])
        'diverged [2/2]'
    """
    values = list(values)
    if not values:
        return "–"
    flags = list(diverged) if diverged is not None else [not _finite([v]) for v in values]
    if len(flags) != len(values):
        raise ValueError(f"{len(flags)} divergence flags for {len(values)} values")
    ok = [v for v, d in zip(values, flags, strict=True) if not d]
    k = sum(bool(d) for d in flags)
    mean, half, n = mean_ci(ok)
    if n == 0:
        return f"diverged [{k}/{len(values)}]"
    text = f"{scale * mean:.{digits}f}"
    text += f" ± {scale * half:.{digits}f}" if math.isfinite(half) else " (1 seed)"
    return text + (f" [{k}/{len(values)} div.]" if k else "")


def paired_difference(
    a: Sequence[Mapping[str, Any]],
    b: Sequence[Mapping[str, Any]],
    *,
    value: str = "final_test_accuracy",
    pair: str = "seed",
    level: float = 0.95,
) -> tuple[float, float, int]:
    r"""Mean and CI half-width of the per-seed difference ``a − b`` (paired by ``pair``).

    A seed fixes the initial weights and the data order in every experiment, so two methods'
    runs with the same seed are paired; their difference removes the seed-to-seed spread that
    an unpaired comparison would carry. Seeds where either run diverged (or lacks ``value``)
    are left out. The difference is *beyond noise* at ``level`` when the interval excludes 0.

    Returns:
        ``(mean, half_width, n_pairs)`` (see :func:`mean_ci`).

    Example:
        >>> a = [{"seed": s, "final_test_accuracy": v} for s, v in enumerate([0.95, 0.96, 0.97])]
        >>> b = [{"seed": s, "final_test_accuracy": v} for s, v in enumerate([0.94, 0.95, 0.958])]
        >>> m, h, n = paired_difference(a, b)
        >>> round(m, 4), n, m - h > 0
        (0.0107, 3, True)
    """

    def by_seed(rows: Sequence[Mapping[str, Any]]) -> dict[Any, float]:
        out = {}
        for r in rows:
            v = r.get(value)
            if not r.get("diverged") and v is not None and math.isfinite(float(v)):
                out[r.get(pair)] = float(v)
        return out

    pa, pb = by_seed(a), by_seed(b)
    return mean_ci([pa[k] - pb[k] for k in pa if k in pb], level)


def score(rows: Sequence[Mapping[str, Any]], value: str, chance: float) -> float:
    """The selection score of a group of seeds: the mean of ``value`` with every diverged seed
    (``diverged`` true or ``value`` missing) counted as ``chance``."""
    vals = []
    for r in rows:
        v = r.get(value)
        ok = not r.get("diverged") and v is not None and math.isfinite(float(v))
        vals.append(float(v) if ok and v is not None else chance)
    if vals:
        return float(np.mean(vals))
    return -math.inf if higher_is_better(value) else math.inf


def knob_value(row: Mapping[str, Any], knob: str | Sequence[str]) -> Any:
    """The knob of a row: ``row[knob]``, or a tuple of fields for a joint knob."""
    if isinstance(knob, str):
        return row.get(knob)
    return tuple(row.get(k) for k in knob)


def shared_seeds(
    per: Mapping[Any, Sequence[Mapping[str, Any]]], pair: str = "seed"
) -> dict[Any, list[Mapping[str, Any]]]:
    """``per`` (rows by knob value) restricted to the seeds that every knob value has.

    A full grid keeps every row. After a two-stage sweep (``--tune-seeds``: the grid on a few
    seeds, then the selected value on all of them) the values are compared on the tuning seeds
    only, so adding seeds at the selected value never changes which value wins. Entries that
    share no seed are kept whole.

    Example:
        >>> per = {0.1: [{"seed": 0}, {"seed": 1}, {"seed": 2}], 0.3: [{"seed": 0}]}
        >>> {k: [r["seed"] for r in v] for k, v in shared_seeds(per).items()}
        {0.1: [0], 0.3: [0]}
    """
    sets = [{r.get(pair) for r in rows} for rows in per.values()]
    common = set.intersection(*sets) if sets else set()
    if not common:
        return {k: list(v) for k, v in per.items()}
    return {k: [r for r in v if r.get(pair) in common] for k, v in per.items()}


def best(
    per: Mapping[Any, Sequence[Mapping[str, Any]]],
    value: str = "final_val_accuracy",
    chance: float = 0.0,
) -> Any:
    """The key of ``per`` (rows by knob value) with the best :func:`score` of ``value`` over
    the seeds every key shares (:func:`shared_seeds`). Best is the highest for an accuracy, the
    lowest for a loss (the field's metric, :func:`jaxstale.tasks.metric_of`).

    An exact tie (runs at chance level score the same: an accuracy is a count over a fixed
    split) goes to the key with the most rows — in a two-stage sweep, the value already
    confirmed on every seed — and then to the key seen first, so the selection does not
    depend on the order of the rows once a value was confirmed.

    Raises:
        ValueError: ``value`` names a test metric, or ``per`` is empty.
    """
    if "test" in value:
        raise ValueError(f"selection must not use test data, got value={value!r}")
    if not per:
        raise ValueError("best: nothing to select from")
    common = shared_seeds(per)
    sign = 1.0 if higher_is_better(value) else -1.0
    scores = {k: sign * score(rows, value, chance) for k, rows in common.items()}
    top = max(scores.values())
    tied = [k for k in common if scores[k] == top]
    return max(tied, key=lambda k: len(per[k]))  # max keeps the first of equal counts


def runner_up(
    per: Mapping[Any, Sequence[Mapping[str, Any]]],
    value: str = "final_val_accuracy",
    chance: float = 0.0,
) -> tuple[Any, float] | None:
    """The selection's own uncertainty: the second-best key of ``per`` (:func:`best`'s order)
    and how far its :func:`score` is behind the best's (≥ 0, in ``value``'s unit), over the
    seeds every key shares; None with fewer than two keys.

    Raises:
        ValueError: ``value`` names a test metric.
    """
    if "test" in value:
        raise ValueError(f"selection must not use test data, got value={value!r}")
    if len(per) < 2:
        return None
    top = best(per, value, chance)
    common = shared_seeds(per)
    sign = 1.0 if higher_is_better(value) else -1.0
    scores = {k: sign * score(rows, value, chance) for k, rows in common.items() if k != top}
    second = max(scores, key=lambda k: scores[k])
    return second, sign * score(common[top], value, chance) - scores[second]


def select(
    rows: Iterable[Mapping[str, Any]],
    *,
    by: Sequence[str],
    knob: str | Sequence[str] = "lr",
    value: str = "final_val_accuracy",
    chance: float = 0.0,
) -> dict[tuple[Any, ...], Any]:
    """The value of ``knob`` with the best validation score of each group ``by`` (the highest
    accuracy, the lowest loss).

    The score (:func:`score`) is the mean over seeds of ``value`` (a *validation* metric: the
    test split is never looked at) with diverged seeds counted at ``chance``, over the seeds
    that every knob value of the group has (:func:`best`). Exact ties go to the knob value with
    the most rows, then to the one seen first.

    Args:
        rows: result rows, one per seed and knob value.
        by: the fields of a group (e.g. ``("method", "workers")``).
        knob: the tuned field (e.g. ``"lr"``), or several tuned jointly (e.g.
            ``("lr", "lam")``: the selected value is then a tuple).
        value: the validation metric (``final_val_accuracy``; ``final_val_loss``, lower is
            better).
        chance: the score of a diverged seed (e.g. 1 / number of classes; ``log V`` nats).

    Returns:
        ``{group tuple: selected knob value}``.

    Raises:
        ValueError: ``value`` names a test metric.
    """
    if "test" in value:
        raise ValueError(f"selection must not use test data, got value={value!r}")
    groups: dict[tuple[Any, ...], dict[Any, list[Mapping[str, Any]]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), {}).setdefault(
            knob_value(r, knob), []
        ).append(r)
    return {g: best(per, value, chance) for g, per in groups.items()}


def time_to_accuracy(
    curve: Sequence[Mapping[str, Any]] | None,
    target: float,
    *,
    key: str = "val_accuracy",
    x: str = "step",
) -> int | None:
    """The first ``x`` (updates) at which ``curve``'s ``key`` reaches ``target`` (None: never):
    at least ``target`` for an accuracy, at most it for a loss (``key``'s metric).

    Example:
        >>> time_to_accuracy([{"step": 10, "val_accuracy": 0.5}, {"step": 20, "val_accuracy": 0.9}],
        ...                  0.9)
        20
    """
    up = higher_is_better(key)
    for rec in curve or []:
        v = rec.get(key)
        if v is not None and (float(v) >= target if up else float(v) <= target):
            return int(rec[x])
    return None


def format_steps(steps: Sequence[int | None]) -> str:
    """The median of the runs that reached the target, and how many did (``"–"`` if none ran).

    Example:
        >>> format_steps([400, 440, None])
        '420 [2/3]'
        >>> format_steps([None, None])
        'never [0/2]'
    """
    steps = list(steps)
    if not steps:
        return "–"
    ok = [s for s in steps if s is not None]
    if not ok:
        return f"never [0/{len(steps)}]"
    text = f"{float(np.median(ok)):.0f}"
    return text if len(ok) == len(steps) else f"{text} [{len(ok)}/{len(steps)}]"


def tuned_table(
    rows: Sequence[Mapping[str, Any]],
    *,
    index: Sequence[str],
    columns: str | None,
    knob: str | Sequence[str] = "lr",
    chance: float = 0.0,
    value: str = "final_test_accuracy",
    select_on: str = "final_val_accuracy",
    scale: float = 100.0,
    digits: int = 1,
    show_knob: bool = True,
    fmt_knob: Any = None,
    fixed: Mapping[tuple[Any, ...], Any] | None = None,
) -> tuple[list[list[str]], dict[tuple[Any, ...], Any]]:
    """Table cells of ``value`` at the knob selected on validation, per ``index`` × ``columns``.

    Args:
        rows: result rows (one per seed, knob value and setting).
        index: fields of a table row (e.g. ``("method",)``).
        columns: field of the columns (e.g. ``"workers"``), or None for one column.
        knob: the tuned field.
        chance: the selection score of a diverged seed.
        value: the reported metric (a test metric).
        select_on: the validation metric of the selection.
        scale, digits: see :func:`format_ci`.
        show_knob: append ``" @ <knob value>"`` to each cell when the knob had several values.
        fmt_knob: ``knob value -> str`` (default ``str``).
        fixed: ``{(index..., column): knob value}`` that overrides the selection (e.g. a knob
            chosen elsewhere); None: select everything here.

    Returns:
        ``(body, selected)``: the table's rows (``[*index values, *cells]``, index and column
        values in first-seen order) and ``{(index..., column): selected knob value}``.
    """
    by = (*index, columns) if columns is not None else tuple(index)
    selected = select(rows, by=by, knob=knob, value=select_on, chance=chance)
    if fixed:
        selected.update(fixed)
    multi = len({knob_value(r, knob) for r in rows}) > 1
    fk = fmt_knob or (lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    idx_vals: list[tuple[Any, ...]] = []
    col_vals: list[Any] = []
    for r in rows:
        i = tuple(r.get(k) for k in index)
        if i not in idx_vals:
            idx_vals.append(i)
        if columns is not None and r.get(columns) not in col_vals:
            col_vals.append(r.get(columns))
    cols = col_vals if columns is not None else [None]
    body = []
    for i in idx_vals:
        cells = []
        for c in cols:
            g = (*i, c) if columns is not None else i
            if g not in selected:
                cells.append("–")
                continue
            pick = [
                r
                for r in rows
                if tuple(r.get(k) for k in by) == g and knob_value(r, knob) == selected[g]
            ]
            text = format_ci(
                [r.get(value) for r in pick],
                scale=scale,
                digits=digits,
                diverged=[bool(r.get("diverged")) for r in pick],
            )
            if show_knob and multi:
                text += f" @ {fk(selected[g])}"
            cells.append(text)
        body.append([*(str(v) for v in i), *cells])
    return body, selected
