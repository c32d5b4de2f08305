"""stale_rl's table and figures: the test reward at each arm's own rate per τ, its paired
difference to on-policy training, the stability cliff over rate × τ, and the diagnostics
(clipped fraction, ESS / n, KL to the behaviour policy) that say what each correction did."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import runs
from ..runs.stats import format_ci, mean_ci, select

VAL, TEST = "final_val_reward", "final_test_reward"
Group = tuple[str, str, int]  # (arm, delay, tau)
#: the arm every τ = 0 run is recorded under: on-policy, every correction is REINFORCE
REFERENCE = "reinforce"


def chance(cfg: Mapping[str, Any]) -> float:
    """The expected reward of a uniform policy over the symbols and the separator."""
    return 1.0 / (cfg["symbols"] + 1)


def scored(rows: Sequence[Mapping[str, Any]], value: str, floor: float) -> list[dict[str, Any]]:
    """``rows`` with a diverged run's ``value`` set to ``floor`` (chance): a collapse counts
    against its arm in every difference, not as a missing seed."""
    return [{**r, value: floor} if r.get("diverged") else dict(r) for r in rows]


def _of(rows: Sequence[Mapping[str, Any]], **match: Any) -> list[Mapping[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def reference(rows: Sequence[Mapping[str, Any]], selected: Mapping[Any, Any]) -> list[Any]:
    """The on-policy rows (τ = 0) at their selected rate."""
    g = next((g for g in selected if g[2] == 0), None)
    return [] if g is None else _of(rows, arm=g[0], delay=g[1], tau=0, lr=selected[g])


def stability(
    rows: Sequence[Mapping[str, Any]], cfg: Mapping[str, Any]
) -> tuple[dict[Group, float | None], dict[tuple[Group, float], bool], float]:
    """``(cliff, stable, best)``: the largest stable rate per (arm, delay, τ) (None: none is),
    each cell's verdict, and the on-policy best mean validation reward they are measured
    against. Stable: no seed diverged and the mean validation reward ≥ best − tolerance."""
    ref = [r for r in rows if r["tau"] == 0]
    best = max(
        (float(np.mean([r[VAL] for r in _of(ref, lr=lr)])) for lr in cfg["lrs"] if _of(ref, lr=lr)),
        default=math.nan,
    )
    stable: dict[tuple[Group, float], bool] = {}
    for r in rows:
        g = (r["arm"], r["delay"], r["tau"])
        cell = _of(rows, arm=g[0], delay=g[1], tau=g[2], lr=r["lr"])
        ok = not any(c.get("diverged") for c in cell)
        stable[(g, r["lr"])] = (
            ok and float(np.mean([c[VAL] for c in cell])) >= best - cfg["tolerance"]
        )
    cliff: dict[Group, float | None] = {}
    for (g, lr), ok in stable.items():
        cliff.setdefault(g, None)
        if ok and (cliff[g] is None or lr > cliff[g]):
            cliff[g] = lr
    return cliff, stable, best


def _arm_by_tau(
    arms: Sequence[str], taus: Sequence[int], cell: Callable[[str, int], str]
) -> list[str]:
    """One table: a row per arm, a column per τ > 0, ``cell(arm, τ)`` in each; then a blank."""
    body = [[arm, *(cell(arm, t) for t in taus)] for arm in arms]
    return [runs.markdown_table(["arm", *(f"τ = {t}" for t in taus)], body), ""]


def make_table(
    rows: list[dict[str, Any]], cfg: Mapping[str, Any]
) -> tuple[str, dict[Any, Any], dict[Any, Any]]:
    """``(markdown, selected, stable)``: ``selected`` the rate per (arm, delay, τ) chosen on
    validation, ``stable`` the cliff's verdict per ((arm, delay, τ), rate)."""
    floor = chance(cfg)
    rows = scored(rows, VAL, floor)
    rows = scored(rows, TEST, floor)
    selected = select(rows, by=("arm", "delay", "tau"), knob="lr", value=VAL, chance=floor)
    cliff, stable, best = stability(rows, cfg)
    ref = reference(rows, selected)
    at = lambda g: _of(rows, arm=g[0], delay=g[1], tau=g[2], lr=selected.get(g))
    # the differences read every seed, a diverged one at chance (paired_difference leaves out
    # the rows marked diverged: these copies are not)
    itt = lambda picked: [{**r, "diverged": False} for r in picked]
    quick = " (**--quick: a smoke run, not a result**)" if cfg["quick"] else ""
    lines = [
        f"# stale_rl{quick}",
        "",
        f"Reverse {cfg['length']} of {cfg['symbols']} symbols, {cfg['model']}, supervised start "
        f"({cfg['sup_steps']} steps), {cfg['steps']} GRPO updates of {cfg['prompts']} prompts × "
        f"{cfg['group']}, Adam, {cfg['seeds']} seeds; reward × 100 (uniform policy "
        f"{100 * floor:.1f}), test split at the rate selected on validation per arm and τ, "
        "mean ± 95 % CI; a diverged seed counts at chance.",
        "",
    ]
    if ref:
        lines += [
            f"On-policy (τ = 0, every correction is REINFORCE): "
            f"{format_ci([r[TEST] for r in ref])} @ {ref[0]['lr']:g}; supervised start "
            f"{100 * ref[0]['start_val_reward']:.1f} (validation).",
            "",
        ]
    arms, taus, top = cfg["arms"], [t for t in cfg["taus"] if t], max(cfg["lrs"])
    for delay in cfg["delays"] if taus else []:

        def own_rate(arm: str, t: int) -> str:
            g = (arm, delay, t)
            pick = at(g)
            k = sum(bool(r.get("diverged")) for r in pick)
            mark = f" [{k}/{len(pick)} div., at chance]" if k else ""
            return f"{format_ci([r[TEST] for r in pick])}{mark} @ {selected[g]:g}" if pick else "–"

        def to_reference(arm: str, t: int) -> str:
            pick = at((arm, delay, t))
            if not pick or not ref:
                return "–"
            m, h, _ = runs.paired_difference(itt(pick), itt(ref), value=TEST)
            if not math.isfinite(h):
                return f"{100 * m:+.1f}"
            return f"{100 * m:+.1f} ± {100 * h:.1f}" + (" *" if abs(m) > h else "")

        def largest_stable(arm: str, t: int) -> str:
            c = cliff.get((arm, delay, t))
            return "–" if c is None else (f"≥ {c:g}" if c == top else f"{c:g}")

        def diagnostics(arm: str, t: int) -> str:
            pick = at((arm, delay, t))
            if not pick:
                return "–"
            mean = lambda k: float(np.mean([r[k] for r in pick if r.get(k) is not None]))
            return (
                f"clip {100 * mean('clipped'):.0f} %, kept {100 * mean('kept'):.0f} %, "
                f"ESS {mean('ess'):.2f}, KL {mean('kl'):.3f}"
            )

        lines += [f"## Test reward at each arm's own rate ({delay} delay)", ""]
        lines += _arm_by_tau(arms, taus, own_rate)
        lines += [f"## Difference to on-policy, paired by seed ({delay} delay)", ""]
        lines += _arm_by_tau(arms, taus, to_reference)
        lines += [
            "\\* beyond noise (the 95 % interval excludes 0).",
            "",
            f"## Stability cliff: the largest stable rate ({delay} delay)",
            "",
            f"Stable at (τ, η): no seed diverged and the mean validation reward ≥ the on-policy "
            f"best ({100 * best:.1f}) − {100 * cfg['tolerance']:g}; '–' none of "
            f"{', '.join(f'{x:g}' for x in cfg['lrs'])} is; '≥' the grid's top is.",
            "",
        ]
        lines += _arm_by_tau(arms, taus, largest_stable)
        lines += [f"## What each correction did at its own rate ({delay} delay)", ""]
        lines += _arm_by_tau(arms, taus, diagnostics)
    lines += ["## Validation grid (mean final validation reward × 100; bold: stable)", ""]
    body = []
    groups = list(dict.fromkeys((r["arm"], r["delay"], r["tau"]) for r in rows))
    for g in groups:
        cells = []
        for lr in cfg["lrs"]:
            cell = _of(rows, arm=g[0], delay=g[1], tau=g[2], lr=lr)
            if not cell:
                cells.append("–")
                continue
            m, _, _ = mean_ci([r[VAL] for r in cell])
            text = f"{100 * m:.1f}"
            cells.append(f"**{text}**" if stable.get((g, lr)) else text)
        body.append([g[0], g[1], str(g[2]), *cells])
    lines += [runs.markdown_table(["arm", "delay", "τ", *(f"{x:g}" for x in cfg["lrs"])], body)]
    # no time here: a table is a function of the rows' results (a resumed sweep writes the same
    # bytes); report() prints the CPU-hours
    return "\n".join(lines) + "\n", selected, stable


