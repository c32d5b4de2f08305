"""Local SGD and the DiLoCo family: data parallelism against synchronous, streaming and
asynchronous DiLoCo at equal tokens, every outer optimizer at its own outer rate.

Question (issue 24's D1–D5): ``M`` workers run ``H`` inner steps of one optimizer between
exchanges of their pseudo-gradients ``Δ = θ − θ_local`` (:mod:`jaxstale.localsgd`). Does
synchronous DiLoCo (outer Nesterov) match data parallelism that sees the same tokens with ``H``
times more exchanges? What do asynchronous arrivals cost naive outer Nesterov, and how much of
it do Delayed Nesterov with dynamic local updates, a polynomial staleness weight and CGAD's
gated decay into outer Adam give back,
per update and in emulated wall clock? What do Streaming DiLoCo's fragments, overlap ``τ`` and
fp8 or fp4 exchange cost?

Methods (``--methods``):

- ``dp``: data parallelism — the inner optimizer on the mean gradient of ``M`` mini-batches
  (one batch of ``M·B``) for ``steps`` updates: the same tokens as ``M`` workers × ``steps``
  inner steps, an exchange every step. Its grid (``--dp-scales``) multiplies the inner rate,
  tuned for its ``M``-fold batch: one worker's one-step ``Δ`` under outer SGD at rate ``s`` is
  the inner optimizer at ``s`` times its rate (AdamW's decoupled decay included).
- ``diloco``: synchronous DiLoCo, outer ``optax.sgd(lr, 0.9, nesterov=True)`` on the mean ``Δ``
  every ``H`` steps (``steps / H`` rounds).
- ``diloco-delayed`` and ``diloco-eager``: synchronous DiLoCo with its outer exchange
  overlapped with the next round (:mod:`jaxstale.localsgd.overlap`): the mean applied one round
  late, or Kale et al.'s eager updates (each worker's fresh share with the others' delayed one).
- ``streaming τ=k`` (one per ``--overlaps`` value), ``streaming-fp8 τ=k`` and
  ``streaming-fp4 τ=k``: Streaming DiLoCo with ``--fragments P`` fragments, overlap ``τ``, merge
  ``--alpha``; Δ exchanged in fp32, fp8 (e4m3) or fp4 (e2m1).
- ``async-nesterov``: asynchronous local SGD (each arrival one outer update, ``M·steps/H`` of
  them), outer Nesterov as if nothing were stale.
- ``async-lookahead``: momentum look-ahead (:func:`jaxstale.momentum_lookahead`): outer
  Nesterov whose workers pull the weights extrapolated ``M − 1`` outer updates (their expected
  staleness) along the negative outer momentum.
- ``async-delayed``: Delayed Nesterov (buffer ``N = M``) with dynamic local updates (DyLU).
- ``async-poly``: the polynomial staleness weight ``(1 + τ)^{-1/2}`` before outer Nesterov.
- ``async-cgad``: CGAD (:func:`jaxstale.cgad`) — the arrival weighed by ``γ(τ)e^{−ατ}``
  (``α = 0.1``, cutoff ``τ_c = 2M``) before outer Adam, whose rates come from ``--adam-lrs``.

Workers' speeds: an inner step takes ``Gamma(k, s/k)`` time units (``--shape k``), a fraction
``--straggler-fraction`` of the workers ``--straggler-slowdown`` times slower; a synchronous
round ends with its slowest worker. ``wall_time`` (emulated, in inner steps of a speed-1
worker) is recorded beside the updates.

Protocol (the experiments' common one): the inner optimizer and its rate are fixed
(``--optimizer``, ``--inner-lr``); every (method, M, H) runs the outer-rate grid ``--lrs``
over the seeds and the rate is **selected on the final validation metric**; a grid whose winner
sits at an edge is extended (``--extend-edges``). A seed fixes the initial weights, the data
order and the workers' timing. Tables: test metric at the selected rate (mean ± 95 % CI,
diverged fraction), paired differences against ``diloco`` at each setting, and the emulated
wall clock and exchanges.

Setting: by default the embedded MNIST-1D with the MLP, AdamW inner at 0.003, batch 32, 2,000
inner steps per worker, ``M = 4``, ``H ∈ {10, 50}``, outer rates 0.3, 0.5, 0.7, 1.0, 5 seeds;
the language model by flag (``--dataset shakespeare --model gpt-cpu``). ``--quick`` is a smoke
run (digits, 40 steps, two seeds), marked so. Models with batch norm are refused (the executor
would drop each worker's running statistics). ``--executor mesh`` runs every cell on the mesh
executor (:mod:`jaxstale.localsgd.mesh`: one run at a time). ``--warm-start K``: every run of a
(model, seed) starts from the same K synchronous steps of the inner optimizer (its schedule over
those K steps at ``--warm-lr``, default the inner rate; one worker's batches of a stream of their
own), as DiLoCo's main runs start from a
pretrained model; the start is trained once, kept in the run folder
(:mod:`experiments.starts`) and its digest recorded in every row.

Outputs (run folder): summary.json rows (model, method, workers, inner_steps, lr, seed,
final_val/test metric, diverged, wall_time, exchanges, tokens — windows of the data, ... — and
for a GPT tokens_per_s, flops_per_token and mfu, :mod:`experiments.throughput`), table.md,
plot.png.
Run: ``python -m experiments.local_sgd --help``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxstale import data, models, optimizers, tasks
from jaxstale.localsgd.core import check_model_state
from jaxstale.sizes import tree_bytes

from .. import common, grids, memory, reports, runs
from ..common import chance, load_checked, opened, task_of, title
from ..config import Base, ConfigError, check_memory, check_model, cli, flag, opt, refuse_unused
from .runner import _Runner, outer_tx
from .runner import schedule as schedule

EXPERIMENT = "local_sgd"
METHODS = (
    "dp",
    "diloco",
    "diloco-delayed",
    "diloco-eager",
    "streaming",
    "streaming-fp8",
    "streaming-fp4",
    "async-nesterov",
    "async-lookahead",
    "async-delayed",
    "async-poly",
    "async-cgad",
)
KEY = ("model", "method", "workers", "inner_steps", "lr", "seed")
EDGE_BY = ("model", "method", "workers", "inner_steps")
OUTER_LRS = (0.3, 0.5, 0.7, 1.0)
#: dp's multipliers of the inner rate (its batch is M times one worker's)
DP_SCALES = (0.5, 1.0, 2.0, 4.0)
#: a language model's --quick: data parallelism, DiLoCo and its naive asynchronous variant,
#: two outer rates and two dp scales
LM_QUICK_METHODS = ("dp", "diloco", "async-nesterov")
LM_QUICK_LRS = (0.5, 0.7)
LM_QUICK_DP_SCALES = (1.0, 2.0)
#: outer Adam's rates (async-cgad): a step of about ``lr`` per coordinate and arrival
ADAM_LRS = (0.001, 0.003, 0.01)


@dataclass(frozen=True)
class Config(Base):
    """local_sgd's configuration (``None``: the default of :meth:`resolved`)."""

    dataset: str = opt("mnist1d", "dataset name", choices=data.dataset_names, kind="dataset")
    model: tuple[str, ...] | None = opt(
        None, "model name(s) (default mlp)", choices=models.model_names, kind="model"
    )
    optimizer: str = opt(
        "adamw", "the inner optimizer (jaxstale.optimizers.per_stage)",
        choices=optimizers.PER_STAGE, kind="optimizer",
    )  # fmt: skip
    momentum: float = opt(0.9, "inner SGD momentum or Adam's β1", low=0, high=1, high_open=True)
    inner_lr: float | None = opt(
        None, "the inner rate (default: the middle of the optimizer's peak grid)", low=0,
        low_open=True,
    )  # fmt: skip
    methods: tuple[str, ...] | None = opt(
        None, "methods (default all)", choices=METHODS, kind="method"
    )
    workers: tuple[int, ...] | None = opt(None, "worker counts M (default 4; --quick 2)", low=1)
    inner_steps: tuple[int, ...] | None = opt(
        None, "inner steps H between exchanges (default 10,50; --quick 4)", low=1
    )
    steps: int | None = opt(
        None, "inner steps per worker, a multiple of every H (default 2000; --quick 40)", low=1
    )
    lrs: tuple[float, ...] | None = opt(
        None, "outer-rate grid (default 0.3,0.5,0.7,1.0)", low=0, low_open=True
    )
    dp_scales: tuple[float, ...] | None = opt(
        None, "dp's multipliers of the inner rate (default 0.5,1,2,4)", low=0, low_open=True
    )
    adam_lrs: tuple[float, ...] | None = opt(
        None, "async-cgad's outer Adam rate grid (default 0.001,0.003,0.01)", low=0,
        low_open=True,
    )  # fmt: skip
    fragments: int = opt(2, "Streaming DiLoCo's fragments P (H a multiple of P)", low=1)
    overlaps: tuple[int, ...] | None = opt(
        None,
        "Streaming DiLoCo's overlaps τ, each < H/P (default those of 0,1,2 below every H/P)",
        low=0,
    )
    alpha: float = opt(0.5, "Streaming DiLoCo's merge α", low=0, high=1)
    shape: float = opt(100.0, "gamma shape k of an inner step's time", low=0, low_open=True)
    straggler_fraction: float = opt(0.25, "fraction of slow workers", low=0, high=1)
    straggler_slowdown: float = opt(2.0, "their slowdown", low=1)
    extend_edges: int | None = opt(None, grids.EXTEND_HELP, low=0)
    tune_seeds: int | None = opt(None, grids.TUNE_HELP, low=1)
    warm_start: int = opt(
        0,
        "synchronous steps every run of a (model, seed) starts from (DiLoCo's pretrained "
        "start): the inner optimizer on one worker's batches, cached in the run folder",
        low=0,
    )
    warm_lr: float | None = opt(
        None, "the warm start's peak rate (default --inner-lr)", low=0, low_open=True
    )
    executor: str = opt(
        "emulate",
        "emulate: one device, seeds and rates as vmapped lanes; mesh: each worker on a 'data' "
        "device (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=8), one run at a time, "
        "to float32 rounding of the emulator's numbers (dp trains on one device)",
        choices=("emulate", "mesh"),
        kind="executor",
    )

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder)."""
        quick = self.quick
        # a GPT's smoke run: the reference and DiLoCo, two rates (all 12 methods x 4 rates of
        # the image smoke run took 29 minutes on a GPT, 118 runs)
        lm_quick = quick and self.text
        hs = list(self.inner_steps or ((4,) if quick else (10, 50)))
        steps = self.steps or (40 if quick else 2000)
        for h in hs:
            if steps % h:
                raise ConfigError("steps", f"{steps} is not a multiple of H = {h}")
        lrs = list(self.lrs or (LM_QUICK_LRS if lm_quick else OUTER_LRS))
        seeds = self.seeds or (2 if quick else 5)
        methods = list(self.methods or (LM_QUICK_METHODS if lm_quick else METHODS))
        streaming = [m for m in methods if m.startswith("streaming")]
        if not streaming:
            why = "is Streaming DiLoCo's; no streaming method runs (--methods)"
            refuse_unused(self, {f: f"{flag(f)} {why}" for f in ("fragments", "overlaps", "alpha")})
        cgad_runs = "async-cgad" in methods
        if not cgad_runs:
            refuse_unused(
                self, {"adam_lrs": f"{flag('adam_lrs')} is async-cgad's; it does not run"}
            )
        adam_lrs = list(self.adam_lrs or ADAM_LRS)
        dp_runs = "dp" in methods
        if not dp_runs:
            refuse_unused(self, {"dp_scales": f"{flag('dp_scales')} is dp's; it does not run"})
        dp_scales = list(self.dp_scales or (LM_QUICK_DP_SCALES if lm_quick else DP_SCALES))
        # the default overlaps are those every H's sync interval fits
        room = min(h // self.fragments for h in hs)
        overlaps = list(self.overlaps or [o for o in (0, 1, 2) if o < room])
        if streaming:
            for h in hs:
                if h % self.fragments:
                    raise ConfigError("fragments", f"H = {h} is not a multiple of {self.fragments}")
                if max(overlaps) >= h // self.fragments:
                    raise ConfigError(
                        "overlaps", f"τ must be below H/P = {h // self.fragments} (H = {h})"
                    )
        grid = grids.PEAK_LRS[self.optimizer]
        inner_lr = self.inner_lr or grid[len(grid) // 2]
        if not self.warm_start:
            refuse_unused(
                self, {"warm_lr": f"{flag('warm_lr')} is the warm start's; no --warm-start"}
            )
        return {
            "quick": quick,
            "dataset": "digits" if quick and self.dataset == "mnist1d" else self.dataset,
            "standardize": self.standardize,
            "models": list(self.model or ["mlp"]),
            "optimizer": self.optimizer,
            "momentum": self.momentum,
            "inner_lr": inner_lr,
            "methods": [
                f"{m} τ={o}" if m in streaming else m
                for m in methods
                for o in (overlaps if m in streaming else (0,))
            ],
            "workers": list(self.workers or ((2,) if quick else (4,))),
            "inner_steps": hs,
            "steps": steps,
            "lrs": lrs,
            **({"adam_lrs": adam_lrs} if cgad_runs else {}),
            **({"dp_scales": dp_scales} if dp_runs else {}),
            "seeds": seeds,
            "batch_size": self.batch_size,
            "fragments": self.fragments,
            "alpha": self.alpha,
            "timing": [self.shape, self.straggler_fraction, self.straggler_slowdown],
            **({"executor": "mesh"} if self.executor == "mesh" else {}),
            **(
                {"warm_start": self.warm_start, "warm_lr": self.warm_lr or inner_lr}
                if self.warm_start
                else {}
            ),
            "target": self.resolved_target,
            "extend_edges": grids.edge_limit(self),
            **grids.tune_seeds(
                self, seeds, [lrs, *([adam_lrs] if cgad_runs else []), *([dp_scales] * dp_runs)]
            ),
        }


def grid_of(cfg: dict[str, Any]) -> Any:
    """The outer-rate grid of a (model, method, M, H) group: dp's inner-rate multipliers, outer
    Adam's rates for ``async-cgad``, else the outer rates."""
    own = {"dp": cfg.get("dp_scales"), "async-cgad": cfg.get("adam_lrs")}
    return lambda g: own.get(g[1]) or cfg["lrs"]


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"model": model, "method": method, "workers": m, "inner_steps": h, "lr": lr, "seed": s}
        for model in cfg["models"]
        for m in cfg["workers"]
        for h in cfg["inner_steps"]
        for method in cfg["methods"]
        if not (method == "dp" and h != cfg["inner_steps"][0])  # dp has no H: one column
        for lr in grid_of(cfg)((model, method))
        for s in grids.grid_seeds(cfg)
    ]


