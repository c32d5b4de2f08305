"""Helpers the experiments share: data streams, delay schedules, result rows, lane batching,
and the protocol every experiment follows (issue 13):

* **data**: the loader's default — training-set standardisation, a validation split carved
  from the training set (:func:`splits`); curves record validation *and* test accuracy;
* **tuning**: each method × setting runs a learning-rate grid; the rate is selected on the
  final validation accuracy (diverged seeds count at chance, :func:`experiments.runs.select`), and
  tables report test accuracy at the selected rate with the rate shown
  (:func:`experiments.reports.tuned_tables`); where the selected rate is the grid's smallest
  or largest, the grid of that method × setting is extended beyond it (:func:`extend_grid`,
  ``--extend-edges``) and the report says so (:func:`experiments.reports.edge_notes`);
* **statistics**: ≥ 5 seeds by default; cells are mean ± 95 % CI over the seeds that trained
  with the diverged fraction written in the cell; time to accuracy (updates until the
  validation accuracy first reaches ``--target``) next to final accuracy;
* **runs**: :func:`opened` / :func:`open_folder` (the code fingerprint includes the
  user-registered methods, models and dataset loaders a config runs and the dataset's digest;
  stale results are refused), ``--quick`` marked as a smoke run in every table
  (:func:`title`); configurations are typed (:mod:`experiments.config`).

Experiments do not import each other; what two of them need lives here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optax

from jaxstale import data, delays, models, tasks, text, train

from . import precision, runs
from .grids import confirm_selected, extend_grid

__all__ = [
    "SMOKE",
    "Gather",
    "chance",
    "convergence",
    "curve_levels",
    "fit_grid",
    "group_clock",
    "lanes_for",
    "levels_sentence",
    "load_checked",
    "load_data",
    "make_delay",
    "open_folder",
    "opened",
    "outcome",
    "run_row",
    "seed_mode",
    "splits",
    "text_levels",
    "title",
    "user_sources",
    "with_levels",
]

SMOKE = (
    "**Smoke run (--quick): a wiring check on a tiny budget, not a result; run without --quick "
    "for the numbers.**"
)


def load_data(cfg: dict[str, Any], config: Any = None) -> data.Dataset:
    """The one data path of every experiment: ``cfg["dataset"]`` standardised as
    ``cfg["standardize"]``, from ``config.data_dir`` (not part of the run id)."""
    return data.load(
        cfg["dataset"],
        standardize=cfg["standardize"],
        data_dir=getattr(config, "data_dir", None),
    )


def user_sources(cfg: dict[str, Any]) -> list[Any]:
    """The user code a config runs: the builders of registered (not built-in) methods, models
    and the dataset's loader, named by ``cfg["methods"]``, ``cfg["model"]``/``cfg["models"]``
    and ``cfg["dataset"]`` (part of the run's code fingerprint, with what they call)."""
    from jaxstale import asyncdp

    found: list[Any] = []
    for name in cfg.get("methods", ()):
        if name in asyncdp.METHODS and name not in asyncdp.methods.BUILTIN:
            found.append(asyncdp.METHODS[name])
    names = cfg.get("models") or ([cfg["model"]] if cfg.get("model") else [])
    found += [b for m in names if (b := models.registered_builder(m)) is not None]
    loader = data.registered_loader(cfg.get("dataset", ""))
    if loader is not None:
        found.append(loader)
    return found


def splits(ds: data.Dataset) -> dict[str, tuple[Any, Any]]:
    """The evaluation splits of a run: ``{"val": ..., "test": ...}`` (``val`` only when the
    dataset has a validation split)."""
    out: dict[str, tuple[Any, Any]] = {}
    if ds.x_val is not None and len(ds.x_val):
        out["val"] = (ds.x_val, ds.y_val)
    out["test"] = (ds.x_test, ds.y_test)
    return out


def task_of(ds: data.Dataset) -> tasks.Task:
    """The dataset's task: classification (accuracy) or language modelling (loss in nats)."""
    if getattr(ds, "task", "classification") == "language_model":
        return tasks.language_model(int(ds.num_classes))
    return tasks.classification(int(ds.num_classes))


def chance(ds: data.Dataset) -> float:
    """The task's chance level (accuracy ``1 / classes``; a language model's ``log V``): the
    selection score of a diverged seed."""
    return task_of(ds).chance


def text_levels(cfg: dict[str, Any], config: Any = None) -> dict[str, float] | None:
    """A built-in text corpus's reference losses on its test split (count unigram, bigram,
    trigram models and ``log V``, :func:`jaxstale.text.reference_losses`); None for any other
    dataset (a user's corpus has no fitted levels)."""
    name = cfg.get("dataset")
    if name not in (*text.TEXTS, *text.TFDS_TEXTS):
        return None
    return text.reference_losses(name, getattr(config, "data_dir", None))


def levels_sentence(levels: dict[str, float] | None) -> str:
    """The reference levels in one sentence for a text run's table ('' without levels).

    Example:
        >>> levels_sentence({"bigram": 2.57, "uniform": 4.42})[-60:]
        'on validation): bigram 2.570; uniform 4.420 nats per character.'
    """
    if not levels:
        return ""
    grams = ", ".join(f"{k} {v:.3f}" for k, v in levels.items() if k != "uniform")
    return (
        "Reference levels, test split (count n-gram models of the training split, add-k "
        f"chosen on validation): {grams}; uniform {levels['uniform']:.3f} nats per character."
    )


def with_levels(table: str, levels: dict[str, float] | None) -> str:
    r"""``table`` (markdown) with :func:`levels_sentence` as a paragraph below its first table
    (at its end without a table; unchanged without levels).

    Example:
        >>> out = with_levels("# t\n\n| a |\n|---|\n\nmore\n", {"uniform": 4.42})
        >>> [line[:16] for line in out.splitlines()]
        ['# t', '', '| a |', '|---|', '', 'Reference levels', '', 'more']
    """
    sentence = levels_sentence(levels)
    if not sentence:
        return table
    lines = table.split("\n")
    start = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if start is None:
        return table.rstrip("\n") + "\n\n" + sentence + "\n"
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join([*lines[:end], "", sentence, *lines[end:]])


def curve_levels(levels: dict[str, float] | None) -> dict[str, float] | None:
    """The levels a learning-curve figure draws: the n-gram models (uniform is the start)."""
    return {k: v for k, v in levels.items() if k != "uniform"} if levels else None


def outcome(res: Any, target: float, task: tasks.Task | None = None) -> dict[str, Any]:
    """The result fields every experiment records for a run (a ``loop.Result``-like object):
    final validation and test accuracy (a language model: loss), divergence, final training
    loss, and ``updates_to_target`` (updates until the validation metric first reached
    ``target``). A language model whose final validation loss is not below the uniform loss
    ``log V`` learned nothing: it counts as diverged (its losses are kept as
    ``unlearned_val_loss`` / ``unlearned_test_loss``)."""
    if getattr(res, "metric", "accuracy") == "loss":
        if task is None or task.metric != "loss":
            raise ValueError("outcome: a loss-measured run needs its language-model task")
        return _loss_outcome(res, target, task)
    acc = dict(getattr(res, "final_accuracy", {}) or {})
    return {
        "final_val_accuracy": acc.get("val"),
        "final_test_accuracy": res.final_test_accuracy,
        "final_test_error": None
        if res.final_test_accuracy is None
        else 1.0 - res.final_test_accuracy,
        "diverged": bool(res.diverged),
        "diverged_step": res.diverged_step,
        "final_train_loss": None if res.diverged or not res.curve else res.curve[-1]["train_loss"],
        "updates_to_target": runs.time_to_accuracy(res.curve, target),
    }


def _loss_outcome(res: Any, target: float, task: tasks.Task) -> dict[str, Any]:
    fin = dict(res.final_loss)
    return loss_fields(
        fin.get("val"), fin.get("test"), res.diverged, res.diverged_step, res.curve, target, task
    )


def loss_fields(
    val: float | None,
    test: float | None,
    diverged: bool,
    diverged_step: int | None,
    curve: list[dict[str, Any]],
    target: float | None,
    task: tasks.Task,
) -> dict[str, Any]:
    """A language model's result fields (:func:`outcome`'s) from its final validation and test
    losses, divergence and curve: not below ``log V`` on validation counts as diverged;
    ``updates_to_target`` where a ``target`` loss is given."""
    unlearned = not diverged and val is not None and not task.learned(val)
    row = {
        "final_val_loss": None if unlearned else val,
        "final_test_loss": None if unlearned else test,
        "diverged": bool(diverged) or unlearned,
        "diverged_step": diverged_step,
        "final_train_loss": None if diverged or not curve else curve[-1]["train_loss"],
    }
    if target is not None:
        row["updates_to_target"] = runs.time_to_accuracy(curve, target, key="val_loss")
    if unlearned:
        row |= {"unlearned_val_loss": val, "unlearned_test_loss": test}
    return row


def convergence(
    curves: Sequence[Sequence[dict[str, Any]]],
    *,
    key: str = "val_accuracy",
    tol: float = 0.01,
    x: str = "step",
) -> dict[str, Any]:
    """Whether the learning curves of one setting (one per seed) have flattened by the end.

    Seeds whose curve misses a value of ``key`` (diverged) are left out; the others must share
    their evaluation steps. ``m(s)`` is the seeds' mean of ``key`` at evaluation step ``s``,
    ``S`` the last step and ``s₀`` the first evaluation at or after ``2S/3``.

    Returns:
        ``plateau``: the mean of ``m`` over the evaluations ``≥ s₀`` (the last third);
        ``flat_since``: the first evaluated step from which every later ``m(s)`` lies within
        ``tol`` of the plateau (None: the last point does not, or no curve);
        ``delta_last_third``: ``(mean, half_width, n)`` of the per-seed change of ``key`` from
        ``s₀`` to ``S`` (95 % CI, :func:`experiments.runs.mean_ci`): an interval around 0 says
        the curve is flat; ``seeds``: the number of curves used.

    Example:
        >>> c = lambda *v: [{"step": 10 * (i + 1), "val_accuracy": a} for i, a in enumerate(v)]
        >>> out = convergence([c(0.5, 0.9, 0.95, 0.96, 0.95, 0.96), c(0.6, 0.92, 0.96, 0.95,
        ...                   0.96, 0.95)])
        >>> out["flat_since"], round(out["plateau"], 3), out["seeds"]
        (30, 0.955, 2)
    """
    ok = [
        c
        for c in curves
        if c and all(r.get(key) is not None and np.isfinite(float(r[key])) for r in c)
    ]
    steps = [r[x] for r in ok[0]] if ok else []
    ok = [c for c in ok if [r[x] for r in c] == steps]
    if not ok:
        return {
            "plateau": None,
            "flat_since": None,
            "delta_last_third": (float("nan"), float("nan"), 0),
            "seeds": 0,
        }
    vals = np.array([[float(r[key]) for r in c] for c in ok])
    mean = vals.mean(axis=0)
    start = next(i for i, s in enumerate(steps) if s >= 2 * steps[-1] / 3)
    plateau = float(mean[start:].mean())
    within = np.abs(mean - plateau) <= tol + 1e-12
    i = len(steps)
    while i > 0 and within[i - 1]:
        i -= 1
    return {
        "plateau": plateau,
        "flat_since": int(steps[i]) if i < len(steps) else None,
        "delta_last_third": runs.mean_ci(vals[:, -1] - vals[:, start]),
        "seeds": len(ok),
    }


def title(cfg: dict[str, Any], text: str) -> str:
    """A table title, with the smoke-run warning under ``--quick``."""
    return f"{SMOKE}\n\n{text}" if cfg.get("quick") else text


def open_folder(
    experiment: str,
    cfg: dict[str, Any],
    config: Any,
    module: Any,
    ds: data.Dataset,
    sources: Sequence[Any] = (),
) -> runs.RunFolder:
    """:func:`open_run` for a typed config (``config.out``, ``config.force_resume``): a bad
    folder raises :class:`experiments.runs.RunFolderError` (a ``ValueError``) instead of
    exiting."""
    import sys

    from . import config as config_module

    digest = (ds.preprocessing or {}).get("digest")
    # the lab's run-folder package (grouping, fingerprints) counts as experiment code: it left
    # the library, whose files are source_sha
    code = runs.code_fingerprint(
        modules=(module, sys.modules[__name__], config_module, runs, precision),
        sources=[*user_sources(cfg), *sources],
        data=[digest] if digest else [],
    )
    return runs.RunFolder(
        experiment, cfg, config.out, code=code, force_resume=bool(config.force_resume),
        checkpoint_every=getattr(config, "checkpoint_every", None),
    )  # fmt: skip


# (experiment, config) -> (resolved config, dataset, run folder) of the last run(config) of that
# experiment in this process, so that report(rows, config) writes where run(config) computed
_OPENED: dict[str, tuple[Any, tuple[dict[str, Any], data.Dataset, runs.RunFolder]]] = {}


def opened(
    experiment: str,
    config: Any,
    module: Any,
    prepare: Callable[[Any], tuple[dict[str, Any], data.Dataset]],
    *,
    fresh: bool = False,
    sources: Sequence[Any] = (),
) -> tuple[dict[str, Any], data.Dataset, runs.RunFolder]:
    """The resolved config, dataset and run folder of a typed ``config``: ``prepare(config)``
    resolves and checks it against its data (raising :class:`~experiments.config.ConfigError`),
    then the folder is opened (:func:`open_folder`). Kept for the next call with the same
    config (``report`` after ``run``); ``fresh=True`` (``run``) checks the code and data again.
    One experiment keeps one config: a dataset can be large."""
    last = _OPENED.get(experiment)
    if fresh or last is None or last[0] != config:
        cfg, ds = precision.prepared(experiment, prepare, config)  # with its precision
        folder = open_folder(experiment, cfg, config, module, ds, sources)
        _OPENED[experiment] = (config, (cfg, ds, folder))
    return _OPENED[experiment][1]


def load_checked(
    cfg: dict[str, Any], config: Any, kinds: Sequence[str] = ("classification",)
) -> data.Dataset:
    """:func:`load_data` for a typed config: a loader's error is a
    :class:`~experiments.config.ConfigError` on ``dataset``, and so is a task the experiment
    does not run (``kinds``, e.g. a language model where only classification is); a batch
    larger than the training set one on ``batch_size``."""
    from .config import ConfigError

    try:
        ds = load_data(cfg, config)
    except (ValueError, RuntimeError) as e:
        raise ConfigError("dataset", str(e)) from None
    if ds.task not in kinds:
        raise ConfigError(
            "dataset",
            f"{ds.name!r} is a {ds.task.replace('_', ' ')} task; this experiment runs "
            f"{' and '.join(k.replace('_', ' ') for k in kinds)} (language models: "
            "pipeline_staleness, constant_delay, sync_baseline, async_workers, delay_cliff, "
            "local_sgd)",
        )
    b = cfg.get("batch_size")
    if b is not None and b > len(ds.x_train):
        raise ConfigError("batch_size", f"{b} exceeds the {len(ds.x_train)} training examples")
    return ds


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
                model,
                input_shape=shape,
                num_classes=ds.num_classes,
                seed=seed,
                task=ds.task,
                **model_kw,
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


def group_clock() -> Callable[[int], tuple[float, float]]:
    """Starts a run group's clocks; the function returned gives each of its ``n`` runs' share of
    the time since, ``(wall, cpu)`` seconds: wall from :func:`time.perf_counter`, CPU from
    :func:`time.process_time` (the process's user + system time, every thread). Rows record
    them as ``wall_s`` and ``cpu_s``."""
    t0, c0 = time.perf_counter(), time.process_time()
    return lambda n: ((time.perf_counter() - t0) / n, (time.process_time() - c0) / n)


def run_row(
    res: Any,
    epoch_batches: int,
    extra: dict[str, Any],
    target: float = 0.95,
    task: tasks.Task | None = None,
) -> tuple[dict, list[dict]]:
    """A summary row (:func:`outcome`, staleness statistics, ``extra``) and the metric records
    of one asynchronous run's result (``task``: a language model's, for a loss)."""
    tau = np.asarray(res.staleness)
    row = {
        **extra,
        **outcome(res, target, task),
        "updates": len(res.losses),
        "mean_staleness": float(tau.mean()),
        "max_staleness": int(tau.max()),
        "staleness_counts": np.bincount(tau).tolist(),
    }
    metrics = [{**c, "epoch": c["batches"] / epoch_batches} for c in res.curve]
    return row, metrics


def seed_mode(model: str, mode: str) -> bool:
    """Whether lanes are vmapped: ``auto`` = vmap for MLPs and GPTs (matrix products only),
    sequential for conv models on CPU (per-lane conv weights become slow grouped convolutions
    there: benchmarks/loop_strategies.py)."""
    if mode == "auto":
        import jax

        return model == "mlp" or model.startswith("gpt") or jax.default_backend() != "cpu"
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
    target: float | None = None,
    extend_edges: int = 0,
    chance: float = 0.0,
    confirm_seeds: int | None = None,
    task: tasks.Task | None = None,
    **fit_kwargs: Any,
) -> list[dict[str, Any]]:
    """Runs :func:`jaxstale.train.fit` over a ``model x lr x seed`` grid into a ``RunFolder``.

    Each ``(method, model, lr, seed)`` is one cell of ``run``; the pending seeds of one
    ``(model, lr)`` train together in one ``fit`` call (so they can share a ``vmap``), cells
    already in ``run`` are skipped (resume), and progress is logged per ``(model, lr)``.

    Args:
      run: the ``experiments.runs.RunFolder`` to record into.
      tx_factory: ``lr -> optax transformation``, e.g. ``lambda lr: optax.sgd(lr, momentum=0.9)``.
      dataset: a ``jaxstale.data.Dataset`` or a dataset name (loaded once).
      method: the rows' ``"method"`` name (e.g. ``"sgd"``).
      models: model names.
      lrs: learning rates.
      seeds: number of seeds or a list of seeds.
      steps, batch_size, eval_every, loop, seed_mode, fit_kwargs: passed to ``fit``.
      target: if given, each row gets ``updates_to_target``, the first evaluated step whose
        validation accuracy reached ``target`` (None: never), as :func:`outcome` records it.
      extend_edges, chance: :func:`extend_grid`'s ``limit`` and ``chance`` per model (0: the
        grid as given).
      confirm_seeds: a two-stage sweep (:func:`experiments.grids.confirm_selected`): ``seeds``
        are the grid's (tuning) seeds, and each model's selected rate then runs seeds
        ``0 … confirm_seeds−1``; None: the grid only.
      task: the dataset's task; a language model's rows carry losses (:func:`loss_fields`:
        ``final_val_loss``, ``final_test_loss``; not below ``log V`` counts as diverged) and
        ``target`` is a validation loss. None: classification.

    Returns:
      One row per cell, in grid order: ``method, model, lr, seed, final_val_accuracy,
      final_test_accuracy, final_train_loss, diverged, diverged_step, steps, batch_size, loop,
      seed_mode, wall_s`` (and ``updates_to_target`` with ``target``), then the rows of the
      grid's extensions (with ``extended``), then those of the selected rates' other seeds.
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
        out = []
        for r in results:
            row = {k: v for k, v in r.items() if k not in drop}
            if task is not None and task.metric == "loss":
                row |= loss_fields(
                    r["final_val_loss"], r["final_test_loss"], r["diverged"],
                    r["diverged_step"], r["curve"], target, task,
                )  # fmt: skip
            elif target is not None:
                row["updates_to_target"] = runs.time_to_accuracy(r["curve"], target)
            out.append((row, r["curve"]))
        return out

    rows = run.run_grouped(keys, cells, vary=("seed",), desc=f"{run.experiment} {method}")
    fields = ("method", "model", "lr", "seed")
    rows = extend_grid(
        run, rows, cells, key=fields, by=fields[:2], grid=lrs, limit=extend_edges, chance=chance,
        task=task,
    )  # fmt: skip
    if confirm_seeds is None:
        return rows
    return confirm_selected(
        run, rows, cells, key=fields, by=fields[:2], seeds=confirm_seeds, chance=chance, task=task
    )
