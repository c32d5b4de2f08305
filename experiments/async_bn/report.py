"""The report of :mod:`experiments.async_bn`: one flat row per run and policy copy, the
choices on validation (learning rate per M, then each policy's rate ``d``), the tables and the
figures."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from jaxstale.asyncdp.methods import LC_BN_MOMENTUM as BN_MOMENTUM

from .. import runs
from ..common import title
from .bank import ASYNC, DEFAULT_DECAY, ORDINARY, POLICIES, RECOMPUTED, _label

KEY = ("workers", "lr", "seed")  # the fields of a cell key: one training run


# ----------------------------------------------------------------------------- selection


def policy_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per run and policy copy: ``workers, lr, seed, policy, decay, diverged,
    final_val_accuracy, final_test_accuracy, final_test_error, updates_to_target``."""
    out = []
    for r in rows:
        for q in r["policies"]:
            acc = q["final_test_accuracy"]
            out.append(
                {
                    **{k: r[k] for k in KEY},
                    "diverged": r["diverged"],
                    **q,
                    "final_test_error": None if acc is None else 1.0 - acc,
                }
            )
    return out


def select(prow: Sequence[dict[str, Any]], chance_acc: float) -> dict[str, dict]:
    """The choices, all on validation: ``{"lr": {M: lr}, "decay": {(policy, M): d}}``: the rate
    per M by the recomputed statistics' accuracy (policy-neutral: the policies share the
    weights), then per policy and M the decay at that rate by the policy's own accuracy."""
    rec = [r for r in prow if r["policy"] == RECOMPUTED]
    lr = {
        g[0]: v for g, v in runs.select(rec, by=("workers",), knob="lr", chance=chance_acc).items()
    }
    at = [r for r in prow if r["policy"] != RECOMPUTED and r["lr"] == lr.get(r["workers"])]
    decay = runs.select(at, by=("policy", "workers"), knob="decay", chance=chance_acc)
    return {"lr": lr, "decay": decay}


def _pick(prow: Sequence[dict], policy: str, m: int, lr: Any, decay: Any) -> list[dict]:
    return [
        r
        for r in prow
        if r["policy"] == policy and r["workers"] == m and r["lr"] == lr and r["decay"] == decay
    ]


# ----------------------------------------------------------------------------- tables


def _err(pick: Sequence[dict]) -> str:
    return runs.format_ci(
        [r["final_test_error"] for r in pick], diverged=[bool(r["diverged"]) for r in pick]
    )


def _paired(a: Sequence[dict], b: Sequence[dict]) -> str:
    """``a − b`` test error in points, mean ± 95 % CI (n pairs), with the verdict."""
    if not a or not b:
        return "–"
    mean, half, n = runs.paired_difference(a, b, value="final_test_error")
    if n == 0:
        return "no pairs"
    if not math.isfinite(half):
        return f"{100 * mean:+.2f} (1 pair)"
    beyond = abs(mean) > half
    return f"{100 * mean:+.2f} ± {100 * half:.2f} ({n})" + (" **beyond noise**" if beyond else "")


def selected_rows(prow: Sequence[dict], sel: dict, m: int) -> dict[str, list[dict]]:
    """The runs behind each table row at M = ``m`` (``sel`` from :func:`select`: the selected
    rate; per policy the selected (``"<policy> tuned"``) and the default decay, and the
    recomputed statistics), keyed like :data:`ROW_NAMES`."""
    lr = sel["lr"].get(m)
    out = {}
    for q in POLICIES:
        out[f"{q} tuned"] = _pick(prow, q, m, lr, sel["decay"].get((q, m)))
        out[f"{q} default"] = _pick(prow, q, m, lr, DEFAULT_DECAY)
    out[RECOMPUTED] = _pick(prow, RECOMPUTED, m, lr, None)
    return out


ROW_NAMES = {
    f"{ORDINARY} tuned": "ordinary BN, rate d selected on validation",
    f"{ASYNC} tuned": "Async-BN, decay d selected on validation",
    f"{ORDINARY} default": f"ordinary BN, the model's momentum m = {BN_MOMENTUM:g}",
    f"{ASYNC} default": f"Async-BN, d = 1 − m = {DEFAULT_DECAY:g} (the default)",
    RECOMPUTED: "recomputed statistics (same weights, precise BN)",
}


