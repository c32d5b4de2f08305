"""The pipeline experiment's tables (:mod:`experiments.pipeline_staleness`): the test metric at
each policy's selected rate per depth, time to target, the validation grid with its edges, and
every pair of policies paired on the seeds."""

from __future__ import annotations

from typing import Any

from jaxstale import optimizers, tasks

from . import reports
from .common import title
from .reports import at_selected, edge_notes, paired_table, pairs_text, tuned_tables

__all__ = ["EDGE_BY", "make_table"]

EDGE_BY = ("model", "method", "stages")  # the rows of one rate grid


def make_table(
    rows: list[dict[str, Any]],
    cfg: dict[str, Any],
    chance_acc: float,
    task: tasks.Task = reports.ACCURACY,
) -> tuple[str, dict[tuple[Any, ...], Any]]:
    """The tuned tables (test accuracy — a language model's loss — at the rate selected on
    validation, time to target, the validation grid), the paired differences and the pairs
    beyond noise."""
    col, m = (lambda n: f"N={n}"), task.label
    acc, ttime, grid, selected = tuned_tables(
        rows, index=("model", "method"), columns="stages", chance_acc=chance_acc, col_label=col,
        task=task,
    )  # fmt: skip
    picked = at_selected(rows, selected, by=("model", "method", "stages"))
    o, mu = cfg["optimizer"], cfg["momentum"]
    opt = f"SGD momentum {mu}" if o == "sgd" else f"{optimizers.LABELS[o]} (β1 {mu})"
    unit = "token" if cfg["dataset"] == "tokens" else "character"
    data = "standardised" if task.metric == "accuracy" else f"next {unit}, loss in nats"
    head = (
        f"{cfg['dataset']} ({data}; validation split for selection), {opt}, "
        f"{cfg['steps']} mini-batches of {cfg['batch_size']}, asynchronous 1F1B with N stages "
        f"(sync: 1F1B with a flush), backward={cfg['backward']}, {cfg['seeds']} seeds"
    )
    parts = [
        title(
            cfg,
            f"**Test {m} at each policy's learning rate selected on validation (mean ± 95 % "
            f"CI over seeds that trained; [diverged/seeds]; @ selected lr), {head}**",
        ),
        acc,
        f"**Updates until validation {m.split()[0]} {'≥' if task.higher_is_better else '≤'} "
        f"{task.scale * cfg['target']:g} at the selected rate (median over seeds; "
        "[reached/seeds])**",
        ttime,
        f"**Validation {m} per learning rate (mean over seeds, diverged seeds at chance; "
        "bold: selected)**",
        grid,
    ]
    lim, lrs = cfg.get("extend_edges", 0), cfg.get("lrs", ())
    edges = edge_notes(rows, by=EDGE_BY, grid=lrs, limit=lim, chance_acc=chance_acc, task=task)
    parts += [n for n in (edges, reports.tuning_note(cfg, task)) if n]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for base in ("vanilla", "sync"):
        if base in methods and len(methods) > 1:
            table, _ = paired_table(
                picked,
                index=("model",),
                compare="method",
                baseline=base,
                columns="stages",
                col_label=col,
                task=task,
            )
            parts += [
                f"**Paired test-{m.split()[0]} difference to {base} ({task.unit}; per seed, each "
                f"policy at "
                f"its selected rate; mean ± 95 % t interval; beyond noise: the interval "
                f"excludes 0)**",
                table,
            ]
    findings: list[dict[str, Any]] = []
    for j, base in enumerate(methods):
        others = methods[j + 1 :]
        if others:
            sub = [r for r in picked if r["method"] in (base, *others)]
            findings += paired_table(
                sub, index=("model",), compare="method", baseline=base, columns="stages", task=task
            )[1]
    if findings:
        parts += [
            f"**Every pair of policies, paired test-{m.split()[0]} difference at the selected "
            "rates (95 % t interval over seeds, uncorrected for the number of pairs)**",
            pairs_text(findings, task),
        ]
    return "\n\n".join(parts) + "\n", selected
