"""Paired differences and the verdict rule.

A claim is judged from one **primary** comparison, declared in the claim's entry before any
number is read, and **secondary** ones (other worker counts or depths, other pairs the claim
names, trends, conditions such as raw inputs or one fixed rate), grouped under labels. Every
comparison is a :class:`Diff`, oriented so that a positive value is the claimed direction.

* A difference is **beyond noise** when at least :data:`~experiments.reports.MIN_PAIRS` seeds
  trained in both runs and the 95 % t interval of the per-seed paired differences excludes 0.
  Its standard error is ``√(sd² / n + test_var)``: the seeds' spread and, where the rows carry
  their final test predictions, the variance from resampling the test examples
  (:func:`examples_variance`; every seed is scored on the same test set, so that part does not
  shrink with more seeds).
* The **minimum detectable effect** of the primary (paired t test, two-sided 5 %, 80 % power):
  ``MDE = (t_{0.975, n−1} + t_{0.80, n−1}) · se`` from its pairs (infinite with fewer than
  ``MIN_PAIRS`` pairs), compared with the paper's effect rescaled to this task.
* The **intention-to-treat companion** of a difference scores a diverged seed at the task's
  chance level instead of leaving the seed out; the per-protocol difference stays the statistic
  the verdict reads, the companion is shown beside it.

:func:`trend` tests "as M grows" claims as the per-seed slope of the paired difference against
log2 M; the verdict rule over these differences is :func:`study.decisions.decide`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.reports import MIN_PAIRS
from jaxstale import tasks
from jaxstale.loop import decode_correct, decode_losses

#: the family-wise error rate of a claim's declared secondaries (Holm), and a difference's
#: two-sided level (its 95 % interval)
ALPHA = 0.05


def _t(q: float, df: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(q, df))


@dataclass(frozen=True)
class Diff:
    """A paired difference ``a − b`` of the test metric: accuracy (fractions, printed in
    points: ``scale`` 100, ``digits`` 1) or a language model's loss (nats, ``scale`` 1,
    ``digits`` 3).

    ``values``: one per seed that trained in both runs (per protocol); ``itt``: one per seed
    run in both, a diverged run scored at ``chance`` (intention to treat; equal to ``values``
    when no seed diverged); ``b_error``: the mean test error of ``b`` over the pairs (1 −
    accuracy; a loss itself: the scale a paper's relative effect is applied to); ``unit``:
    what one value measures; ``what``: the comparison's name when it is not ``a − b`` (a
    trend); ``test_var``: the variance of the mean difference from resampling the test
    examples (:func:`examples_variance`; 0: the test set taken as fixed), added to the seeds'
    ``sd² / n`` in the interval and the MDE."""

    a: str
    b: str
    values: tuple[float, ...]
    itt: tuple[float, ...] = ()
    chance: float | None = None
    b_error: float = math.nan
    unit: str = "points"
    what: str = ""
    test_var: float = 0.0
    scale: float = 100.0
    digits: int = 1
    #: the arms whose rate selected on validation is still the smallest or largest of its grid
    #: (``"<arm> at its grid's smallest rate"``): the difference is then a bound, not a measurement
    edges: tuple[str, ...] = ()
    #: each arm's selection margin (:func:`arm_margins`): its selected rate, the runner-up and
    #: how far behind that was on validation — the selection's own uncertainty (issue 53)
    margins: tuple[tuple[str, Any, Any, float], ...] = ()

    def fmt(self, x: float, sign: bool = False) -> str:
        """A value of this difference's metric as printed (points or nats)."""
        return f"{self.scale * x:{'+' if sign else ''}.{self.digits}f}"

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def sd(self) -> float:
        return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan

    @property
    def se(self) -> float:
        """Standard error of the mean: ``√(sd² / n + test_var)`` (NaN with fewer than two)."""
        return math.sqrt(self.sd**2 / self.n + self.test_var) if self.n > 1 else math.nan

    @property
    def half(self) -> float:
        """Half-width of the 95 % t interval (NaN with fewer than two pairs)."""
        return _t(0.975, self.n - 1) * self.se if self.n > 1 else math.nan

    @property
    def sign(self) -> int:
        """+1 / −1 when beyond noise (≥ ``MIN_PAIRS`` pairs, the 95 % interval excludes 0),
        else 0 (within noise)."""
        if self.n < MIN_PAIRS or not math.isfinite(self.half):
            return 0
        if self.mean - self.half > 0:
            return 1
        if self.mean + self.half < 0:
            return -1
        return 0

    @property
    def mde(self) -> float:
        """Minimum detectable effect (fraction): paired t, two-sided 5 %, 80 % power; infinite
        with fewer than ``MIN_PAIRS`` pairs (nothing can be called beyond noise then)."""
        if self.n < MIN_PAIRS:
            return math.inf
        return (_t(0.975, self.n - 1) + _t(0.80, self.n - 1)) * self.se

    @property
    def p(self) -> float:
        """Two-sided p-value of the paired t test of ``mean = 0`` on ``se`` (1 with fewer than
        ``MIN_PAIRS`` pairs): below :data:`ALPHA` exactly when the 95 % interval excludes 0."""
        if self.n < MIN_PAIRS or not math.isfinite(self.se):
            return 1.0
        if self.se == 0:
            return 0.0 if self.mean != 0 else 1.0
        from scipy import stats

        return float(2 * stats.t.sf(abs(self.mean) / self.se, self.n - 1))

    @property
    def dropped(self) -> int:
        """Seeds run in both but left out of ``values`` (diverged in one or both)."""
        return max(len(self.itt) - self.n, 0)

    def name(self) -> str:
        return self.what or f"{self.a} − {self.b}"

    def _stat(self, values: Sequence[float], test_var: float = 0.0) -> str:
        d = dataclasses.replace(self, values=tuple(values), test_var=test_var)
        half = f" ± {self.fmt(d.half)}" if math.isfinite(d.half) else ""
        return f"{self.fmt(d.mean, sign=True)}{half}"

    def text(self, *, itt: bool = False) -> str:
        """``a − b = +x.x ± y.y points (n seeds, beyond noise)``; with the intention-to-treat
        companion when a seed was left out (or always, ``itt=True``)."""
        if self.n == 0:
            out = f"{self.name()}: no seed where both trained"
        else:
            noise = (
                f"fewer than {MIN_PAIRS} pairs, not testable"
                if self.n < MIN_PAIRS
                else ("beyond noise" if self.sign else "within noise")
            )
            seeds = "seed" if self.n == 1 else "seeds"
            out = (
                f"{self.name()} = {self._stat(self.values, self.test_var)} {self.unit} "
                f"({self.n} {seeds}, {noise})"
            )
        if itt and self.n and not self.dropped and self.chance is None:
            out += "; intention to treat: the same (no seed diverged)"
        elif self.itt and (itt or self.dropped):
            chance = (
                ""
                if self.chance is None
                else f" at chance, {self.scale * self.chance:.3g} "
                + ("%" if self.scale == 100 else self.unit)
            )
            out += (
                f"; intention to treat (diverged seeds{chance}): {self._stat(self.itt)} "
                f"over {len(self.itt)} seeds"
            )
        return out


