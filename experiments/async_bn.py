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
  the cell (:func:`jaxstale.runs.format_ci`); the paired ordinary − Async-BN test-error
  difference per seed, with its 95 % CI (:func:`jaxstale.runs.paired_difference`), is marked
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
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstale import data, delays, loop, models, runs
from jaxstale.asyncdp import emulator as _emulator
from jaxstale.asyncdp.bn import batch_stats_from_update, merge_batch_stats, recompute_batch_stats
from jaxstale.asyncdp.methods import LC_BN_MOMENTUM as BN_MOMENTUM
from jaxstale.asyncdp.methods import LC_LAMBDA, MethodSpec, build_lc_asgd

from .common import (
    chance,
    lanes_for,
    load_checked,
    make_delay,
    opened,
    seed_mode,
    title,
)
from .config import (
    Base,
    ConfigError,
    check_memory,
    check_model,
    from_argv,
    opt,
    usage_errors,
)

EXPERIMENT = "async_bn"
KEY = ("workers", "lr", "seed")  # the fields of a cell key: one training run
ORDINARY, ASYNC, RECOMPUTED = "ordinary", "async-bn", "recomputed"
POLICIES = (ORDINARY, ASYNC)  # the running-statistics policies (each at every decay)
DEFAULT_DECAY = round(1.0 - BN_MOMENTUM, 6)  # the model's own rate: ordinary BN's, Async-BN's
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
    seeds: int | None = opt(None, "number of seeds (default 5; --quick 2)", low=1)
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
    batch_size: int = opt(32, "mini-batch size", low=1)
    eval_every: int | None = opt(
        None, "updates between validation evaluations (default 40, one epoch)", low=1
    )
    target: float = opt(
        0.95,
        "validation accuracy whose first crossing is the time to accuracy",
        low=0,
        high=1,
        low_open=True,
    )
    delay: str = opt(
        "gamma",
        "delay model: gamma (gamma-timed workers), round_robin, constant",
        choices=delays.DELAY_MODELS,
        kind="delay model",
    )
    seed_mode: str = opt(
        "auto",
        "seeds as vmapped lanes of one run, or one after the other (auto: by model and backend)",
        choices=("auto", "vmap", "sequential"),
        kind="seed mode",
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
            "target": self.target,
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


def _label(policy: str, decay: float | None) -> str:
    return policy if decay is None else f"{policy} d={decay:g}"


# ----------------------------------------------------------------------------- the statistics bank


def bank_apply(apply: Callable[..., Any]) -> Callable[..., Any]:
    """``apply`` on a bank ``{"model": s, "ordinary": (s, ...), "async-bn": (s, ...)}``: the
    forward pass reads and advances the model's copy only; the policies' copies are left to
    the server's merge (:func:`bank_merge`). One wrapper per ``apply`` (one compile)."""
    if apply not in _WRAPPED:

        def wrapped(params: Any, bank: Any, x: Any, train: bool) -> tuple[Any, Any]:
            logits, new = apply(params, bank["model"], x, train)
            return logits, {**bank, "model": new}

        _WRAPPED[apply] = wrapped
    return _WRAPPED[apply]


_WRAPPED: dict[Callable[..., Any], Callable[..., Any]] = {}


def init_bank(model_state: Any, num_decays: int) -> dict[str, Any]:
    """The initial bank: every copy is the model's initial statistics."""
    return {
        "model": model_state,
        ORDINARY: (model_state,) * num_decays,
        ASYNC: (model_state,) * num_decays,
    }


def bank_merge(decays: Sequence[float], momentum: float = BN_MOMENTUM) -> Callable[..., Any]:
    """The server's ``merge_model_state`` for a bank: with ``b`` the worker's batch statistics
    (recovered from its update of the model's copy), ordinary copy ``k`` becomes
    ``(1 − d_k)·pulled + d_k·b`` (last writer wins) and Async-BN copy ``k``
    ``(1 − d_k)·server + d_k·b``."""
    ds = [float(d) for d in decays]

    def merge(server: Any, pulled: Any, returned: Any) -> Any:
        b = batch_stats_from_update(pulled["model"], returned["model"], momentum)
        return {
            "model": returned["model"],
            ORDINARY: tuple(
                merge_batch_stats(e, b, d) for e, d in zip(pulled[ORDINARY], ds, strict=True)
            ),
            ASYNC: tuple(
                merge_batch_stats(e, b, d) for e, d in zip(server[ASYNC], ds, strict=True)
            ),
        }

    return merge


_EMULATORS: dict[tuple[Any, ...], _emulator.AsyncEmulator] = {}


def bank_emulator(apply: Callable[..., Any], cfg: dict[str, Any], vmap: bool) -> Any:
    """One compiled emulator for every run of the sweep (lr, M and seed are traced lanes)."""
    key = (apply, cfg["lam"], cfg["momentum"], tuple(cfg["decays"]), max(cfg["workers"]), vmap)
    if key not in _EMULATORS:
        lam, merge = cfg["lam"], bank_merge(cfg["decays"])
        build = lambda hp: MethodSpec(build_lc_asgd(hp, lam=lam), merge_model_state=merge)
        _EMULATORS[key] = _emulator.AsyncEmulator(
            bank_apply(apply), build, max(cfg["workers"]), momentum=cfg["momentum"], vmap=vmap
        )
    return _EMULATORS[key]


def _timing(s: delays.DelaySchedule) -> dict[str, np.ndarray]:
    """LC-ASGD's per-update arguments of a timed schedule (as :func:`jaxstale.asyncdp.make`)."""
    if s.start_time is None or s.finish_time is None:
        return {}
    return {
        "t_comm": s.start_time.astype(np.float32),
        "t_comp": (s.finish_time - s.start_time).astype(np.float32),
    }


def bank_executor(
    emu: Any,
    scheds: Sequence[delays.DelaySchedule],
    xs: Sequence[Any],
    ys: Sequence[Any],
    *,
    learning_rate: Sequence[float],
) -> loop.Executor:
    """The executor of runs (lanes of ``emu``) from their schedules, streams and rates, as
    :func:`jaxstale.asyncdp.make` builds it for asynchronous methods, on a shared emulator."""
    extras = [_timing(s) for s in scheds]
    return _emulator.executor(
        emu,
        [s.batch for s in scheds],
        np.stack([s.worker for s in scheds]),
        np.stack([s.staleness for s in scheds]),
        {k: np.stack([e[k] for e in extras]) for k in extras[0]},
        list(xs),
        list(ys),
        learning_rate=list(learning_rate),
        num_workers=[s.num_workers for s in scheds],
        batches_per_update=1,
    )


_JIT: dict[tuple[Any, ...], Callable[..., Any]] = {}


def _bank_correct(apply: Callable[..., Any]) -> Callable[..., Any]:
    """Jitted: the number of correct predictions of every policy copy of a bank (eval mode)."""
    if ("count", apply) not in _JIT:

        def count(params: Any, bank: Any, x: Any, y: Any) -> jax.Array:
            copies = [*bank[ORDINARY], *bank[ASYNC]]
            hits = [jnp.argmax(apply(params, s, x, False)[0], -1) == y for s in copies]
            return jnp.stack([jnp.sum(h, dtype=jnp.int32) for h in hits])

        _JIT[("count", apply)] = jax.jit(count)
    return _JIT[("count", apply)]


def _recompute(apply: Callable[..., Any]) -> Callable[..., Any]:
    if ("recompute", apply) not in _JIT:
        fn = lambda p, s, x: recompute_batch_stats(apply, p, s, x, momentum=BN_MOMENTUM)
        _JIT[("recompute", apply)] = jax.jit(fn)
    return _JIT[("recompute", apply)]


def _policy_labels(cfg: dict[str, Any]) -> list[tuple[str, float]]:
    """The bank's policy copies in evaluation order."""
    return [(p, d) for p in POLICIES for d in cfg["decays"]]


def _evaluate(
    apply: Callable[..., Any], cfg: dict[str, Any], params: Any, bank: Any, x: Any, y: Any
) -> dict[tuple[str, float | None], float]:
    got = np.asarray(_bank_correct(apply)(params, bank, jnp.asarray(x), jnp.asarray(y)))
    return {lab: int(c) / len(y) for lab, c in zip(_policy_labels(cfg), got, strict=True)}


def _checksum(params: Any) -> float:
    return float(sum(np.abs(np.asarray(p, np.float64)).sum() for p in jax.tree.leaves(params)))


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    """Pending runs (cells differing in seed): each trains once and evaluates every policy."""
    b, updates = cfg["batch_size"], cfg["updates"]
    spe = len(ds.x_train) // b
    t0 = time.perf_counter()
    scheds = [
        make_delay(cfg["delay"], k["workers"], updates, batch_size=b, seed=k["seed"]).validate()
        for k in keys
    ]
    apply, ps, ss, xs, ys = lanes_for(
        ds,
        cfg["model"],
        cfg["model_kw"],
        b,
        [(k["seed"], s) for k, s in zip(keys, scheds, strict=True)],
    )
    vmap = seed_mode(cfg["model"], cfg["seed_mode"]) and len(keys) > 1
    emu = bank_emulator(apply, cfg, vmap)
    groups = [list(range(len(keys)))] if vmap else [[i] for i in range(len(keys))]
    k_dec = len(cfg["decays"])
    stack = lambda trees: jax.tree.map(lambda *a: np.stack([np.asarray(v) for v in a]), *trees)
    out: list[tuple[dict, list]] = [None] * len(keys)  # type: ignore[list-item]
    for g in groups:
        ex = bank_executor(
            emu,
            [scheds[i] for i in g],
            [xs[i] for i in g],
            [ys[i] for i in g],
            learning_rate=[keys[i]["lr"] for i in g],
        )
        banks = [init_bank(ss[i], k_dec) for i in g]
        p0 = stack([ps[i] for i in g]) if vmap else ps[g[0]]
        s0 = stack(banks) if vmap else banks[0]
        results = _train(ex, p0, s0, apply, cfg, ds, spe)
        wall = (time.perf_counter() - t0) / len(keys)
        for i, (row, curve) in zip(g, results, strict=True):
            tau = np.asarray(scheds[i].staleness)
            row.update(
                {
                    "updates": updates,
                    "epochs": updates / spe,
                    "mean_staleness": float(tau.mean()),
                    "max_staleness": int(tau.max()),
                    "staleness_counts": np.bincount(tau).tolist(),
                    "batch_size": b,
                    "delay": cfg["delay"],
                    "lam": cfg["lam"],
                    "momentum": cfg["momentum"],
                    "model": cfg["model"],
                    "dataset": cfg["dataset"],
                    "wall_s": wall,
                }
            )
            out[i] = (row, curve)
    return out


def _val_hook(
    apply: Callable[..., Any], cfg: dict[str, Any], ds: data.Dataset, ex: loop.Executor
) -> loop.Evaluate:
    """:func:`jaxstale.loop.run`'s evaluation hook: every policy copy's validation accuracy,
    ``{"<policy> d=<d>": [lanes]}``, each lane evaluated alone (as a run alone)."""

    def evaluate(params: Any, bank: Any) -> dict[str, np.ndarray]:
        per = [
            _evaluate(
                apply,
                cfg,
                loop.lane(params, j, ex.vmapped),
                loop.lane(bank, j, ex.vmapped),
                ds.x_val,
                ds.y_val,
            )
            for j in range(ex.lanes)
        ]
        return {_label(*k): np.array([acc[k] for acc in per]) for k in _policy_labels(cfg)}

    return evaluate


def _first_bad(losses: np.ndarray) -> int | None:
    """The 1-based update whose loss was first non-finite (None if none)."""
    bad = np.flatnonzero(~np.isfinite(losses))
    return int(bad[0]) + 1 if len(bad) else None


def _curve(res: loop.Result, cfg: dict[str, Any], spe: int) -> list[dict[str, Any]]:
    """The lane's records as the metrics keep them: ``step, epoch, train_loss`` and
    ``val_accuracy/<policy> d=<d>`` while the loss is finite; ``train_loss: None`` after."""
    died = _first_bad(res.losses)
    labels = [_label(*k) for k in _policy_labels(cfg)]
    out = []
    for rec in res.curve:
        step = rec["step"]
        row: dict[str, Any] = {"step": step, "epoch": step / spe, "train_loss": None}
        if died is None or died > step:
            row["train_loss"] = rec["train_loss"]
            row.update({f"val_accuracy/{lab}": rec[f"{lab}_accuracy"] for lab in labels})
        out.append(row)
    return out


def _train(
    ex: loop.Executor,
    params: Any,
    bank: Any,
    apply: Callable[..., Any],
    cfg: dict[str, Any],
    ds: data.Dataset,
    spe: int,
) -> list[tuple[dict, list]]:
    """:func:`jaxstale.loop.run` in intervals of ``eval_every`` updates, every policy's
    validation accuracy after each (:func:`_val_hook`); at the end, validation and test
    accuracy of every policy and of the recomputed statistics. Divergence as the loop's: the
    first non-finite loss (or non-finite final weights); the interval in which the last lane
    diverged is not recorded."""
    results = loop.run(
        ex, params, bank, eval_every=cfg["eval_every"], evaluate=_val_hook(apply, cfg, ds, ex)
    )
    curves = [_curve(res, cfg, spe) for res in results]
    if curves and all(c and c[-1]["train_loss"] is None for c in curves):
        curves = [c[:-1] for c in curves]  # every lane diverged in the last interval
    out = []
    for res, curve in zip(results, curves, strict=True):
        p, bk, dead = res.params, res.model_state, res.diverged
        pol: list[dict[str, Any]] = []
        labels: list[tuple[str, float | None]] = [*_policy_labels(cfg), (RECOMPUTED, None)]
        if dead:
            none = {"final_val_accuracy": None, "final_test_accuracy": None}
            pol = [{"policy": q, "decay": d, **none, "updates_to_target": None} for q, d in labels]
        else:
            val = _evaluate(apply, cfg, p, bk, ds.x_val, ds.y_val)
            test = _evaluate(apply, cfg, p, bk, ds.x_test, ds.y_test)
            fresh = _recompute(apply)(p, bk["model"], jnp.asarray(ds.x_train))
            val[(RECOMPUTED, None)] = float(loop.accuracy(apply, p, fresh, ds.x_val, ds.y_val)[0])
            test[(RECOMPUTED, None)] = float(
                loop.accuracy(apply, p, fresh, ds.x_test, ds.y_test)[0]
            )
            for q, d in labels:
                steps = runs.time_to_accuracy(
                    curve, cfg["target"], key=f"val_accuracy/{_label(q, d)}"
                )
                pol.append(
                    {
                        "policy": q,
                        "decay": d,
                        "final_val_accuracy": val[(q, d)],
                        "final_test_accuracy": test[(q, d)],
                        "updates_to_target": steps,
                    }
                )
        row = {
            "diverged": dead,
            "diverged_step": res.diverged_step,
            "final_train_loss": None if dead or not curve else curve[-1]["train_loss"],
            "params_checksum": None if dead else _checksum(p),
            "policies": pol,
        }
        out.append((row, curve))
    return out


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


# ----------------------------------------------------------------------------- main


def run(config: Config) -> list[dict[str, Any]]:
    """Trains every (M, lr, seed) cell not already in the run folder, evaluating every
    batch-norm policy and decay on the same weights; returns the rows.

    Raises:
      ConfigError: a value that does not fit the data or the machine (names the field).
      jaxstale.runs.RunFolderError: ``out`` holds another config or results of other code.
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
    t0 = time.perf_counter()
    config, p = from_argv(Config, argv, __doc__.splitlines()[0])
    with usage_errors(p):
        return report(run(config), config, started=t0)
    raise AssertionError("not reached")  # pragma: no cover (usage errors exit)


if __name__ == "__main__":
    main()
