"""Claims report: every published claim jaxstale tests, its verdict, and the evidence.

One row per claim (the papers' headlines): DC-ASGD vs ASGD vs SSGD, Gap-Aware
vs staleness-aware as M grows, DANA with momentum, LC-ASGD < DC-ASGD < ASGD, Async-BN vs
ordinary BN, SpecTrain / NAG vs vanilla vs stashing, the delay cliff, and the independent
simulations' acceptance check. Each is marked **held**, **held only when …** (it holds under
a condition the report names, e.g. at a fixed untuned learning rate or with raw inputs),
**within noise** (no difference beyond the 95 % interval of the per-seed paired difference)
or **did not hold** (the reverse, beyond noise), with the table and figure that show it.

Every number comes from the experiments' run folders, under the common protocol: standardised
inputs, validation split, each method at its own learning rate selected on validation, ≥ 5
seeds, paired per-seed differences with 95 % t intervals (a seed fixes the initial weights and
the data order for every method). Nothing is selected on test data. ::

    python -m experiments.claims --run           # run (or resume) every configuration, then
                                                 # write docs/claims.md and its figures
    python -m experiments.claims                 # re-write the report from existing folders
    python -m experiments.claims --run --quick   # smoke: tiny runs, the report says so

``make claims`` is the first line. The run folders live under ``--results`` (default
``results/claims``), one per configuration (:data:`RUNS`); a folder computed by other code is
refused, as for any experiment (re-run, or ``--force-resume``).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from jaxstale import runs

from . import async_bn, async_workers, delay_cliff, pipeline_staleness, sync_baseline
from .config import Base, to_argv

EXPERIMENT = "claims"


@dataclass(frozen=True)
class Run:
    """One experiment configuration the claims read: a typed ``config`` of the ``experiment``
    module (its ``run`` and ``report`` compute it); ``quick``: the fields that make its smoke
    version (``quick=True`` always)."""

    experiment: ModuleType
    config: Base
    quick: tuple[tuple[str, Any], ...] = ()
    what: str = ""

    def at(self, quick: bool) -> Base:
        """The configuration, or its smoke version."""
        return (
            dataclasses.replace(self.config, quick=True, **dict(self.quick))
            if quick
            else self.config
        )

    @property
    def command(self) -> str:
        """The equivalent command line (``python -m experiments.<name> <flags>``)."""
        name = self.experiment.__name__.rpartition(".")[2]
        return " ".join(["python -m experiments." + name, *to_argv(self.config)])


_AW, _PS = async_workers.Config, pipeline_staleness.Config
_FIVE = ("sgd", "asgd", "sa-asgd", "dc-asgd-a", "gap-aware")

#: the configurations, by name (the run folder is ``<results>/<name>``)
RUNS: dict[str, Run] = {
    "async": Run(async_workers, _AW(), what="the default: gamma-timed workers, momentum 0.9"),
    "async-fixed-lr": Run(
        async_workers,
        _AW(delay="round_robin", lrs=(0.02,), workers=(16,), methods=_FIVE),
        (("lrs", (0.02,)),),
        what="round-robin workers, one fixed rate (0.02) for every method, 1,500 updates",
    ),
    "async-raw": Run(
        async_workers,
        _AW(standardize="none", workers=(16, 32), methods=(*_FIVE, "lc-asgd")),
        what="raw inputs (pixels / 16), otherwise the default",
    ),
    "async-momentum0": Run(
        async_workers,
        _AW(momentum=(0.0,), workers=(16, 32), methods=("sgd", "asgd", "gap-aware", "dana")),
        what="no momentum (the rate grid ×10), for the momentum-helps claim",
    ),
    "async-m128": Run(
        async_workers,
        _AW(
            delay="round_robin",
            workers=(64, 128),
            lrs=(0.0003, 0.001, 0.003, 0.01, 0.03, 0.1),
            methods=("sgd", "asgd", "sa-asgd", "gap-aware", "dc-asgd-a", "dana", "ga-dana"),
        ),
        (("workers", (64,)), ("lrs", (0.001, 0.01))),
        what="the moonshot: round-robin workers, M = 64 and 128 (τ = M − 1), a wider rate grid",
    ),
    "pipeline": Run(pipeline_staleness, _PS(), what="the default: N = 2, 4, 8, SGD momentum 0.9"),
    "pipeline-n8": Run(
        pipeline_staleness,
        _PS(stages=(8,), methods=("sync", "2bw", "pipemare", "pipemare-lr", "pipedream-lr")),
        (("stages", (8,)),),
        what="the moonshot: N = 8 with the policies made for deep pipelines",
    ),
    "pipeline-nadam": Run(
        pipeline_staleness,
        _PS(stages=(8,), optimizer="nadam", methods=("sync", "vanilla", "asyncpp", "nesterov")),
        (("stages", (8,)),),
        what="N = 8 with NAdam (AsyncPP's optimizer) per stage",
    ),
    "pipeline-adam": Run(
        pipeline_staleness,
        _PS(
            optimizer="adam",
            stages=(4, 8),
            methods=("sync", "vanilla", "stash", "spectrain-v1", "nesterov"),
        ),
        (("stages", (4,)),),
        what="Adam per stage (β1 0.9): Adam-aware prediction (the last update of Adam itself)",
    ),
    "cliff": Run(
        delay_cliff, delay_cliff.Config(), what="the default: constant delays 0–16, four methods"
    ),
    "async-bn": Run(
        async_bn, async_bn.Config(), what="the default: ResNet-20 (width 8), M = 1, 4, 8, 16"
    ),
    "sync": Run(
        sync_baseline,
        sync_baseline.Config(),
        what="the default: the synchronous references and their budget",
    ),
}


@dataclass
class Verdict:
    """A claim's outcome: ``verdict`` (held / held only when … / within noise / did not hold),
    one paragraph of evidence, tables (markdown) and figures (run name, file stem)."""

    verdict: str
    evidence: str
    tables: list[str] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Claim:
    """A published claim and how to judge it from the run folders."""

    id: str
    title: str
    source: str
    statement: str
    runs: tuple[str, ...]
    judge: Callable[[Context], Verdict]


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
        if name not in self._rows:
            summary = self.path(name) / "summary.json"
            if not summary.exists():
                raise FileNotFoundError(
                    f"no results for {name!r} in {self.path(name)}: run with --run"
                )
            self._rows[name] = json.loads(summary.read_text())["rows"]
        return self._rows[name]

    def config(self, name: str) -> dict[str, Any]:
        return json.loads((self.path(name) / "config.json").read_text())["config"]


# --------------------------------------------------------------------------------- judging


def chance_of(rows: Sequence[dict[str, Any]]) -> float:
    return 0.1  # every dataset here has 10 classes; a diverged seed scores as chance


def selected(
    rows: Sequence[dict[str, Any]], knob: Sequence[str] = ("lr", "lam"), **fields: Any
) -> list[dict[str, Any]]:
    """The rows of one group (``fields``) at its knob selected on validation."""
    group = [r for r in rows if all(r.get(k) == v for k, v in fields.items())]
    if not group:
        return []
    knob = tuple(k for k in knob if any(k in r for r in group))
    (pick,) = runs.select(group, by=(), knob=knob, chance=chance_of(group)).values()
    return [r for r in group if runs.stats.knob_value(r, knob) == pick]


def cell(rows: Sequence[dict[str, Any]]) -> str:
    """``mean ± CI [div.] @ lr`` of the rows of one selected group."""
    if not rows:
        return "–"
    text = runs.format_ci(
        [r.get("final_test_accuracy") for r in rows], diverged=[r["diverged"] for r in rows]
    )
    lr = rows[0].get("lr")
    return f"{text} @ {lr:g}" if isinstance(lr, float) else text


@dataclass
class Diff:
    """A paired difference a − b of test accuracy, in points."""

    a: str
    b: str
    mean: float
    half: float
    n: int

    @property
    def sign(self) -> int:
        """+1 / −1 when the 95 % interval excludes 0, else 0 (within noise)."""
        if self.n < 2 or not (self.half == self.half):  # NaN: one pair
            return 0
        if self.mean - self.half > 0:
            return 1
        if self.mean + self.half < 0:
            return -1
        return 0

    def text(self) -> str:
        if self.n == 0:
            return f"{self.a} − {self.b}: no seed where both trained"
        noise = {1: "beyond noise", -1: "beyond noise", 0: "within noise"}[self.sign]
        half = f" ± {100 * self.half:.1f}" if self.half == self.half else ""
        return (
            f"{self.a} − {self.b} = {100 * self.mean:+.1f}{half} points ({self.n} seeds, {noise})"
        )


def diff(a_rows: Sequence[dict], b_rows: Sequence[dict], a: str, b: str) -> Diff:
    return Diff(a, b, *runs.paired_difference(a_rows, b_rows))


def verdict_of(diffs: Sequence[Diff]) -> str:
    """held: every difference beyond noise in the claimed direction; did not hold: any beyond
    noise against it; else within noise."""
    if diffs and all(d.sign > 0 for d in diffs):
        return "held"
    if any(d.sign < 0 for d in diffs):
        return "did not hold"
    return "within noise"


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
            ra = selected(rows, knob=knob, method=a, workers=1 if a == "sgd" else w)
            rb = selected(rows, knob=knob, method=b, workers=1 if b == "sgd" else w)
            if ra and rb:
                out.append(diff(ra, rb, f"{a} (M={w})", f"{b} (M={w})"))
    return out


def _at_sync_rate(
    ctx: Context,
    name: str,
    better: Sequence[tuple[str, str]],
    workers: Sequence[int],
    mu: float = 0.9,
) -> tuple[str, list[Diff] | None]:
    """The comparisons at one rate for every method: the rate selected on validation for
    1-worker SGD (as a practitioner without a per-method sweep would run); LC-ASGD's λ is still
    chosen on validation at that rate. ``(label, diffs)``; ``diffs`` None without SGD rows."""
    rows = [r for r in ctx.rows(name) if r["momentum"] == mu]
    ref = selected(rows, method="sgd", workers=1)
    if not ref:
        return "", None
    lr = ref[0]["lr"]
    out = _compare([r for r in rows if r["lr"] == lr], better, workers, knob=("lam",))
    return f"one rate for every method, 1-worker SGD's ({lr:g}, chosen on validation)", out


def _conditional(ctx: Context, name: str, fn: Callable[[], list[Diff]]) -> list[Diff] | None:
    return fn() if ctx.has(name) else None


def _evidence(main: list[Diff], cond: dict[str, list[Diff] | None]) -> tuple[str, str]:
    """The verdict and evidence text from the main comparisons and conditional ones."""
    v = verdict_of(main)
    lines = [f"- {d.text()}" for d in main]
    held_when = []
    for label, diffs in cond.items():
        if diffs is None:
            continue
        cv = verdict_of(diffs)
        lines.append(f"- {label}: **{cv}** — " + "; ".join(d.text() for d in diffs))
        if cv == "held" and v != "held":
            held_when.append(label)
    if held_when:
        v = "held only when " + " / ".join(held_when)
    return v, "\n".join(lines)


# ------------------------------------------------------------------------------- the claims


def judge_dc_asgd(ctx: Context) -> Verdict:
    workers = [w for w in (4, 8) if w in ctx.config("async")["workers"]]
    pairs = [("dc-asgd-a", "asgd"), ("dc-asgd-a", "ssgd"), ("dc-asgd-c", "asgd")]
    main = _ordering(ctx, "async", pairs, workers)
    label, at_sync = _at_sync_rate(ctx, "async", pairs[:2], ctx.config("async")["workers"])
    cond = {
        label: at_sync,
        "one fixed rate (0.02), round-robin, M = 16": _conditional(
            ctx, "async-fixed-lr", lambda: _ordering(ctx, "async-fixed-lr", [pairs[0]], [16])
        ),
        "raw inputs, M = 16, 32": _conditional(
            ctx, "async-raw", lambda: _ordering(ctx, "async-raw", [pairs[0]], [16, 32])
        ),
    }
    v, ev = _evidence(main, cond)
    table = _async_table(
        ctx,
        "async",
        ["sgd", "ssgd", "asgd", "dc-asgd-c", "dc-asgd-a"],
        ctx.config("async")["workers"],
    )
    return Verdict(v, ev, [table], [("async", "accuracy_vs_workers")])


def judge_gap_aware(ctx: Context) -> Verdict:
    cfgw = ctx.config("async")["workers"]
    big = [w for w in cfgw if w >= 16] or cfgw[-1:]
    main = _ordering(ctx, "async", [("gap-aware", "sa-asgd")], big)
    label, at_sync = _at_sync_rate(ctx, "async", [("gap-aware", "sa-asgd")], big)
    cond = {
        label: at_sync,
        "one fixed rate (0.02), round-robin, M = 16": _conditional(
            ctx,
            "async-fixed-lr",
            lambda: _ordering(ctx, "async-fixed-lr", [("gap-aware", "sa-asgd")], [16]),
        ),
        "raw inputs": _conditional(
            ctx,
            "async-raw",
            lambda: _ordering(ctx, "async-raw", [("gap-aware", "sa-asgd")], [16, 32]),
        ),
    }
    v, ev = _evidence(main, cond)
    table = _async_table(ctx, "async", ["sgd", "asgd", "sa-asgd", "gap-aware"], cfgw)
    return Verdict(v, ev, [table], [("async", "accuracy_vs_workers")])


def judge_dana(ctx: Context) -> Verdict:
    cfgw = ctx.config("async")["workers"]
    big = [w for w in cfgw if w >= 16] or cfgw[-1:]
    main = _ordering(ctx, "async", [("dana", "asgd")], big)
    label, at_sync = _at_sync_rate(ctx, "async", [("dana", "asgd")], big)
    cond: dict[str, list[Diff] | None] = {label: at_sync}
    if ctx.has("async-momentum0"):
        # momentum helps with DANA: DANA at μ = 0.9 vs DANA at μ = 0 (paired by seed)
        r9 = [r for r in ctx.rows("async") if r["momentum"] == 0.9]
        r0 = ctx.rows("async-momentum0")
        ds = []
        for w in big:
            a, b = selected(r9, method="dana", workers=w), selected(r0, method="dana", workers=w)
            if a and b:
                ds.append(diff(a, b, f"dana μ=0.9 (M={w})", f"dana μ=0 (M={w})"))
        cond["momentum helps DANA (μ = 0.9 vs 0)"] = ds
    v, ev = _evidence(main, cond)
    table = _async_table(ctx, "async", ["sgd", "asgd", "dana", "dana-dc"], cfgw)
    tables = [table]
    if ctx.has("async-momentum0"):
        tables.append(
            "Without momentum (rate grid ×10):\n\n"
            + _async_table(ctx, "async-momentum0", ["sgd", "asgd", "gap-aware", "dana"], big, 0.0)
        )
    return Verdict(v, ev, tables, [("async", "accuracy_vs_workers")])


def judge_lc_asgd(ctx: Context) -> Verdict:
    cfgw = ctx.config("async")["workers"]
    pairs = [("lc-asgd", "dc-asgd-a"), ("dc-asgd-a", "asgd")]
    main = _ordering(ctx, "async", pairs, [w for w in cfgw if w in (4, 8, 16)] or cfgw)
    label, at_sync = _at_sync_rate(ctx, "async", pairs, [w for w in cfgw if w >= 8] or cfgw)
    cond = {
        label: at_sync,
        "raw inputs, M = 16, 32": _conditional(
            ctx, "async-raw", lambda: _ordering(ctx, "async-raw", pairs, [16, 32])
        ),
    }
    v, ev = _evidence(main, cond)
    rows = [r for r in ctx.rows("async") if r["method"] == "lc-asgd"]
    lams = sorted({r["lam"] for r in rows if r.get("lam") is not None})
    sel = [selected(rows, method="lc-asgd", workers=w) for w in cfgw]
    picked = ", ".join(f"M={w}: λ {s[0]['lam']:+g}" for w, s in zip(cfgw, sel, strict=True) if s)
    ev += f"\n- LC-ASGD's λ tuned on validation over {lams} (sign included): {picked}"
    table = _async_table(ctx, "async", ["sgd", "asgd", "dc-asgd-a", "lc-asgd"], cfgw)
    return Verdict(v, ev, [table], [("async", "accuracy_vs_workers")])


def judge_acceptance(ctx: Context) -> Verdict:
    if not ctx.has("async-fixed-lr"):
        return Verdict("not run", "run `python -m experiments.claims --run`")
    rows = ctx.rows("async-fixed-lr")
    m = 16 if any(r["workers"] == 16 for r in rows) else max(r["workers"] for r in rows)
    got = {
        meth: [r for r in rows if r["method"] == meth and r["workers"] == m]
        for meth in ("asgd", "gap-aware", "sa-asgd", "dc-asgd-a")
    }

    def mean(rs: list[dict]) -> float:
        vals = [r["final_test_accuracy"] for r in rs if not r["diverged"]]
        return sum(vals) / len(vals) if vals else 0.0

    collapsed = [r["diverged"] or (r["final_test_accuracy"] or 0) < 0.2 for r in got["asgd"]]
    checks = [
        (f"ASGD diverges or collapses to chance at M={m}", all(collapsed)),
        ("Gap-Aware > 95 %", mean(got["gap-aware"]) > 0.95),
        ("SA-ASGD > 95 %", mean(got["sa-asgd"]) > 0.95),
        ("DC-ASGD-a > 90 %", mean(got["dc-asgd-a"]) > 0.90),
    ]
    v = "held" if all(ok for _, ok in checks) else "did not hold"
    ev = "\n".join(f"- {label}: {'yes' if ok else 'no'}" for label, ok in checks)
    ndiv = sum(r["diverged"] for r in got["asgd"])
    ev += (
        f"\n- ASGD: {ndiv}/{len(got['asgd'])} seeds with a non-finite loss, the others at "
        f"{100 * mean(got['asgd']):.1f} % (chance is 10 %)"
    )
    table = runs.markdown_table(
        ["method", f"M={m}"],
        [[meth, cell(rs)] for meth, rs in got.items()],
    )
    return Verdict(v, ev, [table])


def _pipe_cell(rows: Sequence[dict], method: str, n: int) -> list[dict[str, Any]]:
    return selected(rows, knob=("lr",), method=method, stages=n, model="mlp")


def _pipe_table(rows: Sequence[dict], methods: Sequence[str], stages: Sequence[int]) -> str:
    body = [[m, *(cell(_pipe_cell(rows, m, n)) for n in stages)] for m in methods]
    return runs.markdown_table(["policy", *(f"N={n}" for n in stages)], body)


def _methods_of(ctx: Context, name: str, rows: Sequence[dict]) -> list[str]:
    """The methods of a run in its configuration's order (else in the rows' order)."""
    seen = list(dict.fromkeys(r["method"] for r in rows))
    try:
        order = list(ctx.config(name).get("methods") or [])
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        order = []
    return [m for m in order if m in seen] + [m for m in seen if m not in order]


#: the further pipeline comparisons the report lists (a − b)
PIPE_PAIRS = (
    ("stash", "vanilla"),
    ("spectrain-v1", "stash"),
    ("nesterov", "stash"),
    ("sync", "spectrain-v1"),
    ("sync", "nesterov"),
    ("sync", "stash"),
)


def judge_pipeline(ctx: Context) -> Verdict:
    return _pipeline_verdict(ctx, "pipeline")


def judge_pipeline_adam(ctx: Context) -> Verdict:
    return _pipeline_verdict(ctx, "pipeline-adam")


def _pipeline_verdict(ctx: Context, name: str) -> Verdict:
    rows = ctx.rows(name)
    ns = sorted({r["stages"] for r in rows})
    methods = _methods_of(ctx, name, rows)
    deep = [n for n in ns if n >= 4] or ns
    main = []
    for n in deep:
        for a in ("spectrain-v1", "nesterov"):
            ra, rb = _pipe_cell(rows, a, n), _pipe_cell(rows, "vanilla", n)
            if ra and rb:
                main.append(diff(ra, rb, f"{a} (N={n})", f"vanilla (N={n})"))
    # the same comparison at one rate for every policy: sync's rate (selected on validation)
    sync_pick = _pipe_cell(rows, "sync", ns[0])
    fixed: list[Diff] | None = None
    if sync_pick:
        lr = sync_pick[0]["lr"]
        fixed = []
        for n in deep:
            at = [r for r in rows if r["lr"] == lr and r["stages"] == n]
            for a in ("spectrain-v1", "nesterov"):
                ra = [r for r in at if r["method"] == a]
                rb = [r for r in at if r["method"] == "vanilla"]
                if ra and rb:
                    fixed.append(diff(ra, rb, f"{a} (N={n})", f"vanilla (N={n})"))
    label = f"one rate for every policy (sync's, {sync_pick[0]['lr']:g})" if sync_pick else ""
    v, ev = _evidence(main, {label: fixed} if fixed else {})
    ttt = []
    for n in deep:
        for m in methods:
            pick = _pipe_cell(rows, m, n)
            if pick and "updates_to_target" in pick[0]:
                ttt.append(f"{m} {runs.format_steps([r.get('updates_to_target') for r in pick])}")
        if ttt:
            ev += f"\n- updates to the validation target at N = {n} (selected rates): "
            ev += ", ".join(ttt)
            ttt = []
    others = []
    for n in deep:
        for a, b in PIPE_PAIRS:
            ra, rb = _pipe_cell(rows, a, n), _pipe_cell(rows, b, n)
            if ra and rb:
                others.append(f"- {diff(ra, rb, f'{a} (N={n})', f'{b} (N={n})').text()}")
    ev += "\n" + "\n".join(others)
    table = _pipe_table(rows, methods, ns)
    return Verdict(v, ev, [table], [(name, "accuracy_vs_stages"), (name, "plot")])


def judge_cliff(ctx: Context) -> Verdict:
    rows, cfg = ctx.rows("cliff"), ctx.config("cliff")
    stable = delay_cliff.stable_rates(rows, tolerance=cfg["tolerance"], chance_acc=chance_of(rows))
    ds = sorted({r["delay"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    top = max(r["lr"] for r in rows)

    def largest(m: str, d: int) -> float | None:
        ok = stable.get((m, d), [])
        return max(ok) if ok else None

    def fmt(x: float | None) -> str:
        return "none" if x is None else (f"≥ {x:g}" if x == top else f"{x:g}")

    table = runs.markdown_table(
        ["method", *(f"d={d}" for d in ds)],
        [[m, *(fmt(largest(m, d)) for d in ds)] for m in methods],
    )
    a = [largest("asgd", d) or 0.0 for d in ds]
    shrinks = a[-1] < a[0] and all(x >= y for x, y in itertools.pairwise(a))
    v = "held" if shrinks else "did not hold"
    ev = (
        f"- ASGD's largest stable rate by delay {ds}: {[fmt(largest('asgd', d)) for d in ds]} "
        f"({'non-increasing, smaller at the largest delay' if shrinks else 'not shrinking'}); "
        f"stable = no seed diverged and mean validation accuracy within {cfg['tolerance']:g} "
        "of the method's best at d = 0 (the experiment's definition)"
    )
    for m in methods:
        if m != "asgd":
            ev += f"\n- {m}: largest stable rate at d = {ds[-1]}: {fmt(largest(m, ds[-1]))}"
    return Verdict(v, ev, [table], [("cliff", "stable_lr"), ("cliff", "plot")])


def judge_async_bn(ctx: Context) -> Verdict:
    exp = async_bn
    prow = exp.policy_rows(ctx.rows("async-bn"))
    sel = exp.select(prow, chance_of(prow))
    ms = sorted(sel["lr"])
    main, body = [], []
    pick = {}
    for m in ms:
        at_m = exp.selected_rows(prow, sel, m)
        for q in (exp.ORDINARY, exp.ASYNC):
            pick[(q, m)] = at_m[f"{q} tuned"]
        pick[(exp.RECOMPUTED, m)] = at_m[exp.RECOMPUTED]
        if m >= 8 and pick[(exp.ASYNC, m)] and pick[(exp.ORDINARY, m)]:
            main.append(
                diff(pick[(exp.ASYNC, m)], pick[(exp.ORDINARY, m)], f"async-bn (M={m})",
                     f"ordinary BN (M={m})")
            )  # fmt: skip
    v, ev = _evidence(main, {})
    ev += "\n- accuracy with the statistics recomputed on the training set at the final weights "
    ev += "(the bound any running-statistics policy approximates) in the table's last row"
    for q in (exp.ORDINARY, exp.ASYNC, exp.RECOMPUTED):
        body.append([q, *(cell(pick[(q, m)]) for m in ms)])
    table = runs.markdown_table(["statistics", *(f"M={m}" for m in ms)], body)
    return Verdict(v, ev, [table], [("async-bn", "plot")])


def _gap(best: list[dict], ref: list[dict], a: str, b: str, target: float) -> tuple[bool, str]:
    """Whether ``best`` is within ``target`` points of ``ref`` (paired mean gap), and the text."""
    d = diff(ref, best, b, a)
    ok = d.n > 0 and 100 * d.mean <= target
    miss = 100 * d.mean - target
    verdict = (
        "reached"
        if ok
        else f"not reached, by {miss:.2f}"
        if miss >= 0.005
        else "not reached, by < 0.01"
    )
    return ok, f"{d.text()}; mean gap {100 * d.mean:.2f}, target ≤ {target:g} points: {verdict}"


def _best(
    rows: Sequence[dict], candidates: Sequence[str], **fields: Any
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The candidates with the best mean validation accuracy at their selected rates: one, or
    several tied (the validation split is small, so exact ties happen)."""
    scored = []
    for m in candidates:
        pick = selected(rows, method=m, **fields)
        if pick:
            scored.append((runs.stats.score(pick, "final_val_accuracy", chance_of(pick)), m, pick))
    if not scored:
        return []
    top = max(t[0] for t in scored)
    return [(m, pick) for v, m, pick in scored if v >= top - 1e-12]