def by_seed(
    rows: Sequence[Mapping[str, Any]], chance: float | None, field: str
) -> dict[Any, float]:
    """``field`` (the test metric) by seed; a diverged (or valueless) run left out, or at
    ``chance``."""
    out: dict[Any, float] = {}
    for r in rows:
        v = r.get(field)
        if not r.get("diverged") and v is not None and math.isfinite(float(v)):
            out[r.get("seed")] = float(v)
        elif chance is not None:
            out[r.get("seed")] = chance
    return out


def _trained(rows: Sequence[Mapping[str, Any]], field: str) -> bool:
    return all(not r.get("diverged") and r.get(field) is not None for r in rows)


def _pairs(
    a_rows: Sequence[Mapping[str, Any]],
    b_rows: Sequence[Mapping[str, Any]],
    chance_of: Callable[[Sequence[Mapping[str, Any]]], float],
    field: str,
) -> tuple[dict[Any, tuple[float, float]], dict[Any, tuple[float, float]], float | None]:
    """Per-protocol pairs, intention-to-treat pairs (by seed) and the chance level used (None
    when no seed diverged: it is then never looked up)."""
    pa, pb = by_seed(a_rows, None, field), by_seed(b_rows, None, field)
    pp = {k: (pa[k], pb[k]) for k in pa if k in pb}
    if _trained(a_rows, field) and _trained(b_rows, field):
        return pp, pp, None
    chance = chance_of([*a_rows, *b_rows])
    ia, ib = by_seed(a_rows, chance, field), by_seed(b_rows, chance, field)
    return pp, {k: (ia[k], ib[k]) for k in ia if k in ib}, chance


