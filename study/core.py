"""The claims' machinery: claims and their verdicts, the run folders' rows, the task's chance
level, selection on validation, paired differences and the shared comparisons."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments import runs
from experiments.grids import never_trains
from jaxstale import tasks

from . import decisions, verdicts
from .verdicts import Diff


@dataclass
class Verdict:
    """A claim's outcome: ``verdict`` (the headline: a label of the report's header, with what
    it rests on), evidence (markdown lines), tables (markdown) and figures (run, file stem)."""

    verdict: str
    evidence: str
    tables: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)
    #: what qualifies the verdict without changing it (a primary arm whose selected rate is
    #: still at its grid's edge: the primary is a bound); "" when nothing does
    caveat: str = ""
    #: the set-up checks, whichever way they point (:func:`~study.decisions.setup_summary`)
    setup: str = ""
    #: a comparative claim's primary, its minimum detectable effect and the expected effect
    #: (the headline table's numbers); None for a threshold check or a moonshot
    primary: Diff | None = None
    mde: float = math.nan
    expected: float = math.nan

    @property
    def summary(self) -> str:
        """The verdict with its set-up checks and caveat, as the report's sections print it."""
        return "; ".join(x for x in (self.verdict, self.setup, self.caveat) if x)

    @property
    def label(self) -> str:
        """The verdict's label alone (``not reached`` for ``not reached, the upper bound …``)."""
        return self.verdict.split(" (")[0].split(", ")[0]

    @property
    def short(self) -> str:
        """The verdict in at most 40 characters, for the headline table: its label, and why
        an untestable one is (chance, assay sensitivity, size)."""
        why = self.verdict.partition(" (")[2]
        if self.label == "untestable here":
            for key, text in (("chance", "arm at chance"), ("assay", "no assay sensitivity"),
                              ("grid's edge", "arm at its grid's edge"),
                              ("failure to prevent", "no failure to prevent"),
                              ("MDE", "MDE > expected"), ("pairs", "too few pairs")):  # fmt: skip
                if key in why:
                    return f"untestable ({text})"
        return self.label


@dataclass
class Evidence:
    """What a comparative claim's judge returns: the declared ``primary`` comparison (None: its
    cells were not run), the ``secondary`` comparisons and conditions by label (every
    difference oriented so that positive is the claimed direction), ``notes`` (further lines:
    comparisons without a claimed direction, conditions left out and why), tables, figures."""

    primary: Diff | None
    secondary: dict[str, list[Diff]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)
    #: the expected effect in the primary's unit when the judge computes it from the runs (a
    #: paper's "closes 53 % of the gap" times this task's gap); None: the claim's ``expected``
    expected: float | None = None
    #: a non-inferiority claim's negative control: the same test run on an arm that should
    #: fail it (vanilla, no mitigation); if it passes too, the test cannot tell the method
    #: from doing nothing (no assay sensitivity) and a passing primary is not a verdict
    control: Diff | None = None
    #: the failure a fix claims to prevent, as ``uncorrected − reference + margin`` (negative
    #: beyond noise: it fails); if it is not shown, there is nothing to prevent here
    premise: Diff | None = None


#: the caveat of a verdict an estimated expected effect decides (Claim.expected_estimate)
ESTIMATE = "rests on an estimated expected effect (not checked against the paper's tables)"

#: the edge mark of an arm no rate lifts off chance (:func:`rate_edge`): no test of a primary
CHANCE_EDGE = "at chance at every rate of its grid"


