"""Synchronous SGD baseline: the converged staleness-free reference, lr chosen on validation.

Question: how well does plain synchronous SGD-momentum (staleness 0) do on the experiments'
data and models, at its own best learning rate and with a budget long enough to have
converged? Every staleness experiment compares with this number, so the table says it in one
sentence per model: "sync MLP reaches X ± CI % test at lr Y (selected on validation), flat
since step Z".

Protocol (the experiments' common one, ``experiments/common.py``): standardised inputs
(training-set statistics) and a validation split carved from the training set; every model runs
a learning-rate grid (``--lrs``) over ``--seeds`` seeds; the rate is **selected on validation
accuracy** (a diverged seed counts at chance) and the table reports **test accuracy at the
selected rate** (mean ± 95 % CI over the seeds that trained, diverged fraction in the cell).
A rate selected at an edge of the grid extends that model's grid (``--extend-edges``,
:func:`experiments.grids.extend_grid`); the table says what was added. Time to accuracy:
updates until the validation accuracy first reaches ``--target``.
**Convergence evidence**, on validation at the selected rate: the change of each seed's
validation accuracy over the last third of training (mean ± 95 % CI; an interval around 0 is a
flat curve), and "flat since step Z": the first evaluation from which the seeds' mean
validation accuracy stays within ``--flat-tol`` (1 point) of its last-third plateau
(:func:`experiments.common.convergence`).

Setting: :func:`jaxstale.train.fit` (``experiments.common.fit_grid``), digits, the MLP and the
CNN, SGD with momentum 0.9, batch 32 (as the other experiments), 1,500 steps (37 epochs of the
1,295 training examples), evaluated every 50 steps, 5 seeds; a seed fixes the initial weights
and the data order (the asynchronous experiments' lanes use the same ones). Rates
{0.001, 0.003, 0.01, 0.03, 0.1}, async_workers' grid (0.1 already fails for both models at
batch 32; 0.3, measured too, fails as well).

Speed: the default is 2 models × 5 rates × 5 seeds = 50 runs; the MLP's seeds run vmapped in a
scan (≈ 10 s of CPU per rate), the CNN's one after the other in a host loop
(``train.default_strategy``; ≈ 40 s of CPU per rate). About 3.5 minutes of CPU time (user +
sys); the wall time on 2 idle cores is at most that (the box was shared when measured: the
wall time there was about 2.5x the CPU time). The budget is what convergence needs, well
under the experiments' 10-minute ceiling.
``--quick`` (2 rates, 2 seeds, 200 steps) is a smoke run: 27 s of CPU, a minute of wall time on
the loaded box, marked as such in its table.

Outputs (run folder ``results/sync_baseline/<run-id>/`` or ``--out``): config.json,
metrics.jsonl (the curves: step, train_loss, val_accuracy, test_accuracy), summary.json rows
(method="sgd", model, lr, seed, final_val_accuracy, final_test_accuracy, updates_to_target,
diverged, diverged_step, final_train_loss, steps, batch_size, ...), table.md (the reference
sentences; test accuracy and convergence at the selected rate; the validation grid), plot.png
(validation accuracy and training loss per rate, one row per model). Re-running the same
configuration skips finished cells.

**Language models** (issue 23): ``--dataset shakespeare`` trains the ``gpt-cpu`` GPT (8 blocks
× 64; ``--quick``: ``gpt-tiny``) with the language-model AdamW (β2 0.95, decay 0.1, warm-up +
cosine; ``--optimizer`` any of :data:`OPTIMIZERS`), batch 16, 1,000 updates (the LM claims'
budget), rates {0.001, 0.003, 0.01}; every number is then a mean next-token loss in nats
(lower is better, selected on the lowest validation loss, a run not below ``log V`` counted as
diverged), ``--flat-tol`` is in nats, and the sentence and the figure give the corpus's count
unigram / bigram / trigram levels on the test split (:func:`jaxstale.text.reference_losses`).

Run: ``python -m experiments.sync_baseline [--quick] [--out DIR] [--model mlp,cnn] [--lrs ...]``;
``python -m experiments.sync_baseline --dataset shakespeare [--quick]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import optax

from jaxstale import data, models, optimizers, tasks

from . import runs
from .common import (
    chance,
    convergence,
    curve_levels,
    fit_grid,
    load_checked,
    opened,
    task_of,
    text_levels,
    title,
)
from .config import Base, check_memory, check_model, cli, opt
from .grids import EXTEND_HELP, PEAK_LRS, TUNE_HELP, edge_limit, grid_seeds, tune_seeds
from .precision import gpt_kw
from .reports import edge_notes, tuned_tables, tuning_note

EXPERIMENT = "sync_baseline"
MODELS = ["mlp", "cnn"]
#: MNIST-1D's signals are sequences (40, 1): its convolution is the 1-D one (cnn was refused)
MODELS_1D = ["mlp", "cnn1d"]
LRS = [0.001, 0.003, 0.01, 0.03, 0.1]  # async_workers' grid at momentum 0.9
QUICK_LRS = [0.01, 0.03]
#: the optimizers (:func:`jaxstale.optimizers.per_stage`; ``sgd`` is ``optax.sgd``)
OPTIMIZERS = optimizers.PER_STAGE
KEY = ("method", "model", "lr", "seed")


@dataclass(frozen=True)
class Config(Base):
    """sync_baseline's configuration: :class:`~experiments.config.Base` plus its own fields.
    ``None`` fields take the defaults of :meth:`resolved` (which depend on ``quick``)."""

    model: tuple[str, ...] | None = opt(
        None, "model name(s) (default mlp,cnn; a text: gpt-cpu, --quick gpt-tiny)",
        choices=models.model_names, kind="model",
    )  # fmt: skip
    optimizer: str | None = opt(
        None, "the optimizer (default sgd; a text: adamw)", choices=OPTIMIZERS, kind="optimizer"
    )
    batch_size: int | None = opt(None, "mini-batch size (default 32; a text: 16)", low=1)
    steps: int | None = opt(
        None, "training steps per run (default 1500, a text 1000; --quick 200, 120)", low=1
    )
    lrs: tuple[float, ...] | None = opt(
        None,
        "learning-rate grid; each model uses the rate with the best validation metric "
        "(default 0.001,0.003,0.01,0.03,0.1; --quick 0.01,0.03; a text: 0.001,0.003,0.01 "
        "for Adam-family optimizers)",
        low=0,
        low_open=True,
    )
    extend_edges: int | None = opt(None, EXTEND_HELP, low=0)
    tune_seeds: int | None = opt(None, TUNE_HELP, low=1)
    momentum: float = opt(0.9, "SGD momentum, Adam's β1 or Muon's β", low=0, high=1, high_open=True)
    eval_every: int | None = opt(None, "steps between evaluations (default 50; --quick 20)", low=1)
    flat_tol: float = opt(
        0.01,
        "'flat since step Z': the mean validation metric stays within this of its last-third "
        "plateau from Z on (accuracy as a fraction; a text's loss in nats)",
        low=0,
        high=1,
        low_open=True,
    )

    def resolved(self) -> dict[str, Any]:
        """The run's config (everything that decides its results; its hash names the folder),
        the defaults filled in (a text's: a GPT, AdamW, batch 16, 1,000 updates)."""
        quick, lm = self.quick, self.text
        name = self.task_optimizer(self.optimizer)
        if name == "sgd" and not lm:  # the image experiments' SGD-momentum grid
            grid = QUICK_LRS if quick else LRS
        else:
            grid = PEAK_LRS[name][:2] if quick else PEAK_LRS[name]
        lrs, seeds = list(self.lrs or grid), self.seeds or (2 if quick else 5)
        steps = self.steps or ((120 if quick else 1000) if lm else (200 if quick else 1500))
        images = MODELS_1D if self.dataset == "mnist1d" else MODELS
        models_ = (["gpt-tiny"] if quick else ["gpt-cpu"]) if lm else images
        return {
            "quick": quick,
            "dataset": self.dataset,
            "standardize": self.standardize,
            "models": list(self.model or models_),
            "optimizer": name,
            "lrs": lrs,
            "seeds": seeds,
            "steps": steps,
            "batch_size": self.batch_size or (16 if lm else 32),
            "eval_every": self.eval_every or (20 if quick else 50),
            "momentum": self.momentum,
            "target": self.resolved_target,
            "flat_tol": self.flat_tol,
            "extend_edges": edge_limit(self),
            **tune_seeds(self, seeds, [lrs]),
        }


def _curves(run: runs.RunFolder, rows: list[dict], model: str, lr: float) -> list[list[dict]]:
    return [
        run.metrics({k: r[k] for k in KEY}) or []
        for r in rows
        if r["model"] == model and r["lr"] == lr
    ]


def reference(
    rows: list[dict],
    selected: dict,
    curves_of: Any,
    cfg: dict[str, Any],
    task: tasks.Task = tasks.DEFAULT,
) -> dict[str, dict[str, Any]]:
    """Per model, at the rate selected on validation: the test metric (mean, CI, seeds,
    diverged), the convergence evidence (:func:`experiments.common.convergence` on the
    validation curves) and the updates to the target."""
    out = {}
    fmt = {"scale": task.scale, "digits": task.digits}
    for model in cfg["models"]:
        if (model,) not in selected:
            continue
        lr = selected[(model,)]
        pick = [r for r in rows if r["model"] == model and r["lr"] == lr]
        div = [r["diverged"] for r in pick]
        trained = [r[task.final("test")] for r in pick if not r["diverged"]]
        out[model] = {
            "lr": lr,
            "test": runs.mean_ci(trained),
            "test_text": runs.format_ci([r[task.final("test")] for r in pick], diverged=div, **fmt),
            "val_text": runs.format_ci([r[task.final("val")] for r in pick], diverged=div, **fmt),
            "steps_text": runs.format_steps([r.get("updates_to_target") for r in pick]),
            "convergence": convergence(
                curves_of(model, lr), key=task.key("val"), tol=cfg["flat_tol"]
            ),
        }
    return out


def summarise(
    rows: list[dict],
    cfg: dict[str, Any],
    curves_of: Any,
    chance_acc: float,
    task: tasks.Task = tasks.DEFAULT,
    levels: dict[str, float] | None = None,
) -> tuple[str, dict, dict[str, dict[str, Any]]]:
    """Selection on validation and the tables: ``(table, selected, reference)``.

    ``curves_of(model, lr)`` gives the seeds' metric records at that rate; ``selected`` maps
    ``(model,)`` to the rate with the best mean final validation metric (diverged seeds at
    ``chance_acc``); ``reference`` is :func:`reference`'s; ``levels``: a text's reference
    losses (:func:`experiments.common.text_levels`), quoted beside its loss."""
    _, _, grid, selected = tuned_tables(
        rows, index=("model",), columns=None, chance_acc=chance_acc, task=task
    )
    ref = reference(rows, selected, curves_of, cfg, task)
    lim = cfg.get("extend_edges", 0)
    notes = edge_notes(
        rows, by=("model",), grid=cfg["lrs"], limit=lim, chance_acc=chance_acc, task=task
    )
    notes = "\n\n".join(n for n in (notes, tuning_note(cfg, task)) if n)
    grid += "\n\n" + notes if notes else ""
    return make_table(rows, cfg, ref, grid, task, levels), selected, ref


def _optimizer_text(cfg: dict[str, Any]) -> str:
    name = cfg.get("optimizer", "sgd")
    return f"SGD-momentum {cfg['momentum']}" if name == "sgd" else optimizers.LABELS[name]


def make_table(
    rows: list[dict],
    cfg: dict[str, Any],
    ref: dict,
    grid: str,
    task: tasks.Task = tasks.DEFAULT,
    levels: dict[str, float] | None = None,
) -> str:
    """The reference sentences, the table at the selected rates and the validation grid."""
    acc = task.metric == "accuracy"
    opt_text = _optimizer_text(cfg)
    unit = "token" if cfg["dataset"] == "tokens" else "character"
    data_text = "standardised" if acc else f"next {unit}"
    setting = (
        f"{opt_text}, {cfg['dataset']} ({data_text}; validation split for "
        f"selection), batch {cfg['batch_size']}, {cfg['steps']} steps, {cfg['seeds']} seeds"
    )
    sentences, body = [], []
    tol = task.scale * cfg["flat_tol"]
    if acc:
        points = f"{tol:g} point" + ("" if tol == 1 else "s")
        unit, cell, test_unit = "points", 2, "% test"
    else:
        points, unit, cell, test_unit = f"{tol:g} nats", "nats", 3, "nats test"
    for model, r in ref.items():
        conv = r["convergence"]
        flat = (
            f"flat since step {conv['flat_since']}"
            if conv["flat_since"] is not None
            else "**not flat at the end**"
        )
        m, h, n = conv["delta_last_third"]
        sc = task.scale
        delta = "–" if not n else f"{sc * m + 0.0:+.{cell}f}"
        delta += f" ± {sc * h:.{cell}f}" if n > 1 else ""
        refs = ""
        if not acc and levels:
            grams = ", ".join(f"{k} {v:.3f}" for k, v in levels.items() if k != "uniform")
            refs = f" (n-gram levels: {grams}; uniform {task.chance:.3f} nats)"
        sentences.append(
            f"- sync {model.upper()} reaches **{r['test_text']} {test_unit}**{refs} at lr "
            f"{r['lr']:g} (selected on validation), {flat} (validation within {points} of its "
            f"last-third plateau; change over the last third {delta} {unit})."
        )
        body.append(
            [
                model,
                f"{r['lr']:g}",
                r["test_text"],
                r["val_text"],
                r["steps_text"],
                delta,
                "not flat" if conv["flat_since"] is None else str(conv["flat_since"]),
            ]
        )
    word = "accuracy" if acc else "loss"
    short = "acc. %" if acc else "loss (nats)"
    target = f"{100 * cfg['target']:g} % val." if acc else f"val. loss {cfg['target']:g}"
    heads = [
        "model",
        "lr (selected on val.)",
        f"test {short}",
        f"val. {short}",
        f"updates to {target}",
        f"Δ val. over last third ({unit})",
        f"flat since step (±{tol:g} {'pt' if acc else 'nats'})",
    ]
    return (
        "\n\n".join(
            [
                title(cfg, f"**Synchronous reference: {setting}**"),
                "\n".join(sentences),
                f"**At the learning rate selected on validation: test {task.label} (mean ± 95 % "
                f"CI over seeds that trained; [diverged/seeds]), validation {task.label}, updates "
                f"until the validation {word} first reaches the target (median; [reached/seeds]), "
                f"change of validation {word} over the last third of training (mean ± 95 % CI "
                "over seeds), first step of the flat stretch**",
                runs.markdown_table(heads, body),
                f"**Validation {task.label} per learning rate (mean over seeds, diverged seeds at "
                "chance; bold: selected)**",
                grid,
            ]
        )
        + "\n"
    )


def _prepare(config: Config) -> tuple[dict[str, Any], data.Dataset]:
    """The resolved config and its dataset, checked against each other (model fits the data,
    batch fits the training set, the sweep fits in memory)."""
    cfg = config.resolved()
    ds = load_checked(cfg, config, tasks.KINDS)
    name = cfg["optimizer"]
    params = max(check_model("model", m, ds, optimizer=name) for m in cfg["models"])
    lanes = cfg["seeds"] * len(cfg["lrs"])
    state = 4 if name == "sgd" else 5  # weights, gradient, update + momentum (+ Adam's ν)
    check_memory(
        {
            "model": 4.0 * params * state * lanes,
            "steps": 8.0 * cfg["steps"] * (cfg["batch_size"] + 2) * lanes,
        },
    )
    return cfg, ds


def _open(config: Config, fresh: bool = False) -> tuple[dict, data.Dataset, runs.RunFolder]:
    return opened(EXPERIMENT, config, sys.modules[__name__], _prepare, fresh=fresh)


def run(config: Config) -> list[dict[str, Any]]:
    """Trains every (model, rate, seed) cell not already in the run folder; returns the rows.

    Raises:
      ConfigError: a value that does not fit the data or the machine (names the field).
      experiments.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, ds, folder = _open(config, fresh=True)
    mu, name = cfg["momentum"], cfg["optimizer"]
    return fit_grid(
        folder,
        tx_factory(name, mu, cfg["steps"]),
        ds,
        method=name,
        models=cfg["models"],
        lrs=cfg["lrs"],
        seeds=grid_seeds(cfg),
        steps=cfg["steps"],
        batch_size=cfg["batch_size"],
        eval_every=cfg["eval_every"],
        target=cfg["target"],
        extend_edges=cfg["extend_edges"],
        chance=chance(ds),
        confirm_seeds=cfg["seeds"],
        task=task_of(ds),
        **({"model_kwargs": kw} if (kw := gpt_kw(cfg)) else {}),
    )


def tx_factory(name: str, momentum: float, steps: int) -> Any:
    """``lr -> optimizer``: ``optax.sgd(lr, momentum)`` for ``sgd``, else
    :func:`jaxstale.optimizers.per_stage` (a language model's AdamW: warm-up + cosine over
    ``steps``)."""
    if name == "sgd":
        return lambda lr: optax.sgd(lr, momentum=momentum)
    return lambda lr: optimizers.per_stage(name, lr, momentum, steps)


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Writes the table, the figure and the summary into the run folder; returns ``{"rows",
    "paths", "table", "selected", "reference", "run"}``."""
    cfg, ds, folder = _open(config)
    task = task_of(ds)
    curves_of = lambda m, lr: _curves(folder, rows, m, lr)
    levels = None if task.metric == "accuracy" else text_levels(cfg, config)
    table, selected, ref = summarise(rows, cfg, curves_of, chance(ds), task, levels)
    series = {
        model: {
            f"lr {lr:g}" + (" (selected)" if ref.get(model, {}).get("lr") == lr else ""): _curves(
                folder, rows, model, lr
            )
            for lr in dict.fromkeys(r["lr"] for r in rows if r["model"] == model)
        }
        for model in cfg["models"]
    }
    opt_text = _optimizer_text(cfg)
    fig = runs.curves_figure(
        series,
        ys=("train_loss", task.key("val")),
        title=f"Synchronous {opt_text} on {cfg['dataset']}: validation curves per rate",
        levels=curve_levels(levels),
    )
    paths = folder.report(table, {"plot": fig}, num_runs=len(rows), started=started)
    return {
        "rows": rows,
        "paths": paths,
        "table": table,
        "selected": selected,
        "reference": ref,
        "run": folder,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    from jaxstale._program import run_as_program

    run_as_program(main)