def examples_variance(
    a_rows: Sequence[Mapping[str, Any]], b_rows: Sequence[Mapping[str, Any]], seeds: Sequence[Any]
) -> float:
    """The variance of the mean paired difference over ``seeds`` from resampling the test
    examples: with ``c`` a run's per-example correctness (``test_correct``) — or a language
    model's loss per test window (``test_losses``) — and ``D_i = mean_s (c_a,s,i − c_b,s,i)``,
    ``Var(D) / N`` over the ``N`` examples (the seeds' runs share one test set, so this part of
    the error does not shrink with more seeds). 0 when a run has neither (the test set then
    counts as fixed). :func:`contrast_variance` of ``((1, a), (−1, b))``."""
    return contrast_variance(((1.0, a_rows), (-1.0, b_rows)), seeds)


def contrast_variance(
    arms: Sequence[tuple[float, Sequence[Mapping[str, Any]]]], seeds: Sequence[Any]
) -> float:
    """:func:`examples_variance` of a linear contrast ``Σ_k w_k · m_k`` (:func:`contrast`):
    ``D_i = mean_s Σ_k w_k c_k,s,i`` over the seeds, ``Var(D) / N`` (a margin added to the
    contrast is a constant: it adds nothing). 0 when an arm's rows carry no predictions for
    one of the seeds, or the arms' test sets differ in size."""
    if not seeds:
        return 0.0
    total: np.ndarray | None = None
    for w, rows in arms:
        field = "test_losses" if any(r.get("test_losses") for r in rows) else "test_correct"
        read = decode_losses if field == "test_losses" else decode_correct
        by = {r.get("seed"): r.get(field) for r in rows}
        if not all(by.get(s) for s in seeds):
            return 0.0
        got = np.stack([read(by[s]) for s in seeds]).astype(np.float64)
        if (total is not None and got.shape != total.shape) or not np.isfinite(got).all():
            return 0.0
        total = w * got if total is None else total + w * got
    if total is None or total.shape[1] < 2:
        return 0.0
    d = total.mean(axis=0)
    return float(d.var(ddof=1) / len(d))


def _reading(task: tasks.Task | None) -> dict[str, Any]:
    """A :class:`Diff`'s fields for the task's metric (accuracy in points by default)."""
    t = tasks.or_default(task)
    unit = "points" if t.metric == "accuracy" else t.unit
    return {"unit": unit, "scale": t.scale, "digits": t.digits}


def _error(values: Sequence[float], task: tasks.Task | None) -> float:
    """The mean test error of an arm: 1 − accuracy, or the loss itself."""
    mean = float(np.mean(values))
    return 1.0 - mean if tasks.or_default(task).higher_is_better else mean


