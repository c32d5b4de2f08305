"""Constant delay: what a gradient τ updates stale costs each optimizer, and how much weight
prediction gives back.

Question (the one-step-delay and marin studies, issue 23's LM4 / LM5): with any optax optimizer
(AdamW, NAdamW, Muon, SGD) and every gradient taken at weights ``τ`` updates old
(:mod:`jaxstale.delayed`: ``g_t = ∇L(θ_{t−τ})`` applied to ``θ_t``), how far does the final
validation loss fall behind ``τ = 0`` as ``τ`` grows, and what fraction of that gap does
SpecTrain-style weight prediction from the optimizer's own last update close
(``θ̃ = θ_{t−τ} + τ·(θ_{t−τ} − θ_{t−τ−1})``)? Besides a uniform ``τ``, ``--stage-profiles N``
adds a pipeline's profile: the model cut into ``N`` parameter-balanced stages of whole blocks,
stage ``s`` ``N − 1 − s`` updates stale (the ages of PipeDream's stashed versions; 2BW's
one-step-stale updates are ``τ = 1``).

Protocol (the experiments' common one, ``experiments/common.py``): every (model, method, delay)
runs the rate grid over the seeds; the rate is **selected on the final validation metric**
(a diverged seed counts at chance: ``log V`` for a language model) and the tables report the
**test metric at the selected rate** (mean ± 95 % CI over the seeds that trained, diverged
fraction, ``@`` rate); a grid whose winner sits at an edge is extended (``--extend-edges``). A
seed fixes the initial weights and the data order for every delay and method, so the paired
tables compare seed against seed: predicted − stale at each delay, and each delay's gap to
``τ = 0`` with the fraction of it prediction closes, ``1 − gap(predicted) / gap(stale)``.
``method``: ``stale`` (plain delay), ``predicted``, or ``feedback`` (error feedback around the
optimizer, :func:`jaxstale.error_feedback` with ``c = 1``: Zmushko et al.'s one-step rule, the
same rule at larger ``τ``; asked for by ``--methods``); at ``τ = 0`` each is the optimizer
itself (bit for bit), so only ``stale`` runs there.

Setting: by default the embedded Shakespeare (next character, 64-character windows), the
``gpt-cpu`` GPT (8 blocks × 64), AdamW (β2 0.95, decay 0.1, warm-up 5 % + cosine, clipping 1)
at batch 16 for 2,000 updates, ``τ ∈ {0, 1, 2, 4, 8, 16}``, 3 peak rates, 5 seeds; any
dataset, zoo or registered model and :data:`OPTIMIZERS` entry by flag. ``--quick`` (gpt-tiny,
``τ ∈ {0, 2}``, two rates, two seeds, 120 updates) is a smoke run, marked so.

Speed: one compiled program per (model, method, delay) runs every rate and seed as vmapped
lanes; the state holds ``τ + 1`` weight versions per lane (one more with prediction).

Outputs (run folder): summary.json rows (model, method, delay, lr, seed, optimizer,
final_val/test_loss or _accuracy, diverged, updates_to_target, final_train_loss, ...),
table.md, plot.png (the test metric at the selected rate against the delay, per method).
Run: ``python -m experiments.constant_delay --help``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxstale import data, delayed, loop, losses, models, optimizers, tasks
from jaxstale.pipeline.kernel import compose
from jaxstale.sizes import residual_bytes
from jaxstale.transforms import error_feedback

from . import grids, reports, runs
from .common import (
    chance,
    curve_levels,
    group_clock,
    load_checked,
    opened,
    outcome,
    splits,
    task_of,
    text_levels,
    title,
    with_levels,
)
from .config import (
    EVAL_HELP,
    Base,
    ConfigError,
    check_memory,
    check_staged_model,
    cli,
    eval_every,
    opt,
)
from .precision import gpt_kw
from .throughput import lm_throughput, log_throughput

EXPERIMENT = "constant_delay"
OPTIMIZERS = optimizers.PER_STAGE
METHODS = ("stale", "predicted", "feedback")
#: a fix in words (the gap table's headings)
WORDS = {"predicted": "prediction", "feedback": "error feedback"}
#: the methods a run has by default (error feedback is asked for: ``--methods``)
DEFAULT_METHODS = ("stale", "predicted")
#: peak-rate grids per optimizer (grids.PEAK_LRS)
LRS = grids.PEAK_LRS
KEY = ("model", "method", "delay", "lr", "seed")
EDGE_BY = ("model", "method", "delay")


@dataclass(frozen=True)
class Config(Base):
    """constant_delay's configuration (``None``: the default of :meth:`resolved`)."""

    dataset: str = opt("shakespeare", "dataset name", choices=data.dataset_names, kind="dataset")
    batch_size: int = opt(16, "mini-batch size", low=1)
    model: tuple[str, ...] | None = opt(
        None,
        "model name(s) (default gpt-cpu, --quick gpt-tiny; on images mlp)",
        choices=models.model_names,
        kind="model",
    )  # fmt: skip
    optimizer: str = opt(
        "adamw", "the optimizer (jaxstale.optimizers.per_stage)", choices=OPTIMIZERS,
        kind="optimizer",
    )  # fmt: skip
    momentum: float = opt(0.9, "SGD momentum, Adam's β1 or Muon's β", low=0, high=1, high_open=True)
    delays: tuple[int, ...] | None = opt(
        None, "uniform delays τ (default 0,1,2,4,8,16; --quick 0,2)", low=0
    )
    stage_profiles: tuple[int, ...] | None = opt(
        None, "stage counts N of pipeline profiles τ_s = N − 1 − s (default none)", low=2
    )
    methods: tuple[str, ...] | None = opt(
        None,
        "stale, predicted and/or feedback (default stale,predicted)",
        choices=METHODS,
        kind="method",
    )
    steps: int | None = opt(None, "updates per run (default 2000; --quick 120)", low=2)
    lrs: tuple[float, ...] | None = opt(
        None, "peak-rate grid (default by optimizer: adamw 0.001,0.003,0.01)", low=0, low_open=True
    )
    extend_edges: int | None = opt(None, grids.EXTEND_HELP, low=0)
    tune_seeds: int | None = opt(None, grids.TUNE_HELP, low=1)
    eval_every: int | None = opt(None, EVAL_HELP, low=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        only_fixes = self.methods is not None and "stale" not in self.methods
        if only_fixes and not self.stage_profiles and self.delays == (0,):
            raise ConfigError(
                "methods", f"{','.join(self.methods)} at τ = 0 is the optimizer itself: add a delay"
            )
        steps = self.resolved_steps
        longest = [("delays", d) for d in self.delays or ()]
        longest += [("stage_profiles", n - 1) for n in self.stage_profiles or ()]
        for name, d in longest:  # a run with no gradient arriving was tabled as a result
            if d >= steps:
                raise ConfigError(
                    name, f"a delay of {d} updates is not shorter than the run ({steps} updates)"
                )

    @property
    def resolved_steps(self) -> int:
        """``--steps``, or the default: 2,000 updates (``--quick``: 120)."""
        return self.steps or (120 if self.quick else 2000)

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder)."""
        quick = self.quick
        steps = self.resolved_steps
        grid = LRS[self.optimizer]
        lrs = list(self.lrs or (grid[:2] if quick else grid))
        seeds = self.seeds or (2 if quick else 5)
        return {
            "quick": quick,
            "dataset": self.dataset,
            "standardize": self.standardize,
            # a GPT takes text; on an image dataset the default is the MLP (it was refused)
            "models": list(
                self.model or ((["gpt-tiny"] if quick else ["gpt-cpu"]) if self.text else ["mlp"])
            ),
            "optimizer": self.optimizer,
            "momentum": self.momentum,
            "delays": [str(d) for d in (self.delays or ((0, 2) if quick else (0, 1, 2, 4, 8, 16)))]
            + [f"stages-{n}" for n in self.stage_profiles or ()],
            "methods": list(self.methods or DEFAULT_METHODS),
            "lrs": lrs,
            "seeds": seeds,
            "steps": steps,
            "batch_size": self.batch_size,
            "eval_every": self.eval_every or (40 if quick else eval_every(None, steps)),
            "target": self.resolved_target,
            "extend_edges": grids.edge_limit(self),
            **grids.tune_seeds(self, seeds, [lrs]),
        }


def profile(delay: str) -> tuple[int, Any]:
    """``(stages, delay)`` of a delay label: ``"4"`` → ``(1, 4)``; ``"stages-8"`` →
    ``(8, [7, …, 0])``."""
    if delay.startswith("stages-"):
        n = int(delay.split("-")[1])
        return n, delayed.stage_profile(n)
    return 1, int(delay)


def label(delay: str) -> str:
    """A delay's column heading."""
    return f"τ_s = {profile(delay)[0]} − 1 − s" if delay.startswith("stages-") else f"τ = {delay}"


