"""Training of :mod:`experiments.async_bn`: one run per cell, on the one driver
(:func:`jaxstale.loop.run`) with an evaluation hook that measures every policy copy of the
statistics bank; at the end, every policy and the recomputed statistics on validation and test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstale import data, loop

from .. import runs
from ..common import group_clock, lanes_for, make_delay, seed_mode
from .bank import (
    RECOMPUTED,
    _evaluate,
    _label,
    _policy_labels,
    _recompute,
    bank_emulator,
    bank_executor,
    init_bank,
)


def _checksum(params: Any) -> float:
    return float(sum(np.abs(np.asarray(p, np.float64)).sum() for p in jax.tree.leaves(params)))


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    """Pending runs (cells differing in seed): each trains once and evaluates every policy."""
    b, updates = cfg["batch_size"], cfg["updates"]
    spe = len(ds.x_train) // b
    clock = group_clock()
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
        wall, cpu = clock(len(keys))
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
                    "cpu_s": round(cpu, 3),
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


def _curves(results: list[loop.Result], cfg: dict[str, Any], spe: int) -> list[list[dict]]:
    """The lanes' records as the metrics keep them: ``step, epoch, train_loss`` and
    ``val_accuracy/<policy> d=<d>`` while the lane's loss is finite, ``train_loss: None`` after;
    the interval in which the last lane diverged (where the loop stopped) is not recorded."""
    labels = [_label(*k) for k in _policy_labels(cfg)]
    curves = []
    for res in results:
        died = _first_bad(res.losses)
        curve = []
        for rec in res.curve:
            step = rec["step"]
            row: dict[str, Any] = {"step": step, "epoch": step / spe, "train_loss": None}
            if died is None or died > step:
                row["train_loss"] = rec["train_loss"]
                row.update({f"val_accuracy/{lab}": rec[f"{lab}_accuracy"] for lab in labels})
            curve.append(row)
        curves.append(curve)
    if curves and all(c and c[-1]["train_loss"] is None for c in curves):
        curves = [c[:-1] for c in curves]  # every lane diverged in the last interval
    return curves


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
    curves = _curves(results, cfg, spe)
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