def paired(
    a_rows: Sequence[Mapping[str, Any]],
    b_rows: Sequence[Mapping[str, Any]],
    a: str,
    b: str,
    chance_of: Callable[[Sequence[Mapping[str, Any]]], float],
    task: tasks.Task | None = None,
) -> Diff:
    """The paired difference ``a − b`` of the task's test metric by seed (accuracy without a
    task), with its intention-to-treat companion (``chance_of(rows)`` is asked only when a
    seed diverged). For a loss, ``a − b`` is positive when ``a`` is worse: a judge orients its
    comparisons by the order of the arms."""
    field = tasks.or_default(task).final("test")
    pp, itt, chance = _pairs(a_rows, b_rows, chance_of, field)
    err = _error([y for _, y in pp.values()], task) if pp else math.nan
    return Diff(
        a,
        b,
        tuple(x - y for x, y in pp.values()),
        tuple(x - y for x, y in itt.values()),
        chance,
        err,
        test_var=examples_variance(a_rows, b_rows, list(pp)),
        **_reading(task),
        edges=arm_edges([(a, a_rows), (b, b_rows)]),
        margins=arm_margins([(a, a_rows), (b, b_rows)]),
    )


def arm_margins(
    arms: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
) -> tuple[tuple[str, Any, Any, float], ...]:
    """``(arm, selected, runner-up, gap)`` for every arm whose rows carry a ``rate_margin``
    (:func:`study.core.selected`: the runner-up's validation score behind the selection's,
    over the seeds every rate ran)."""
    out = []
    for name, rows in arms:
        got = next((r["rate_margin"] for r in rows if r.get("rate_margin")), None)
        if got:
            out.append((name, got[0], got[1], float(got[2])))
    return tuple(out)


def margin_text(d: Diff) -> str:
    """The evidence line of a difference's selection margins ("" without any): each arm's rate
    and the runner-up's, the gap on validation in the difference's unit."""

    def knob(k: Any) -> str:  # a rate, or (rate, λ) with λ None for a method without one
        ks = [x for x in (k if isinstance(k, tuple) else (k,)) if x is not None]
        return ", λ ".join(f"{x:g}" for x in ks)

    parts = [f"{arm} {knob(sel)} over {knob(run)} by {d.fmt(gap)}"
             for arm, sel, run, gap in d.margins]  # fmt: skip
    if not parts:
        return ""
    unit = d.unit.split(" per ")[0]
    return (f"- the selection's own uncertainty (validation, the seeds every rate ran; {unit}): "
            + "; ".join(parts))  # fmt: skip


