"""The modern claims' configurations: the language-model ladder (issue 52: LM7, LM8, the 4k
rung) and the asynchronous-RL family (issue 55: RL1–RL5). :mod:`study.configs` adds them to
:data:`~study.configs.RUNS` after the earlier families, in this order."""

from __future__ import annotations

from typing import Any

from experiments import constant_delay, local_sgd, pipeline_staleness, stale_rl

from .workloads import LM, LM_QUICK, Run

__all__ = ["ARMS", "DILOCO_GPT_RUNS", "GRID", "INNER_GRID", "LADDER_RUNS", "MUON_GRID", "RL_RUNS",
           "RUNGS"]  # fmt: skip

_CD = constant_delay.Config

# ----------------------------------------------------------- the language-model ladder

#: The language-model ladder's configurations (issue 52): the pipeline claims and the two 2026
#: fixes on ``gpt-cpu`` beyond the n-gram regime, declared before any of them ran.
#:
#: **Why a ladder.** The 1,000-update LM runs (1.02 M characters, 0.23 epochs, 2.5 tokens per
#: parameter) end where count models sit: synchronous AdamW at 1.906 nats against a trigram's
#: 1.974, every asynchronous AdamW arm at N ≥ 4 but 2BW at the bigram's 2.569 — a regime in which
#: the papers' end-of-training claims have no answer yet. The rungs: 1k updates (the committed
#: rows: "early training"), 4k (0.9 epochs, 10 tokens per parameter) and 16k (3.8 epochs, 40 tokens
#: per parameter), a verdict read at the largest rung where sync's last third is flat by the
#: Budget rule.
#:
#: **The arms** (:data:`ARMS`, N = 8, AdamW per stage): sync, vanilla, stash, 2bw, pipemare,
#: spectrain-v1, nesterov, the two 2026 rows — 2bw-spectrain (2BW + prediction) and 2bw-ef (2BW +
#: error feedback) — and, in their own configurations, AsyncPP (NAdamW with its β1 rule) and basis
#: rotation (the ``rotated`` optimizer with stashing, N = 2, 4, 8, against AdamW's). Rates: a ×2
#: grid (:data:`GRID`) centred on the 1k runs' selection (every AdamW arm chose 0.003 or its
#: neighbours), 2 tuning seeds, an edge winner extended, 5 seeds at the selected rate.
#:
#: **Cost, planned** (0.174 CPU-s per update of an N = 8 round at batch 16, measured; a rung of
#: ``U`` updates costs one arm ``(3·2 + 3)·U·0.174`` CPU-s): the 4k rung 1.74 CPU-hours per arm,
#: ≈ 16 for the nine arms, ≈ 4 for AsyncPP's, ≈ 10 for the rotation pair (rotated's update is
#: ≈ 1.4× AdamW's); the 16k rung 4× that per arm, run for the arms whose 4k verdicts need it
#: once the 4k sync reference says whether it is flat; the error-feedback harness (τ = 0, 1,
#: three methods, two optimizers) ≈ 6 at 4k. The 4k rung with the harness: ≈ 36 CPU-hours.
#: the ladder's rungs, updates
RUNGS = (1000, 4000, 16000)
#: the pipeline arms at N = 8 (AdamW per stage)
ARMS = (
    "sync",
    "vanilla",
    "stash",
    "2bw",
    "pipemare",
    "spectrain-v1",
    "nesterov",
    "2bw-spectrain",
    "2bw-ef",
)
#: AdamW's peak-rate grid, ×2 apart, centred on the 1k selections
GRID = (0.0015, 0.003, 0.006)
#: Muon's (the 1k runs chose 0.02)
MUON_GRID = (0.01, 0.02, 0.04)