@dataclass(frozen=True)
class Claim:
    """A published claim and how to judge it from the run folders.

    ``primary``: the one comparison the verdict rests on, declared here (the report prints it
    before any number); ``expected``: the paper's effect as a relative reduction of the test
    error of the primary's reference arm (``b``; for a trend, per doubling), applied to that
    arm's error on this task to give the expected effect in points; ``expected_why``: where
    the number comes from; ``expected_abs``: ``expected`` is already in the primary's unit (a
    fraction of accuracy, or nats), not relative to the reference arm's error (a language
    model's gap in nats, whose papers report it absolute). ``judge`` returns
    :class:`Evidence` (verdict by :func:`~study.decisions.decide`) or, for a
    threshold check or a moonshot, a :class:`Verdict`."""

    id: str
    title: str
    source: str
    statement: str
    runs: tuple[str, ...]
    judge: Callable[[Context], Evidence | Verdict]
    primary: str = ""
    expected: float | None = None
    expected_why: str = ""
    expected_abs: bool = False
    #: how an absolute ``expected`` is printed before any run is read: nats as is, or an
    #: accuracy fraction in points (``expected_scale`` 100)
    expected_unit: str = "nats"
    expected_scale: float = 1.0
    #: the expected effect is an estimate, not checked against the paper's tables (issue 53):
    #: a verdict it decides ("within noise" against "untestable here") says so
    expected_estimate: bool = False
    #: the short pre-declared list of secondaries (label prefixes): the only ones corrected
    #: together (Holm) and allowed to qualify the verdict; other labels are exploratory, labels
    #: starting "set-up check" are reported beside the verdict (:func:`decisions.partition`)
    secondaries: tuple[str, ...] = ()

    def expected_points(self, primary: Diff, ev: Evidence | None = None) -> float:
        """The expected effect on this task, in the primary's unit (a fraction of accuracy, or
        nats): the judge's (``ev.expected``), else ``expected`` as is (``expected_abs``) or ×
        the primary's reference arm's test error (NaN when unknown)."""
        if ev is not None and ev.expected is not None:
            return ev.expected
        if self.expected is None:
            return math.nan
        return self.expected if self.expected_abs else self.expected * primary.b_error

    def assess(self, ctx: Context) -> Verdict:
        """The claim's verdict from the run folders (``not run`` without its first folder)."""
        return self.judged(ctx)[0]

    def judged(self, ctx: Context) -> tuple[Verdict, Evidence | None]:
        """:meth:`assess`'s verdict and its judge's evidence (None where it judged none)."""
        missing = [n for n in self.runs[:1] if not ctx.has(n)]
        if missing:
            return Verdict("not run", f"missing run folder(s): {', '.join(missing)}"), None
        got = self.judge(ctx)
        return (got, None) if isinstance(got, Verdict) else (self.render(got), got)

    def render(self, ev: Evidence) -> Verdict:
        """The verdict and evidence text of a comparative claim."""
        if ev.primary is None:
            lines = [f"- primary ({self.primary}): not run", *ev.notes]
            return Verdict("not run", "\n".join(lines), ev.tables, ev.figures)
        p = ev.primary
        expected = self.expected_points(p, ev)
        secondary, repeats = decisions.distinct(p, ev.secondary)
        declared, exploratory, checks = decisions.partition(secondary, self.secondaries)
        d = decisions.decide(p, declared, expected)
        over = " (mean over the trend's points)" if p.what else ""
        scale = (
            "from this task's runs"
            if ev.expected is not None
            else "the paper's, as is"
            if self.expected_abs
            else f"{100 * (self.expected or 0):.3g} % of {p.b}'s test error here{over}, "
            + (f"{100 * p.b_error:.1f} %" if p.scale == 100 else f"{p.fmt(p.b_error)} {p.unit}")
        )
        mde = "∞ (too few pairs)" if not math.isfinite(d.mde) else p.fmt(d.mde)
        want = (
            f"expected {p.fmt(expected)} {p.unit} ({scale}; {self.expected_why})"
            if math.isfinite(expected)
            else "no expected effect (no paper effect, or no pair to rescale it by)"
        )
        lines = [
            f"- **primary**: {p.text(itt=True)}",
            f"- minimum detectable effect (80 % power): {mde} {p.unit}; {want}",
            *filter(None, [verdicts.margin_text(p)]),
        ]
        for label, diffs in declared.items():
            signs = d.signs[label]
            tag = (" — **against the claim**" if any(x < 0 for x in signs)
                   else " — for the claim" if any(x > 0 for x in signs) else "")  # fmt: skip
            lost = sum(bool(x.sign) and not y for x, y in zip(diffs, signs, strict=True))
            tag += f" ({lost} beyond noise alone, not after Holm's correction)" * bool(lost)
            lines.append(f"- secondary, {label}{tag}: " + "; ".join(x.text() for x in diffs))
        for label, diffs in {**checks, **exploratory}.items():
            kind = "" if label in checks else "exploratory (not in the verdict), "
            lines.append(f"- {kind}{label}: " + "; ".join(x.text() for x in diffs))
        for label, x, earlier in repeats:
            kind = "secondary" if label.startswith(self.secondaries or ("\0",)) else "exploratory"
            lines.append(
                f"- {kind}, {label}: {x.text()} — repeats {earlier} (the same per-seed "
                "results: this condition selected the same runs); not counted again"
            )
        caveat = ""
        if self.expected_estimate and d.label in ("within noise", "untestable here"):
            caveat = ESTIMATE
        if p.edges:
            caveat = "; ".join(x for x in (caveat, "a bound: " + ", ".join(p.edges)) if x)
            lines.append(
                f"- **a bound**: an arm of the primary was not measured at its best rate "
                f"({'; '.join(p.edges)}; the grid after its extensions): it may do better at a "
                "rate not run"
            )
        headline = d.headline
        dead = [e for e in p.edges if e.endswith(CHANCE_EDGE)]
        if dead:  # issue 53: a difference to an untrained arm is no test
            headline = "untestable here (an arm of the primary at chance at every rate)"
        elif turn := verdicts.reversible_edges(p):  # issue 53: a bound that may turn it round
            why = f"at its grid's edge, a rate not run may reverse it: {', '.join(turn)}"
            headline = f"untestable here ({why})"
            lines.append("- **not testable as run**: the primary is read as "
                         f"{'for' if p.sign > 0 else 'against'} the claim, and an arm at its "
                         "grid's edge could move it the other way at a rate not run")  # fmt: skip
        more, headline = decisions.sensitivity(ev.control, ev.premise, d.label, headline)
        lines += more
        lines += ev.notes
        setup = decisions.setup_summary(checks)
        return Verdict(headline, "\n".join(lines), ev.tables, ev.figures, caveat, setup, p,
                       d.mde, expected)  # fmt: skip


