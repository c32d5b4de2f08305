"""Async workers: how accuracy degrades with the number of asynchronous workers, per method.

Question: with M workers pushing gradients to a parameter server, each gradient is about M − 1
updates stale. How much does plain ASGD lose as M grows, and how much do the
mitigations recover — SSGD (synchronous, no staleness), the staleness-aware learning rate,
DC-ASGD (constant and adaptive λ), Gap-Aware, DANA, DANA-DC and LC-ASGD — each at its own best
learning rate?

Protocol (the experiments' common one, ``experiments/common.py``): standardised inputs
(training-set statistics) and a validation split carved from the training set; every method ×
M runs a learning-rate grid (``--lrs``) over ``--seeds`` seeds; the rate is **selected on
validation accuracy** (a diverged seed counts at chance) and the table reports **test
accuracy at the selected rate** (mean ± 95 % CI over the seeds that trained, diverged fraction
in the cell, the rate after ``@``). LC-ASGD's λ is tuned the same way, its sign included
(``--lc-lambdas``), and DC-ASGD's λ0 with ``--dc-lambda-scales`` (multiples of the paper's:
0.04 constant, 2 adaptive). A rate selected at an edge of its grid extends that method × M's
grid (``--extend-edges``, :func:`experiments.grids.extend_grid`); the table says so.
Time to accuracy: updates until the validation accuracy first reaches ``--target``.

Setting: :func:`jaxstale.asyncdp.run` (exact emulation, or the mesh executor), digits + MLP by
default, batch 32, SGD with momentum 0.9, gamma-timed workers (``--delay``). **Budget =
samples**: every method sees ``--updates`` mini-batches (1,500 = 37 epochs of the 1,295
training examples: the synchronous reference has converged, its validation curve flat from
~750 updates); ASGD-type methods apply one update per mini-batch, SSGD one per M mini-batches
(effective batch ``M·B``), as in the DC-ASGD paper's per-epoch comparison. A seed fixes the
initial weights, the data order and the worker timing, so all methods, worker counts and rates
see the same data stream. ``sgd`` is the 1-worker reference (M = 1 only; every method but DANA
reduces to it at M = 1, which the tests check). Methods: sgd, ssgd, asgd, sa-asgd, dc-asgd-c,
dc-asgd-a, gap-aware, dana, dana-dc, lc-asgd, plus any name added with
:func:`jaxstale.asyncdp.register_method` and passed with ``--methods``.

Speed: one executable per (method, momentum, λ) serves every worker count, learning rate and
seed (traced hyper-parameters, a fixed snapshot capacity): lanes run vmapped (MLP) or
sequentially (conv models on the CPU); SSGD compiles once per M. Default: ~1,100 runs of 1,500
updates in about 10 minutes on 2 cores; ``--quick`` is a smoke run (one minute).

**Language models** (issue 23): ``--dataset shakespeare`` trains a GPT (default ``gpt-cpu``;
``--quick``: ``gpt-tiny``, sgd / asgd / dana, 100 updates, about 1.5 minutes) with the same
server methods; every number is then a next-token loss in nats (selected on the lowest
validation loss, a run not below ``log V`` counted as diverged, the tables and figures in
nats).

Outputs (run folder): summary.json rows (method, workers, momentum, lr, lam, seed,
final_val_accuracy, final_test_accuracy, diverged, diverged_step, updates_to_target,
mean_staleness, staleness_counts, ...), table.md (test accuracy at the selected rate; updates
to the target; the validation grid), plot.png (learning curves, one row of panels per M, each
method at its selected rate), accuracy_vs_workers.png (with 95 % CIs), staleness_hist.png,
staleness.json. Run: ``python -m experiments.async_workers --help``.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from typing import Any

from jaxstale import asyncdp, data, delays, models, tasks

from . import runs
from .async_tables import (
    EDGE_BY,
    KNOB,
    ONE_WORKER,
    make_figures,
    make_table,
    staleness_counts,
)
from .common import (
    chance,
    curve_levels,
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
    EVAL_HELP,
    Base,
    ConfigError,
    check_memory,
    check_model,
    cli,
    eval_every,
    opt,
    refuse_unused,
    seed_mode_opt,
)
from .grids import (
    EXTEND_HELP,
    TUNE_HELP,
    confirm_selected,
    edge_limit,
    extend_grid,
    grid_seeds,
    tune_seeds,
)
from .precision import gpt_kw
from .presets import PRESETS

EXPERIMENT = "async_workers"
DEFAULT_METHODS = (
    "sgd",
    "ssgd",
    "asgd",
    "sa-asgd",
    "dc-asgd-c",
    "dc-asgd-a",
    "gap-aware",
    "dana",
    "dana-dc",
    "lc-asgd",
)
#: a text's smoke run (--quick): the reference, plain ASGD and one mitigation
QUICK_TEXT = ("sgd", "asgd", "dana")
LAMBDA_METHODS = ("lc-asgd", "lc-asgd-async-bn")  # λ tuned with the rate
DC_METHODS = {"dc-asgd-c": False, "dc-asgd-a": True}  # λ0 tuned with the rate: adaptive?
KEY = ("method", "workers", "momentum", "lr", "lam", "seed")  # the fields of a cell key
#: the learning-rate grid per momentum (×10 without momentum: the same effective step η/(1−μ))
LRS = {0.9: [0.001, 0.003, 0.01, 0.03, 0.1], 0.0: [0.01, 0.03, 0.1, 0.3, 1.0]}


# ----------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class Config(Base):
    """async_workers' configuration (``None``: a preset's value, else the default of
    :meth:`resolved`)."""

    model: tuple[str, ...] | None = opt(
        None, "model name (one; default mlp)", choices=models.model_names, kind="model"
    )
    steps: int | None = opt(
        None, "mini-batches per run, the budget (default 1500; --quick 300)", low=1
    )
    lrs: tuple[float, ...] | None = opt(
        None,
        "learning-rate grid; each method and setting uses the rate with the best validation "
        "accuracy (default by momentum: 0.9 -> 0.001,0.003,0.01,0.03,0.1; --quick 0.003,0.03)",
        low=0,
        low_open=True,
    )
    methods: tuple[str, ...] | None = opt(
        None, f"methods (default {','.join(DEFAULT_METHODS)})", choices=asyncdp.method_names,
        kind="method",
    )  # fmt: skip
    workers: tuple[int, ...] | None = opt(
        None, "worker counts M (default 4,8,16,32; --quick 4,16; sgd runs at M = 1)", low=1
    )
    momentum: tuple[float, ...] | None = opt(
        None, "momenta (default 0.9)", low=0, high=1, high_open=True
    )
    extend_edges: int | None = opt(None, EXTEND_HELP, low=0)
    tune_seeds: int | None = opt(None, TUNE_HELP, low=1)
    eval_every: int | None = opt(None, EVAL_HELP, low=1)
    lc_lambdas: tuple[float, ...] | None = opt(
        None, "LC-ASGD's λ grid, tuned with the rate, sign included (default -0.1,0.1)"
    )
    dc_lambda_scales: tuple[float, ...] | None = opt(
        None, "DC-ASGD's λ0 grid, tuned with the rate, as multiples of the paper's (0.04 "
        "constant, 2 adaptive; default: the paper's alone)", low=0, low_open=True,
    )  # fmt: skip
    batch_size: int | None = opt(None, "mini-batch size (default 32)", low=1)
    preset: str | None = opt(
        None,
        "a paper-scale configuration (CIFAR-10, ResNet-20; needs prepared TFDS data and a GPU), "
        "with the paper's numbers beside ours; other flags override it",
        choices=sorted(PRESETS),
        kind="preset",
    )
    delay: str = opt(
        "gamma",
        "delay model: gamma (workers with gamma-distributed step times), round_robin (worker "
        "m's gradient lands after the other M - 1), constant (every gradient M - 1 updates "
        "stale)",
        choices=delays.DELAY_MODELS,
        kind="delay model",
    )
    straggler_fraction: float = opt(
        0.0, "--delay gamma only: fraction of workers that are stragglers", low=0, high=1
    )
    straggler_slowdown: float = opt(
        1.0, "--delay gamma only: how many times slower a straggler's steps are", low=1
    )
    warmup_epochs: int = opt(0, "lr warm-up from lr/M (DANA: 5)", low=0)
    seed_mode: str = seed_mode_opt(
        "seeds and rates as vmapped lanes or one after the other (auto: by model and backend); "
        "on XLA:CPU an MLP lane is its run alone bit for bit (gap-aware: float32 rounding)"
    )
    executor: str = opt(
        "emulate",
        "emulate: one device (exact emulation); mesh: workers on a 'data' device axis (CPU: "
        "XLA_FLAGS=--xla_force_host_platform_device_count=8); on XLA:CPU both give an MLP's "
        "numbers bit for bit (sa-asgd, gap-aware: to float32 rounding; see "
        "docs/reproducibility.md)",
        choices=asyncdp.EXECUTORS,
        kind="executor",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model is not None and len(self.model) > 1:
            raise ConfigError("model", f"async_workers takes one model, got {','.join(self.model)}")
        unused = {}
        if self.delay != "gamma":
            why = f"applies to --delay gamma only, not {self.delay}"
            unused.update(straggler_fraction=why, straggler_slowdown=why)
        methods = self.methods or self._default_methods()
        for field, names in (("lc_lambdas", LAMBDA_METHODS), ("dc_lambda_scales", DC_METHODS)):
            if not set(names) & set(methods):
                unused[field] = f"applies to {' / '.join(names)} only, not in --methods"
        refuse_unused(self, unused)

    def _default_methods(self) -> tuple[str, ...]:
        pre = PRESETS[self.preset]["config"] if self.preset else {}
        return tuple(
            pre.get("methods") or (QUICK_TEXT if self.quick and self.text else DEFAULT_METHODS)
        )

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder); a text's
        defaults: gpt-cpu (``--quick``: gpt-tiny, three methods, 100 updates)."""
        quick, lm = self.quick, self.text
        pre = PRESETS[self.preset]["config"] if self.preset else {}
        momenta = list(self.momentum or pre.get("momentum") or [0.9])
        grid = self.lrs or pre.get("lrs")
        lrs = {
            str(mu): list(grid)
            if grid
            else ([0.003, 0.03] if quick else LRS.get(mu, LRS[0.9] if mu else LRS[0.0]))
            for mu in momenta
        }
        lams = list(self.lc_lambdas or ([0.1] if quick else [-0.1, 0.1]))
        seeds = self.seeds or pre.get("seeds") or (2 if quick else 5)
        methods = list(self.methods or self._default_methods())
        model = pre.get("model") or (("gpt-tiny" if quick else "gpt-cpu") if lm else "mlp")
        updates = self.steps or ((100 if lm else 300) if quick else pre.get("updates", 1500))
        scales = list(self.dc_lambda_scales or [])
        tuned = [*lrs.values(), *([lams] if set(LAMBDA_METHODS) & set(methods) else [])]
        tuned += [scales] if set(DC_METHODS) & set(methods) else []
        return {
            "quick": quick,
            "preset": self.preset,
            # a preset's dataset and standardisation unless the fields differ from their defaults
            "dataset": pre.get("dataset", "digits") if self.dataset == "digits" else self.dataset,
            "standardize": pre.get("standardize", "feature")
            if self.standardize == "feature"
            else self.standardize,
            "model": (self.model or [model])[0],
            "model_kw": {},
            "methods": methods,
            "workers": list(
                self.workers or pre.get("workers") or ([4, 16] if quick else [4, 8, 16, 32])
            ),
            "momentum": momenta,
            "lrs": lrs,
            "lc_lambdas": lams,
            **({"dc_lambda_scales": scales} if scales else {}),  # without: run ids as before
            "seeds": seeds,
            "batch_size": self.batch_size or pre.get("batch_size") or 32,
            "updates": updates,
            "eval_every": eval_every(self.eval_every, updates),
            "target": self.resolved_target,
            "delay": self.delay,
            "straggler_fraction": self.straggler_fraction,
            "straggler_slowdown": self.straggler_slowdown,
            "warmup_epochs": self.warmup_epochs,
            "seed_mode": self.seed_mode,
            "executor": self.executor,
            "extend_edges": edge_limit(self),
            **tune_seeds(self, seeds, tuned),
        }


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    keys = []
    for mu in cfg["momentum"]:
        for method in cfg["methods"]:
            lams = _lambdas(cfg, method)
            for m in [1] if method in ONE_WORKER else cfg["workers"]:
                for lr in cfg["lrs"][str(mu)]:
                    for lam in lams:
                        for seed in grid_seeds(cfg):
                            keys.append(
                                {"method": method, "workers": m, "momentum": mu, "lr": lr,
                                 "lam": lam, "seed": seed}
                            )  # fmt: skip
    return keys