def make_figures(
    rows: list[dict[str, Any]],
    cfg: Mapping[str, Any],
    selected: Mapping[Any, Any],
    stable: Mapping[Any, bool],
) -> dict[str, Any]:
    """Rows carry their curves as ``_metrics``. ``plot``: validation reward against update,
    one panel per (delay, τ), one line per arm at its own rate (the on-policy reference in
    every panel); ``cliff``: mean validation reward over rate × τ, one panel per arm, stable
    cells framed."""
    from matplotlib.figure import Figure

    floor = chance(cfg)  # a diverged run's final reward at chance, as in the table
    rows = scored(scored(rows, VAL, floor), TEST, floor)
    ref_g = next((g for g in selected if g[2] == 0), None)
    series: dict[str, dict[str, list[Any]]] = {}
    for delay in cfg["delays"]:
        for t in [t for t in cfg["taus"] if t]:
            panel: dict[str, list[Any]] = {}
            if ref_g is not None:
                panel["on-policy (τ = 0)"] = [
                    r["_metrics"] for r in _of(rows, arm=ref_g[0], tau=0, lr=selected[ref_g])
                ]
            for arm in cfg["arms"]:
                g = (arm, delay, t)
                if g in selected:
                    panel[arm] = [
                        r["_metrics"]
                        for r in _of(rows, arm=arm, delay=delay, tau=t, lr=selected[g])
                    ]
            series[f"{delay}, τ = {t}"] = panel
    figs: dict[str, Any] = {}
    if series:
        figs["plot"] = runs.curves_figure(
            series, ys=("val_reward",), logy=(), methods=["on-policy (τ = 0)", *cfg["arms"]],
            footer=f"{cfg['model']}, reverse {cfg['length']}/{cfg['symbols']}, own rates",
        )  # fmt: skip
    arms, taus, lrs = cfg["arms"], cfg["taus"], cfg["lrs"]
    fig = Figure(figsize=(2.6 * len(arms) + 1, 2.8 * len(cfg["delays"])), layout="constrained")
    axes = fig.subplots(len(cfg["delays"]), len(arms), squeeze=False)
    image = None
    for i, delay in enumerate(cfg["delays"]):
        for j, arm in enumerate(arms):
            ax = axes[i][j]
            grid = np.full((len(taus), len(lrs)), np.nan)
            for a, t in enumerate(taus):
                for b, lr in enumerate(lrs):
                    cell = _of(
                        rows,
                        arm=REFERENCE if t == 0 else arm,
                        delay="constant" if t == 0 else delay,
                        tau=t,
                        lr=lr,
                    )
                    if cell:
                        grid[a, b] = np.mean([r[VAL] for r in cell])
                    g = (REFERENCE if t == 0 else arm, "constant" if t == 0 else delay, t)
                    if stable.get((g, lr)):
                        ax.add_patch(_frame(b, a))
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
            ax.set_xticks(range(len(lrs)), [f"{x:g}" for x in lrs], rotation=45, fontsize=7)
            ax.set_yticks(range(len(taus)), [str(t) for t in taus], fontsize=7)
            ax.set_title(f"{arm} ({delay})", fontsize="small")
            if j == 0:
                ax.set_ylabel("staleness τ")
            ax.set_xlabel("Adam rate η", fontsize="small")
    if image is not None:
        fig.colorbar(image, ax=axes, label="mean final validation reward", shrink=0.8)
    figs["cliff"] = runs.finish_figure(fig, smoke=cfg["quick"])
    return figs


def _frame(x: int, y: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="white", linewidth=1.5)