def _target(
    best: list[tuple[str, list[dict[str, Any]]]],
    ref: list[dict[str, Any]],
    what: str,
    ref_name: str,
    target: float,
) -> tuple[bool, list[str], set[str]]:
    """Whether the validation-best candidate is within ``target`` points of ``ref`` — every one
    of them when several tie on validation (the conservative reading) — with the text lines."""
    lines, oks = [], []
    tie = " (tied on validation with " if len(best) > 1 else ""
    for name, pick in best:
        ok, text = _gap(pick, ref, f"{name} ({what})", ref_name, target)
        oks.append(ok)
        others = [n for n, _ in best if n != name]
        lines.append(
            f"best on validation {name}{tie}{', '.join(others)}{')' if tie else ''}: {text}"
        )
    return all(oks), lines, {n for n, _ in best}


def judge_moonshot_async(ctx: Context) -> Verdict:
    rows = ctx.rows("async-m128")
    ms = sorted({r["workers"] for r in rows if r["workers"] > 1})
    methods = [m for m in _methods_of(ctx, "async-m128", rows) if m != "sgd"]
    ref = selected(rows, method="sgd", workers=1)
    oks, ev = [], []
    for m in ms:
        target = 0.5 if m <= 64 else 1.0
        best = _best(rows, methods, workers=m)
        if not best or not ref:
            continue
        ok, lines, names = _target(best, ref, f"M={m}", "1-worker SGD", target)
        oks.append(ok)
        ev += [f"- M = {m}: {line}" for line in lines]
        for meth in methods:
            pick = selected(rows, method=meth, workers=m)
            if pick and meth not in names:
                ev.append(f"  - {diff(ref, pick, '1-worker SGD', f'{meth} (M={m})').text()}")
    v = "reached" if oks and all(oks) else ("not run" if not oks else "not reached")
    table = _async_table(ctx, "async-m128", ["sgd", *methods], ms)
    figs = [("async-m128", "accuracy_vs_workers"), ("async-m128", "plot")]
    return Verdict(v, "\n".join(ev), [table], figs)