def arm_edges(arms: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> tuple[str, ...]:
    """``"<arm> <why>"`` (e.g. ``"asgd at its grid's smallest rate"``) for every arm whose rows
    carry a ``rate_edge`` mark (:func:`study.core.selected` sets it)."""
    out = []
    for name, rows in arms:
        side = next((r.get("rate_edge") for r in rows if r.get("rate_edge")), None)
        if side:
            out.append(f"{name} {side}")
    return tuple(out)


def reversible_edges(d: Diff) -> tuple[str, ...]:
    """The edges of ``d`` (:func:`arm_edges`) that could reverse its reading: an arm whose
    selected rate is its grid's smallest or largest may do better at a rate not run, which
    moves ``a − b`` up for a better ``a`` in accuracy (down in a loss) and down for a better
    ``b`` (up in a loss); an edge moving it against the sign it is read with makes the reading
    no evidence (issue 53, rule 5). Empty for a difference within noise, a trend (its arms'
    edges move each point differently) or edges of arms other than ``a`` and ``b``."""
    if not d.sign or d.unit.endswith(("per doubling of M", "per doubling of N")):
        return ()
    loss = d.unit.startswith("nats")
    out = []
    for e in d.edges:
        arm = d.a if e.startswith(f"{d.a} ") else d.b if e.startswith(f"{d.b} ") else None
        if arm is None:
            continue
        move = (1 if arm == d.a else -1) * (-1 if loss else 1)
        if move == -d.sign:
            out.append(e)
    return tuple(out)


def contrast(
    arms: Sequence[tuple[float, Sequence[Mapping[str, Any]]]],
    a: str,
    b: str,
    chance_of: Callable[[Sequence[Mapping[str, Any]]], float],
    task: tasks.Task | None = None,
    what: str = "",
    offset: float = 0.0,
) -> Diff:
    """A per-seed linear contrast of the task's test metric, ``offset + Σ_k w_k · m_k``, over
    the seeds every arm ran: a paired difference is ``((1, a), (−1, b))``; a difference of two
    gaps (AdamW's staleness cost minus Muon's) is ``(+1, −1, −1, +1)`` over four arms; an
    ``offset`` turns ``b + δ − a`` into a non-inferiority test with margin ``δ``. Per protocol
    over the seeds where every arm trained; the intention-to-treat companion scores a diverged
    arm at the task's chance level. ``b_error`` is NaN (no reference arm to rescale by). Its
    interval counts the test set's resampling as :func:`paired`'s does
    (:func:`contrast_variance`)."""
    field = tasks.or_default(task).final("test")

    def common(per: list[dict[Any, float]]) -> list[Any]:
        return [k for k in per[0] if all(k in p for p in per[1:])]

    def combine(per: list[dict[Any, float]]) -> tuple[float, ...]:
        return tuple(
            offset + sum(w * p[k] for (w, _), p in zip(arms, per, strict=True)) for k in common(per)
        )

    trained = [by_seed(rows, None, field) for _, rows in arms]
    values = combine(trained)
    if all(_trained(rows, field) for _, rows in arms):
        itt, chance = values, None
    else:
        chance = chance_of([r for _, rows in arms for r in rows])
        itt = combine([by_seed(rows, chance, field) for _, rows in arms])
    names = [a, b, *(f"arm {k + 1}" for k in range(2, len(arms)))]
    named = [(n, rows) for n, (_, rows) in zip(names, arms, strict=False)]
    test_var = contrast_variance(arms, common(trained))
    return Diff(a, b, values, itt, chance, what=what, test_var=test_var, **_reading(task),
                edges=arm_edges(named), margins=arm_margins(named))  # fmt: skip


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    xs = np.array([x for x, _ in points])
    if len(set(xs.tolist())) < 2:
        return None
    ys = np.array([y for _, y in points])
    return float(np.sum((xs - xs.mean()) * (ys - ys.mean())) / np.sum((xs - xs.mean()) ** 2))


def trend(
    points: Sequence[tuple[float, Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]],
    a: str,
    b: str,
    var: str,
    chance_of: Callable[[Sequence[Mapping[str, Any]]], float],
    task: tasks.Task | None = None,
) -> Diff:
    """How the paired difference ``a − b`` changes as ``var`` grows: per seed, the least-squares
    slope of its differences against log2 ``var`` over the values of ``var`` where that seed
    has a pair (at least two), in points (a loss: nats) per doubling; its 95 % interval over
    the seeds (a seed fixes the initial weights and the data order at every ``var``).
    ``points``: ``(value of var, a's rows, b's rows)``, each pair at its own selected rate;
    ``b_error``: ``b``'s mean error over them."""
    field = tasks.or_default(task).final("test")
    pp: dict[Any, list[tuple[float, float]]] = {}
    itt: dict[Any, list[tuple[float, float]]] = {}
    errors, chance = [], None
    for x, ra, rb in points:
        p, i, c = _pairs(ra, rb, chance_of, field)
        chance = c if c is not None else chance
        for k, (u, v) in p.items():
            pp.setdefault(k, []).append((math.log2(x), u - v))
        for k, (u, v) in i.items():
            itt.setdefault(k, []).append((math.log2(x), u - v))
        if p:
            errors.append(_error([v for _, v in p.values()], task))
    xs = ", ".join(f"{x:g}" for x, _, _ in points)

    def slopes(per: dict[Any, list[tuple[float, float]]]) -> tuple[float, ...]:
        return tuple(s for s in (slope(v) for v in per.values()) if s is not None)

    reading = _reading(task)
    reading["unit"] = f"{reading['unit']} per doubling of {var}"
    return Diff(
        a,
        b,
        slopes(pp),
        slopes(itt),
        chance,
        float(np.mean(errors)) if errors else math.nan,
        what=f"slope of {a} − {b} against log2 {var} ({var} = {xs})",
        **reading,
    )