def _cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"model": m, "method": method, "delay": d, "lr": lr, "seed": seed}
        for m in cfg["models"]
        for d in cfg["delays"]
        for method in cfg["methods"]
        if method == "stale" or d != "0"  # a fix at τ = 0 is the optimizer itself: stale's run
        for lr in cfg["lrs"]
        for seed in grids.grid_seeds(cfg)
    ]


class _Runner:
    def __init__(self, cfg: dict[str, Any], ds: data.Dataset) -> None:
        self.cfg, self.ds, self.task = cfg, ds, task_of(ds)
        self.tx = optimizers.per_stage(cfg["optimizer"], 1.0, cfg["momentum"], cfg["steps"])
        self.computed = 0

    def _stages(self, name: str, n: int, seed: int) -> list[models.Functional]:
        m = models.create(
            name,
            input_shape=tuple(self.ds.x_train.shape[1:]),
            num_classes=self.ds.num_classes,
            seed=seed,
            task=self.ds.task,
            **gpt_kw(self.cfg),
        )
        return models.functional_stages(m, n)

    def group(self, keys: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict]]]:
        """Every pending rate and seed of one (model, method, delay), as vmapped lanes."""
        cfg, ds = self.cfg, self.ds
        name, method, delay = keys[0]["model"], keys[0]["method"], keys[0]["delay"]
        n, taus = profile(delay)
        inits = [self._stages(name, n, k["seed"]) for k in keys]
        stack = lambda trees: jax.tree.map(lambda *a: np.stack(a), *trees)
        params = stack([[f.params for f in fs] for fs in inits])
        states = stack([[f.state for f in fs] for fs in inits])
        idx = np.stack(
            [
                data.batch_indices(
                    len(ds.x_train),
                    batch_size=cfg["batch_size"],
                    num_steps=cfg["steps"],
                    seed=k["seed"],
                )
                for k in keys
            ]
        )
        clock = group_clock()
        # error feedback (Zmushko et al. 2026) wraps the optimizer: the paper's rule, c = 1
        tx = error_feedback(self.tx) if method == "feedback" else self.tx
        ex = delayed.executor(
            compose(inits[0]), tx, ds.x_train, ds.y_train, idx, delay=taus,
            predict=method == "predicted", vmap=True,
            hyperparams={"learning_rate": [k["lr"] for k in keys]},
        )  # fmt: skip
        results = loop.run(
            ex, params, states, eval_every=cfg["eval_every"], eval_data=splits(ds),
            metric=self.task.metric,
        )  # fmt: skip
        wall, cpu = clock(len(keys))
        self.computed += len(keys)
        speed = lm_throughput(name, ds, cfg["steps"], cfg["batch_size"], wall)
        log_throughput(EXPERIMENT, f"{name} {method} τ={delay}", len(keys), speed)
        out = []
        for res in results:
            row = {
                "optimizer": cfg["optimizer"],
                "momentum": cfg["momentum"],
                **outcome(res, cfg["target"], self.task),
                "steps": cfg["steps"],
                "batch_size": cfg["batch_size"],
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                **speed,
            }
            out.append((row, res.curve))
        return out