@functools.cache
def _dataset(name: str) -> Any:
    """A dataset by name, as its task reads it (raw; a text's fixed splits), once per process."""
    from jaxstale import data, text

    if name in (*text.TEXTS, *text.TFDS_TEXTS):
        return data.load(name)
    return data.load(name, validation=0.0, standardize="none")


def dataset_task(dataset: str) -> tasks.Task:
    """The task of a dataset by name: its metric, direction and chance level."""
    from experiments.common import task_of as _task

    return _task(_dataset(dataset))


def num_classes(dataset: str) -> int:
    """The number of classes of a dataset (a language model's: its vocabulary)."""
    return int(_dataset(dataset).num_classes)


def task_of(rows: Sequence[Mapping[str, Any]]) -> tasks.Task:
    """The rows' task: a classification over the ``num_classes`` the rows record, else their
    ``dataset``'s task (:meth:`Context.rows` fills it in from the run's config.json).

    Raises:
        ValueError: the rows name no dataset, or several."""
    rc = {r["reward_chance"] for r in rows if r.get("reward_chance") is not None}
    if rc:  # a reward (stale_rl): a uniform policy's expected reward
        return tasks.reward(rc.pop()) if len(rc) == 1 else _several(rc)
    ks = {r["num_classes"] for r in rows if r.get("num_classes")}
    if not ks:
        names = {r["dataset"] for r in rows if r.get("dataset")}
        if len(names) != 1:
            raise ValueError(
                f"chance level: the rows name {len(names)} datasets ({sorted(names)}); "
                "need exactly one (a row's 'dataset' or the run's config.json)"
            )
        return dataset_task(names.pop())
    if len(ks) != 1:
        raise ValueError(f"chance level: rows of datasets with {sorted(ks)} classes")
    return tasks.classification(int(ks.pop()))


def _several(levels: set[float]) -> tasks.Task:
    raise ValueError(f"chance level: rows of rewards with chance levels {sorted(levels)}")


def chance_of(rows: Sequence[Mapping[str, Any]]) -> float:
    """The task's chance level (:func:`task_of`): ``1 / num_classes``, a language model's
    ``log V``: the score of a diverged seed in selection and intention to treat."""
    return task_of(rows).chance


def _metric_task(rows: Sequence[Mapping[str, Any]]) -> tasks.Task | None:
    """The task whose metric the rows record, for reading them (field names, unit, scale):
    None (accuracy) unless they record a loss, then their dataset's task, or a language
    model's reading without a chance level when they name no dataset (:func:`chance_of` is
    what asks for one)."""
    if any("final_val_reward" in r for r in rows):
        return task_of(rows) if any("reward_chance" in r for r in rows) else tasks.reward(0.0)
    if not any(r.get("final_test_loss") is not None or r.get("final_val_loss") is not None
               for r in rows):  # fmt: skip
        return None
    names = {r["dataset"] for r in rows if r.get("dataset")}
    if len(names) == 1:
        return dataset_task(names.pop())
    return tasks.Task("language_model", "loss", math.nan, 1.0, 3, "nats")