#: pipeline policies that keep at most two weight versions per stage (the moonshot's class)
MEMORY_LIGHT = ("vanilla", "spectrain-v1", "spectrain-v2", "nesterov", "pipemare", "pipemare-lr",
                "2bw")  # fmt: skip


def judge_moonshot_pipeline(ctx: Context) -> Verdict:
    rows = [r for r in ctx.rows("pipeline-n8") if r["stages"] == 8]
    if ctx.has("pipeline"):  # the default policies at N = 8 (same seeds: paired)
        rows += [r for r in ctx.rows("pipeline") if r["stages"] == 8 and r["method"] != "sync"]
    methods = _methods_of(ctx, "pipeline-n8", rows)
    light = [m for m in methods if m in MEMORY_LIGHT]
    ref = _pipe_cell(rows, "sync", 8)
    best = _best(rows, light, stages=8, model="mlp")
    if not best or not ref:
        return Verdict("not run", "no N = 8 rows")
    ok, lines, names = _target(best, ref, "N=8", "sync (N=8)", 0.5)
    ev = [f"- memory-light policies: {line}" for line in lines]
    for m in methods:
        pick = _pipe_cell(rows, m, 8)
        if pick and m != "sync" and m not in names:
            tag = "" if m in MEMORY_LIGHT else " (N − k weight versions: not memory-light)"
            ev.append(f"  - {diff(ref, pick, 'sync', m).text()}{tag}")
    tables = [_pipe_table(rows, methods, [8])]
    if ctx.has("pipeline-nadam"):
        nrows = ctx.rows("pipeline-nadam")
        nm = _methods_of(ctx, "pipeline-nadam", nrows)
        tables.append(
            "With NAdam per stage (AsyncPP's optimizer):\n\n" + _pipe_table(nrows, nm, [8])
        )
        nref = _pipe_cell(nrows, "sync", 8)
        for m in nm:
            pick = _pipe_cell(nrows, m, 8)
            if pick and nref and m != "sync":
                ev.append(f"- NAdam: {diff(nref, pick, 'sync', m).text()}")
    v = "reached" if ok else "not reached"
    return Verdict(v, "\n".join(ev), tables, [("pipeline-n8", "plot")])