def _lambdas(cfg: dict[str, Any], method: str) -> list[float | None]:
    """The method's tuned λ values: LC-ASGD's grid, DC-ASGD's paper λ0 times the scales."""
    if method in LAMBDA_METHODS:
        return list(cfg["lc_lambdas"])
    if method in DC_METHODS and cfg.get("dc_lambda_scales"):
        lam0 = asyncdp.methods.DC_LAMBDA0[method]
        return [float(f"{lam0 * s:.6g}") for s in cfg["dc_lambda_scales"]]
    return [None]


def _builder(method: str, lam: float | None) -> asyncdp.Method:
    """The method as the executors take it: its name, or its builder at λ (λ0) = ``lam``."""
    if lam is None:
        return method
    if method in DC_METHODS:
        adaptive = DC_METHODS[method]
        return functools.partial(asyncdp.methods.build_dc_asgd, lam=lam, adaptive=adaptive)
    lc = asyncdp.methods.build_lc_asgd, asyncdp.methods.build_lc_asgd_async_bn
    return functools.partial(lc[method != "lc-asgd"], lam=lam)


def _run_group(cfg: dict[str, Any], ds: data.Dataset, keys: list[dict]) -> list[tuple[dict, list]]:
    """All pending cells of one (method, momentum, λ): one asyncdp.run (per M for SSGD)."""
    method, mu, lam = keys[0]["method"], keys[0]["momentum"], keys[0]["lam"]
    task = task_of(ds)
    b = cfg["batch_size"]
    spe = len(ds.x_train) // b
    updates = cfg["updates"]
    is_sync = asyncdp.method_mode(method) == "sync"
    parts = (
        [[k for k in keys if k["workers"] == m] for m in sorted({k["workers"] for k in keys})]
        if is_sync
        else [keys]
    )
    out: dict[int, tuple[dict, list]] = {}
    for part in parts:
        clock = group_clock()
        scheds = [
            make_delay(
                cfg["delay"],
                k["workers"],
                updates,
                batch_size=b,
                seed=k["seed"],
                straggler_fraction=cfg["straggler_fraction"],
                straggler_slowdown=cfg["straggler_slowdown"],
            )
            for k in part
        ]
        apply, ps, ss, xs, ys = lanes_for(
            ds,
            cfg["model"],
            {**cfg["model_kw"], **gpt_kw(cfg)},
            b,
            [(k["seed"], s) for k, s in zip(part, scheds, strict=True)],
        )
        res = asyncdp.run(
            apply,
            _builder(method, lam),
            ps,
            ss,
            scheds,
            xs,
            ys,
            learning_rate=[k["lr"] for k in part],
            momentum=mu,
            warmup_steps=cfg["warmup_epochs"] * spe,
            eval_data=splits(ds),
            eval_every=cfg["eval_every"],
            vmap=seed_mode(cfg["model"], cfg["seed_mode"]),
            executor=cfg["executor"],
            metric=task.metric,
        )
        wall, cpu = clock(len(part))
        for k, r in zip(part, res, strict=True):
            extra = {
                "delay": "sync" if is_sync else cfg["delay"],
                "batch_size": b,
                "epochs": updates / spe,
                "model": cfg["model"],
                "dataset": cfg["dataset"],
                "warmup_epochs": cfg["warmup_epochs"],
                "wall_s": wall,
                "cpu_s": round(cpu, 3),
            }
            out[id(k)] = run_row(r, spe, extra, cfg["target"], task)
    return [out[id(k)] for k in keys]