def make_table(rows: list[dict], cfg: dict[str, Any], chance_acc: float) -> tuple[str, dict]:
    """The report: test error at the selected settings, paired differences (selected; per
    learning rate), time to the target, the validation grids of both selections."""
    prow = policy_rows(rows)
    sel = select(prow, chance_acc)
    ms = cfg["workers"]
    many_d = len(cfg["decays"]) > 1
    head = ["", *(f"M={m}" for m in ms)]
    by_m = {m: selected_rows(prow, sel, m) for m in ms}

    main = []
    for name, text in ROW_NAMES.items():
        cells = []
        for m in ms:
            pick = by_m[m][name]
            cell = _err(pick) if pick else "–"
            if name.endswith("tuned") and many_d and pick:
                cell += f" @ d={sel['decay'][(name.split()[0], m)]:g}"
            cells.append(cell)
        main.append([text, *cells])
    main.append(
        [
            "learning rate (selected on recomputed validation accuracy)",
            *(f"{sel['lr'][m]:g}" if m in sel["lr"] else "–" for m in ms),
        ]
    )

    pairs = [
        ("ordinary − Async-BN, each at its selected d", f"{ORDINARY} tuned", f"{ASYNC} tuned"),
        (
            "ordinary − Async-BN, defaults (m = 0.9 vs d = 0.1)",
            f"{ORDINARY} default",
            f"{ASYNC} default",
        ),
        ("ordinary (selected d) − recomputed", f"{ORDINARY} tuned", RECOMPUTED),
        ("Async-BN (selected d) − recomputed", f"{ASYNC} tuned", RECOMPUTED),
    ]
    paired = [[text, *(_paired(by_m[m][a], by_m[m][b]) for m in ms)] for text, a, b in pairs]

    per_lr = []
    for lr in cfg["lrs"]:
        cells = []
        for m in ms:
            a = _pick(prow, ORDINARY, m, lr, DEFAULT_DECAY)
            b = _pick(prow, ASYNC, m, lr, DEFAULT_DECAY)
            div = sum(bool(r["diverged"]) for r in a)
            cell = _paired(a, b) + (f" [{div}/{len(a)} div.]" if div else "")
            cells.append(cell + (" (selected lr)" if sel["lr"].get(m) == lr else ""))
        per_lr.append([f"lr {lr:g}", *cells])

    ttt = [
        [
            ROW_NAMES[name],
            *(runs.format_steps([r["updates_to_target"] for r in by_m[m][name]]) for m in ms),
        ]
        for name in ROW_NAMES
        if name != RECOMPUTED
    ]

    lr_grid = []
    for m in ms:
        cells = []
        for lr in cfg["lrs"]:
            per = _pick(prow, RECOMPUTED, m, lr, None)
            cells.append(_grid_cell(per, chance_acc, sel["lr"].get(m) == lr))
        lr_grid.append([f"M={m}", *cells])
    d_grid = []
    for q in POLICIES:
        for m in ms:
            cells = []
            for d in cfg["decays"]:
                per = _pick(prow, q, m, sel["lr"].get(m), d)
                cells.append(_grid_cell(per, chance_acc, sel["decay"].get((q, m)) == d and many_d))
            d_grid.append([q, f"M={m}", *cells])

    epochs = rows[0]["epochs"] if rows else float("nan")
    budget = f"{cfg['updates']} updates (≈ {epochs:.0f} epochs)"
    setting = (
        f"{cfg['model']} {cfg['model_kw']} on {cfg['dataset']} (standardised; validation split "
        f"for every choice), {cfg['delay']} delays, batch {cfg['batch_size']}, LC-ASGD λ "
        f"{cfg['lam']:g}, momentum {cfg['momentum']:g}, {budget}, {cfg['seeds']} seeds"
    )
    parts = [
        title(
            cfg,
            f"**Test error % with each batch-norm policy's statistics (mean ± 95 % CI over "
            f"seeds that trained; [diverged/seeds]; @ the policy's selected d), at the "
            f"learning rate selected per M; {setting}**",
        ),
        runs.markdown_table(["batch-norm statistics", *head[1:]], main),
        "**Paired by seed (same weights): test-error difference in points, mean ± 95 % CI "
        "(pairs); positive = the second is better; beyond noise = the interval excludes 0**",
        runs.markdown_table(["difference", *head[1:]], paired),
        "**Ordinary − Async-BN test error (defaults, m = 0.9 vs d = 0.1), paired by seed, at "
        "every learning rate of the grid (no selection: where the difference lives)**",
        runs.markdown_table(["learning rate", *head[1:]], per_lr),
        f"**Updates until the policy's validation accuracy ≥ {100 * cfg['target']:g} % (median "
        f"over seeds; [reached/seeds]; evaluated every {cfg['eval_every']} updates)**",
        runs.markdown_table(["batch-norm statistics", *head[1:]], ttt),
        "**Learning-rate selection: validation accuracy % with recomputed statistics (mean over "
        "seeds, diverged at chance; bold: selected)**",
        runs.markdown_table(["workers", *(f"lr {lr:g}" for lr in cfg["lrs"])], lr_grid),
        "**Rate selection at the selected learning rate: validation accuracy % with the "
        "policy's statistics (bold: selected)**",
        runs.markdown_table(["policy", "workers", *(f"d {d:g}" for d in cfg["decays"])], d_grid),
    ]
    return "\n\n".join(parts) + "\n", sel


