"""The pipeline claims: SpecTrain / NAG prediction, Adam-aware prediction, the delay cliff
and the 8-stage moonshot."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from experiments import cliff_tables, runs

from . import speed
from .core import (
    Context,
    Diff,
    Evidence,
    Verdict,
    _methods_of,
    _secondary,
    cell,
    chance_of,
    diff,
    selected,
    trend,
)
from .targets import best_on_validation, within_target


def pipe_cell(
    rows: Sequence[dict], method: str, n: int, model: str | None = "mlp"
) -> list[dict[str, Any]]:
    """The rows of ``method`` at ``N = n`` at its rate selected on validation (``model``: the
    rows' model, None: any — a language-model run has one)."""
    where = {} if model is None else {"model": model}
    return selected(rows, knob=("lr",), method=method, stages=n, **where)


def pipe_table(
    rows: Sequence[dict],
    methods: Sequence[str],
    stages: Sequence[int],
    model: str | None = "mlp",
) -> str:
    """One cell per policy and depth (:func:`pipe_cell`)."""
    body = [[m, *(cell(pipe_cell(rows, m, n, model)) for n in stages)] for m in methods]
    return runs.markdown_table(["policy", *(f"N={n}" for n in stages)], body)


#: the further pipeline comparisons the report lists (a − b), with no claimed direction; the
#: first is what staleness costs: the gap prediction and stashing are meant to close
PIPE_PAIRS = (
    ("sync", "vanilla"),
    ("stash", "vanilla"),
    ("sync", "spectrain-v1"),
    ("sync", "nesterov"),
    ("sync", "stash"),
)

#: the speed readings' pairs at the deepest pipeline (:mod:`.speed`): what staleness costs
#: in speed, and what each policy recovers of it
SPEED_PAIRS = (
    ("sync", "vanilla"),
    ("stash", "vanilla"),
    ("spectrain-v1", "vanilla"),
    ("nesterov", "vanilla"),
)

#: prediction against stashing (P1 claims prediction beats PipeDream's stashing too)
OVER_STASH = (("spectrain-v1", "stash"), ("nesterov", "stash"))


def judge_pipeline(ctx: Context) -> Evidence:
    return _pipeline_evidence(ctx, "pipeline")


def judge_pipeline_adam(ctx: Context) -> Evidence:
    return _pipeline_evidence(ctx, "pipeline-adam")


def _pairs_at(rows: Sequence[dict], pairs: Sequence[tuple[str, str]], ns: Sequence[int]) -> list:
    out = []
    for n in ns:
        for a, b in pairs:
            ra, rb = pipe_cell(rows, a, n), pipe_cell(rows, b, n)
            if ra and rb:
                out.append(diff(ra, rb, f"{a} (N={n})", f"{b} (N={n})"))
    return out


def _to_target(
    ctx: Context, name: str, rows: Sequence[dict], methods: Sequence[str], ns: Sequence[int]
) -> list[str]:
    """Per depth, the updates each policy took to reach the run's validation target (its
    ``--target``, stated); one line saying so where no policy reached it (the target is then
    above this task's accuracies and says nothing about speed)."""
    target = ctx.config(name).get("target")
    what = f"the validation target ({100 * target:g} %, the run's --target)" if target else (
        "the validation target"
    )  # fmt: skip
    notes, never = [], []
    for n in ns:
        picks = [(m, pipe_cell(rows, m, n)) for m in methods]
        steps = {m: [r.get("updates_to_target") for r in p] for m, p in picks
                 if p and "updates_to_target" in p[0]}  # fmt: skip
        if steps and all(s is None for v in steps.values() for s in v):
            never.append(n)
        elif steps:
            ttt = ", ".join(f"{m} {runs.format_steps(v)}" for m, v in steps.items())
            notes.append(f"- updates to {what} at N = {n} (selected rates): {ttt}")
    if never:
        at = ", ".join(map(str, never))
        notes.append(f"- no policy reached {what} at N = {at}: time to target not measured")
    return notes


def _pipeline_evidence(ctx: Context, name: str) -> Evidence:
    """Primary: SpecTrain − vanilla at the deepest pipeline run, each policy at its own rate;
    secondaries: NAG − vanilla, SpecTrain − vanilla at the other depths ≥ 4, prediction −
    stashing, the trend of SpecTrain − vanilla in N, and the comparisons at one rate."""
    rows = ctx.rows(name)
    ns = sorted({r["stages"] for r in rows})
    methods = _methods_of(ctx, name, rows)
    deep = [n for n in ns if n >= 4] or ns
    top = max(deep)
    pts = [(n, pipe_cell(rows, "spectrain-v1", n), pipe_cell(rows, "vanilla", n)) for n in ns]
    pts = [(n, a, b) for n, a, b in pts if a and b]
    sec: dict[str, list[Diff] | None] = {
        "NAG prediction − vanilla": _pairs_at(rows, [("nesterov", "vanilla")], deep),
        "SpecTrain − vanilla at the other depths": _pairs_at(
            rows, [("spectrain-v1", "vanilla")], [n for n in deep if n != top]
        ),
        "prediction − stashing": _pairs_at(rows, OVER_STASH, deep),
        "trend in N (staleness grows with depth)": [trend(pts, "spectrain-v1", "vanilla", "N")]
        if len(pts) >= 2
        else [],
    }
    # the same comparisons at one rate for every policy: sync's rate (selected on validation)
    sync_pick = pipe_cell(rows, "sync", ns[0])
    if sync_pick:
        lr = sync_pick[0]["lr"]
        at = [r for r in rows if r["lr"] == lr]
        fixed = []
        for n in deep:
            for a in ("spectrain-v1", "nesterov"):
                ra = [r for r in at if r["method"] == a and r["stages"] == n]
                rb = [r for r in at if r["method"] == "vanilla" and r["stages"] == n]
                if ra and rb:
                    fixed.append(diff(ra, rb, f"{a} (N={n})", f"vanilla (N={n})"))
        sec[f"one rate for every policy (sync's, {lr:g})"] = fixed
    notes = _to_target(ctx, name, rows, methods, deep)
    others = [f"  - {d.text()}" for d in _pairs_at(rows, PIPE_PAIRS, deep)]
    if others:
        notes += ["- further differences (no claimed direction; not in the verdict):", *others]
    notes += speed.notes(
        [(pipe_cell(rows, a, top), pipe_cell(rows, b, top), f"{a} (N={top})", f"{b} (N={top})")
         for a, b in SPEED_PAIRS],
        diff,
    )  # fmt: skip
    primary = _pairs_at(rows, [("spectrain-v1", "vanilla")], [top])
    return Evidence(
        primary[0] if primary else None,
        _secondary(sec),
        notes,
        [pipe_table(rows, methods, ns)],
        [(name, "accuracy_vs_stages"), (name, "plot")],
    )


def judge_cliff(ctx: Context) -> Verdict:
    rows, cfg = ctx.rows("cliff"), ctx.config("cliff")
    stable = cliff_tables.stable_rates(rows, tolerance=cfg["tolerance"], chance_acc=chance_of(rows))
    ds = sorted({r["delay"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    top = max(r["lr"] for r in rows if not r.get("extended"))  # the configured grid's largest

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


#: pipeline policies that keep at most two weight versions per stage (the moonshot's class)
MEMORY_LIGHT = ("vanilla", "spectrain-v1", "spectrain-v2", "nesterov", "pipemare", "pipemare-lr",
                "2bw")  # fmt: skip


#: the fields in which two pipeline runs' configurations may differ for their rows to be read
#: together (:meth:`Context.differs`; every other field, the budget among them, must match):
#: which policies and depths ran — ``pipeline`` with ``pipeline-n8`` here, the LM runs
POLICY_VARIES = ("methods", "policies", "schedules", "stages")


def judge_moonshot_pipeline(ctx: Context) -> Verdict:
    rows = [r for r in ctx.rows("pipeline-n8") if r["stages"] == 8]
    apart = ctx.apart("pipeline-n8", "pipeline", POLICY_VARIES) if ctx.has("pipeline") else None
    if ctx.has("pipeline") and apart is None:  # the default policies at N = 8 (same seeds)
        rows += [r for r in ctx.rows("pipeline") if r["stages"] == 8 and r["method"] != "sync"]
    methods = _methods_of(ctx, "pipeline-n8", rows)
    light = [m for m in methods if m in MEMORY_LIGHT]
    ref = pipe_cell(rows, "sync", 8)
    best = best_on_validation(rows, light, stages=8, model="mlp")
    if not best or not ref:
        return Verdict("not run", "no N = 8 rows")
    ok, lines, names = within_target(best, ref, "N=8", "sync (N=8)", 0.5)
    ev = [f"- memory-light policies: {line}" for line in lines]
    for m in methods:
        pick = pipe_cell(rows, m, 8)
        if pick and m != "sync" and m not in names:
            tag = "" if m in MEMORY_LIGHT else " (N − k weight versions: not memory-light)"
            ev.append(f"  - {diff(ref, pick, 'sync', m).text()}{tag}")
    ev += [apart] if apart else []
    if ctx.has("pipeline") and apart is None:
        ev += _second_sync(ctx.rows("pipeline"), rows, [pick for _, pick in best])
    ev += speed.notes(
        [(ref, pick, "sync (N=8)", f"{m} (N=8)") for m in methods if m != "sync"
         if (pick := pipe_cell(rows, m, 8))],
        diff,
    )  # fmt: skip
    tables = [pipe_table(rows, methods, [8])]
    if ctx.has("pipeline-nadam"):
        nrows = ctx.rows("pipeline-nadam")
        nm = _methods_of(ctx, "pipeline-nadam", nrows)
        tables.append(
            "With NAdam per stage (AsyncPP's optimizer):\n\n" + pipe_table(nrows, nm, [8])
        )
        nref = pipe_cell(nrows, "sync", 8)
        for m in nm:
            pick = pipe_cell(nrows, m, 8)
            if pick and nref and m != "sync":
                ev.append(f"- NAdam: {diff(nref, pick, 'sync', m).text()}")
    v = "reached" if ok else "not reached"
    return Verdict(v, "\n".join(ev), tables, [("pipeline-n8", "plot")])


def _second_sync(
    other: Sequence[dict], rows: Sequence[dict], picks: Sequence[list[dict]]
) -> list[str]:
    """M2's line on ``pipeline``'s own sync at N = 8: the same runs as ``pipeline-n8``'s (model,
    rate, seed), computed apart. Where they differ (another machine's float rounding: a cell is
    bit for bit only on the machine that computed it), how many, and the primary read with
    ``pipeline``'s sync as the reference instead (a reader sees whether the verdict hangs on
    which copy is used)."""
    key = lambda r: (r.get("model"), r["lr"], r["seed"])
    mine = {key(r): r for r in rows if r["method"] == "sync" and r["stages"] == 8}
    theirs = {key(r): r for r in other if r["method"] == "sync" and r["stages"] == 8}
    shared = sorted(mine.keys() & theirs.keys(), key=str)
    if not shared:
        return []
    ignore = (*runs.groups.TIMING_FIELDS, "host")  # a cell's result: every other field
    apart = [k for k in shared if runs.groups.first_difference(
        {"row": theirs[k]}, {}, mine[k], [], ignore=ignore)]  # fmt: skip
    if not apart:
        return [f"- `pipeline`'s sync at N = 8 equals `pipeline-n8`'s on all {len(shared)} "
                "runs both hold"]  # fmt: skip
    seeds = sorted({k[2] for k in apart})
    line = (
        f"- `pipeline` ran sync at N = 8 too: {len(apart)} of the {len(shared)} runs both hold "
        f"differ (seeds {', '.join(map(str, seeds))}; computed apart: a cell is bit for bit on "
        "its own machine, and rows need not record theirs); the reference above is "
        "`pipeline-n8`'s"
    )
    ref = pipe_cell(other, "sync", 8)
    reads = [diff(ref, pick, "sync of `pipeline`", pick[0]["method"]).text() for pick in picks]
    return [line + ("; with `pipeline`'s: " + "; ".join(reads) if ref and reads else "")]
