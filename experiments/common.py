"""Helpers the experiments share: data streams, delay schedules, result rows, lane batching.

Experiments do not import each other; what two of them need lives here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optax

from jaxstale import data, delays, models, train

__all__ = ["Gather", "fit_grid", "lanes_for", "make_delay", "run_row", "seed_mode"]


class Gather:
    """A lazy pre-batched stream: ``stream[b]`` = ``x[idx[b]]`` (no copy of the whole run)."""

    def __init__(self, x: np.ndarray, idx: np.ndarray) -> None:
        self.x, self.idx = x, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, b: Any) -> np.ndarray:
        return self.x[self.idx[b]]


def make_delay(
    kind: str,
    workers: int,
    updates: int,
    *,
    batch_size: int,
    seed: int,
    straggler_fraction: float = 0.0,
    straggler_slowdown: float = 1.0,
) -> delays.DelaySchedule:
    """The delay schedule of one run (``kind`` in ``jaxstale.delays.DELAY_MODELS``)."""
    if kind == "gamma":
        return delays.gamma_timed(
            workers,
            updates,
            batch_size=batch_size,
            seed=seed,
            straggler_fraction=straggler_fraction,
            straggler_slowdown=straggler_slowdown,
        )
    return delays.make_schedule(kind, workers, updates)


_FUNCS: dict[Any, dict[int, Any]] = {}  # functional models, shared: one apply -> one eval compile


def lanes_for(
    ds: data.Dataset,
    model: str,
    model_kw: dict[str, Any],
    batch_size: int,
    items: Sequence[tuple[int, delays.DelaySchedule]],
) -> tuple[Callable[..., Any], list[Any], list[Any], list[Gather], list[Gather]]:
    """Initial weights and data streams of runs given as ``(seed, schedule)`` pairs.

    Seed ``s`` fixes the initialisation (``models.create(..., seed=s)``) and the batch order
    (``data.batch_indices(..., seed=s)``, the synchronous trainer's).

    Returns:
        ``(apply, params, states, x_streams, y_streams)``; one ``apply`` for every run (the same
        graph), so evaluation compiles once.
    """
    shape = tuple(ds.x_train.shape[1:])
    funcs = _FUNCS.setdefault((ds.name, shape, ds.num_classes, model, repr(model_kw)), {})
    apply = next(iter(funcs.values())).apply if funcs else None
    ps, ss, xs, ys = [], [], [], []
    for seed, sched in items:
        if seed not in funcs:
            m = models.create(
                model, input_shape=shape, num_classes=ds.num_classes, seed=seed, **model_kw
            )
            funcs[seed] = models.functional(m)
        f = funcs[seed]
        apply = apply or f.apply
        n = int(np.max(sched.batch)) + 1
        idx = data.batch_indices(len(ds.x_train), batch_size=batch_size, num_steps=n, seed=seed)
        ps.append(f.params)
        ss.append(f.state)
        xs.append(Gather(ds.x_train, idx))
        ys.append(Gather(ds.y_train, idx))
    assert apply is not None
    return apply, ps, ss, xs, ys


def run_row(res: Any, epoch_batches: int, extra: dict[str, Any]) -> tuple[dict, list[dict]]:
    """A summary row and the metric records of one asynchronous run's result."""
    tau = np.asarray(res.staleness)
    acc = res.final_test_accuracy
    row = {
        **extra,
        "final_test_accuracy": acc,
        "final_test_error": None if acc is None else 1.0 - acc,
        "diverged": bool(res.diverged),
        "diverged_step": res.diverged_step,
        "final_train_loss": None if res.diverged else res.curve[-1]["train_loss"],
        "updates": len(res.losses),
        "mean_staleness": float(tau.mean()),
        "max_staleness": int(tau.max()),
        "staleness_counts": np.bincount(tau).tolist(),
    }
    metrics = [{**c, "epoch": c["batches"] / epoch_batches} for c in res.curve]
    return row, metrics


def seed_mode(model: str, mode: str) -> bool:
    """Whether lanes are vmapped: ``auto`` = vmap for MLPs, sequential for conv models on CPU
    (per-lane conv weights become slow grouped convolutions there; DESIGN.md)."""
    if mode == "auto":
        import jax

        return model == "mlp" or jax.default_backend() != "cpu"
    return mode == "vmap"


def fit_grid(
    run: Any,
    tx_factory: Callable[[float], optax.GradientTransformation],
    dataset: Any,
    *,
    method: str,
    models: Sequence[str],
    lrs: Sequence[float],
    seeds: int | Sequence[int],
    steps: int,
    batch_size: int,
    eval_every: int | None = None,
    loop: str = "auto",
    seed_mode: str = "auto",
    **fit_kwargs: Any,
) -> list[dict[str, Any]]:
    """Runs :func:`jaxstale.train.fit` over a ``model x lr x seed`` grid into a ``RunFolder``.

    Each ``(method, model, lr, seed)`` is one cell of ``run``; the pending seeds of one
    ``(model, lr)`` train together in one ``fit`` call (so they can share a ``vmap``), cells
    already in ``run`` are skipped (resume), and progress is logged per ``(model, lr)``.

    Args:
      run: the ``jaxstale.runs.RunFolder`` to record into.
      tx_factory: ``lr -> optax transformation``, e.g. ``lambda lr: optax.sgd(lr, momentum=0.9)``.
      dataset: a ``jaxstale.data.Dataset`` or a dataset name (loaded once).
      method: the rows' ``"method"`` name (e.g. ``"sgd"``).
      models: model names.
      lrs: learning rates.
      seeds: number of seeds or a list of seeds.
      steps, batch_size, eval_every, loop, seed_mode, fit_kwargs: passed to ``fit``.

    Returns:
      One row per cell, in grid order: ``method, model, lr, seed, final_test_accuracy,
      diverged, diverged_step, final_train_loss, steps, batch_size, loop, seed_mode, wall_s``.
      The cell's metrics (its ``curve``) go to ``metrics.jsonl`` (``run.metrics(key)``).
    """
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    keys = [
        {"method": method, "model": m, "lr": float(lr), "seed": s}
        for m in models
        for lr in lrs
        for s in seeds
    ]

    def cells(group: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        model, lr = group[0]["model"], group[0]["lr"]
        results = train.fit(
            model,
            tx_factory(lr),
            dataset,
            steps=steps,
            batch_size=batch_size,
            seeds=[k["seed"] for k in group],
            eval_every=eval_every,
            loop=loop,
            seed_mode=seed_mode,
            **fit_kwargs,
        )
        drop = ("seed", "curve", "params", "state")
        return [({k: v for k, v in r.items() if k not in drop}, r["curve"]) for r in results]

    return run.run_grouped(keys, cells, vary=("seed",), desc=f"{run.experiment} {method}")