def gap_table(picked: list[dict[str, Any]], task: tasks.Task) -> str:
    """Each delay's paired test gap to ``τ = 0`` (every method at its own rate) and the fraction
    of the stale gap each fix (prediction, error feedback) closes."""
    value, scale = task.final("test"), task.scale
    present = {r["method"] for r in picked}
    methods = [m for m in METHODS if m in present]
    fixes = [m for m in methods if m != "stale"]
    body = []
    for model in dict.fromkeys(r["model"] for r in picked):
        base = [r for r in picked if (r["model"], r["delay"]) == (model, "0")]
        for delay in dict.fromkeys(r["delay"] for r in picked if r["model"] == model):
            if delay == "0" or not base:
                continue
            cells, means = [], {}
            for method in methods:
                rows = [
                    r
                    for r in picked
                    if (r["model"], r["delay"], r["method"]) == (model, delay, method)
                ]
                if not rows:
                    cells.append("–")
                    continue
                m, h, k = runs.paired_difference(rows, base, value=value)
                means[method] = m
                ci = f" ± {scale * h:.3f}" if k > 1 else ""  # one pair: no interval
                cells.append("–" if not k else f"{scale * m:+.3f}{ci} ({k})")
            closed = [
                f"{100 * (1 - means[f] / means['stale']):.0f} %"
                if f in means and means.get("stale") not in (None, 0)
                else "–"
                for f in fixes
            ]
            body.append([model, label(delay), *cells, *closed])
    heads = ["model", "delay", *(f"{m} − τ=0" for m in methods)]
    heads += [f"gap closed by {WORDS[f]}" for f in fixes]
    return runs.markdown_table(heads, body)