#: the 4k rung's evaluations: every 250 updates (16 per run; the whole test split, 242,321
#: characters, costs ≈ 4.5 CPU-s per lane and evaluation on gpt-cpu: ≈ 13 % of a run)
_RUNG: dict[str, Any] = {**LM, "steps": 4000, "tune_seeds": 2, "extend_edges": 2, "eval_every": 250}
_LPS = pipeline_staleness.Config
_PS_BASE: dict[str, Any] = {**_RUNG, "model": ("gpt-cpu",), "batch_size": 16, "lrs": GRID}
#: smoke versions: one rate (a wiring check of every arm in < 2 minutes)
_QUICK: tuple[tuple[str, Any], ...] = (
    *LM_QUICK,
    ("stages", (2,)),
    ("extend_edges", 0),
    ("lrs", (0.003,)),
    ("tune_seeds", None),
)
_CD_QUICK: tuple[tuple[str, Any], ...] = (*LM_QUICK, ("delays", (0, 1)), ("extend_edges", 0))


def _ef_run(optimizer: str, lrs: tuple[float, ...], quick: tuple, what: str) -> Run:
    """LM7's harness for one optimizer: τ = 0, 1; stale, predicted, error feedback."""
    methods = ("stale", "predicted", "feedback")
    config = _CD(**_RUNG, model=("gpt-cpu",), optimizer=optimizer, lrs=lrs, delays=(0, 1),
                 methods=methods)  # fmt: skip
    return Run(constant_delay, config, quick, what=what)


LADDER_RUNS: dict[str, Run] = {
    "lm-ladder-4k": Run(
        pipeline_staleness,
        _LPS(**_PS_BASE, optimizer="adamw", stages=(8,), methods=ARMS),
        _QUICK,
        what="the ladder's 4k rung: a GPT, AdamW per stage, N = 8, every policy and the 2026 "
        "rows (2BW + prediction, 2BW + error feedback)",
    ),
    "lm-ladder-4k-asyncpp": Run(
        pipeline_staleness,
        _LPS(
            **_PS_BASE,
            optimizer="nadamw",
            stages=(8,),
            momentum_rule="asyncpp",
            methods=("sync", "asyncpp"),
        ),
        _QUICK,
        what="the 4k rung of AsyncPP: NAdamW with its per-stage β1, stashing, N = 8",
    ),
    "lm-rotation": Run(
        pipeline_staleness,
        _LPS(**_PS_BASE, optimizer="rotated", stages=(2, 4, 8), methods=("sync", "stash")),
        _QUICK,
        what="LM8: basis rotation (AdamW in rotated bases, refreshed every 10 updates) with "
        "PipeDream's stashing, N = 2, 4, 8, 4k updates",
    ),
    "lm-rotation-adamw": Run(
        pipeline_staleness,
        _LPS(**_PS_BASE, optimizer="adamw", stages=(2, 4, 8), methods=("sync", "stash")),
        _QUICK,
        what="LM8's reference: the same with AdamW (paired on the seeds)",
    ),
    "lm-ef-adamw": _ef_run(
        "adamw",
        GRID,
        _CD_QUICK,
        "LM7: every gradient one update stale, AdamW, stale / "
        "predicted / error feedback, 4k updates",
    ),
    "lm-ef-muon": _ef_run(
        "muon",
        MUON_GRID,
        (*_CD_QUICK, ("lrs", (0.02,)), ("tune_seeds", None)),
        "LM7 with Muon (on the hidden matrices; AdamW on the rest)",
    ),
}

# ----------------------------------------------------------- DiLoCo on the GPT

