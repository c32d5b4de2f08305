"""Pipeline staleness: weight policies x pipeline depth on the emulated asynchronous 1F1B pipeline.

Question: in pipelined model parallelism without a flush (PipeDream's asynchronous 1F1B), stage
``k``'s forward pass is ``N - 1 - k`` updates stale and its backward pass sees other weights
still. How much accuracy does that cost as the pipeline deepens, and how much do weight stashing
(PipeDream), SpecTrain's weight prediction (v1, v2) and NAG prediction recover — each policy at
its own best learning rate, and which differences are beyond seed-to-seed noise?

Protocol: the experiments' common one (``experiments/common.py``; docs/experiments/index.md):
every policy × model × depth ``N`` runs a learning-rate grid over ``--seeds`` seeds, the rate
**selected on validation** (a diverged seed at chance), the tables give **test** results at it
(mean ± 95 % CI, the diverged fraction, the rate after ``@``); a seed fixes the initial weights
and data order for every policy, so policies are compared **seed against seed**
(:func:`experiments.runs.paired_difference`, *beyond noise* when the interval excludes 0; every
pair beyond noise is listed, uncorrected). Edge rates extend the grid (``--extend-edges``);
``--tune-seeds K`` tunes on K seeds. Time to accuracy: updates until validation first reaches
``--target``.

Setting: each model is split into ``N`` parameter-balanced stages and trained by the pipeline
emulator (:mod:`jaxstale.pipeline`) on ``one_f_one_b(N, steps)`` (a policy may have its own
schedule: :data:`SCHEDULES`), with SGD + momentum 0.9 per stage (``--optimizer adam`` / ``nadam``:
Adam / NAdam, ``--momentum`` is then β1; ``adamw`` / ``nadamw`` / ``muon``: the language-model
recipes of :func:`jaxstale.optimizers.injected`, warm-up and cosine decay over the run, the rate
their peak). Policies (the ``method`` field of summary.json):

* ``sync`` — every pass at the sequential target (the schedule's flush counterpart: 1F1B with a
  flush, ``N`` micro-batches): sequential SGD, identical for every ``N`` up to float rounding;
* ``vanilla`` — no stash: forward and backward at the weights current at their tick;
* ``stash`` — PipeDream weight stashing;
* ``spectrain-v1`` — SpecTrain prediction in both passes towards the round-trip target (the lab's
  horizons ``⌊k/2⌋ + N - k - 1`` / ``⌊k/2⌋``);
* ``spectrain-v2`` — one prediction per mini-batch at the forward, sequential target
  (``s = N - k - 1``, the lab's v2 horizon), backward at the current weights;
* ``nesterov`` — NAG prediction with spectrain-v1's horizons; it decays the last update by the
  momentum ``μ`` (Adam: β1, ``--momentum``) per step; SpecTrain's rule (the optimizer's own last
  update times the horizon) needs no μ, so it covers the Adam family and Muon as is;
* any policy added with :func:`jaxstale.pipeline.register_policy` and passed with ``--methods``
  (its definition is recorded in the config; a policy that needs its own schedule adds a
  factory ``(num_stages, num_batches) -> Schedule`` to :data:`SCHEDULES`).

Budget: 1,500 mini-batches of 32 (37 epochs of digits), where sync has converged (flat from
about 750). Rates: SGD 0.001–0.03 (0.1 diverges or collapses for every policy), Adam 1e-4–1e-2.
A NaN/inf loss ends a run, recorded ``diverged`` at its update; the sweep goes on.

``--backward`` (:mod:`jaxstale.pipeline.program`): ``saved`` (the default) keeps the forward's
activations and uses the backward weights where the weights enter the gradient (PipeDream
without stashing); ``recompute`` reruns the stage forward at the backward weights. Measured at
N = 4 and 8 with the default grid and seeds: the same selected rates and test accuracies within
±0.3 points, no difference beyond noise; ``saved`` is about 10 % cheaper. ``--remat``
(:mod:`jaxstale.models.remat`) chooses what a slot keeps: ``names`` (a GPT's tagged
activations) carries 104.75 MiB instead of 446.23 for gpt-cpu, N = 8, vanilla; the rules per
policy in that module.

Language models: ``--dataset shakespeare --model gpt-tiny`` (or ``gpt-cpu``; AdamW by
default) trains a GPT on next-character prediction: every number above becomes the mean
cross-entropy in nats per character (``final_val_loss``, ``final_test_loss``), lower is
better everywhere; a run whose final validation loss is not below ``log V`` counts as diverged.

Speed: the runs of one (model, N, policy), every rate and seed, are lanes of one vmapped
compiled round (``--model cnn``: one after the other, ``--seed-mode``; grouped convolutions
under vmap are slow on the CPU). ``--executor mesh`` runs one run at a time on a ``"stage"``
device axis, within float32 rounding of the emulator (bit for bit on XLA:CPU for most policies
with SGD, not 2BW, NAdam or Adam: docs/reproducibility.md).
Default: 3 depths × 6 policies × 4 rates × 5 seeds = 360 runs of 1,500 updates; ``--quick``
(N ∈ {2, 4}, 2 rates, 2 seeds, 300 updates; a text dataset: N = 2, sync and vanilla,
60 updates) is a smoke run, marked so in its tables.

Outputs (run folder): summary.json rows (method, model, stages, lr, seed, optimizer, momentum,
target, schedule, backward, remat where set, final_val/test_accuracy or _loss, diverged,
diverged_step, updates_to_target, final_train_loss, steps, batch_size, wall_s and cpu_s),
table.md (the tables above, paired differences against vanilla and sync), plot.png (curves at
the deepest N), accuracy_vs_stages.png (loss_vs_stages.png for a language model), gantt.png
(the schedule at the run's deepest N, with weight versions). Run:
``python -m experiments.pipeline_staleness --help``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxstale import data, loop, models, optimizers, pipeline, schedules, tasks
from jaxstale.pipeline.program import recompute_refusal

from . import common, grids, memory, reports, runs
from .common import (
    chance,
    load_checked,
    opened,
    outcome,
    seed_mode,
    splits,
    task_of,
)
from .config import (
    EVAL_HELP,
    Base,
    ConfigError,
    check_staged_model,
    cli,
    eval_every,
    opt,
    refuse_unused,
    seed_mode_opt,
)
from .pipeline_tables import EDGE_BY, make_table
from .precision import gpt_kw
from .reports import at_selected, metric_vs_figure
from .throughput import lm_throughput, log_throughput

EXPERIMENT = "pipeline_staleness"
DEFAULT_METHODS = ("sync", "vanilla", "stash", "spectrain-v1", "spectrain-v2", "nesterov")
OPTIMIZERS = optimizers.PER_STAGE
#: the learning-rate grids per optimizer (half-decade steps); adamw, nadamw, muon: the peak
_ADAM, _MUON = [0.0001, 0.0003, 0.001, 0.003, 0.01], [0.003, 0.01, 0.03, 0.1]
LRS = {"sgd": [0.001, 0.003, 0.01, 0.03], "muon": _MUON} | dict.fromkeys(
    ("adam", "nadam", "adamw", "nadamw", "rotated"), _ADAM
)
QUICK_LRS: dict[str, list[float]] = {k: [v[1], v[2]] for k, v in LRS.items()}
MODEL_KW: dict[str, dict[str, Any]] = {
    "mlp": {"hidden": (64,) * 7},  # 8 blocks: splits into up to 8 stages
    "cnn": {},  # 5 blocks: at most 5 stages
    "resnet20": {"width": 8},  # 11 blocks
}
KEY = ("model", "stages", "method", "lr", "seed")  # the fields of a cell key

#: policy name -> schedule factory ``(num_stages, num_batches) -> Schedule`` for a policy that
#: needs its own schedule (e.g. a double-buffered 2BW-style one); every other policy runs
#: :func:`jaxstale.schedules.one_f_one_b` (``sync`` its flush counterpart, by the policy's
#: ``flush``). Add an entry next to ``register_policy``; its source joins the code fingerprint.
SCHEDULES: dict[str, Callable[[int, int], schedules.Schedule]] = {}


def _factory_name(f: Callable[..., Any]) -> str:
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def _described(policy: pipeline.Policy) -> dict[str, Any]:
    """The policy's fields, error feedback's only where it is on (it came after the rows)."""
    return {k: v for k, v in policy._asdict().items() if k != "feedback" or v}


def schedule_factory(policy: str) -> Callable[[int, int], schedules.Schedule]:
    """The schedule factory of ``policy`` (:data:`SCHEDULES`, default asynchronous 1F1B)."""
    return SCHEDULES.get(policy, schedules.one_f_one_b)


# ----------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class Config(Base):
    """pipeline_staleness's configuration (``None``: the default of :meth:`resolved`)."""

    model: tuple[str, ...] | None = opt(
        None, "model name(s) (default mlp)", choices=models.model_names, kind="model"
    )
    steps: int | None = opt(
        None, "mini-batches per run, the budget (default 1500; --quick 300, a text 60)", low=1
    )
    lrs: tuple[float, ...] | None = opt(
        None,
        "learning-rate grid; each policy and N uses the rate with the best validation accuracy "
        "(default by optimizer: sgd 0.001,0.003,0.01,0.03; adam and nadam "
        "0.0001,0.0003,0.001,0.003,0.01)",
        low=0,
        low_open=True,
    )
    extend_edges: int | None = opt(None, grids.EXTEND_HELP, low=0)
    tune_seeds: int | None = opt(None, grids.TUNE_HELP, low=1)
    eval_every: int | None = opt(None, EVAL_HELP, low=1)
    stages: tuple[int, ...] | None = opt(
        None, "stage counts N (default 2,4,8; --quick 2,4, a text 2)", low=1
    )
    methods: tuple[str, ...] | None = opt(
        None,
        f"policies (default {','.join(DEFAULT_METHODS)})",
        choices=lambda: list(pipeline.POLICIES),
        kind="policy",
    )
    optimizer: str | None = opt(
        None,
        "per-stage optimizer (default sgd; adamw on text, a GPT's recipe; nadam: AsyncPP's; "
        "adamw, nadamw, muon: warm-up + cosine, see jaxstale.optimizers.injected)",
        choices=OPTIMIZERS,
        kind="optimizer",
    )
    momentum: float = opt(
        0.9,
        "SGD momentum μ, or Adam's β1; the NAG rule decays by it",
        low=0,
        high=1,
        high_open=True,
    )
    backward: str = opt(
        "saved",
        "how a backward runs at other weights than its forward (see jaxstale.pipeline.program)",
        choices=pipeline.BACKWARD_MODES,
        kind="backward mode",
    )
    remat: str = opt(
        "none",
        "which activations a stage's forward keeps for its backward (jaxstale.models.remat): "
        "none (jax.vjp's own), names (a GPT's tagged ones: under a quarter of its residual "
        "memory), dots (the weight products' outputs), full (only the stage input)",
        choices=models.REMAT,
        kind="remat policy",
    )
    executor: str = opt(
        "emulate",
        "emulate: one device, runs as vmapped lanes; mesh: a device per stage, one run at a time "
        "(CPU: XLA_FLAGS=--xla_force_host_platform_device_count=8); the same numbers to float32 "
        "rounding, see docs/reproducibility.md",
        choices=pipeline.EXECUTORS,
        kind="executor",
    )
    mlp_width: int = opt(64, "width of the MLP's 7 hidden layers (8 blocks: up to 8 stages)", low=1)
    momentum_rule: str = opt(
        "constant",
        "β1 per stage: constant (--momentum), or asyncpp: AsyncPP's adaptive momentum "
        "(jaxstale.optimizers.asyncpp_b1; Adam family or Muon)",
        choices=("constant", "asyncpp"),
        kind="momentum rule",
    )
    seed_mode: str = seed_mode_opt(
        "emulator lanes: vmapped, or one after the other (auto: vmap for the MLP, sequential "
        "for conv models on a CPU); on XLA:CPU an MLP lane is its run alone bit for bit"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if "mlp" not in (self.model or ["mlp"]):
            refuse_unused(self, {"mlp_width": "applies to --model mlp only, not in --model"})
        untagged = [m for m in self.model or ["mlp"] if not m.startswith("gpt")]
        if self.remat == "names" and untagged:
            raise ConfigError(
                "remat",
                f"names keeps the activations a GPT tags; {', '.join(untagged)} tags none "
                "(dots or full recompute any model)",
            )
        if self.resolved_optimizer == "sgd":
            why = "a per-stage β1 needs an Adam-family optimizer or Muon"
            refuse_unused(self, {"momentum_rule": why})

    @property
    def resolved_optimizer(self) -> str:
        """``--optimizer``, or the task's default (``Base.task_optimizer``)."""
        return self.task_optimizer(self.optimizer)

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder)."""
        quick, lm_quick = self.quick, self.quick and self.text  # a GPT's smoke run: ~1 min
        default = ("sync", "vanilla") if lm_quick else DEFAULT_METHODS
        methods, names = list(self.methods or default), list(self.model or ["mlp"])
        kw = {m: dict(MODEL_KW.get(m, {})) for m in names}
        kw.get("mlp", {})["hidden"] = (self.mlp_width,) * 7
        steps = self.steps or (60 if lm_quick else 300 if quick else 1500)
        grid = (QUICK_LRS if quick else LRS)[self.resolved_optimizer]
        if lm_quick and self.resolved_optimizer != "sgd":
            # a GPT's peak rates: 60 AdamW updates of gpt-tiny reach 2.85 nats at 0.01, 3.24
            # (the unigram level) at 1e-3
            grid = grids.PEAK_LRS[self.resolved_optimizer][1:]
        lrs = list(self.lrs or grid)
        seeds = self.seeds or (2 if quick else 5)
        return {
            "quick": quick,
            "dataset": self.dataset,
            "standardize": self.standardize,
            "models": names,
            "model_kw": kw,
            "stages": list(self.stages or ([2] if lm_quick else [2, 4] if quick else [2, 4, 8])),
            "methods": methods,
            "optimizer": self.resolved_optimizer,
            "momentum": self.momentum,
            "lrs": lrs,
            "seeds": seeds,
            "steps": steps,
            "batch_size": self.batch_size,
            # rounds (one mini-batch each when steady)
            "eval_every": self.eval_every
            or (30 if lm_quick else 25 if quick else eval_every(None, steps)),
            "target": self.resolved_target,
            "backward": self.backward,
            # recorded where it is set: a run without it reads as before
            **({"remat": self.remat} if self.remat != "none" else {}),
            **({"momentum_rule": self.momentum_rule} if self.momentum_rule != "constant" else {}),
            "executor": self.executor,
            "seed_mode": self.seed_mode,
            "extend_edges": grids.edge_limit(self),
            **grids.tune_seeds(self, seeds, [lrs]),
            # what each policy is (a registered one's definition decides its results); a field
            # added later is recorded where it is set, so a policy without it reads as before
            "policies": {m: _described(pipeline.get_policy(m)) for m in methods},
            "schedules": {m: _factory_name(schedule_factory(m)) for m in methods},
        }


class _Runner:
    """Runs groups of cells; holds what runs of one structure share (the split template, the
    optimizer object), so that they share a compiled round."""

    def __init__(self, cfg: dict[str, Any], ds: data.Dataset) -> None:
        self.cfg, self.ds, self.task = cfg, ds, task_of(ds)
        self.shape = tuple(ds.x_train.shape[1:])
        self.tx = optimizers.per_stage(
            cfg["optimizer"], cfg["lrs"][0], cfg["momentum"], cfg["steps"]
        )
        self.templates: dict[tuple[str, int], list[Any]] = {}
        self.inits: dict[tuple[str, int, int], tuple[list[Any], list[Any]]] = {}
        self.computed = 0  # runs computed by this process

    def _create(self, name: str, seed: int) -> Any:
        kw = {**self.cfg["model_kw"].get(name, {}), **gpt_kw(self.cfg)}
        return models.create(
            name,
            input_shape=self.shape,
            num_classes=self.ds.num_classes,
            seed=seed,
            task=self.ds.task,
            **kw,
        )

    def num_blocks(self, name: str) -> int:
        return len(self._create(name, 0).blocks)

    def template(self, name: str, n: int) -> list[Any]:
        if (name, n) not in self.templates:
            self.templates[(name, n)] = models.functional_stages(self._create(name, 0), n)
        return self.templates[(name, n)]

    def init(self, name: str, n: int, seed: int) -> tuple[list[Any], list[Any]]:
        """Per-stage initial weights and batch-norm states of seed ``seed``."""
        if (name, n, seed) not in self.inits:
            fs = models.functional_stages(self._create(name, seed), n)
            self.inits[(name, n, seed)] = ([f.params for f in fs], [f.state for f in fs])
        return self.inits[(name, n, seed)]

    def data(self, seeds: list[int]) -> tuple[data.Indexed, data.Indexed]:
        """The seeds' mini-batches ``(xb, yb)`` as indices into the training split (``idx``
        ``[seeds, steps, B]``, the examples held once), gathered by the executor."""
        cfg, ds = self.cfg, self.ds
        n, b, steps = len(ds.x_train), cfg["batch_size"], cfg["steps"]
        idx = np.stack(
            [data.batch_indices(n, batch_size=b, num_steps=steps, seed=s) for s in seeds]
        )
        return data.indexed(ds.x_train, idx), data.indexed(ds.y_train, idx)

    def group(self, keys: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict]]]:
        """All pending cells of one (model, N, policy): every rate and seed."""
        cfg = self.cfg
        name, n, method = keys[0]["model"], keys[0]["stages"], keys[0]["method"]
        stages = self.template(name, n)
        sched = schedule_factory(method)(n, cfg["steps"])
        kw = {"backward": cfg["backward"], "momentum": cfg["momentum"]}
        kw["remat"] = cfg.get("remat", "none")
        clock = common.group_clock()
        results: list[loop.Result] = []
        if cfg["executor"] == "mesh":  # one run at a time, its own optimizer object
            for k in keys:
                xb, yb = (a._replace(idx=a.idx[0]) for a in self.data([k["seed"]]))
                tx = optimizers.per_stage(cfg["optimizer"], k["lr"], cfg["momentum"], cfg["steps"])
                trees: dict[str, Any] = {}  # the optimizer on each stage's pytree where needed
                if cfg.get("momentum_rule") == "asyncpp":
                    trees["hyperparams"] = {"b1": optimizers.asyncpp_b1(cfg["momentum"], n)}
                if cfg["optimizer"] in optimizers.NAMES or trees:
                    trees["stage_trees"] = True
                ex = pipeline.make("mesh", stages, sched, method, tx, xb, yb, **kw, **trees)
                results += self._run(ex, [self.init(name, n, k["seed"])])
        else:
            vmap = seed_mode(name, cfg["seed_mode"])
            for part in [keys] if vmap else [[k] for k in keys]:
                xb, yb = self.data([k["seed"] for k in part])
                lrs: dict[str, list[Any]] = {"learning_rate": [k["lr"] for k in part]}
                if cfg.get("momentum_rule") == "asyncpp":  # AsyncPP's β1 per stage
                    lrs["b1"] = [optimizers.asyncpp_b1(cfg["momentum"], n)] * len(part)
                args = (stages, sched, method, self.tx, xb, yb)
                ex = pipeline.make("emulate", *args, lanes=len(part), hyperparams=lrs, **kw)
                results += self._run(ex, [self.init(name, n, k["seed"]) for k in part])
        wall, cpu = clock(len(keys))
        self.computed += len(keys)
        policy = pipeline.get_policy(method)
        speed = lm_throughput(name, self.ds, cfg["steps"], cfg["batch_size"], wall)
        log_throughput(EXPERIMENT, f"{name} N={n} {method}", len(keys), speed)
        out = []
        for res in results:
            row = {
                "optimizer": cfg["optimizer"],
                "momentum": cfg["momentum"],
                "target": policy.target,
                "schedule": sched.name,
                "backward": cfg["backward"],
                **({"remat": cfg["remat"]} if "remat" in cfg else {}),
                **outcome(res, cfg["target"], self.task),
                "steps": cfg["steps"],
                "batch_size": cfg["batch_size"],
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                **speed,
            }
            out.append((row, res.curve))
        return out

    def _run(self, ex: loop.Executor, inits: list[tuple[list[Any], list[Any]]]) -> list[Any]:
        if ex.vmapped:
            stack = lambda trees: jax.tree.map(lambda *a: np.stack(a), *trees)
            n = len(inits[0][0])
            params = [stack([p[k] for p, _ in inits]) for k in range(n)]
            states = [stack([s[k] for _, s in inits]) for k in range(n)]
        else:
            ((params, states),) = inits
        every, metric = self.cfg["eval_every"], self.task.metric
        return loop.run(
            ex, params, states, eval_every=every, eval_data=splits(self.ds), metric=metric
        )


def _cells(cfg: dict[str, Any], blocks: dict[str, int]) -> list[dict[str, Any]]:
    keys = []
    for name in cfg["models"]:
        for n in cfg["stages"]:
            if n > blocks[name]:
                print(
                    f"[{EXPERIMENT}] skipping {name} at N={n}: it has {blocks[name]} blocks",
                    file=sys.stderr,
                )
                continue
            for method in cfg["methods"]:
                for lr in cfg["lrs"]:
                    for seed in grids.grid_seeds(cfg):
                        keys.append(
                            {"model": name, "stages": n, "method": method, "lr": lr, "seed": seed}
                        )
    return keys


# ----------------------------------------------------------------------------- tables and plots


def make_figures(
    rows: list[dict[str, Any]],
    selected: dict[tuple[Any, ...], Any],
    metrics_of: Callable[[dict[str, Any]], list[dict[str, Any]] | None],
    cfg: dict[str, Any],
    task: tasks.Task = reports.ACCURACY,
    levels: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The learning curves at the deepest N, the metric against N, the Gantt charts; a text
    run's figures draw its corpus's n-gram ``levels``."""
    figs: dict[str, Any] = {}
    picked = at_selected(rows, selected, by=("model", "method", "stages"))
    names = list(dict.fromkeys(r["model"] for r in rows))
    series: dict[str, dict[str, list[Any]]] = {}
    for name in names:
        n = max(r["stages"] for r in rows if r["model"] == name)
        group: dict[str, list[Any]] = {}
        for method in cfg["methods"]:
            pick = [
                r for r in picked if (r["model"], r["stages"], r["method"]) == (name, n, method)
            ]
            if pick:
                group[f"{method} (lr {pick[0]['lr']:g})"] = [metrics_of(r) or [] for r in pick]
        series[f"{name}, N={n}"] = group
    figs["plot"] = runs.curves_figure(
        series,
        x="step",
        ys=("train_loss", task.key("val")),
        title="Learning curves at the deepest N, each policy at its rate selected on validation",
        methods=cfg["methods"],
        levels=common.curve_levels(levels),
    )
    # named by the task's metric: a language model's is loss_vs_stages (a loss under an
    # accuracy name before)
    figs[f"{task.metric}_vs_stages"] = metric_vs_figure(
        picked, panel="model", x="stages", methods=cfg["methods"], xlabel="pipeline stages N",
        task=task, levels=common.curve_levels(levels),
    )  # fmt: skip
    deepest = max(cfg["stages"])  # the run's own depth (an N = 2 run drew N = 4 before)
    figs["gantt"] = schedules.render(schedules.one_f_one_b(deepest, 2 * deepest))
    for method in cfg["methods"]:
        if method in SCHEDULES:
            figs[f"gantt_{method}"] = schedules.render(
                schedule_factory(method)(deepest, 2 * deepest)
            )
    return figs


