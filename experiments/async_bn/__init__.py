"""Async-BN vs ordinary batch norm: whose running statistics does the server evaluate with?

Question (LC-ASGD, Li et al. ICPP 2020, its Async-BN): in asynchronous data parallelism each
worker pulls the server's batch-norm running statistics with its weights, advances its copy with
its mini-batch and pushes it back with the gradient. With **ordinary BN** the server keeps the
copy that arrives (last writer wins), ``E ← (1 − d)·E_pulled + d·μ_batch``, an EMA along a
chain of stale copies that lags the weights by about ``M`` times the window ``1/d``. **Async-BN**
(``lc-asgd-async-bn``) instead merges each worker's batch statistics into the server's own EMA,
``E ← (1 − d)·E_server + d·μ_batch``. The paper's claim: Async-BN beats ordinary BN, the more so
as ``M`` grows. Does it, beyond seed noise, with every choice made on validation data?

One training run, every policy. In training mode a forward pass normalises with its batch's own
statistics, so gradients never read the running statistics: every policy trains **the same
weights** (``lc-asgd`` and ``lc-asgd-async-bn`` agree bit for bit, which the tests check). Each
run therefore carries a *bank* of statistics through the emulator (its model state): the
model's own copy (momentum ``m = 0.9``), from whose update the worker's batch statistics are
recovered (:func:`jaxstale.asyncdp.bn.batch_stats_from_update`), and one copy per policy and
rate ``d`` in ``--decays``, advanced as above (:func:`jaxstale.asyncdp.bn.merge_batch_stats`).
A worker pulls the whole bank with its weights, so each ordinary copy is exactly what a model
with batch-norm momentum ``1 − d`` would return (``d = 1 − m = 0.1``: the ``lc-asgd`` run), and
each Async-BN copy exactly the ``lc-asgd-async-bn`` run at decay ``d`` (tested against both
registered methods). *Recomputed* evaluates the final weights with the statistics of the whole
training set at those weights (precise BN, :func:`jaxstale.asyncdp.recompute_batch_stats`):
the reference every running-statistics policy approximates.

Protocol (``experiments/common.py``): standardised digits with a validation split; ≥ 5 seeds (a
seed fixes the initial weights, the data order and the worker timing, so the policies and rates
are paired by seed); every choice on validation, the tables report **test** error:

* **learning rate, per M, policy-neutral**: the rate of ``--lrs`` with the best mean final
  validation accuracy *with recomputed statistics* (a diverged seed at chance). The rate decides
  the weights, which all policies share; choosing it with one policy's running statistics would
  favour that policy, while the recomputed statistics depend on the weights alone. All
  policies are then compared on the same weights;
* **rate d, per M and policy**: at the selected learning rate, each policy's ``d`` in
  ``--decays`` with the best mean final validation accuracy with that policy's statistics.
  Ordinary BN is tuned too (its ``d`` is the batch-norm momentum ``1 − m``, the usual knob), so
  a gain of Async-BN is the server-side merge, not a better-tuned EMA. The untuned defaults
  (ordinary BN with the model's ``m = 0.9``, Async-BN at ``d = 1 − m = 0.1``, the builder's
  default) are reported beside them;
* **statistics**: cells are mean ± 95 % CI over the seeds that trained, diverged fraction in
  the cell (:func:`experiments.runs.format_ci`); the paired ordinary − Async-BN test-error
  difference per seed, with its 95 % CI (:func:`experiments.runs.paired_difference`), is marked
  *beyond noise* when the interval excludes 0; time to accuracy = updates until a policy's
  validation accuracy first reaches ``--target`` (evaluated every ``--eval-every`` updates);
* a table of the default-vs-default paired difference at *every* learning rate of the grid
  (no selection) shows under which rates a difference appears.

LC-ASGD's λ (``--lam``, default 0.1) and SGD's momentum (``--momentum``, default 0) are fixed,
not tuned: they shape the weights both policies share, not the statistics.

Setting: the exact emulator (:class:`jaxstale.asyncdp.AsyncEmulator`, one compiled step for the
whole sweep; conv lanes run one after another on the CPU), ResNet-20 (batch norm, option-A
shortcuts) at ``--width 8`` (stages of 8/16/32 channels: 3.6x cheaper per update than the
paper's 16 on the CPU, the same depth and batch-norm layers) on the embedded digits, batch 32,
gamma-timed workers, M ∈ {1, 4, 8, 16}, lrs {0.03, 0.1}, decays {0.02, 0.1, 0.3}, 600 updates
(≈ 15 epochs of the 1,295 training images). Budget check: the 1-worker validation curve is flat
from ≈ 240 updates (6 epochs) at both rates; at M = 16 and lr 0.03 it is flat from ≈ 480.

Trade-off (measured on the shared 2-core box: ≈ 13 ms CPU per update at width 8 vs ≈ 47 ms at
width 16, ≈ 10 s CPU per compile): 5 seeds × 4 M × 2 rates × 600 updates = 24,000 updates. The
paper's width 16 would allow only ≈ 6 epochs or 2 seeds in the same time; a third rate (0.3,
best for M = 1 on some seeds, diverging or stuck for M ≥ 8) or a fifth M would cost 50 % / 25 %
more. ``--quick`` (smoke run: M ∈ {1, 8}, 2 seeds, 80 updates, d = 0.1 only) takes about a
minute.

Measured: the default is 24,000 updates, ≈ 5 minutes of CPU at 13 ms each plus one compile
per M (≈ 10 s each); the wall time on 2 idle cores is about that.

Outputs (run folder): summary.json (one row per run: workers, lr, seed, diverged, staleness,
params_checksum, ``policies``: per policy and d the final validation and test accuracy and the
updates to the target), table.md (test error at the selected settings; paired differences;
paired differences per learning rate; time to the target; the validation grids of both
selections), plot.png (test error vs M per policy, 95 % CIs), curves.png (validation accuracy
per policy at M = 1, the convergence check, and at the largest M), metrics.jsonl (the curves).

Run: ``python -m experiments.async_bn [--quick] [--out DIR] [--workers 1,4,8,16]
[--lrs 0.03,0.1] [--decays 0.02,0.3] [--seeds 5] [--steps 600] [--width 8]``.

Modules: this one (configuration, :func:`run`, :func:`report`, :func:`main`);
:mod:`~experiments.async_bn.bank` (the statistics bank, its emulator and executor, the
evaluation of its copies); :mod:`~experiments.async_bn.train` (one run per cell, on
:func:`jaxstale.loop.run` with an evaluation hook); :mod:`~experiments.async_bn.report` (the
selection on validation, the tables and figures).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxstale import data, delays, models
from jaxstale.asyncdp.methods import LC_BN_MOMENTUM as BN_MOMENTUM
from jaxstale.asyncdp.methods import LC_LAMBDA

from ..common import chance, load_checked, opened
from ..config import Base, ConfigError, check_memory, check_model, cli, opt, seed_mode_opt
from .bank import (
    ASYNC,
    DEFAULT_DECAY,
    ORDINARY,
    POLICIES,
    RECOMPUTED,
    bank_apply,
    bank_emulator,
    bank_executor,
    bank_merge,
    init_bank,
)
from .report import (
    KEY,
    ROW_NAMES,
    make_figures,
    make_table,
    policy_rows,
    select,
    selected_rows,
)
from .report import _paired as _paired  # a private name the tests read
from .train import _run_group

__all__ = [
    "ASYNC",
    "BN_MOMENTUM",
    "DECAYS",
    "DEFAULT_DECAY",
    "EXPERIMENT",
    "KEY",
    "LRS",
    "ORDINARY",
    "POLICIES",
    "RECOMPUTED",
    "ROW_NAMES",
    "UPDATES",
    "WIDTH",
    "WORKERS",
    "Config",
    "bank_apply",
    "bank_emulator",
    "bank_executor",
    "bank_merge",
    "init_bank",
    "main",
    "make_figures",
    "make_table",
    "policy_rows",
    "report",
    "run",
    "select",
    "selected_rows",
]

EXPERIMENT = "async_bn"
DECAYS = (0.02, 0.1, 0.3)
LRS = (0.03, 0.1)
WORKERS = (1, 4, 8, 16)
UPDATES = 600
WIDTH = 8


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config(Base):
    """async_bn's configuration (``None``: the default of :meth:`resolved`)."""

    model: tuple[str, ...] | None = opt(
        None,
        "model name (one, with batch norm; default resnet20)",
        choices=models.model_names,
        kind="model",
    )
    steps: int | None = opt(
        None, f"updates per run, the budget (default {UPDATES}; --quick 80)", low=1
    )
    lrs: tuple[float, ...] | None = opt(
        None,
        "learning-rate grid, selected on validation (default 0.03,0.1)",
        low=0,
        low_open=True,
    )
    workers: tuple[int, ...] | None = opt(
        None, "worker counts M (default 1,4,8,16; --quick 1,8)", low=1
    )
    decays: tuple[float, ...] | None = opt(
        None,
        f"the rates d of both policies, selected on validation; d = 1 - m = {DEFAULT_DECAY:g} is "
        "always included (default 0.02,0.1,0.3; --quick none but that one)",
        low=0,
        high=1,
        low_open=True,
    )
    lam: float = opt(LC_LAMBDA, "LC-ASGD's λ (fixed)")
    momentum: float = opt(0.0, "SGD momentum (fixed)", low=0, high=1, high_open=True)
    width: int | None = opt(
        None, f"ResNet-20's first-stage channels (default {WIDTH}; the paper: 16)", low=1
    )
    eval_every: int | None = opt(
        None, "updates between validation evaluations (default 40, one epoch)", low=1
    )
    delay: str = opt(
        "gamma",
        "delay model: gamma (gamma-timed workers), round_robin, constant",
        choices=delays.DELAY_MODELS,
        kind="delay model",
    )
    seed_mode: str = seed_mode_opt(
        "seeds as vmapped lanes of one run, or one after the other (auto: by model and backend)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model is not None and len(self.model) > 1:
            raise ConfigError("model", f"async_bn takes one model, got {','.join(self.model)}")
        if self.width is not None and (self.model or ("resnet20",))[0] != "resnet20":
            raise ConfigError("width", "applies to resnet20 only")

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder)."""
        quick = self.quick
        decays = list(self.decays) if self.decays is not None else ([] if quick else list(DECAYS))
        model = (self.model or ("resnet20",))[0]
        width = self.width if self.width is not None else (WIDTH if model == "resnet20" else None)
        return {
            "quick": quick,
            "dataset": self.dataset,
            "standardize": self.standardize,
            "model": model,
            "model_kw": {} if width is None else {"width": width},
            "workers": list(self.workers or ([1, 8] if quick else WORKERS)),
            "lrs": list(self.lrs or LRS),
            "decays": list(dict.fromkeys([DEFAULT_DECAY, *decays])),  # the default first
            "lam": self.lam,
            "momentum": self.momentum,
            "seeds": self.seeds or (2 if quick else 5),
            "batch_size": self.batch_size,
            "updates": self.steps or (80 if quick else UPDATES),
            "eval_every": self.eval_every or 40,
            "target": self.resolved_target,
            "delay": self.delay,
            "seed_mode": self.seed_mode,
        }


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked against each other: the model fits the
    data and has batch-norm statistics; the sweep fits in memory."""
    cfg = config.resolved()
    ds = load_checked(cfg, config)
    params = check_model("model", cfg["model"], ds, cfg["model_kw"])
    lanes = cfg["seeds"] * len(cfg["lrs"]) * len(cfg["decays"])
    check_memory(
        {
            "workers": 4.0 * params * (2 * max(cfg["workers"]) + 4) * lanes,
            "steps": 8.0 * cfg["updates"] * (cfg["batch_size"] + 2) * lanes,
        },
    )
    shape = tuple(ds.x_train.shape[1:])
    m = models.create(
        cfg["model"], input_shape=shape, num_classes=ds.num_classes, **cfg["model_kw"]
    )
    if not any(np.size(leaf) for leaf in jax.tree.leaves(models.functional(m).state)):
        raise ConfigError("model", f"{cfg['model']!r} has no batch-norm statistics to compare")
    return cfg, ds


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"workers": m, "lr": lr, "seed": seed}
        for m in cfg["workers"]
        for lr in cfg["lrs"]
        for seed in range(cfg["seeds"])
    ]


# ----------------------------------------------------------------------------- main


def run(config: Config) -> list[dict[str, Any]]:
    """Trains every (M, lr, seed) cell not already in the run folder, evaluating every
    batch-norm policy and decay on the same weights; returns the rows.

    Raises:
      ConfigError: a value that does not fit the data or the machine (names the field).
      experiments.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, ds, folder = opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=True)
    return folder.run_grouped(
        _cells(cfg), lambda ks: _run_group(cfg, ds, ks), vary=("seed",), desc=EXPERIMENT
    )


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Tables and figures into the run folder; returns ``{"rows", "paths", "table",
    "selected"}``."""
    cfg, ds, folder = opened(EXPERIMENT, config, sys.modules[__name__], _prepare)
    table, sel = make_table(rows, cfg, chance(ds))
    figs = make_figures(rows, sel, lambda r: folder.metrics({k: r[k] for k in KEY}), cfg)
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    return {"rows": rows, "paths": paths, "table": table, "selected": sel}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])