#: DiLoCo on the GPT (issue 52), stage 1 of 2, declared before any of it ran.
#:
#: **Regime.** ``gpt-cpu`` (414,803 parameters) on the embedded Shakespeare, AdamW inner
#: optimizer, batch 16 × 64 characters, M = 4 workers of 2,000 inner steps each: 8.2 M characters,
#: ≈ 20 per parameter (1.9 epochs); every run of a seed starts from the same 1,000 synchronous
#: AdamW steps of one worker at 0.003 (1.0 M characters, 12 % of the budget: DiLoCo's main runs
#: start from a synchronously pretrained model, 2311.08105). The papers: 60 M parameters and up,
#: H = 100–500.
#:
#: **Stage 1: the inner rate**, the paper's protocol tuned for this model: synchronous DiLoCo at
#: H = 50 for each inner AdamW peak of :data:`INNER_GRID` (×2 apart, centred on the ladder's
#: AdamW selection), outer Nesterov at 0.5 / 0.7 / 1.0, 2 tuning seeds; data parallelism (batch
#: M·B, its rate the inner rate × 0.5–4) beside it, 5 seeds (the reference of stage 2). The
#: inner rate of stage 2 is stage 1's best on validation; stage 2 (M = 4, H = 50 and 250; dp,
#: diloco, async-nesterov, async-delayed; Delayed Nesterov against tuned naive asynchronous
#: Nesterov as the new primary, D1–D7 re-declared on its rows) is declared when it is known.
#:
#: **Cost, planned** from a pilot (M = 4, 200 steps, alone on a core: 75 CPU-s for synchronous
#: DiLoCo, 120 for async-delayed, compile and 10 evaluations of the whole test split included):
#: a 2,000-step run ≈ 12.5 CPU-minutes (DiLoCo, dp), ≈ 20 (asynchronous methods); stage 1
#: ≈ 3 × 6 × 12.5 min + dp 4 × 2 + 3 runs ≈ 6 CPU-hours; stage 2 ≈ 22 (M = 4, both H).
#: the inner AdamW peak rates of stage 1
INNER_GRID = (0.0015, 0.003, 0.006)
_LS = local_sgd.Config
_DG: dict[str, Any] = {
    "dataset": "shakespeare",
    "model": ("gpt-cpu",),
    "optimizer": "adamw",
    "batch_size": 16,
    "steps": 2000,
    "workers": (4,),
    "inner_steps": (50,),
    "warm_start": 1000,
    "warm_lr": 0.003,  # one start for every inner rate
    "extend_edges": 2,
}
#: smoke versions: gpt-tiny, 40 steps from a 10-step start, H = 4, two workers, one rate
_DG_QUICK: tuple[tuple[str, Any], ...] = (
    *LM_QUICK,
    ("workers", (2,)),
    ("inner_steps", (4,)),
    ("warm_start", 10),
    ("extend_edges", 0),
    ("tune_seeds", None),
)
DILOCO_GPT_RUNS: dict[str, Run] = {
    **{
        f"diloco-gpt-inner-{lr:g}": Run(
            local_sgd,
            _LS(
                **_DG, inner_lr=lr, methods=("diloco",), lrs=(0.5, 0.7, 1.0), seeds=2, tune_seeds=2
            ),
            (*_DG_QUICK, ("lrs", (0.7,))),
            what=f"DiLoCo on the GPT, stage 1: synchronous DiLoCo, M = 4, H = 50, inner AdamW "
            f"at {lr:g} from a 1,000-step synchronous start",
        )
        for lr in INNER_GRID
    },
    "diloco-gpt-dp": Run(
        local_sgd,
        _LS(
            **_DG,
            inner_lr=0.003,
            methods=("dp",),
            dp_scales=(0.5, 1.0, 2.0, 4.0),
            seeds=5,
            tune_seeds=2,
        ),
        (*_DG_QUICK, ("dp_scales", (1.0,))),
        what="DiLoCo on the GPT: data parallelism (batch M·B, AdamW at 0.0015-0.012) from the "
        "same start, the reference",
    ),
}

_INFLIGHT = ("constant", "inflight")

#: the asynchronous-RL family (issue 55): every correction at every τ, then in-flight updates;
_RL_ARMS = tuple(a for a in stale_rl.ARMS if "m2po-clip" not in a)  # the arms it was declared with
RL_RUNS: dict[str, Run] = {
    "rl-stale": Run(  # its smoke version keeps the default quick arms, as when declared
        stale_rl,
        stale_rl.Config(arms=_RL_ARMS),
        (("arms", None),),
        "RL1-RL4: every correction, τ 1-16",
    ),
    "rl-inflight": Run(
        stale_rl,
        stale_rl.Config(arms=("reinforce", "ppo-clip"), taus=(0, 4, 8, 16), delays=_INFLIGHT),
        what="RL5: in-flight weight updates against off-by-τ, the same tokens per update",
    ),
    # declared after rl-stale began (M2PO's authors' rule landed later), before any of its rows
    "rl-m2po": Run(
        stale_rl,
        stale_rl.Config(arms=("m2po-clip", "m2po-clip-dual")),
        what="RL3's secondaries: M2PO's adaptive clip as its authors run it, and with PPO's "
        "dual clip, τ 1-16",
    ),
}
