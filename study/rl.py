"""The asynchronous-RL claims (issue 55), declared before their runs: RL1–RL5 on
``experiments.stale_rl`` (``RL_RUNS`` in :mod:`study.configs_modern`).

Every value is the test reward × 100 (per-character reward of reversing 8 symbols of 16; a
uniform policy scores 5.9), each arm at its own Adam rate selected on the validation reward;
differences are oriented so that positive is the claim. On-policy is REINFORCE at τ = 0 (every
correction is REINFORCE there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import runs
from experiments.stale_rl import tables as rl_tables

from .core import Claim, Context, Diff, Evidence, Verdict, cell, contrast, diff, selected

__all__ = ["MARGIN", "RL_CLAIMS", "judge_inflight", "judge_law"]

#: the non-inferiority margin of "stays within a margin of on-policy" (RL1's other pair, RL3):
#: 5 points of reward, the stability tolerance of the experiment — above the seed noise of a
#: converged run, far below a collapse (tens of points)
MARGIN = 0.05

_REGIME = (
    "gpt-tiny (27k parameters), reverse 8 of 16 symbols, 300 GRPO updates × 128 responses "
    "from a 30-step supervised start (the papers: 0.5B–32B LLMs on math, up to 256 stale)"
)


def _cell(rows: Sequence[dict], arm: str, tau: int, delay: str = "constant") -> list[dict]:
    arm = rl_tables.REFERENCE if tau == 0 else arm
    return selected(rows, knob=("lr",), arm=arm, tau=tau, delay=delay)


def _area(rows: Sequence[dict]) -> list[dict]:
    """The rows with their area under the test curve (the mean test reward over the run's
    evaluations after update 0) as the test metric a difference reads."""
    return [{**r, "final_test_reward": r.get("mean_test_reward")} for r in rows]


def _at(rows: Sequence[dict], arm: str, tau: int, lr: float) -> list[dict]:
    return [r for r in rows if r["arm"] == arm and r["tau"] == tau and r["lr"] == lr]


def _name(arm: str, tau: int, delay: str = "constant") -> str:
    return f"{arm} (τ={tau}{', in-flight' if delay == 'inflight' else ''})"


def _beats(rows: Sequence[dict], a: str, b: str, tau: int, area: bool = False) -> Diff | None:
    """``a − b`` at τ, each at its own rate; ``area``: of the area under the test curve."""
    ra, rb = _cell(rows, a, tau), _cell(rows, b, tau)
    if not ra or not rb:
        return None
    if not area:
        return diff(ra, rb, _name(a, tau), _name(b, tau))
    d = diff(_area(ra), _area(rb), _name(a, tau), _name(b, tau))
    return dataclasses.replace(d, what=f"{d.a} − {d.b} (area under the test curve)")


def _near(rows: Sequence[dict], arm: str, tau: int) -> Diff | None:
    """``arm − on-policy + δ`` at τ: positive beyond noise = less than :data:`MARGIN` worse."""
    got, ref = _cell(rows, arm, tau), _cell(rows, rl_tables.REFERENCE, 0)
    if not got or not ref:
        return None
    name = _name(arm, tau)
    return contrast(
        [(1.0, got), (-1.0, ref)],
        name,
        "on-policy",
        what=f"{name} − on-policy + {100 * MARGIN:g} (non-inferiority, margin "
        f"{100 * MARGIN:g} points)",
        offset=MARGIN,
    )


def _taus(rows: Sequence[dict]) -> list[int]:
    return sorted({int(r["tau"]) for r in rows if r["tau"]})


def _table(ctx: Context, run: str) -> str:
    """Test reward at each arm's own rate, arm × τ (× delay), from the rows."""
    rows = ctx.rows(run)
    taus = _taus(rows)
    delays = list(dict.fromkeys(r["delay"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows if r["tau"]))
    body = [
        [
            f"{arm}{'' if d == 'constant' else f' ({d})'}",
            *(cell(_cell(rows, arm, t, d)) for t in taus),
        ]
        for d in delays
        for arm in arms
    ]
    ref = f"On-policy (τ = 0): {cell(_cell(rows, 'reinforce', 0))}."
    return f"{ref}\n\n{runs.markdown_table(['arm', *(f'τ={t}' for t in taus)], body)}"


def _evidence(
    ctx: Context, primary: Diff | None, secondary: dict[str, list[Diff]], notes: list[str],
    *, expected: float | None = None, control: Diff | None = None, run: str = "rl-stale",
    premise: Diff | None = None,
) -> Evidence:  # fmt: skip
    sec = {k: [d for d in v if d is not None] for k, v in secondary.items()}
    return Evidence(
        primary,
        {k: v for k, v in sec.items() if v},
        notes,
        [_table(ctx, run)],
        [(run, "plot"), (run, "cliff")],
        expected=expected,
        control=control,
        premise=premise,
    )


def _one_rate(rows: Sequence[dict], a: str, b: str, tau: int) -> Diff | None:
    """``a − b`` at τ, both at on-policy's selected rate (exploratory: one rate for both)."""
    ref = _cell(rows, rl_tables.REFERENCE, 0)
    if not ref:
        return None
    lr = ref[0]["lr"]
    ra, rb = _at(rows, a, tau, lr), _at(rows, b, tau, lr)
    if not ra or not rb:
        return None
    return diff(ra, rb, f"{_name(a, tau)} @ {lr:g}", f"{_name(b, tau)} @ {lr:g}")


def judge_is(ctx: Context) -> Evidence:
    """RL1. Primary: PPO-clip − untruncated IS at τ = 3, own rates. Declared: the same at the
    neighbouring τ (2, 4); PPO-clip within the margin of on-policy at τ = 3. Premise: IS at
    τ = 3 falls more than the margin below on-policy (the collapse PPO-clip should prevent)."""
    rows = ctx.rows("rl-stale")
    near = [t for t in (2, 4) if t in _taus(rows)]
    return _evidence(
        ctx,
        _beats(rows, "ppo-clip", "is", 3),
        {
            "PPO-clip − IS at τ = 2, 4": [_beats(rows, "ppo-clip", "is", t) for t in near],
            "PPO-clip within the margin of on-policy": [_near(rows, "ppo-clip", 3)],
            "exploratory, one rate (on-policy's)": [_one_rate(rows, "ppo-clip", "is", 3)],
            "exploratory, area under the test curve": [_beats(rows, "ppo-clip", "is", 3, True)],
        },
        [],
        premise=_near(rows, "is", 3),
    )


def judge_vcpo(ctx: Context) -> Evidence:
    """RL2. Primary: VCPO − sequence-level TIS at τ = 2, own rates. Declared: the same at every
    larger τ run (the paper: stable to 128). Premise: sequence-level TIS at τ = 2 falls more
    than the margin below on-policy (the paper's collapse)."""
    rows = ctx.rows("rl-stale")
    more = [t for t in _taus(rows) if t > 2]
    return _evidence(
        ctx,
        _beats(rows, "vcpo", "tis-seq", 2),
        {
            "VCPO − sequence TIS at larger τ": [_beats(rows, "vcpo", "tis-seq", t) for t in more],
            "exploratory, area under the test curve": [_beats(rows, "vcpo", "tis-seq", 2, True)],
        },
        [],
        premise=_near(rows, "tis-seq", 2),
    )


def judge_m2po(ctx: Context) -> Evidence:
    """RL3. Primary: M2PO within :data:`MARGIN` of on-policy at the largest τ run
    (non-inferiority); declared: the same at τ = 4, 8, and — where ``rl-m2po`` ran — M2PO's
    adaptive clip as its authors' code runs it, without and with PPO's dual clip, each against
    that run's own on-policy reference at its largest τ. Negative control: the same test on
    REINFORCE without a correction at the largest τ."""
    rows = ctx.rows("rl-stale")
    taus = _taus(rows)
    top = taus[-1] if taus else 16
    secondary = {
        "M2PO within the margin at τ = 4, 8": [_near(rows, "m2po", t) for t in (4, 8) if t < top]
    }
    if ctx.has("rl-m2po"):
        auth = ctx.rows("rl-m2po")
        last = _taus(auth)[-1] if _taus(auth) else top
        secondary["M2PO's adaptive clip (its authors' code) within the margin"] = [
            _near(auth, "m2po-clip", last)
        ]
        secondary["M2PO's adaptive clip with a dual clip within the margin"] = [
            _near(auth, "m2po-clip-dual", last)
        ]
    return _evidence(
        ctx, _near(rows, "m2po", top), secondary, [], expected=MARGIN,
        control=_near(rows, "reinforce", top),
    )  # fmt: skip


def _cliffs(rows: Sequence[dict], tolerance: float, lrs: Sequence[float]) -> dict[Any, Any]:
    cfg = {"lrs": list(lrs), "tolerance": tolerance}
    return rl_tables.stability([dict(r) for r in rows], cfg)[0]


def law_slope(points: Sequence[tuple[int, float]]) -> float:
    """The least-squares slope of ``log2 η*`` against ``log2 τ`` (the S·η law: −1)."""
    x = np.log2([t for t, _ in points])
    y = np.log2([lr for _, lr in points])
    return float(np.polyfit(x, y, 1)[0])


def judge_law(ctx: Context) -> Verdict:
    """RL4 (a threshold check on the grid, no interval: the cliff is a grid quantity). The
    largest stable rate of REINFORCE without a correction at each τ ≥ 1; the slope of
    ``log2 η*`` on ``log2 τ`` over the τ whose cliff the grid bounds (a stable rate below the
    top: at the smallest rate the cliff lies in [η₁, η₂), a measurement; none stable, or the
    top, is censored): held within [−1.5, −0.5] (the law's −1 ± half), did not hold outside,
    untestable with fewer than 3 such τ."""
    rows, cfg = ctx.rows("rl-stale"), ctx.config("rl-stale")
    floor = 1.0 / (cfg["symbols"] + 1)
    rows = rl_tables.scored(
        rl_tables.scored(rows, "final_val_reward", floor), "final_test_reward", floor
    )
    lrs, taus = cfg["lrs"], _taus(rows)
    cliffs = _cliffs(rows, cfg["tolerance"], lrs)
    cliff = lambda arm, t: cliffs.get((arm, "constant", t))
    # the τ whose cliff the grid bounds: a stable rate below the grid's top
    bounded = lambda arm: [
        (t, c) for t in taus if (c := cliff(arm, t)) is not None and c < max(lrs)
    ]
    lines, table = [], []
    for arm in cfg["arms"]:
        table.append([arm, *(_fmt(cliff(arm, t), lrs) for t in taus)])
        inside = bounded(arm)
        if len(inside) >= 3:
            lines.append(
                f"- {arm}: slope {law_slope(inside):+.2f} over τ = {[t for t, _ in inside]}"
            )
        else:
            lines.append(f"- {arm}: {len(inside)} τ with the cliff inside the grid (3 needed)")
    head = runs.markdown_table(["arm", *(f"τ={t}" for t in taus)], table)
    inside = bounded(rl_tables.REFERENCE)
    if len(inside) < 3:
        v = f"untestable here (REINFORCE's cliff inside the grid at {len(inside)} of {len(taus)} τ)"
    else:
        s = law_slope(inside)
        v = "held" if -1.5 <= s <= -0.5 else "did not hold"
        v += f" (slope {s:+.2f})"
    return Verdict(v, "\n".join(lines), [head], [("rl-stale", "cliff")])


def _fmt(c: float | None, lrs: Sequence[float]) -> str:
    return "none" if c is None else (f"≥ {c:g}" if c == max(lrs) else f"{c:g}")


def judge_inflight(ctx: Context) -> Evidence:
    """RL5. Primary: in-flight − off-by-τ mean test reward over the run (how fast: the paper's
    claim is speed) with REINFORCE at τ = 8 (the same tokens per update, max lag τ), own rates
    selected on the final validation reward; declared: the same at τ = 4, 16, with PPO-clip,
    and the final test reward at τ = 8."""
    rows = ctx.rows("rl-inflight")

    def pair(arm: str, tau: int, area: bool = True) -> Diff | None:
        a, b = _cell(rows, arm, tau, "inflight"), _cell(rows, arm, tau)
        if not a or not b:
            return None
        read = _area if area else list
        what = "area under the test curve" if area else "final test reward"
        d = diff(read(a), read(b), _name(arm, tau, "inflight"), _name(arm, tau))
        return dataclasses.replace(d, what=f"{d.a} − {d.b} ({what})")

    taus = [t for t in _taus(rows) if t != 8]
    return _evidence(
        ctx,
        pair("reinforce", 8),
        {
            "in-flight − off-by-τ at τ = 4, 16": [pair("reinforce", t) for t in taus],
            "in-flight − off-by-τ with PPO-clip": [pair("ppo-clip", t) for t in _taus(rows)],
            "in-flight − off-by-τ final reward": [pair("reinforce", 8, area=False)],
        },
        [],
        run="rl-inflight",
    )


_PTS = {"expected_abs": True, "expected_unit": "points", "expected_scale": 100.0}

RL_CLAIMS: list[Claim] = [
    Claim(
        "RL1",
        "PPO-clip stays on track where uncorrected importance sampling breaks",
        "tinker-cookbook #822; TRL #6945",
        "At 3 steps stale, training on the untruncated importance ratio collapses while PPO-clip "
        "against the behaviour policy stays near on-policy (94.5 % vs 94.0 %).",
        ("rl-stale",),
        judge_is,
        primary=f"PPO-clip − IS test reward at τ = 3, each at its own rate; regime: {_REGIME}",
        expected=0.10,
        expected_why="an estimate: a collapse costs tens of points; 10 points is its lower end",
        expected_estimate=True,
        secondaries=("PPO-clip − IS at τ = 2, 4", "PPO-clip within the margin of on-policy"),
        **_PTS,
    ),
    Claim(
        "RL2",
        "VCPO's ESS-scaled step keeps sequence-level IS stable",
        "Huang et al., ICML 2026 (arXiv 2602.17616)",
        "Sequence-level truncated IS collapses at 2 steps of lag; scaling the step by the "
        "importance weights' effective sample size (VCPO) stays stable to 128.",
        ("rl-stale",),
        judge_vcpo,
        primary="VCPO − sequence TIS test reward at τ = 2, each at its own rate; regime: "
        f"{_REGIME}",
        expected=0.10,
        expected_why="an estimate: a collapse costs tens of points; 10 points is its lower end",
        expected_estimate=True,
        secondaries=("VCPO − sequence TIS at larger τ",),
        **_PTS,
    ),
    Claim(
        "RL3",
        "M2PO stays within a margin of on-policy at the largest staleness",
        "Zheng, Zhao, Chen, ICLR 2026 (arXiv 2510.01161)",
        "A second-moment trust region (M2PO) matches on-policy training on data ≥ 256 updates "
        "stale.",
        ("rl-stale", "rl-m2po"),
        judge_m2po,
        primary=f"M2PO − on-policy + {100 * MARGIN:g} test reward at the largest τ run "
        f"(non-inferiority), M2PO at its own rate; regime: {_REGIME}",
        expected=MARGIN,
        expected_why=f"the margin ({100 * MARGIN:g} points: the experiment's stability tolerance)",
        secondaries=(
            "M2PO within the margin at τ = 4, 8",
            "M2PO's adaptive clip (its authors' code) within the margin",
            "M2PO's adaptive clip with a dual clip within the margin",
        ),
        **_PTS,
    ),
    Claim(
        "RL4",
        "The largest stable rate falls as 1/τ",
        "arXiv 2607.01083",
        "Stale rollouts bias each policy gradient by O(S·η): the largest stable learning rate "
        "falls in proportion to 1 / staleness.",
        ("rl-stale",),
        judge_law,
    ),
    Claim(
        "RL5",
        "In-flight weight updates beat off-by-τ at equal throughput",
        "Piché et al., arXiv 2509.19128 (PipelineRL)",
        "Updating the weights while responses are generated (each response's later tokens from "
        "newer weights) learns about 2× faster than waiting τ updates for whole rollouts.",
        ("rl-inflight",),
        judge_inflight,
        primary="in-flight − off-by-τ area under the test-reward curve (the mean over the "
        "run's evaluations: the paper's claim is speed) with REINFORCE at τ = 8 (the same "
        "tokens per update; in-flight lag falling from τ to 0 along a response), own rates; "
        f"regime: {_REGIME}",
        expected_why="none in reward (the paper reports wall-clock speed on 128 H100s)",
        secondaries=(
            "in-flight − off-by-τ at τ = 4, 16",
            "in-flight − off-by-τ with PPO-clip",
            "in-flight − off-by-τ final reward",
        ),
        **_PTS,
    ),
]