CLAIMS: list[Claim] = [
    Claim(
        "C1",
        "DC-ASGD beats ASGD and SSGD",
        "Zheng et al., ICML 2017",
        "Delay compensation recovers the accuracy ASGD loses to stale gradients: at M = 4 and 8 "
        "(CIFAR-10, ResNet-20) DC-ASGD-a < DC-ASGD-c < SSGD < ASGD in test error.",
        ("async", "async-fixed-lr", "async-raw"),
        judge_dc_asgd,
    ),
    Claim(
        "C2",
        "Gap-Aware beats staleness-aware as M grows",
        "Barkai et al., ICLR 2020",
        "Penalising a gradient by its per-coordinate gap beats dividing it by its staleness, "
        "increasingly so with more workers.",
        ("async", "async-fixed-lr", "async-raw"),
        judge_gap_aware,
    ),
    Claim(
        "C3",
        "DANA tames momentum in ASGD",
        "Hakimi et al., 2019; Barkai et al., ICLR 2020",
        "With DANA's look-ahead, momentum helps asynchronous training instead of hurting it: "
        "DANA beats ASGD with momentum at many workers.",
        ("async", "async-momentum0"),
        judge_dana,
    ),
    Claim(
        "C4",
        "LC-ASGD < DC-ASGD < ASGD",
        "Li et al., ICPP 2020",
        "Loss compensation beats delay compensation, which beats plain ASGD (test error, M = 4, "
        "8, 16; CIFAR-10, ResNet-18).",
        ("async", "async-raw"),
        judge_lc_asgd,
    ),
    Claim(
        "A1",
        "Independent simulations' acceptance check",
        "issue 13",
        "Standardised digits, round-robin delays, momentum 0.9, lr 0.02 for every method, 1,500 "
        "updates: ASGD diverges at M = 16 while Gap-Aware and SA stay above 95 % and DC-ASGD-a "
        "above 90 %.",
        ("async-fixed-lr",),
        judge_acceptance,
    ),
    Claim(
        "C5",
        "Async-BN beats ordinary batch norm",
        "Li et al., ICPP 2020",
        "Merging the workers' batch statistics into the server's own running statistics gives "
        "lower test error than keeping the stale copies the workers push, the more so as M grows.",
        ("async-bn",),
        judge_async_bn,
    ),
    Claim(
        "P1",
        "SpecTrain / NAG prediction beats vanilla and stashing",
        "Chen et al. 2018 (SpecTrain); Harlap et al. 2018 (PipeDream)",
        "In an asynchronous 1F1B pipeline, predicting the weights a mini-batch will meet "
        "recovers the accuracy staleness costs: prediction beats vanilla (no stashing) and "
        "PipeDream's stashing, close to synchronous training.",
        ("pipeline",),
        judge_pipeline,
    ),
    Claim(
        "P2",
        "The delay cliff",
        "Jain et al., ICLR 2018 workshop",
        "With momentum SGD and every gradient d updates stale, the largest learning rate that "
        "still trains shrinks as d grows.",
        ("cliff",),
        judge_cliff,
    ),
    Claim(
        "P3",
        "Adam-aware prediction",
        "Guan et al. (XPipe / PipeOptim)",
        "Predicting with the inner optimizer's own last update (Ŵ = W + s·Δw_last) works for "
        "Adam as it does for momentum SGD: prediction beats vanilla with Adam per stage.",
        ("pipeline-adam",),
        judge_pipeline_adam,
    ),
    Claim(
        "M1",
        "Moonshot: 64 and 128 asynchronous workers",
        "issue 16",
        "Round-robin workers (τ = M − 1): the best method within 0.5 points of 1-worker SGD at "
        "M = 64 and within 1 point at M = 128, every method at its own rate, same updates.",
        ("async-m128",),
        judge_moonshot_async,
    ),
    Claim(
        "M2",
        "Moonshot: an 8-stage asynchronous pipeline",
        "issue 16",
        "Asynchronous 1F1B with N = 8: the best memory-light policy (at most two weight "
        "versions per stage) within 0.5 points of synchronous training.",
        ("pipeline-n8", "pipeline", "pipeline-nadam"),
        judge_moonshot_pipeline,
    ),
]