def with_settings(rows: list[dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows with their ``setting`` column ``"M=4, H=10"``; a ``dp`` row (it has no ``H``)
    stands in every ``H``'s column, so each column compares every method."""
    out = []
    for r in rows:
        hs = cfg["inner_steps"] if r["method"] == "dp" else [r["inner_steps"]]
        out += [{**r, "setting": f"M={r['workers']}, H={h}"} for h in hs]
    return out


def make_table(
    rows: list[dict[str, Any]], cfg: dict[str, Any], chance_acc: float, task: tasks.Task
) -> tuple[str, dict[tuple[Any, ...], Any], list[dict[str, Any]]]:
    """The tuned tables, the paired differences against ``diloco`` and the wall clock."""
    rows = with_settings(rows, cfg)
    acc, _, grid, selected = reports.tuned_tables(
        rows, index=("model", "method"), columns="setting", chance_acc=chance_acc, task=task
    )
    picked = reports.at_selected(rows, selected, by=("model", "method", "setting"))
    m = task.label
    head = (
        f"{cfg['dataset']}, inner {optimizers.LABELS[cfg['optimizer']]} at {cfg['inner_lr']:g}, "
        f"{cfg['steps']} inner steps of {cfg['batch_size']} per worker, {cfg['seeds']} seeds"
    )
    parts = [
        title(cfg, f"**Test {m} at each (method, setting)'s outer rate selected on validation "
              f"(mean ± 95 % CI over seeds that trained; [diverged/seeds]; @ outer lr; dp: @ "
              f"its multiple of the inner rate), {head}**"),
        acc,
        f"**Validation {m} per outer rate (dp: multiple of the inner rate; mean over seeds, "
        "diverged at chance; bold: selected)**",
        grid,
    ]  # fmt: skip
    edges = reports.edge_notes(
        rows, by=EDGE_BY, grid=grid_of(cfg), limit=cfg.get("extend_edges", 0),
        chance_acc=chance_acc, task=task,
    )  # fmt: skip
    parts += [n for n in (edges, reports.tuning_note(cfg, task)) if n]
    if any(r["method"] == "diloco" for r in picked):
        table, _ = reports.paired_table(
            picked, index=("model",), compare="method",
            baseline="diloco", columns="setting", task=task,
        )  # fmt: skip
        parts += [f"**Paired test-{m.split()[0]} difference, method − diloco ({task.unit}; 95 % "
                  "t interval over seeds)**", table]  # fmt: skip
    body = []
    for key in dict.fromkeys((r["model"], r["method"], r["setting"]) for r in picked):
        at = [r for r in picked if (r["model"], r["method"], r["setting"]) == key]
        wall = np.mean([r["wall_time"] for r in at])
        tau = np.mean([r["mean_staleness"] for r in at])
        body.append([*key, f"{wall:.0f}", f"{at[0]['models_sent']:g}", f"{tau:.2f}"])
    heads = ["model", "method", "setting", "wall clock", "models sent", "mean τ"]
    parts += [
        "**Emulated wall clock (inner steps of a speed-1 worker, mean over seeds), whole "
        "models each worker sends, and mean staleness (outer updates between a pseudo-gradient's "
        "dispatch and its application; diloco-delayed 1, diloco-eager the other replicas' "
        "share (M − 1)/M), at the selected rate**",
        runs.markdown_table(heads, body),
    ]
    return "\n\n".join(parts) + "\n", selected, picked


def make_figure(
    picked: list[dict[str, Any]], task: tasks.Task, levels: dict[str, float] | None = None
) -> Any:
    """The test metric at the selected rate per setting, one line per method."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    cols = list(dict.fromkeys(r["setting"] for r in picked))
    methods = list(dict.fromkeys(r["method"] for r in picked))
    for method in methods:
        pts = [
            (i, [r for r in picked if (r["method"], r["setting"]) == (method, c)])
            for i, c in enumerate(cols)
        ]
        style = runs.method_style(method, methods)
        reports.accuracy_vs(ax, [(i, rs) for i, rs in pts if rs], method, style, task)
    ax.set_xticks(range(len(cols)), cols, rotation=20)
    ax.set_xlabel("workers and inner steps")
    if levels:
        runs.draw_levels(ax, levels)
    ax.set_ylabel(f"test {task.label} at the selected outer rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked: every model builds for the data without
    batch norm, and the streams fit in memory."""
    cfg = config.resolved()
    ds = load_checked(cfg, config, tasks.KINDS)
    state = 0
    for name in cfg["models"]:
        check_model("model", name, ds, {}, cfg["optimizer"])
        net = models.create(name, input_shape=tuple(ds.x_train.shape[1:]),
                            num_classes=ds.num_classes, seed=0, task=ds.task)  # fmt: skip
        f = models.functional(net)
        try:
            check_model_state(f.state)
        except ValueError as e:
            raise ConfigError("model", f"{name!r} has batch norm: {e}") from None
        state = max(state, state_bytes(cfg, f.params))
    lanes = group_lanes(cfg)
    check_memory({"steps": stream_bytes(cfg, ds), "workers": lanes * state})
    return cfg, ds


def state_bytes(cfg: dict[str, Any], params: Any) -> int:
    """One run's carried state at the most workers ``M``: the global weights and the largest
    outer optimizer state of the methods, and per worker its inner optimizer state, its dispatch
    point or replica, and the weights its job ends at (from abstract shapes)."""
    m = max(cfg["workers"])
    inner = optimizers.per_stage(cfg["optimizer"], 0.1, cfg["momentum"], cfg["steps"])
    bases = {method.partition(" τ=")[0] for method in cfg["methods"]}
    outer = max(tree_bytes(jax.eval_shape(outer_tx(b, m).init, params)) for b in bases)
    p = tree_bytes(params)
    return p + outer + m * (tree_bytes(jax.eval_shape(inner.init, params)) + 2 * p)


def group_lanes(cfg: dict[str, Any]) -> int:
    """The most runs one group holds at once (:func:`experiments.memory.group_lanes` over the
    longest of the outer-rate grids: a method's own, Adam's, dp's scales); 1 on the mesh, which
    runs a group's runs one after another."""
    grids_ = [cfg["lrs"], cfg.get("adam_lrs") or [], cfg.get("dp_scales") or []]
    rates = max(grids_, key=len)
    return memory.group_lanes({**cfg, "lrs": rates}, vmapped=cfg.get("executor") != "mesh")


def stream_bytes(cfg: dict[str, Any], ds: data.Dataset) -> float:
    """The largest group's mini-batch streams (each run's: the most workers × inner steps ×
    batch examples; dp's batch of M·B over as many steps is the same). Vmapped lanes keep them
    as int32 indices (:class:`~jaxstale.data.Indexed`), on the host and on the device, beside
    one device copy of the training split; the mesh runs one run at a time, its stream
    materialised on the host and on the devices."""
    n = max(cfg["workers"]) * cfg["steps"] * cfg["batch_size"]
    if cfg.get("executor") == "mesh":
        return 2 * n * (ds.x_train[:1].nbytes + ds.y_train[:1].nbytes)
    return 2 * 4 * n * group_lanes(cfg) + ds.x_train.nbytes + ds.y_train.nbytes


def _open(config: Config, fresh: bool = False) -> tuple[dict, data.Dataset, runs.RunFolder]:
    return opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=fresh)


def run(config: Config) -> list[dict[str, Any]]:
    """Runs every (model, method, M, H, lr, seed) cell not already in the run folder."""
    cfg, ds, folder = _open(config, fresh=True)
    runner = _Runner(cfg, ds, folder)
    kw = {"key": KEY, "by": EDGE_BY, "chance": chance(ds), "task": task_of(ds)}
    rows = folder.run_grouped(_cells(cfg), runner.group, vary=("seed", "lr"), desc=EXPERIMENT)
    rows = grids.extend_grid(
        folder, rows, runner.group, grid=grid_of(cfg), limit=cfg["extend_edges"], **kw
    )
    rows = grids.confirm_selected(folder, rows, runner.group, seeds=cfg["seeds"], **kw)
    print(f"[{EXPERIMENT}] {runner.computed} runs computed now, the rest resumed", file=sys.stderr)
    return rows


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Tables and the figure into the run folder; returns ``{"rows", "paths", "table",
    "selected", "path"}``."""
    cfg, ds, folder = _open(config)
    task = task_of(ds)
    table, selected, picked = make_table(rows, cfg, chance(ds), task)
    levels = common.text_levels(cfg, config)
    table = common.with_levels(table, levels)
    figs = {"plot": make_figure(picked, task, common.curve_levels(levels))}
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    path = str(folder.path)
    return {"rows": rows, "paths": paths, "table": table, "selected": selected, "path": path}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
