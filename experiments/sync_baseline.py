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

Run: ``python -m experiments.sync_baseline [--quick] [--out DIR] [--model mlp,cnn] [--lrs ...]``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import optax

from jaxstale import data, models, runs

from .common import (
    chance,
    convergence,
    fit_grid,
    load_checked,
    opened,
    title,
)
from .config import Base, check_memory, check_model, cli, opt
from .grids import EXTEND_HELP, TUNE_HELP, edge_limit, grid_seeds, tune_seeds
from .reports import edge_notes, tuned_tables, tuning_note

EXPERIMENT = "sync_baseline"
METHOD = "sgd"
MODELS = ["mlp", "cnn"]
LRS = [0.001, 0.003, 0.01, 0.03, 0.1]  # async_workers' grid at momentum 0.9
QUICK_LRS = [0.01, 0.03]
KEY = ("method", "model", "lr", "seed")


@dataclass(frozen=True)
class Config(Base):
    """sync_baseline's configuration: :class:`~experiments.config.Base` plus its own fields.
    ``None`` fields take the defaults of :meth:`resolved` (which depend on ``quick``)."""

    model: tuple[str, ...] | None = opt(
        None, "model name(s) (default mlp,cnn)", choices=models.model_names, kind="model"
    )
    steps: int | None = opt(None, "training steps per run (default 1500; --quick 200)", low=1)
    lrs: tuple[float, ...] | None = opt(
        None,
        "learning-rate grid; each model uses the rate with the best validation accuracy "
        "(default 0.001,0.003,0.01,0.03,0.1; --quick 0.01,0.03)",
        low=0,
        low_open=True,
    )
    extend_edges: int | None = opt(None, EXTEND_HELP, low=0)
    tune_seeds: int | None = opt(None, TUNE_HELP, low=1)
    momentum: float = opt(0.9, "SGD momentum", low=0, high=1, high_open=True)
    eval_every: int | None = opt(None, "steps between evaluations (default 50; --quick 20)", low=1)
    flat_tol: float = opt(
        0.01,
        "'flat since step Z': the mean validation accuracy stays within this of its last-third "
        "plateau from Z on",
        low=0,
        high=1,
        low_open=True,
    )

    def resolved(self) -> dict[str, Any]:
        """The run's config (everything that decides its results; its hash names the folder),
        the defaults filled in."""
        quick = self.quick
        lrs, seeds = (
            list(self.lrs or (QUICK_LRS if quick else LRS)),
            self.seeds or (2 if quick else 5),
        )
        return {
            "quick": quick,
            "dataset": self.dataset,
            "standardize": self.standardize,
            "models": list(self.model or MODELS),
            "lrs": lrs,
            "seeds": seeds,
            "steps": self.steps or (200 if quick else 1500),
            "batch_size": self.batch_size,
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
    rows: list[dict], selected: dict, curves_of: Any, cfg: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per model, at the rate selected on validation: the test accuracy (mean, CI, seeds,
    diverged), the convergence evidence (:func:`experiments.common.convergence` on the
    validation curves) and the updates to the target."""
    out = {}
    for model in cfg["models"]:
        if (model,) not in selected:
            continue
        lr = selected[(model,)]
        pick = [r for r in rows if r["model"] == model and r["lr"] == lr]
        trained = [r["final_test_accuracy"] for r in pick if not r["diverged"]]
        out[model] = {
            "lr": lr,
            "test": runs.mean_ci(trained),
            "test_text": runs.format_ci(
                [r["final_test_accuracy"] for r in pick], diverged=[r["diverged"] for r in pick]
            ),
            "val_text": runs.format_ci(
                [r["final_val_accuracy"] for r in pick], diverged=[r["diverged"] for r in pick]
            ),
            "steps_text": runs.format_steps([r.get("updates_to_target") for r in pick]),
            "convergence": convergence(curves_of(model, lr), tol=cfg["flat_tol"]),
        }
    return out


def summarise(
    rows: list[dict], cfg: dict[str, Any], curves_of: Any, chance_acc: float
) -> tuple[str, dict, dict[str, dict[str, Any]]]:
    """Selection on validation and the tables: ``(table, selected, reference)``.

    ``curves_of(model, lr)`` gives the seeds' metric records at that rate; ``selected`` maps
    ``(model,)`` to the rate with the best mean final validation accuracy (diverged seeds at
    ``chance_acc``); ``reference`` is :func:`reference`'s."""
    _, _, grid, selected = tuned_tables(rows, index=("model",), columns=None, chance_acc=chance_acc)
    ref = reference(rows, selected, curves_of, cfg)
    lim = cfg.get("extend_edges", 0)
    notes = edge_notes(rows, by=("model",), grid=cfg["lrs"], limit=lim, chance_acc=chance_acc)
    notes = "\n\n".join(n for n in (notes, tuning_note(cfg)) if n)
    return make_table(rows, cfg, ref, grid + ("\n\n" + notes if notes else "")), selected, ref


def make_table(rows: list[dict], cfg: dict[str, Any], ref: dict, grid: str) -> str:
    """The reference sentences, the table at the selected rates and the validation grid."""
    setting = (
        f"SGD-momentum {cfg['momentum']}, {cfg['dataset']} (standardised; validation split for "
        f"selection), batch {cfg['batch_size']}, {cfg['steps']} steps, {cfg['seeds']} seeds"
    )
    sentences, body = [], []
    tol = 100 * cfg["flat_tol"]
    points = f"{tol:g} point" + ("" if tol == 1 else "s")
    for model, r in ref.items():
        conv = r["convergence"]
        flat = (
            f"flat since step {conv['flat_since']}"
            if conv["flat_since"] is not None
            else "**not flat at the end**"
        )
        m, h, n = conv["delta_last_third"]
        delta = "–" if not n else f"{100 * m + 0.0:+.2f}" + (f" ± {100 * h:.2f}" if n > 1 else "")
        sentences.append(
            f"- sync {model.upper()} reaches **{r['test_text']} % test** at lr {r['lr']:g} "
            f"(selected on validation), {flat} (validation within {points} of its "
            f"last-third plateau; change over the last third {delta} points)."
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
    heads = [
        "model",
        "lr (selected on val.)",
        "test acc. %",
        "val. acc. %",
        f"updates to {100 * cfg['target']:g} % val.",
        "Δ val. over last third (points)",
        f"flat since step (±{tol:g} pt)",
    ]
    return (
        "\n\n".join(
            [
                title(cfg, f"**Synchronous reference: {setting}**"),
                "\n".join(sentences),
                "**At the learning rate selected on validation: test accuracy % (mean ± 95 % CI "
                "over seeds that trained; [diverged/seeds]), validation accuracy %, updates until "
                "the validation accuracy first reaches the target (median; [reached/seeds]), "
                "change of validation accuracy over the last third of training (mean ± 95 % CI "
                "over seeds), first step of the flat stretch**",
                runs.markdown_table(heads, body),
                "**Validation accuracy % per learning rate (mean over seeds, diverged seeds at "
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
    ds = load_checked(cfg, config)
    params = max(check_model("model", m, ds) for m in cfg["models"])
    lanes = cfg["seeds"] * len(cfg["lrs"])
    check_memory(
        {
            "model": 4.0 * params * 4 * lanes,  # weights, gradient, momentum, update
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
      jaxstale.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, ds, folder = _open(config, fresh=True)
    mu = cfg["momentum"]
    return fit_grid(
        folder,
        lambda lr: optax.sgd(lr, momentum=mu),
        ds,
        method=METHOD,
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
    )


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Writes the table, the figure and the summary into the run folder; returns ``{"rows",
    "paths", "table", "selected", "reference", "run"}``."""
    cfg, ds, folder = _open(config)
    curves_of = lambda m, lr: _curves(folder, rows, m, lr)
    table, selected, ref = summarise(rows, cfg, curves_of, chance(ds))
    series = {
        model: {
            f"lr {lr:g}" + (" (selected)" if ref.get(model, {}).get("lr") == lr else ""): _curves(
                folder, rows, model, lr
            )
            for lr in dict.fromkeys(r["lr"] for r in rows if r["model"] == model)
        }
        for model in cfg["models"]
    }
    fig = runs.curves_figure(
        series,
        ys=("train_loss", "val_accuracy"),
        title=f"Synchronous SGD-momentum {cfg['momentum']} on {cfg['dataset']}: validation "
        "curves per rate",
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
    main()