# ----------------------------------------------------------------------------- main


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked against each other: every model builds
    for the data, has one logit per class and is a sequence of blocks a pipeline can cut; the
    mesh has a device per stage; the budget fits in memory."""
    cfg = config.resolved()
    if cfg["executor"] == "mesh" and max(cfg["stages"]) > jax.device_count():
        raise ConfigError(
            "executor",
            f"mesh needs one device per stage, N={max(cfg['stages'])} > {jax.device_count()} "
            "devices (on a CPU set XLA_FLAGS=--xla_force_host_platform_device_count=8)",
        )
    if cfg["backward"] == "recompute":  # jaxstale.pipeline.compile refuses it mid-sweep
        for why in filter(None, map(recompute_refusal, cfg["methods"])):
            raise ConfigError("backward", why)
    ds = load_checked(cfg, config, tasks.KINDS)
    built = {
        name: check_staged_model("model", name, ds, cfg["model_kw"].get(name, {}), cfg)
        for name in cfg["models"]
    }
    vmapped = lambda name: seed_mode(name, cfg["seed_mode"])
    memory.check_pipeline(cfg, ds, built, schedule_factory, vmapped)
    return cfg, ds


def _open(config: Config, fresh: bool = False) -> tuple[dict, data.Dataset, runs.RunFolder]:
    # a policy's definition is in the config; a schedule factory of its own is user code
    user = [SCHEDULES[m] for m in config.resolved()["methods"] if m in SCHEDULES]
    return opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=fresh, sources=user)


def run(config: Config) -> list[dict[str, Any]]:
    """Runs every (model, N, policy, lr, seed) cell not already in the run folder (N up to the
    model's blocks); returns the rows.

    Raises:
      ConfigError: a value that does not fit the data, the devices or the machine.
      experiments.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, ds, folder = _open(config, fresh=True)
    runner = _Runner(cfg, ds)
    blocks = {name: runner.num_blocks(name) for name in cfg["models"]}
    rows = grids.tuned_sweep(
        folder, _cells(cfg, blocks), runner.group, cfg, key=KEY, by=EDGE_BY, chance=chance(ds),
        task=task_of(ds),
    )  # fmt: skip
    print(f"[{EXPERIMENT}] {runner.computed} runs computed now, the rest resumed", file=sys.stderr)
    return rows


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Tables and figures into the run folder; returns ``{"rows", "paths", "table",
    "selected", "path"}``. The table is a function of the rows (a resumed sweep writes the same
    bytes); the time taken is printed, not tabled."""
    cfg, ds, folder = _open(config)
    task = task_of(ds)
    table, selected = make_table(rows, cfg, chance(ds), task)
    levels = common.text_levels(cfg, config)
    table = common.with_levels(table, levels)
    metrics = lambda r: folder.metrics({k: r[k] for k in KEY})
    figs = make_figures(rows, selected, metrics, cfg, task, levels)
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    path = str(folder.path)
    return {"rows": rows, "paths": paths, "table": table, "selected": selected, "path": path}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