def _grid_cell(per: Sequence[dict], chance_acc: float, bold: bool) -> str:
    if not per:
        return "–"
    sc = 100 * runs.stats.score(per, "final_val_accuracy", chance_acc)
    div = sum(bool(r["diverged"]) for r in per)
    mark = "**" if bold else ""
    return f"{mark}{sc:.1f}{mark}" + (f" [{div}/{len(per)} div.]" if div else "")


# ----------------------------------------------------------------------------- figures


def make_figures(
    rows: list[dict], sel: dict, metrics_of: Callable[[dict], list], cfg: dict
) -> dict[str, Any]:
    from matplotlib.figure import Figure

    prow = policy_rows(rows)
    ms = cfg["workers"]
    by_m = {m: selected_rows(prow, sel, m) for m in ms}
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for name, text in ROW_NAMES.items():
        xs, ys, es = [], [], []
        for m in ms:
            vals = [r["final_test_error"] for r in by_m[m][name] if not r["diverged"]]
            mean, half, n = runs.mean_ci(vals)
            if n:
                xs.append(m)
                ys.append(100 * mean)
                es.append(100 * half if math.isfinite(half) else 0.0)
        ls = "--" if name == RECOMPUTED else (":" if name.endswith("default") else "-")
        runs.clipped_errorbar(ax, xs, ys, es, capsize=3, marker="o", ls=ls, label=text)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("workers M")
    ax.set_ylabel("test error % (selected lr; 95 % CI)")
    ax.set_title(f"Batch-norm statistics under asynchrony ({cfg['model']}, {cfg['dataset']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")

    groups: dict[str, dict[str, list]] = {}
    for m in sorted({min(ms), max(ms)}):
        lr = sel["lr"].get(m)
        runs_m = [r for r in rows if r["workers"] == m and r["lr"] == lr]
        series: dict[str, list] = {}
        for q in POLICIES:
            for d in sorted({DEFAULT_DECAY, sel["decay"].get((q, m), DEFAULT_DECAY)}):
                key = f"val_accuracy/{_label(q, d)}"
                series[f"{q} (d={d:g})"] = [
                    [{"epoch": c["epoch"], "val_accuracy": c.get(key)} for c in metrics_of(r) or []]
                    for r in runs_m
                ]
        groups[f"M={m}, lr {lr}"] = series
    curves = runs.curves_figure(
        groups,
        x="epoch",
        ys=("val_accuracy",),
        logy=(),
        title="Validation accuracy with each policy's statistics (selected lr; M = 1: the "
        "convergence check)",
    )
    return {"plot": fig, "curves": curves}
