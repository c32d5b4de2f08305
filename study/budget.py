"""Has the synchronous reference converged at the claims' budget? Read from the runs' curves.

The protocol promises budgets at which the synchronous reference has converged. For every
configuration with a synchronous arm — ``sgd`` (``async_workers``' 1-worker SGD,
``sync_baseline``) or ``sync`` (a pipeline's flush schedule) — and each of its settings (model,
depth, momentum), :func:`facts` takes the rate selected on validation and the learning curves of
its seeds and applies :func:`experiments.common.convergence`: the plateau of the mean validation
curve over the last third, the first update from which it stays within 1 point of it, and the
per-seed change over the last third with its 95 % interval. A reference on a decaying schedule
(warm-up + cosine: the DiLoCo configurations' inner AdamW) gains over its last third at any
length, so it is judged instead against a longer run of the same reference where one exists
(:func:`unconverged`); a language model's is compared at equal updates and not judged. The
curves live in the run folders' cells, which are not committed, so
:func:`study.provenance.snapshot` writes these facts as ``budget.json`` beside each
configuration's rows and the report reads them there (:func:`section`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from experiments import runs
from experiments.common import convergence
from jaxstale import optimizers

__all__ = ["FILE", "REFERENCES", "facts", "section", "unconverged"]

#: the file beside a configuration's committed rows
FILE = "budget.json"
#: the methods that are a configuration's synchronous reference (``dp``: ``local_sgd``'s data
#: parallelism on the same tokens, whose "rate" is a multiple of the inner rate)
REFERENCES = ("sgd", "sync", "dp")
#: "flat": within this of the plateau (fraction of accuracy)
TOL = 0.01
#: a language model's "flat": within this of the plateau, nats
LOSS_TOL = 0.02
_TUNED = ("lr", "lam", "seed")


def facts(folder: Path) -> list[dict[str, Any]]:
    """The convergence of each synchronous setting of the run folder ``folder`` (empty when it
    has none): ``setting`` (the key fields but rate, λ and seed), the selected ``lr``,
    ``steps``, ``plateau``, ``flat_since`` and ``delta_last_third`` (mean, half-width, n)."""
    cells = []
    for path in sorted((folder / "cells").glob("*.json")):
        try:
            cell = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(cell, dict) and cell.get("key", {}).get("method") in REFERENCES:
            cells.append(cell)
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        setting = {k: v for k, v in c["key"].items() if k not in _TUNED}
        groups.setdefault(json.dumps(setting), []).append(c)
    out = []
    refs = None
    for setting, group in sorted(groups.items()):
        rows = [c["row"] for c in group]
        loss = any(r.get("final_val_loss") is not None for r in rows)
        if loss and refs is None:
            refs = _text_references(folder)
        chance = refs["uniform"] if loss and refs else math.inf if loss else 0.0
        value = "final_val_loss" if loss else "final_val_accuracy"
        lr = runs.select(rows, by=(), knob="lr", value=value, chance=chance)[()]
        curves = [c.get("metrics") or [] for c in group if c["row"].get("lr") == lr]
        conv = (
            convergence(curves, key="val_loss", tol=LOSS_TOL)
            if loss
            else convergence(curves, tol=TOL)
        )
        steps = max((c[-1].get("step", 0) for c in curves if c), default=0)
        fact = {"setting": json.loads(setting), "lr": lr, "steps": steps, **conv}
        if loss:
            fact.update({"metric": "loss", **(refs or {})})
        out.append(fact)
    return out


def _text_references(folder: Path) -> dict[str, float] | None:
    """A text run's reference losses: the corpus's count unigram / bigram / trigram levels on
    the validation split (the budget reads validation curves) and ``log V`` (None when the
    folder's dataset is not one of :mod:`jaxstale.text`'s corpora)."""
    from jaxstale import text

    try:
        return {**text.reference_losses(_config(folder)["dataset"], split="val"), "split": "val"}
    except (KeyError, ValueError):
        return None


def _converged(f: dict[str, Any]) -> bool:
    """Within ``TOL`` of the last-third plateau from some update on, and not still rising over
    the last third beyond noise (an accuracy reference; no curve: not converged)."""
    mean, half, n = f["delta_last_third"]
    rising = n > 1 and math.isfinite(half) and mean - half > 0
    return f["plateau"] is not None and f["flat_since"] is not None and not rising


def _verdict(converged: bool | None) -> str:
    return "converged" if converged else "**not converged**"


#: the configuration fields that decide how a reference trains, besides its setting: two
#: configurations equal on them train the same reference for different budgets
_SAME = ("dataset", "standardize", "optimizer", "momentum", "inner_lr", "batch_size", "mlp_width",
         "momentum_rule")  # fmt: skip


def _config(folder: Path) -> dict[str, Any]:
    """The configuration a run folder's (or its committed rows') ``config.json`` records;
    ``{}`` without one."""
    try:
        return json.loads((folder / "config.json").read_text())["config"]
    except (FileNotFoundError, KeyError, TypeError, json.JSONDecodeError):
        return {}


class Judged(NamedTuple):
    """One Budget fact of configuration ``name`` and its judgement: ``converged`` True, False,
    or None (not judged); ``by``: the longer run ``(name, fact)`` it was judged against."""

    name: str
    fact: dict[str, Any]
    converged: bool | None
    by: tuple[str, dict[str, Any]] | None = None
    decays: bool = False  # on a decaying schedule (judged by ``by`` alone)


def _judged(rows: Path, names: Sequence[str]) -> list[Judged]:
    """Every fact of ``names``, judged by :func:`_converged` and, where another configuration
    of ``names`` trains the same reference (:data:`_SAME`, the same setting) for more updates,
    against the longest such run too: converged only when that run's plateau is also within
    :data:`TOL` of this one's (a curve flat over its own last third can still gain more than
    a point from three times the updates). An accuracy reference on a decaying schedule (an
    optimizer of :data:`jaxstale.optimizers.NAMES`: warm-up + cosine over the run, whose last
    third gains from the decay at any length) is judged by the longer run alone, and not
    judged without one. A language model's fact is judged against its other rungs
    (:func:`_loss_judged`)."""
    facts = {
        n: json.loads((rows / n / FILE).read_text()) for n in names if (rows / n / FILE).exists()
    }
    cfgs = {n: _config(rows / n) for n in facts}
    out = []
    for name, found in facts.items():
        cfg = cfgs[name]
        decays = cfg.get("optimizer") in optimizers.NAMES
        for f in found:
            if f.get("metric") == "loss":
                out.append(_loss_judged(name, f, facts, cfgs))
                continue
            if f["plateau"] is None:  # no curve without divergence: not converged
                out.append(Judged(name, f, _converged(f)))
                continue
            longer = [
                (g["steps"], other, g)
                for other, theirs in facts.items()
                if other != name and all(cfgs[other].get(k) == cfg.get(k) for k in _SAME)
                for g in theirs
                if g["setting"] == f["setting"] and g["steps"] > f["steps"]
                and g.get("plateau") is not None
            ]  # fmt: skip
            if not longer:
                out.append(Judged(name, f, _converged(f) if not decays else None))
                continue
            _, other, g = max(longer, key=lambda t: t[0])
            close = g["plateau"] - f["plateau"] <= TOL
            ok = close and (decays or _converged(f))
            out.append(Judged(name, f, ok, (other, g), decays))
    return out


def _loss_judged(
    name: str, f: dict[str, Any], facts: dict[str, Any], cfgs: dict[str, dict[str, Any]]
) -> Judged:
    """A language model's reference, on a warm-up + cosine schedule over its run (its last
    third gains from the decay at any length), judged against the ladder's other rungs of the
    same reference (:data:`_SAME`, the same setting): not converged where a longer rung's
    last-third plateau is more than :data:`LOSS_TOL` below this one's; at the longest rung,
    converged only where the next shorter rung's is within :data:`LOSS_TOL` of it (the last
    multiple of the updates gained nothing); not judged alone."""
    if f["plateau"] is None:
        return Judged(name, f, False)
    cfg = cfgs[name]
    rungs = [
        (other, g)
        for other, theirs in facts.items()
        if other != name and all(cfgs[other].get(k) == cfg.get(k) for k in _SAME)
        for g in theirs
        if g["setting"] == f["setting"] and g.get("plateau") is not None
        and g["steps"] != f["steps"]
    ]  # fmt: skip
    longer = [(o, g) for o, g in rungs if g["steps"] > f["steps"]]
    if longer:
        other, g = max(longer, key=lambda t: t[1]["steps"])
        return Judged(name, f, f["plateau"] - g["plateau"] <= LOSS_TOL, (other, g), True)
    if rungs:
        other, g = max(rungs, key=lambda t: t[1]["steps"])
        return Judged(name, f, g["plateau"] - f["plateau"] <= LOSS_TOL, (other, g), True)
    return Judged(name, f, None)


def unconverged(rows: Path, names: Sequence[str]) -> list[str]:
    """The configurations of ``names`` whose synchronous reference has not converged at their
    budget in some setting (the Budget section's **not converged**: :func:`_judged`), from the
    ``budget.json`` files under ``rows``. A language model's reference without another rung
    of it, and a decaying schedule's without a longer run, are not judged and never listed.

    Example:
        >>> unconverged(Path("no-such-rows"), ["async"])
        []
    """
    return list(dict.fromkeys(j.name for j in _judged(rows, names) if j.converged is False))


def _loss_line(name: str, setting: str, f: dict[str, Any], judged: Judged | None = None) -> str:
    """A language model's line: its validation loss at the budget against the corpus's
    n-gram levels and the uniform loss, and where another rung of it ran, its convergence
    (:func:`_loss_judged`)."""
    if f["plateau"] is None:
        return f"- `{name}`, {setting}: no curve without divergence at {_rate(f)}."
    mean, half, n = f["delta_last_third"]
    change = (
        f"{mean:+.3f} ± {half:.3f} nats over {n} seeds"
        if n > 1 and math.isfinite(half)
        else "one seed"
    )
    refs = ""
    if f.get("unigram") is not None:
        refs = "; " + level_text(f["plateau"], f)
    head = f"- `{name}`, {setting}, {_rate(f)}:"
    if judged is not None and judged.by is not None:
        other, g = judged.by
        head += (
            f" {_verdict(judged.converged)} (against `{other}`, {g['steps']:,} updates: "
            f"{g['plateau']:.3f} nats, {g['plateau'] - f['plateau']:+.3f});"
        )
    return (
        f"{head} validation loss {f['plateau']:.3f} nats over "
        f"the last third of {f['steps']:,} updates{refs}; change over the last third {change} "
        "(a language model is compared at equal updates, on its warm-up + cosine schedule)."
    )


def level_text(loss: float, levels: dict[str, Any]) -> str:
    """Where ``loss`` sits among a corpus's n-gram levels (:func:`jaxstale.text.reference_losses`
    keys, read on the split ``levels["split"]``, default test; a loss within 0.02 of a level
    is "at" it).

    Example:
        >>> lv = {"unigram": 3.29, "bigram": 2.57, "trigram": 1.97, "uniform": 4.42}
        >>> level_text(2.30, lv)[:50]
        'between the bigram (2.57) and trigram (1.97) level'
    """
    grams = [(k, float(levels[k])) for k in ("unigram", "bigram", "trigram") if k in levels]
    split = {"val": "validation"}.get(levels.get("split", "test"), "test")
    tail = f" of the corpus (count models, {split} split; uniform {levels['uniform']:.2f})"
    at = [k for k, v in grams if abs(loss - v) <= 0.02]
    if at:
        return f"at the {at[-1]} level ({dict(grams)[at[-1]]:.2f}){tail}"
    below = [(k, v) for k, v in grams if loss < v]
    if not below:
        return f"**above the unigram level** ({grams[0][1]:.2f}){tail}"
    if len(below) == len(grams):
        k, v = grams[-1]
        return f"below the {k} level ({v:.2f}){tail}"
    (k, v), (k2, v2) = below[-1], grams[len(below)]
    return f"between the {k} ({v:.2f}) and {k2} ({v2:.2f}) levels{tail}"


def _rate(f: dict[str, Any]) -> str:
    """The selected rate in words (``dp``'s grid scales the inner rate)."""
    if f["setting"].get("method") == "dp":
        return f"rate {f['lr']:g} × the inner rate"
    return f"lr {f['lr']:g}"


def _line(judged: Judged) -> str:
    name, f = judged.name, judged.fact
    if f.get("metric") == "loss":
        setting = ", ".join(f"{k} {v}" for k, v in f["setting"].items())
        return _loss_line(name, setting, f, judged)
    setting = ", ".join(f"{k} {v}" for k, v in f["setting"].items())
    mean, half, n = f["delta_last_third"]
    change = (
        f"{100 * mean:+.1f} ± {100 * half:.1f} points over {n} seeds"
        if n > 1 and math.isfinite(half)
        else "one seed"
    )
    if f["plateau"] is None:
        return f"- `{name}`, {setting}: no curve without divergence at {_rate(f)}."
    head = f"- `{name}`, {setting}, {_rate(f)}"
    plateau = f"validation plateau {100 * f['plateau']:.1f} %"
    decay = (
        f"on its warm-up + cosine schedule, whose last third gains from the decay at any "
        f"length (here {change})"
    )
    if judged.converged is None:
        return (
            f"{head}: not judged; {plateau} over the last third of {f['steps']:,} updates, "
            f"{decay}, and no longer run of it to compare with."
        )
    if judged.by is not None and judged.decays:
        other, g = judged.by
        return (
            f"{head}: {_verdict(judged.converged)}; {plateau} at "
            f"{f['steps']:,} updates against {100 * g['plateau']:.1f} % at {g['steps']:,} "
            f"(`{other}`), judged by that longer run: {decay}."
        )
    flat = (
        f"flat (±{100 * TOL:g} point) since update {f['flat_since']:,} of {f['steps']:,}"
        if f["flat_since"] is not None
        else f"not within ±{100 * TOL:g} point of its plateau at the end ({f['steps']:,} updates)"
    )
    longer = ""
    if judged.by is not None:
        other, g = judged.by
        longer = (
            f"; a longer run of the same reference (`{other}`) plateaus at "
            f"{100 * g['plateau']:.1f} % at {g['steps']:,} updates"
        )
    return (
        f"{head}: {_verdict(judged.converged)}; {plateau}, {flat}; change over the last "
        f"third {change}{longer}."
    )


def section(rows: Path, names: Sequence[str]) -> list[str]:
    """The report's "Budget" lines from each configuration's ``budget.json`` under ``rows``
    (``[]`` when none has one)."""
    lines = [_line(j) for j in _judged(rows, names)]
    if not lines:
        return []
    head = (
        "The synchronous reference of each configuration at its rate selected on validation "
        "(mean validation curve over the seeds; **not converged**: never within 1 point of its "
        "last-third plateau, or still rising over the last third beyond noise, or its "
        "last-third plateau more than 1 point below that of a longer run of the same reference "
        "where one ran; on a decaying schedule, whose last third gains from the decay at any "
        "length, by the longer run alone):"
    )
    return ["", '<a id="budget"></a>', "", "## Budget", "", head, "", *lines]
