"""Delay cliff: the largest stable learning rate shrinks as a constant gradient delay grows.

Question (Jain et al., ICLR 2018 workshop): with SGD + momentum 0.9 and every
gradient exactly ``d`` updates stale (``w_{t+1} = w_t − η·v_t``, ``v_t = μ v_{t−1} + g(w_{t−d})``),
which learning rates still train? Their LeNet-5/MNIST result (batch 128): at η = 0.01, d = 0
reaches ≈ 99.2 % but d ≥ 4 diverges (≈ 11 %); at η = 0.001 all d ≤ 8 reach ≈ 98.3–98.5 %; the
largest stable learning rate shrinks as the delay grows. We look for that shape on the embedded
dataset, and measure how far each mitigation (staleness-aware lr, DC-ASGD-a, Gap-Aware) moves
the cliff.

Protocol (the experiments' common one, ``experiments/common.py``): standardised inputs
(training-set statistics) and a validation split carved from the training set; every decision
is taken on **validation** accuracy, the tables report **test** accuracy. A learning rate η is
**stable at delay d** for a method when *no seed diverged* at (d, η) and the *mean final
validation accuracy* over the seeds at (d, η) is at least the method's best d = 0 mean
validation accuracy (over the grid) minus ``--tolerance`` (5 points): it trains about as well as
the method can without delay. (A run that collapses towards chance without a NaN fails the
second test: a single such seed pulls the mean down by ≈ 17 points.) The *largest stable
learning rate* per (method, d) is the cliff; when it is the top of the grid the cliff lies
beyond the grid and the cell says "≥". The 5-point tolerance sits between the seed noise of a
converged run (≈ 1 point) and a collapse (tens of points); the validation grid in the table
lets a reader apply another. At d = 0 every method is plain SGD (each transform is the identity
at τ = 0), so the d = 0 references agree up to float rounding. Besides the cliff: the rate
*selected on validation* per (method, d) with its test accuracy (mean ± 95 % CI over the seeds
that trained, diverged fraction in the cell) and the updates until the validation accuracy
first reaches ``--target``; and, for the published claim, ASGD's test accuracy at the paper's
rates (0.01 and 0.001) for every d (those rates are fixed by the paper, nothing is chosen).
A rate selected at an edge of the grid extends that (method, d)'s grid for the selection only
(``--extend-edges``, :func:`experiments.grids.extend_grid`; the table says what was added):
the cliff, its reference and the heat maps read the configured grid.

Setting: constant delay ``d ∈ {0, 1, 2, 4, 8, 16}`` (``jaxstale.delays.constant``; the first
``d`` gradients are taken at ``w_0``) × learning rates {0.001, 0.003, 0.01, 0.03, 0.1, 0.3} ×
methods (asgd, sa-asgd, dc-asgd-a, gap-aware) × 5 seeds; the digits MLP, batch 32, momentum 0.9,
1,500 updates (37 epochs of the 1,295 training examples; synchronous SGD, which is d = 0 here,
has converged by then: ``sync_baseline`` finds its validation curve within 1 point of its
plateau from step ~200 and flat over the last third), evaluated every 50 updates. A seed
fixes the initial weights and the data order, so every method, delay and rate of a seed sees the
same data stream. Any method registered with :func:`jaxstale.asyncdp.register_method` can be
passed with ``--methods``.

Speed: one executable per method serves every (d, lr, seed) lane (traced learning rate, a
snapshot capacity of ``max(d) + 1``); lanes run vmapped (MLP) or one after another (conv models
on the CPU). Default: 4 × 180 runs of 1,500 updates, about 10 minutes of CPU time (user +
sys) on the 2-core box (one method's 150 lanes at five rates measured 114–133 s); the wall
time on 2 idle cores is at most that (on the shared, loaded box it was about 3.5x the CPU
time). ``--quick`` (d ∈ {0, 2,
8}, two rates, two seeds, 300 updates) is a smoke run: 24 s of CPU, a minute of wall time on
the loaded box, marked as such in its table.

**Language models** (issue 23): ``--dataset shakespeare`` trains a GPT (default ``gpt-cpu``;
``--quick``: ``gpt-tiny``, 60 updates) under the same constant delays; every number is then a
next-token loss in nats: the reference is the lowest d = 0 validation loss, "stable" means at
most ``--tolerance`` nats above it (default 0.1: above a converged GPT's seed noise of about
0.01–0.03 nats, far below a collapse towards ``log V``), a seed whose loss is not below
``log V`` counts as diverged, the heat maps show the loss (brighter is lower) and the check at
the paper's rates (MNIST's) is left out. Tables and figures: :mod:`experiments.cliff_tables`.

Outputs (run folder): summary.json rows (method, delay, lr, seed, final_val_accuracy,
final_test_accuracy, diverged, diverged_step, updates_to_target, max_staleness, ...), table.md
(the largest stable rate per (method, d) with its test accuracy; the rate selected on validation
per (method, d); updates to the target; the claim check; the validation grid, stable cells in
bold), plot.png (heat maps of the mean validation accuracy: delay × learning rate, one panel
per method, stable cells framed, "x" where a seed diverged), stable_lr.png (the largest stable
rate against d, one line per method).

Run: ``python -m experiments.delay_cliff [--quick] [--out DIR] [--methods a,b] [--lrs ...]
[--delays ...] [--tolerance T]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from jaxstale import asyncdp, data, models, tasks

from .cliff_tables import make_figures, make_table
from .common import (
    chance,
    group_clock,
    lanes_for,
    load_checked,
    make_delay,
    opened,
    run_row,
    seed_mode,
    splits,
    task_of,
    text_levels,
    with_levels,
)
from .config import (
    Base,
    ConfigError,
    check_memory,
    check_model,
    cli,
    opt,
    seed_mode_opt,
)
from .grids import EXTEND_HELP, edge_limit, extend_grid
from .precision import gpt_kw

EXPERIMENT = "delay_cliff"
DEFAULT_METHODS = ("asgd", "sa-asgd", "dc-asgd-a", "gap-aware")
DELAYS = [0, 1, 2, 4, 8, 16]
LRS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3]
KEY = ("method", "delay", "lr", "seed")
#: a text's default tolerance of "stable" (nats of validation loss): above the seed noise of a
#: converged GPT on shakespeare (≈ 0.01–0.03 nats), far below a collapse (≥ 1 nat to log V)
TEXT_TOLERANCE = 0.1


# ----------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class Config(Base):
    """delay_cliff's configuration (``None``: the default of :meth:`resolved`)."""

    model: tuple[str, ...] | None = opt(
        None, "model name (one; default mlp)", choices=models.model_names, kind="model"
    )
    steps: int | None = opt(None, "updates per run (default 1500; --quick 300)", low=1)
    lrs: tuple[float, ...] | None = opt(
        None,
        "learning-rate grid (default 0.001,0.003,0.01,0.03,0.1,0.3; --quick 0.003,0.03)",
        low=0,
        low_open=True,
    )
    methods: tuple[str, ...] | None = opt(
        None,
        f"asynchronous methods (default {','.join(DEFAULT_METHODS)})",
        choices=asyncdp.method_names,
        kind="method",
    )
    delays: tuple[int, ...] | None = opt(
        None,
        "constant delays d, including 0, the reference of 'stable' (default 0,1,2,4,8,16; "
        "--quick 0,2,8)",
        low=0,
    )
    extend_edges: int | None = opt(
        None,
        EXTEND_HELP + "; the rate selected per (method, d) only: the cliff reads the grid",
        low=0,
    )
    momentum: float = opt(0.9, "SGD momentum", low=0, high=1, high_open=True)
    tolerance: float | None = opt(
        None,
        "stable at d: no seed diverged and mean validation accuracy >= the method's best at "
        "d = 0 minus this (default 0.05 = 5 points); a text: mean validation loss <= the best "
        f"at d = 0 plus this (default {TEXT_TOLERANCE:g} nats)",
        low=0,
    )
    seed_mode: str = seed_mode_opt(
        "seeds and rates as vmapped lanes of one run, or one after the other (auto: by model "
        "and backend)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.delays is not None and 0 not in self.delays:
            raise ConfigError(
                "delays", f"must include 0 (the reference of 'stable'), got {list(self.delays)}"
            )
        if self.tolerance is not None and self.tolerance > 1 and not self.text:
            raise ConfigError(
                "tolerance", f"an accuracy tolerance must be in [0, 1], got {self.tolerance}"
            )
        if self.model is not None and len(self.model) > 1:
            raise ConfigError("model", f"delay_cliff takes one model, got {','.join(self.model)}")
        for m in self.methods or ():
            if asyncdp.method_mode(m) == "sync":
                raise ConfigError(
                    "methods",
                    f"{m} is synchronous (its workers step in lockstep): it has no delay to "
                    "vary here; choose asynchronous methods",
                )

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder); a text's
        defaults: gpt-cpu (``--quick``: gpt-tiny, 60 updates) and a tolerance in nats."""
        quick, lm = self.quick, self.text
        steps = self.steps or ((60 if lm else 300) if quick else 1500)
        model = ("gpt-tiny" if quick else "gpt-cpu") if lm else "mlp"
        tolerance = self.tolerance
        if tolerance is None:
            tolerance = TEXT_TOLERANCE if lm else 0.05
        return {
            "quick": quick,
            "dataset": self.dataset,
            "standardize": self.standardize,
            "model": (self.model or (model,))[0],
            "model_kw": {},
            "methods": list(self.methods or DEFAULT_METHODS),
            "delays": list(self.delays or ([0, 2, 8] if quick else DELAYS)),
            "lrs": list(self.lrs or ([0.003, 0.03] if quick else LRS)),
            "seeds": self.seeds or (2 if quick else 5),
            "batch_size": self.batch_size,
            "steps": steps,
            "eval_every": min(50, max(1, steps // 5)),
            "momentum": self.momentum,
            "tolerance": tolerance,
            "target": self.resolved_target,
            "seed_mode": self.seed_mode,
            "extend_edges": edge_limit(self),
        }


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"method": m, "delay": d, "lr": lr, "seed": s}
        for m in cfg["methods"]
        for d in cfg["delays"]
        for lr in cfg["lrs"]
        for s in range(cfg["seeds"])
    ]


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    """All pending cells of one (method, delay): one asyncdp.run, one lane per (lr, seed).

    Grouped by delay too so that a group (30 runs at the claims' 9,000 updates, a few CPU
    minutes) finishes well inside a session: a group of every delay did not, and an unfinished
    group saves nothing. The numbers do not depend on the grouping (tests/experiments)."""
    method = keys[0]["method"]
    b, steps = cfg["batch_size"], cfg["steps"]
    spe = len(ds.x_train) // b
    clock = group_clock()
    scheds = [make_delay("constant", k["delay"] + 1, steps, batch_size=b, seed=0) for k in keys]
    apply, ps, ss, xs, ys = lanes_for(
        ds,
        cfg["model"],
        {**cfg["model_kw"], **gpt_kw(cfg)},
        b,
        [(k["seed"], s) for k, s in zip(keys, scheds, strict=True)],
    )
    res = asyncdp.run(
        apply,
        method,
        ps,
        ss,
        scheds,
        xs,
        ys,
        learning_rate=[k["lr"] for k in keys],
        momentum=cfg["momentum"],
        eval_data=splits(ds),
        eval_every=cfg["eval_every"],
        vmap=seed_mode(cfg["model"], cfg["seed_mode"]),
        metric=task_of(ds).metric,
    )
    wall, cpu = clock(len(keys))
    extra = {
        "momentum": cfg["momentum"],
        "model": cfg["model"],
        "dataset": cfg["dataset"],
        "batch_size": b,
        "epochs": steps / spe,
        "wall_s": wall,
        "cpu_s": round(cpu, 3),
    }
    return [run_row(r, spe, extra, cfg["target"], task_of(ds)) for r in res]


# ----------------------------------------------------------------------------- main


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked against each other."""
    cfg = config.resolved()
    ds = load_checked(cfg, config, tasks.KINDS)
    params = check_model("model", cfg["model"], ds, cfg["model_kw"])
    lanes = cfg["seeds"] * len(cfg["lrs"])
    check_memory(
        {
            # the snapshot ring of max(d) + 1 versions and the server's copies, per lane
            "delays": 4.0 * params * (max(cfg["delays"]) + 5) * lanes,
            "steps": 8.0 * cfg["steps"] * (cfg["batch_size"] + 2) * lanes,
        },
    )
    return cfg, ds


def run(config: Config) -> list[dict[str, Any]]:
    """Runs every (method, delay, lr, seed) cell not already in the run folder; returns the
    rows.

    Raises:
      ConfigError: a value that does not fit the data or the machine (names the field).
      experiments.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, ds, folder = opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=True)
    compute = lambda ks: _run_group(cfg, ds, ks)
    rows = folder.run_grouped(_cells(cfg), compute, vary=("lr", "seed"), desc=EXPERIMENT)
    kw = {"key": KEY, "by": ("method", "delay"), "grid": cfg["lrs"], "limit": cfg["extend_edges"]}
    return extend_grid(folder, rows, compute, chance=chance(ds), task=task_of(ds), **kw)


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Tables and figures into the run folder; returns ``{"rows", "paths", "table", "stable",
    "selected"}``."""
    cfg, ds, folder = opened(EXPERIMENT, config, sys.modules[__name__], _prepare)
    chance_acc, task = chance(ds), task_of(ds)
    table, stable, selected = make_table(rows, cfg, chance_acc, task)
    table = with_levels(table, text_levels(cfg, config))
    figs = make_figures(rows, cfg, stable, chance_acc, task)
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    return {"rows": rows, "paths": paths, "table": table, "stable": stable, "selected": selected}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
