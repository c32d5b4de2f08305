"""The report's headline: one row a claim (regime, primary effect, the paper's effect, MDE,
verdict, answer) and the questions a practitioner asks first, answered from the rows.

Both lead the claims report and the README (issue 53): every number in them is computed from
the committed rows by the same functions as the claims' sections below them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from experiments import runs
from jaxstale import tasks

from . import rungs
from .advice import advice
from .core import (
    CHANCE_EDGE,
    Claim,
    Context,
    Verdict,
    _metric_task,
    chance_if_needed,
    diff,
    selected,
)
from .language import lm_scale
from .localsgd import ASYNC_VARIES
from .pipeline import POLICY_VARIES
from .verdicts import Diff

__all__ = ["QUESTIONS", "Question", "answer", "qualifiers", "questions", "regime_of", "table"]

#: datasets as the headline prints them
_DATASETS = {"mnist1d": "MNIST-1D", "digits": "digits", "shakespeare": "Shakespeare"}

#: ``<ref> + δ − <method> (non-inferiority`` or ``<method> − <ref> + δ (non-inferiority``
_REF_FIRST = re.compile(r"^(?P<ref>.+?) \+ \S+(?: \S+)? − (?P<method>.+?) \(non-inferiority")
_METHOD_FIRST = re.compile(r"^(?P<method>.+?) − (?P<ref>.+?) \+ .*\(non-inferiority")


def regime_of(ctx: Context, claim: Claim) -> str:
    """The regime the claim's verdict speaks for, briefly: a GPT's size and tokens, else the
    first run's model, dataset and budget (``–`` without rows)."""
    name = rungs.run_read(ctx, claim)
    if not ctx.has(name) or not (rows := ctx.rows(name)):
        return "–"
    if (lm := lm_scale(rows)) is not None:
        model, params, tokens = lm
        return f"{model} ({params / 1e3:,.0f} k), {tokens / 1e6:.3g} M tokens"
    r = rows[0]
    try:
        cfg = ctx.config(name)
    except (FileNotFoundError, KeyError, ValueError):
        cfg = {}
    if "symbols" in cfg and "length" in cfg:  # a reward task (stale_rl): no dataset, no model
        task = f"reverse {cfg['length']} of {cfg['symbols']}"
        return f"{cfg['model']}, {task}, {cfg['steps']} updates"
    steps = cfg.get("steps")
    steps = steps or max((int(x.get("steps") or x.get("updates") or 0) for x in rows), default=0)
    dataset = _DATASETS.get(str(r.get("dataset")), str(r.get("dataset")))
    budget = f", {steps / 1000:g}k steps" if steps else ""
    return f"{r.get('model') or 'mlp'}, {dataset}{budget}"


def _effect(p: Diff) -> str:
    if p.n == 0:
        return "–"
    half = f" ± {p.fmt(p.half)}" if math.isfinite(p.half) else ""
    unit = "pts" if p.unit.startswith("points") else "nats" if p.unit.startswith("nats") else ""
    return f"{p.fmt(p.mean, sign=True)}{half} {unit}".rstrip()


#: a threshold check's or a moonshot's answer, by label
_TARGETS = {"held": "every threshold met", "did not hold": "a threshold missed",
            "reached": "target met", "not reached": "target missed"}  # fmt: skip


#: why an untestable verdict makes no call, by its short form
_UNTESTABLE = {
    "untestable (arm at chance)": "no call: an arm trains at no rate of its grid",
    "untestable (arm at its grid's edge)": "no call: an arm's best rate lies beyond its grid",
    "untestable (no assay sensitivity)": "no call: the test passes doing nothing too",
    "untestable (no failure to prevent)": "no call: the uncorrected arm does not break here",
}


def answer(v: Verdict) -> str:
    """What the primary says a practitioner should do, in the claim's arms (oriented by the
    metric: a loss difference ``a − b`` > 0 favours ``b``)."""
    p = v.primary
    if p is None:
        return _TARGETS.get(v.label, "–")
    if v.label == "untestable here":
        return _UNTESTABLE.get(v.short, "no call: the runs cannot resolve the expected effect")
    if m := (_REF_FIRST.match(p.what) or _METHOD_FIRST.match(p.what)):
        method, ref = m["method"], m["ref"]
        return (
            f"{method} within the margin of {ref}"
            if p.sign > 0
            else f"{method} worse than {ref} by more than the margin"
            if p.sign < 0
            else f"{method} vs {ref}: not resolved"
        )
    if p.what:  # a trend or a contrast: its name says what a positive value means
        return {1: f"positive: {p.what}", -1: f"negative: {p.what}"}.get(
            p.sign, f"not resolved: {p.what}"
        )
    loss = p.unit.startswith("nats")
    good, bad = (p.b, p.a) if loss else (p.a, p.b)
    if p.sign == 0:
        return f"{p.a} ≈ {p.b} (within ±{p.fmt(p.half)} {p.unit})"
    return f"{good} better than {bad}" if p.sign > 0 else f"{bad} better than {good}"