def _needs_chance(rows: Sequence[Mapping[str, Any]], value: str) -> bool:
    return any(r.get("diverged") or r.get(value) is None for r in rows)


def chance_if_needed(rows: Sequence[Mapping[str, Any]], value: str = "final_val_accuracy") -> float:
    """:func:`chance_of` where a seed diverged (or lacks ``value``), else 0 (unused then:
    selection scores a diverged seed only)."""
    return chance_of(rows) if _needs_chance(rows, value) else 0.0


#: configuration fields that decide which cells a sweep runs and how, not what a cell computes
#: (how many seeds, which ran the rate grid, how far a grid is extended, how seeds are grouped
#: into vmapped lanes: bit for bit the same numbers, or float rounding apart where README's
#: "What agrees with what" says so): two runs may differ in them and still be read together
#: (:meth:`Context.differs`)
PROCEDURAL = ("seeds", "tune_seeds", "extend_edges", "seed_mode")


class Context:
    """The run folders' rows, by configuration name."""

    def __init__(self, results: Path, quick: bool) -> None:
        self.results, self.quick = results, quick
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def path(self, name: str) -> Path:
        return self.results / name

    def has(self, name: str) -> bool:
        return (self.path(name) / "summary.json").exists()

    def rows(self, name: str) -> list[dict[str, Any]]:
        """The rows of a run; a row without ``dataset`` gets the run config's (so that
        :func:`chance_of` finds the task's chance level from the rows)."""
        if name not in self._rows:
            summary = self.path(name) / "summary.json"
            if not summary.exists():
                raise FileNotFoundError(
                    f"no results for {name!r} in {self.path(name)}: run with --run"
                )
            rows = json.loads(summary.read_text())["rows"]
            ds = self.dataset(name)
            if ds is not None:
                rows = [r if r.get("dataset") else {**r, "dataset": ds} for r in rows]
            if (k := self.setting(name, "symbols")) is not None:  # a reward's chance level
                rows = [{**r, "reward_chance": 1.0 / (k + 1)} for r in rows]
            self._rows[name] = rows
        return self._rows[name]

    def config(self, name: str) -> dict[str, Any]:
        return json.loads((self.path(name) / "config.json").read_text())["config"]

    def dataset(self, name: str) -> str | None:
        """The dataset a run's config.json names (None without one)."""
        ds = self.setting(name, "dataset")
        return ds if isinstance(ds, str) else None

    def setting(self, name: str, key: str) -> Any:
        """One field of a run's config.json (None without it)."""
        try:
            return self.config(name).get(key)
        except (FileNotFoundError, KeyError, json.JSONDecodeError):
            return None

    def chance(self, name: str) -> float:
        """The chance level of a run's task (1 / classes of its dataset)."""
        return chance_of(self.rows(name)) if self.rows(name) else math.nan

    def differs(self, base: str, other: str, varies: Sequence[str]) -> list[str]:
        """How ``other``'s configuration differs from ``base``'s outside the fields ``varies``
        (``"field base → other"``, sorted); empty when the two runs' rows can be read together:
        a seed then pairs across them (same data, model, budget, evaluation), so a paired
        difference may take one arm from each. A run re-run at another budget while the other
        keeps its rows is not read with them."""
        a, b = self.config(base), self.config(other)
        keys = sorted((set(a) | set(b)) - set(varies) - set(PROCEDURAL))
        return [f"{k} {a.get(k)} → {b.get(k)}" for k in keys if a.get(k) != b.get(k)]

    def apart(self, base: str, other: str, varies: Sequence[str]) -> str | None:
        """The evidence line saying why ``other``'s rows are not read with ``base``'s (None
        when they can be: :meth:`differs` is empty)."""
        d = self.differs(base, other, varies)
        if not d:
            return None
        return (
            f"- `{other}`'s rows not read with `{base}`'s: its configuration differs outside "
            f"{', '.join(varies)} ({'; '.join(d)}); a seed pairs across runs of one set-up only"
        )


# --------------------------------------------------------------------------------- judging


