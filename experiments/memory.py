"""Whether a pipeline sweep fits in memory, checked before anything is written: one run's
carried state in the emulator from abstract shapes (:func:`jaxstale.pipeline.carried_bytes`:
weights or stashes, optimizer state, and the in-flight mini-batches' inputs and residuals,
which dominate for a deep model) times the runs one compiled round holds at once (its lanes),
plus the data: the emulator takes each lane's mini-batches as indices into one copy of the
training split (:class:`jaxstale.data.Indexed`), the mesh a copy of the run's mini-batches.

Measured (gpt-cpu, N = 8, vanilla): the carry is 446 MiB per run at batch 16; a process's peak
grew by 0.22 GiB from batch 8 to 16 (the carry's growth) and by 0.61 GiB from one vmapped lane
to two, on ~1.7 GiB of JAX, data and compiled code. The estimate is the carry alone: a floor,
so a configuration it refuses cannot run on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxstale import data, models, optimizers, pipeline

from .config import ConfigError, fmt_bytes, machine_memory

__all__ = ["check_pipeline", "group_lanes"]


def group_lanes(cfg: dict[str, Any], vmapped: bool) -> int:
    """The most runs one compiled round holds at once: 1 when runs go one at a time (sequential
    lanes, the mesh), else the largest group the sweep runs — the rate grid on its tuning seeds,
    the other seeds at the selected rate, or every rate and seed without a tuning stage."""
    if not vmapped:
        return 1
    k, rates = cfg.get("tune_seeds"), len(cfg["lrs"])
    if k:  # an edge extension runs at most one new rate per side on the tuning seeds
        return max(rates * k, cfg["seeds"] - k, 2 * k)
    return rates * cfg["seeds"]


def check_pipeline(
    cfg: dict[str, Any],
    ds: data.Dataset,
    built: Mapping[str, models.StagedModel],
    factory: Callable[[str], Callable[[int, int], Any]],
    vmapped: Callable[[str], bool],
    limit: int | None = None,
) -> None:
    """Raises :class:`~experiments.config.ConfigError` when the largest group of runs cannot
    fit in memory (``limit``, default :func:`~experiments.config.machine_memory`): every model
    of ``cfg`` (``built[name]``, as :func:`~experiments.config.check_staged_model` returns it)
    at its deepest N, every policy (``factory(method)(N,
    updates)``: its schedule), ``vmapped(name)``: whether its runs are lanes of one round. With
    vmapped lanes that fit one at a time, the error names ``--seed-mode sequential``."""
    limit = machine_memory() if limit is None else limit
    tx = optimizers.per_stage(cfg["optimizer"], cfg["lrs"][0], cfg["momentum"], cfg["steps"])
    x = jax.ShapeDtypeStruct((cfg["batch_size"], *ds.x_train.shape[1:]), ds.x_train.dtype)
    mesh = cfg.get("executor") == "mesh"
    per_example = ds.x_train[0].nbytes + ds.y_train[0].nbytes if mesh else 8  # int64 indices
    batches = cfg["steps"] * cfg["batch_size"] * per_example  # per run
    shared = 0 if mesh else ds.x_train.nbytes + ds.y_train.nbytes
    worst: tuple[int, int, int, str, int, str] | None = None  # total, lanes, run, model, N, …
    for name in cfg["models"]:
        model = built[name]
        depths = [n for n in cfg["stages"] if n <= len(model.blocks)]
        if not depths:
            continue
        n = max(depths)
        stages = models.functional_stages(model, n)
        lanes = 1 if mesh else group_lanes(cfg, vmapped(name))
        # a short timeline reaches the steady state: the slots are those of the full run
        steps = min(cfg["steps"], 4 * n + 4)
        for method in cfg["methods"]:
            sched = factory(method)(n, steps)
            run = pipeline.carried_bytes(
                stages, sched, method, tx, x, backward=cfg["backward"],
                remat=cfg.get("remat", "none"),
            )  # fmt: skip
            total = lanes * (run + batches) + shared
            if worst is None or total > worst[0]:
                worst = (total, lanes, run, name, n, method)
    if worst is None or worst[0] <= limit:
        return
    total, lanes, run, name, n, method = worst
    what = f"{lanes} runs at once (lanes of one compiled round) × " if lanes > 1 else "one run: "
    msg = (
        f"this configuration needs about {fmt_bytes(total)} of memory, more than the "
        f"{fmt_bytes(limit)} this process may use: {what}{fmt_bytes(run)} of carried pipeline "
        f"state ({name}, N={n}, {method}: weights, optimizer state and the in-flight mini-batches' "
        "activations) and its mini-batches" + ("" if mesh else "' indices")
    )
    if lanes > 1 and run + batches + shared <= limit:
        raise ConfigError("seed_mode", msg + "; --seed-mode sequential runs one at a time")
    if batches > run:  # the run's mini-batches (or their indices), held up front
        raise ConfigError("steps", msg + f" ({fmt_bytes(batches)} per run)")
    raise ConfigError("batch_size", msg + "; a smaller --batch-size or N needs less")