def make_table(
    rows: list[dict[str, Any]], cfg: dict[str, Any], chance_acc: float, task: tasks.Task
) -> tuple[str, dict[tuple[Any, ...], Any], list[dict[str, Any]]]:
    """The tuned tables, the paired differences and the gap table."""
    acc, ttime, grid, selected = reports.tuned_tables(
        rows, index=("model", "method"), columns="delay", chance_acc=chance_acc,
        col_label=label, task=task,
    )  # fmt: skip
    picked = reports.at_selected(rows, selected, by=EDGE_BY)
    o, m = optimizers.LABELS[cfg["optimizer"]], task.label
    head = (
        f"{cfg['dataset']}, {o} (β1/μ {cfg['momentum']}), {cfg['steps']} updates of "
        f"{cfg['batch_size']}, gradients τ updates stale, {cfg['seeds']} seeds"
    )
    parts = [
        title(cfg, f"**Test {m} at each (method, delay)'s rate selected on validation (mean ± "
              f"95 % CI over seeds that trained; [diverged/seeds]; @ lr), {head}**"),
        acc,
        f"**Updates until the validation {m.split()[0]} reaches {task.scale * cfg['target']:g} "
        "(median over seeds; [reached/seeds])**",
        ttime,
        f"**Validation {m} per rate (mean over seeds, diverged at chance; bold: selected)**",
        grid,
    ]  # fmt: skip
    lim = cfg.get("extend_edges", 0)
    edges = reports.edge_notes(
        rows, by=EDGE_BY, grid=cfg["lrs"], limit=lim, chance_acc=chance_acc, task=task
    )
    parts += [n for n in (edges, reports.tuning_note(cfg, task)) if n]
    present = [m for m in METHODS if m in {r["method"] for r in rows}]
    if "stale" in present and len(present) > 1:
        table, _ = reports.paired_table(
            [r for r in picked if r["delay"] != "0"], index=("model",), compare="method",
            baseline="stale", columns="delay", col_label=label, task=task,
        )  # fmt: skip
        fixes = ", ".join(f"{f} − stale" for f in present if f != "stale")
        parts += [f"**Paired test-{m.split()[0]} difference, {fixes} ({task.unit}; "
                  "95 % t interval over seeds)**", table]  # fmt: skip
    closes = " and ".join(WORDS[f] for f in present if f != "stale") or "a fix"
    parts += [
        f"**Gap to τ = 0 ({task.unit}; paired over seeds, each at its selected rate; (pairs)) "
        f"and the fraction of the stale gap {closes} closes**",
        gap_table(picked, task),
    ]
    return "\n\n".join(parts) + "\n", selected, picked