def selected(
    rows: Sequence[dict[str, Any]], knob: Sequence[str] = ("lr", "lam"), **fields: Any
) -> list[dict[str, Any]]:
    """The rows of one group (``fields``) at its knob selected on validation (a diverged seed
    scored at the task's chance level)."""
    group = [r for r in rows if all(r.get(k) == v for k, v in fields.items())]
    if not group:
        return []
    knob = tuple(k for k in knob if any(k in r for r in group))
    value = tasks.or_default(_metric_task(group)).final("val")
    chance = chance_if_needed(group, value)
    (pick,) = runs.select(group, by=(), knob=knob, value=value, chance=chance).values()
    out = [r for r in group if runs.stats.knob_value(r, knob) == pick]
    per: dict[Any, list[dict[str, Any]]] = {}
    for r in group:
        per.setdefault(runs.stats.knob_value(r, knob), []).append(r)
    extra: dict[str, Any] = {}
    if side := rate_edge(group, out):
        extra["rate_edge"] = side
    if (second := runs.stats.runner_up(per, value, chance)) is not None:
        extra["rate_margin"] = (pick, second[0], second[1])  # issue 53: the selection's doubt
    return [{**r, **extra} for r in out] if extra else out


def _never_trains(group: Sequence[dict[str, Any]]) -> bool:
    """Whether no rate of the group beats chance on validation (:func:`experiments.grids.
    never_trains`, the sweeps' own rule); False when the rows do not say their task (hand-built
    rows without a dataset)."""
    try:
        t = task_of(group)
    except ValueError:
        return False
    return never_trains(group, t.chance, t)


def rate_edge(group: Sequence[dict[str, Any]], picked: Sequence[dict[str, Any]]) -> str | None:
    """What makes a selection a bound, or None: ``"at its grid's smallest rate"`` (or
    largest) when the learning rate of ``picked`` (a group's rows at its selection) is still at
    that end of the rates the group ran (its grid after the extensions,
    :func:`experiments.grids.extend_grid`); ``"at chance at every rate of its grid"`` when no
    rate trains (a tie at chance can leave the selection inside the grid while the rate that
    trains lies beyond it). None when the group ran fewer than two rates (a fixed rate is not a
    selection)."""
    rates = sorted({r["lr"] for r in group if isinstance(r.get("lr"), int | float)})
    lr = picked[0].get("lr") if picked else None
    if len(rates) < 2 or lr not in rates:
        return None
    if _never_trains(group):
        return CHANCE_EDGE
    side = "smallest" if lr == rates[0] else "largest" if lr == rates[-1] else None
    return f"at its grid's {side} rate" if side else None


def cell(rows: Sequence[dict[str, Any]]) -> str:
    """``mean ± CI [div.] @ lr`` of the rows of one selected group."""
    if not rows:
        return "–"
    t = tasks.or_default(_metric_task(rows))
    text = runs.format_ci(
        [r.get(t.final("test")) for r in rows],
        scale=t.scale,
        digits=t.digits,
        diverged=[r["diverged"] for r in rows],
    )
    lr = rows[0].get("lr")
    edge = " (edge)" if rows[0].get("rate_edge") else ""
    return f"{text} @ {lr:g}{edge}" if isinstance(lr, float) else text


def diff(a_rows: Sequence[dict], b_rows: Sequence[dict], a: str, b: str) -> Diff:
    """The paired difference ``a − b`` with its intention-to-treat companion (a diverged seed
    at the rows' chance level, :func:`chance_of`), of the rows' test metric."""
    return verdicts.paired(a_rows, b_rows, a, b, chance_of, _metric_task([*a_rows, *b_rows]))


def contrast(
    arms: Sequence[tuple[float, Sequence[dict]]],
    a: str,
    b: str,
    what: str = "",
    offset: float = 0.0,
) -> Diff:
    """A per-seed linear contrast of the arms' test metric (:func:`verdicts.contrast`)."""
    task = _metric_task([r for _, rows in arms for r in rows])
    return verdicts.contrast(arms, a, b, chance_of, task, what, offset)


def trend(
    points: Sequence[tuple[float, Sequence[dict], Sequence[dict]]], a: str, b: str, var: str
) -> Diff:
    """The per-seed slope of ``a − b`` against log2 ``var`` (:func:`verdicts.trend`)."""
    task = _metric_task([r for _, ra, rb in points for r in (*ra, *rb)])
    return verdicts.trend(points, a, b, var, chance_of, task)