#: a caveat's opening words and its short form in the headline's "qualified by" column
_CAVEATS = (
    ("reference not converged", "reference not converged"),
    ("on rows of an earlier configuration", "rows of an earlier configuration"),
    ("a bound", "a bound"),
    ("rests on an estimated expected effect", "expected effect an estimate"),
)


def qualifiers(v: Verdict) -> str:
    """What qualifies the verdict, briefly (the report lists each in full under the table):
    each set-up check's direction, an unconverged reference, rows of an earlier
    configuration, a primary that is a bound; a GPT's regime is the regime column's."""
    out = []
    for check in filter(None, v.setup.split("; ")):
        counts = check.rpartition(": ")[2]
        way = ("both ways" if "for the claim" in counts and "against" in counts
               else "for" if "for the claim" in counts else "against" if "against" in counts
               else "within noise")  # fmt: skip
        out.append(f"set-up check {way}")
    for part in v.caveat.split("; "):
        out += [short for start, short in _CAVEATS if part.startswith(start)]
    return "; ".join(out) or "–"


def table(ctx: Context, claims: Sequence[Claim], verdicts: Mapping[str, Verdict], link: str) -> str:
    """The headline table: one row a claim, its verdict in at most 40 characters
    (:attr:`Verdict.short`; defined under Verdicts) linking to its section."""
    body = []
    for c in claims:
        v = verdicts[c.id]
        p = v.primary
        na = p is None
        body.append([
            f"[{c.id}]({link}#{c.id.lower()}) {c.title}",
            regime_of(ctx, c) if v.label != "not run" else "–",
            "–" if na else _effect(p),
            "–" if na or not math.isfinite(v.expected) else p.fmt(v.expected),
            "–" if na else p.fmt(v.mde) if math.isfinite(v.mde) else "∞",
            f"**{v.short}**",
            qualifiers(v),
            advice(c.id, v.label, answer(v)),
        ])  # fmt: skip
    head = ["claim", "regime", "primary ± 95 % CI", "paper's", "MDE", "verdict", "qualified by",
            "answer"]  # fmt: skip
    return runs.markdown_table(head, body)


@dataclass(frozen=True)
class Question:
    """A question answered from the rows: ``candidates`` (each at its own rate selected on
    validation) under each of ``conditions`` (row fields), the best on validation named and
    every other compared with it on test (paired by seed), the ``reference`` (no staleness)
    beside them. ``runs`` are read together where their set-ups are one (:meth:`Context.
    differs` outside ``varies``); ``ref_fields`` select the reference's rows when they differ
    from the condition's (1-worker SGD); ``rung``: a longer run of the same question (the
    ladder's, :mod:`study.rungs`), read alone once it has finished."""

    text: str
    runs: tuple[str, ...]
    candidates: tuple[str, ...]
    reference: str
    conditions: tuple[Mapping[str, Any], ...]
    varies: tuple[str, ...] = ("methods",)
    ref_fields: Mapping[str, Any] = field(default_factory=dict)
    rung: str | None = None


#: the questions a practitioner asks first (issues 52, 53)
QUESTIONS: tuple[Question, ...] = (
    Question(
        "Which policy for an 8-stage asynchronous GPT pipeline with AdamW?",
        ("lm-depth", "lm-policies"),
        (
            "vanilla",
            "stash",
            "2bw",
            "pipemare",
            "spectrain-v1",
            "nesterov",
            "2bw-spectrain",
            "2bw-ef",
        ),
        "sync",
        ({"stages": 8},),
        varies=POLICY_VARIES,
        rung="lm-ladder-4k",
    ),
    Question(
        "Which asynchronous data-parallel method (SGD with momentum 0.9, MNIST-1D)?",
        ("async",),
        ("asgd", "dc-asgd-a", "dc-asgd-c", "sa-asgd", "gap-aware", "dana", "lc-asgd"),
        "sgd",
        ({"workers": 8, "momentum": 0.9}, {"workers": 32, "momentum": 0.9}),
        ref_fields={"workers": 1, "momentum": 0.9},
    ),
    Question(
        "Which outer optimizer for asynchronous DiLoCo (H = 10)?",
        ("diloco-async", "diloco-lookahead"),
        ("async-nesterov", "async-cgad", "async-lookahead"),
        "diloco",
        tuple({"workers": m, "inner_steps": 10} for m in (4, 16)),
        varies=ASYNC_VARIES,
    ),
    Question(  # D3's practitioner question (issue 52), paired on the same seeds
        "Does Delayed Nesterov with dynamic local updates fix naive asynchronous Nesterov?",
        ("diloco",),
        ("async-nesterov", "async-delayed"),
        "diloco",
        ({"workers": 4, "inner_steps": 10},),
    ),
)