def make_figure(
    picked: list[dict[str, Any]], task: tasks.Task, levels: dict[str, float] | None = None
) -> Any:
    """The test metric at the selected rate against the delay, one line per method."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    delays = list(dict.fromkeys(r["delay"] for r in picked))
    methods = list(dict.fromkeys(r["method"] for r in picked))
    for method in methods:  # at τ = 0 every method is the optimizer itself: stale's runs
        want = lambda d, m=method: "stale" if d == "0" else m
        pts = [
            (i, [r for r in picked if (r["delay"], r["method"]) == (d, want(d))])
            for i, d in enumerate(delays)
        ]
        style = runs.method_style(method, methods)
        reports.accuracy_vs(ax, [(i, rs) for i, rs in pts if rs], method, style, task)
    ax.set_xticks(range(len(delays)), [label(d) for d in delays], rotation=20)
    ax.set_xlabel("gradient delay")
    if levels:
        runs.draw_levels(ax, levels)
    ax.set_ylabel(f"test {task.label} at the selected rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked: every model builds for the data, has the
    blocks its stage profiles cut, and the sweep fits in memory."""
    cfg = config.resolved()
    ds = load_checked(cfg, config, tasks.KINDS)
    most = max((profile(d)[0] for d in cfg["delays"]), default=1)
    need = {"stages": [most], "optimizer": cfg["optimizer"]}
    built = [
        check_staged_model("model", name, ds, {}, need, stages_field="stage_profiles")
        for name in cfg["models"]
    ]
    size = max(models.param_count(m) for m in built)
    taus = [delayed.capacity(profile(d)[1], predict=True) for d in cfg["delays"]]
    lanes = cfg["seeds"] * len(cfg["lrs"])
    # the backward's saved activations of one mini-batch per lane (a GPT at batch 4096 asked
    # for 219 GB and died in its first step, after 85 s, before this term)
    acts = max(_activation_bytes(m, ds, cfg["batch_size"]) for m in built)
    check_memory({"versions": 4.0 * size * (max(taus) + 4) * lanes, "batch_size": acts * lanes})
    return cfg, ds


def _activation_bytes(model: Any, ds: data.Dataset, batch: int) -> int:
    """What one training step's backward keeps for a mini-batch of ``batch`` examples
    (:func:`jaxstale.sizes.residual_bytes`, abstract shapes: nothing runs)."""
    f = models.functional(model)
    x = jax.ShapeDtypeStruct((batch, *ds.x_train.shape[1:]), ds.x_train.dtype)
    y = jax.ShapeDtypeStruct((batch, *ds.y_train.shape[1:]), ds.y_train.dtype)

    def loss(p: Any, x: Any, y: Any) -> Any:
        return losses.cross_entropy(f.apply(p, f.state, x, True)[0], y)

    return residual_bytes(loss, f.params, x, y)


def _open(config: Config, fresh: bool = False) -> tuple[dict, data.Dataset, runs.RunFolder]:
    return opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=fresh)


def run(config: Config) -> list[dict[str, Any]]:
    """Runs every (model, method, delay, lr, seed) cell not already in the run folder."""
    cfg, ds, folder = _open(config, fresh=True)
    runner = _Runner(cfg, ds)
    rows = grids.tuned_sweep(
        folder, _cells(cfg), runner.group, cfg, key=KEY, by=EDGE_BY, chance=chance(ds),
        task=task_of(ds),
    )  # fmt: skip
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
    levels = text_levels(cfg, config)
    table = with_levels(table, levels)
    figs = {"plot": make_figure(picked, task, curve_levels(levels))}
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    path = str(folder.path)
    return {"rows": rows, "paths": paths, "table": table, "selected": selected, "path": path}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
