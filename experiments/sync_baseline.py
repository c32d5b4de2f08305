"""Synchronous SGD baseline: SGD-momentum with the MLP and the CNN over a learning-rate grid.

This is the reference every staleness experiment compares against: plain synchronous training
(staleness 0), one ``(model, lr, seed)`` cell at a time, recorded in a run folder
(``results/sync_baseline/<run-id>/``: config.json, metrics.jsonl, summary.json, table.md,
plot.png). Re-running the same configuration skips finished cells.

    python -m experiments.sync_baseline          # 2 models x 4 lrs x 3 seeds, < 3 min, 2 cores
    python -m experiments.sync_baseline --quick  # 2 lrs x 2 seeds, short runs
    python -m experiments.sync_baseline --model mlp --lrs 0.1 0.3 --steps 1000 --out /tmp/run

Rows of summary.json: ``method="sgd"``, ``model``, ``lr``, ``seed``, ``final_test_accuracy``
(null if diverged), ``diverged``, ``diverged_step``, ``steps``, ``batch_size`` and more.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import optax

from jaxstale import data
from jaxstale.runs import RunFolder, cli_parser, curves_figure, mean_std_table

from .common import fit_grid

EXPERIMENT = "sync_baseline"
DEFAULTS = {
    "models": ["mlp", "cnn"],
    "lrs": [0.01, 0.03, 0.1, 0.3],
    "seeds": 3,
    "steps": 600,
    "batch_size": 64,
    "momentum": 0.9,
}
QUICK = {"lrs": [0.03, 0.1], "seeds": 2, "steps": 100}


def config_from_args(argv: Sequence[str] | None = None) -> dict:
    """Parses the command line into the run's config (the dict that names the run folder).

    Args:
      argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
      The config dict (plus ``"out"``, which is not part of the run-id).
    """
    p = cli_parser(__doc__.splitlines()[0])
    p.add_argument("--lrs", type=float, nargs="+", default=None, help="learning-rate grid")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default 64)")
    p.add_argument("--eval-every", type=int, default=None, help="steps between evaluations")
    args = p.parse_args(argv)
    base = {**DEFAULTS, **(QUICK if args.quick else {})}
    steps = args.steps or base["steps"]
    config = {
        "dataset": args.dataset,
        "models": args.model or base["models"],
        "lrs": args.lrs or base["lrs"],
        "seeds": args.seeds or base["seeds"],
        "steps": steps,
        "batch_size": args.batch_size or base["batch_size"],
        "eval_every": args.eval_every or max(1, steps // 20),
        "momentum": base["momentum"],
    }
    return {**config, "out": args.out}


def main(argv: Sequence[str] | None = None) -> RunFolder:
    """Runs the experiment; prints the table and the paths of table.md and plot.png.

    Args:
      argv: command-line arguments (see ``--help``).

    Returns:
      The :class:`jaxstale.runs.RunFolder` written.
    """
    start = time.perf_counter()
    config = config_from_args(argv)
    out = config.pop("out")
    run = RunFolder(EXPERIMENT, config, out=out)
    ds = data.load(config["dataset"])
    momentum = config["momentum"]
    rows = fit_grid(
        run,
        lambda lr: optax.sgd(lr, momentum=momentum),
        ds,
        method="sgd",
        models=config["models"],
        lrs=config["lrs"],
        seeds=config["seeds"],
        steps=config["steps"],
        batch_size=config["batch_size"],
        eval_every=config["eval_every"],
    )
    table = mean_std_table(rows, index=("model",), columns="lr")
    title = (
        f"Synchronous SGD-momentum ({momentum}) on {config['dataset']}: test accuracy (%), "
        f"mean ± std over {config['seeds']} seeds, {config['steps']} steps of batch "
        f"{config['batch_size']}"
    )
    series = {
        model: {
            f"lr={lr}": [
                run.metrics({"method": "sgd", "model": model, "lr": float(lr), "seed": s}) or []
                for s in range(config["seeds"])
            ]
            for lr in config["lrs"]
        }
        for model in config["models"]
    }
    fig = curves_figure(series, title=f"SGD-momentum on {config['dataset']}")
    paths = run.finish(f"{title}\n\n{table}\n", {"plot": fig})
    print(f"\n{title}\n\n{table}\n")
    print(f"table: {paths['table']}")
    print(f"plot:  {paths['plot']}")
    print(f"({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return run


if __name__ == "__main__":
    main()