# ----------------------------------------------------------------------------- main


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked against each other (the model fits the
    data, the batch the training set, the sweep the memory)."""
    cfg = config.resolved()
    ds = load_checked(cfg, config, tasks.KINDS)
    params = check_model("model", cfg["model"], ds, cfg["model_kw"])
    lams = max(len(cfg["lc_lambdas"]), len(cfg.get("dc_lambda_scales", [])))
    lanes = cfg["seeds"] * max(len(v) for v in cfg["lrs"].values()) * lams
    m = max(cfg["workers"])
    check_memory(
        {
            # the server's copies and every worker's pulled weights, per vmapped lane
            "workers": 4.0 * params * (m + 4) * lanes,
            # the delay schedule and the batch order, per lane
            "steps": 8.0 * cfg["updates"] * (cfg["batch_size"] + 2 * m) * lanes,
        },
    )
    return cfg, ds


def run(config: Config) -> list[dict[str, Any]]:
    """Runs every (method, M, momentum, lr, λ, seed) cell not already in the run folder;
    returns the rows.

    Raises:
      ConfigError: a value that does not fit the data or the machine (names the field).
      experiments.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, ds, folder = opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=True)
    compute = lambda ks: _run_group(cfg, ds, ks)
    rows = folder.run_grouped(_cells(cfg), compute, vary=("seed", "workers", "lr"), desc=EXPERIMENT)
    lrs = lambda g: cfg["lrs"][str(g[2])]
    kw = {"key": KEY, "by": EDGE_BY, "knob": KNOB, "chance": chance(ds), "task": task_of(ds)}
    rows = extend_grid(folder, rows, compute, grid=lrs, limit=cfg["extend_edges"], **kw)
    return confirm_selected(folder, rows, compute, seeds=cfg["seeds"], **kw)


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Tables, figures and the staleness histogram into the run folder; returns ``{"rows",
    "paths", "table", "selected"}``."""
    cfg, ds, folder = opened(EXPERIMENT, config, sys.modules[__name__], _prepare)
    task = task_of(ds)
    table, selected = make_table(rows, cfg, chance(ds), task)
    levels = text_levels(cfg, config)
    table = with_levels(table, levels)
    metrics_of = lambda r: folder.metrics({k: r[k] for k in KEY})
    figs = make_figures(rows, selected, metrics_of, cfg, task, curve_levels(levels))
    counts = {
        str(m): c.tolist() for m in cfg["workers"] if (c := staleness_counts(rows, m)) is not None
    }
    runs.atomic_write_text(folder.path / "staleness.json", json.dumps(counts) + "\n")
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    return {"rows": rows, "paths": paths, "table": table, "selected": selected}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