#: methods whose step is divided by the staleness or the gap: one shared rate is not neutral
#: between them and a method that does not rescale, nor between the two (they rescale
#: differently), so the one-rate conditions leave out every pair with one of them
RESCALED = frozenset({"sa-asgd", "gap-aware"})


def _async_table(
    ctx: Context, name: str, methods: Sequence[str], workers: Sequence[int], mu: float = 0.9
) -> str:
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    cols = [1, *(w for w in workers if w != 1)]
    body = []
    for m in methods:
        cells = []
        for w in cols:
            pick = selected(rows, method=m, workers=w) if (m == "sgd") == (w == 1) else []
            cells.append(cell(pick))
        body.append([m, *cells])
    return runs.markdown_table(["method", *(f"M={w}" for w in cols)], body)


def _ordering(
    ctx: Context,
    name: str,
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    mu: float = 0.9,
) -> list[Diff]:
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    return _compare(rows, better, workers, knob=("lr", "lam"))


def _pick(rows: Sequence[dict], method: str, w: int, knob: Sequence[str]) -> list[dict]:
    return selected(rows, knob=knob, method=method, workers=1 if method == "sgd" else w)


def _compare(
    rows: Sequence[dict[str, Any]],
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    knob: Sequence[str],
) -> list[Diff]:
    """``a − b`` for every pair and worker count, each at its ``knob`` selected on validation
    (``sgd`` at M = 1)."""
    out = []
    for w in workers:
        for a, b in better:
            ra, rb = _pick(rows, a, w, knob), _pick(rows, b, w, knob)
            if ra and rb:
                out.append(diff(ra, rb, f"{a} (M={w})", f"{b} (M={w})"))
    return out


def _trend_in_m(
    ctx: Context, name: str, a: str, b: str, workers: Sequence[int], mu: float = 0.9
) -> Diff | None:
    """The slope of ``a − b`` (each at its own selected rate) against log2 M; None with fewer
    than two worker counts run."""
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    knob = ("lr", "lam")
    pts = [(w, _pick(rows, a, w, knob), _pick(rows, b, w, knob)) for w in workers]
    pts = [(w, ra, rb) for w, ra, rb in pts if ra and rb]
    return trend(pts, a, b, "M") if len(pts) >= 2 else None


def _workers(ctx: Context, name: str) -> list[int]:
    """The worker counts of a run (its config's, else its rows'), M = 1 left out."""
    try:
        ws = [int(w) for w in ctx.config(name)["workers"]]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        ws = sorted({int(r["workers"]) for r in ctx.rows(name)})
    return [w for w in ws if w > 1]


def _at_sync_rate(
    ctx: Context,
    name: str,
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    mu: float = 0.9,
) -> tuple[str, list[Diff] | None]:
    """The comparisons at one rate for every method: the rate selected on validation for
    1-worker SGD (as a practitioner without a per-method sweep would run); LC-ASGD's λ is still
    chosen on validation at that rate. Pairs with a method of :data:`RESCALED` are left out.
    ``(label, diffs)``; ``diffs`` None without SGD rows."""
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    ref = selected(rows, method="sgd", workers=1)
    better = [(a, b) for a, b in better if not {a, b} & RESCALED]
    if not ref or not better:
        return "", None
    lr = ref[0]["lr"]
    out = _compare([r for r in rows if r["lr"] == lr], better, workers, knob=("lam",))
    return f"one rate for every method (1-worker SGD's, {lr:g})", out


def _conditional(ctx: Context, name: str, fn: Callable[[], list[Diff]]) -> list[Diff] | None:
    return fn() if ctx.has(name) else None


def _secondary(items: Mapping[str, list[Diff] | None]) -> dict[str, list[Diff]]:
    """The secondary comparisons that were run (labels with no difference left out)."""
    return {k: v for k, v in items.items() if k and v}


def _methods_of(ctx: Context, name: str, rows: Sequence[dict]) -> list[str]:
    """The methods of a run in its configuration's order (else in the rows' order)."""
    seen = list(dict.fromkeys(r["method"] for r in rows))
    try:
        order = list(ctx.config(name).get("methods") or [])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        order = []
    return [m for m in order if m in seen] + [m for m in seen if m not in order]