def _rows(ctx: Context, q: Question) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the question's runs that can be read together, and the names read."""
    if q.rung is not None and ctx.has(q.rung):
        return list(ctx.rows(q.rung)), [q.rung]
    names = [n for n in q.runs if ctx.has(n)]
    if not names:
        return [], []
    keep = [names[0], *(n for n in names[1:] if not ctx.differs(names[0], n, q.varies))]
    return [r for n in keep for r in ctx.rows(n)], keep


def _val_score(pick: Sequence[dict[str, Any]]) -> float:
    value = tasks.or_default(_metric_task(pick)).final("val")
    sign = 1.0 if tasks.higher_is_better(value) else -1.0
    return sign * runs.stats.score(pick, value, chance_if_needed(pick, value))


def _behind(best: list[dict], other: list[dict], b: str, o: str) -> Diff:
    """How far ``other`` is behind ``best`` on test (positive: behind), paired by seed."""
    task = _metric_task([*best, *other])
    loss = task is not None and not task.higher_is_better
    return diff(other, best, o, b) if loss else diff(best, other, b, o)


def _answer(rows: list[dict], q: Question, cond: Mapping[str, Any]) -> str:
    picks = {m: selected(rows, method=m, **cond) for m in q.candidates}
    picks = {m: p for m, p in picks.items() if p}
    if not picks:
        return "not run"
    best = max(picks, key=lambda m: _val_score(picks[m]))
    same, behind, ahead = [], [], []
    for m, p in picks.items():
        if m == best:
            continue
        d = _behind(picks[best], p, best, m)
        (behind if d.sign > 0 else ahead if d.sign < 0 else same).append(
            f"{_name(m, p)} {_effect(d)}"
        )
    ref = selected(rows, method=q.reference, **(q.ref_fields or cond))
    parts = [f"**{_name(best, picks[best])}** (best on validation; test {_cell(picks[best])})"]
    parts.append(f"within noise of it: {', '.join(same) or 'none'}")
    parts.append(f"behind it beyond noise: {', '.join(behind) or 'none'}")
    parts += [f"ahead of it on test beyond noise: {', '.join(ahead)}"] if ahead else []
    if ref:
        cost = _effect(_behind(ref, picks[best], q.reference, best))
        parts.append(f"its cost against {q.reference} (no staleness): {cost}")
    return "; ".join(parts)


def _cell(rows: Sequence[dict[str, Any]]) -> str:
    t = tasks.or_default(_metric_task(rows))
    vals = [r.get(t.final("test")) for r in rows]
    got = runs.format_ci(
        vals, scale=t.scale, digits=t.digits, diverged=[r["diverged"] for r in rows]
    )
    return f"{got} {'%' if t.scale == 100 else t.unit}"


def _name(method: str, rows: Sequence[dict[str, Any]]) -> str:
    """The method, marked when its selection is a bound (its rate at its grid's edge, or no
    rate trains: a gap to it measures the grid, not the method)."""
    edge = rows[0].get("rate_edge") if rows else None
    return method if not edge else f"{method} ({'at chance' if edge == CHANCE_EDGE else 'edge'})"


def questions(ctx: Context) -> list[str]:
    """The questions section's lines: each question, each condition's answer (differences as
    "behind the best": positive is worse, in points or nats)."""
    out = []
    for q in QUESTIONS:
        rows, names = _rows(ctx, q)
        out.append(f"- **{q.text}** ({', '.join(f'`{n}`' for n in names) or 'not run'})")
        for cond in q.conditions if rows else ():
            where = ", ".join(f"{k} {v}" for k, v in cond.items() if k != "momentum")
            out.append(f"  - {where}: {_answer(rows, q, cond)}")
    return out