# ------------------------------------------------------------------------------------ report


def run_configs(names: Sequence[str], results: Path, quick: bool, force: bool) -> None:
    """Run (or resume) the named configurations into ``results/<name>``."""
    for name in names:
        spec = RUNS[name]
        config = dataclasses.replace(spec.at(quick), out=str(results / name), force_resume=force)
        print(f"[{EXPERIMENT}] {name}: {spec.command}{' (smoke)' if quick else ''}")
        spec.experiment.report(spec.experiment.run(config), config)


def report(ctx: Context, out: Path) -> str:
    """docs/claims.md's text (figures copied next to it, under ``claims/``)."""
    fig_dir = out.parent / "claims"
    lines = [
        "# Claims report",
        "",
        "<!-- generated by `python -m experiments.claims` (make claims); do not edit -->",
        "",
    ]
    if ctx.quick:
        lines += [
            "**Smoke report (--quick): tiny budgets, not results. Run `make claims` for the "
            "numbers.**",
            "",
        ]
    lines += [
        "Each published claim jaxstale tests, with its verdict on the embedded digits data "
        "under one protocol: inputs standardised with training statistics, a validation split "
        "carved from the training set, every method at its own learning rate **selected on "
        "validation accuracy**, at least 5 seeds, budgets at which the synchronous reference "
        "has converged. Cells are test accuracy %, mean ± 95 % CI over the seeds that trained, "
        "`[k/n div.]` the seeds that diverged, `@` the selected rate. A difference is "
        "**beyond noise** when the 95 % t interval of the per-seed paired difference (a seed "
        "fixes initial weights and data order for every method) excludes 0.",
        "",
        "Verdicts: **held**; **held only when …** (under a condition this report ran, e.g. one "
        "fixed untuned rate, or raw inputs); **within noise** (no difference beyond noise); "
        "**did not hold** (the reverse, beyond noise).",
        "",
        f"Generated {datetime.date.today().isoformat()} from the run folders in "
        f"`{ctx.results}` by `python -m experiments.claims`; the configurations:",
        "",
    ]
    for name, spec in RUNS.items():
        lines.append(f"- `{name}`: `{spec.command}` — {spec.what}")
    lines += ["", "## Summary", ""]
    verdicts: dict[str, Verdict] = {}
    for c in CLAIMS:
        missing = [n for n in c.runs[:1] if not ctx.has(n)]
        verdicts[c.id] = (
            Verdict("not run", f"missing run folder(s): {', '.join(missing)}")
            if missing
            else c.judge(ctx)
        )
    lines.append(
        runs.markdown_table(
            ["claim", "paper", "verdict"],
            [
                [
                    f'<a href="#{c.id.lower()}">{c.id}</a> {c.title}',
                    c.source,
                    f"**{verdicts[c.id].verdict}**",
                ]
                for c in CLAIMS
            ],
        )
    )
    for c in CLAIMS:
        v = verdicts[c.id]
        lines += [
            "",
            f'<a id="{c.id.lower()}"></a>',
            "",
            f"## {c.id}. {c.title}",
            "",
            f"*{c.source}.* {c.statement}",
            "",
            f"**Verdict: {v.verdict}.**",
            "",
            v.evidence,
        ]
        for t in v.tables:
            lines += ["", t]
        for run_name, stem in v.figures:
            src = ctx.path(run_name) / f"{stem}.png"
            if src.exists():
                fig_dir.mkdir(parents=True, exist_ok=True)
                dst = fig_dir / f"{run_name}-{stem}.png"
                shutil.copyfile(src, dst)
                lines += ["", f"![{c.id}: {stem}](claims/{dst.name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runs.OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="store_true", help="run (or resume) the configurations first")
    p.add_argument(
        "--quick", action="store_true", help="smoke configurations (about a minute each)"
    )
    p.add_argument(
        "--results",
        default=None,
        help="run folders (default results/claims, --quick: results/claims-quick)",
    )
    p.add_argument("--out", default="docs/claims.md", help="the report (default docs/claims.md)")
    p.add_argument(
        "--only",
        type=runs.name_list(list(RUNS), "configuration"),
        default=None,
        help="run only these configurations (comma-separated)",
    )
    p.add_argument("--force-resume", action="store_true", help="passed to every experiment")
    args = p.parse_args(argv)
    results = Path(args.results or ("results/claims-quick" if args.quick else "results/claims"))
    if not args.run:
        for flag, given in (("--only", args.only), ("--force-resume", args.force_resume)):
            if given:
                p.error(f"argument {flag}: applies with --run only (nothing would be run)")
        if not any(results.glob("**/summary.json")):
            p.error(
                f"no finished run under {results}: nothing to report (run with --run first, or "
                f"point --results at the run folders); {args.out} left as it is"
            )
    if args.run:
        run_configs(args.only or list(RUNS), results, args.quick, args.force_resume)
    ctx = Context(results, args.quick)
    out = Path(args.out)
    text = report(ctx, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.atomic_write_text(out, text)
    print(text)
    print(f"[{EXPERIMENT}] wrote {out}", file=sys.stderr)
    return {"text": text, "path": out}


if __name__ == "__main__":
    main()
