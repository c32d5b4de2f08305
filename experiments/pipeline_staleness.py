"""Pipeline staleness: weight policies x pipeline depth on the emulated asynchronous 1F1B pipeline.

Question: in pipelined model parallelism without a flush (PipeDream's asynchronous 1F1B), stage
``k``'s forward pass is ``N - 1 - k`` updates stale and its backward pass sees other weights
still. How much accuracy does that cost as the pipeline deepens, and how much do weight stashing
(PipeDream), SpecTrain's weight prediction (v1, v2) and NAG prediction recover?

Setting: each model is split into ``N`` parameter-balanced stages and trained by
the pipeline emulator (:mod:`jaxstale.pipeline`) on the schedule ``one_f_one_b(N, steps)``
with SGD + momentum. Methods (the ``method`` field of summary.json):

* ``sync`` — every pass at the sequential target (GPipe with a flush): the data-parallel /
  sequential-SGD reference, identical for every ``N`` up to float rounding;
* ``vanilla`` — no stash: forward and backward at the weights current at their tick;
* ``stash`` — PipeDream weight stashing;
* ``spectrain-v1`` — SpecTrain prediction in both passes towards the round-trip target (the lab's
  horizons ``⌊k/2⌋ + N - k - 1`` / ``⌊k/2⌋``);
* ``spectrain-v2`` — one prediction per mini-batch at the forward, sequential target
  (``s = N - k - 1``, the lab's v2 horizon), backward at the current weights (see the emulator);
* ``nesterov`` — NAG prediction with spectrain-v1's horizons.

High momentum (0.9) and a large learning rate make staleness matter (ALGORITHMS.md §8: the
largest stable learning rate shrinks as the delay grows). A NaN/inf loss ends a run: it is
recorded ``diverged`` (with the step) and the sweep goes on.

Configurations (measured on the 2-core CPU box, shared with other jobs: CPU time is the
figure that does not depend on the load):

* default — MLP (7 hidden layers of 64: 8 blocks) at N ∈ {2, 4, 8}, CNN (LeNet-5 style, 5
  blocks: N = 8 impossible) at N ∈ {2, 4}, ResNet-20 (width 8) at N = 4 only (its rounds compile
  ~3x longer; ``--model resnet20`` runs N ∈ {2, 4, 8}); 3 seeds, 200 steps of batch 32, lr 0.01,
  momentum 0.9: 230–252 s CPU, 7.3–7.5 min wall.
* ``--quick`` — MLP and CNN at N ∈ {2, 4}, 3 seeds, 120 steps: 77–82 s CPU, 106 s wall (4 min
  when other jobs loaded the box to ~12).

Compilation dominates (one compiled round per model, depth and policy group; seeds and the
three prediction policies share it).

Outputs (run folder): summary.json rows (method, model, stages, seed, lr, momentum, target,
final_test_accuracy, diverged, diverged_step, final_train_loss, steps, wall_s), table.md (test
accuracy %, mean ± std over seeds, one row per model and method, one column per depth, like the
SpecTrain port's table), plot.png (learning curves at the deepest common depth, one panel per
model), gantt.png (the N = 4 asynchronous 1F1B schedule with weight versions).

Run: ``python -m experiments.pipeline_staleness [--quick] [--out DIR]``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import optax

from jaxstale import data, loop, models, pipeline, runs, schedules

EXPERIMENT = "pipeline_staleness"
DEFAULT_METHODS = ("sync", "vanilla", "stash", "spectrain-v1", "spectrain-v2", "nesterov")
MODEL_KW: dict[str, dict[str, Any]] = {
    "mlp": {"hidden": (64,) * 7},  # 8 blocks: splits into up to 8 stages
    "cnn": {},  # 5 blocks: at most 5 stages
    "resnet20": {"width": 8},  # 11 blocks; narrower than 16 to fit the CPU budget
}


def config_from_args(args: Any) -> dict[str, Any]:
    quick = bool(args.quick)
    methods = list(DEFAULT_METHODS) if not args.methods else args.methods.split(",")
    return {
        "dataset": args.dataset,
        "models": args.model or (["mlp", "cnn"] if quick else ["mlp", "cnn", "resnet20"]),
        "stages": [int(s) for s in args.stages.split(",")]
        if args.stages
        else ([2, 4] if quick else [2, 4, 8]),
        # ResNet-20 compiles 3x longer than the others: the default runs it at N = 4 only, to
        # stay within 10 minutes on 2 cores (`--model resnet20` runs every depth)
        "stages_by_model": {"resnet20": [4]} if not (quick or args.model or args.stages) else {},
        "methods": methods,
        "seeds": args.seeds or 3,
        "steps": args.steps or (120 if quick else 200),
        "batch_size": 32,
        "lr": args.lr,
        "momentum": args.momentum,
        "eval_every": 20,
        "backward": args.backward,
        "executor": args.executor,
        # what each policy is (a registered one's definition decides its results)
        "policies": {m: pipeline.POLICIES[m]._asdict() for m in methods if m in pipeline.POLICIES},
        "model_kw": {k: dict(v) for k, v in MODEL_KW.items()},
    }


class _Setup:
    """Per (model, stages): the split template model, the schedule and the optimizer, shared by
    every method and seed so that runs of one structure share a compiled round."""

    def __init__(self, cfg: dict[str, Any], ds: data.Dataset, model_name: str, n: int):
        self.cfg, self.ds, self.n, self.name = cfg, ds, n, model_name
        self.kw = cfg["model_kw"].get(model_name, {})
        self.shape = ds.x_train.shape[1:]
        template = models.create(
            model_name, input_shape=self.shape, num_classes=ds.num_classes, seed=0, **self.kw
        )
        self.stages = models.functional_stages(template, n)
        self.sched = schedules.one_f_one_b(n, cfg["steps"])
        self.tx = optax.sgd(cfg["lr"], momentum=cfg["momentum"] or None)

    def run(self, method: str, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        cfg = self.cfg
        t0 = time.perf_counter()
        model = models.create(
            self.name, input_shape=self.shape, num_classes=self.ds.num_classes, seed=seed, **self.kw
        )
        fs = models.functional_stages(model, self.n)
        xb, yb = data.batches(
            self.ds.x_train,
            self.ds.y_train,
            batch_size=cfg["batch_size"],
            num_steps=cfg["steps"],
            seed=seed,
        )
        ex = pipeline.make(
            cfg["executor"],
            self.stages,
            self.sched,
            method,
            self.tx,
            xb,
            yb,
            backward=cfg["backward"],
            momentum=cfg["momentum"],
        )
        (res,) = loop.run(
            ex,
            [f.params for f in fs],
            [f.state for f in fs],
            eval_every=cfg["eval_every"],
            eval_data=(self.ds.x_test, self.ds.y_test),
        )
        row = {
            "lr": cfg["lr"],
            "momentum": cfg["momentum"],
            "target": pipeline.get_policy(method).target,
            "final_test_accuracy": res.final_test_accuracy,
            "diverged": res.diverged,
            "diverged_step": res.diverged_step,
            "final_train_loss": None if res.diverged else res.curve[-1]["train_loss"],
            "steps": cfg["steps"],
            "wall_s": round(time.perf_counter() - t0, 2),
        }
        return row, res.curve


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runs.cli_parser(__doc__.splitlines()[0])
    p.add_argument("--stages", default=None, help="comma-separated stage counts (default 2,4,8)")
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated weight policies (registered: {', '.join(pipeline.POLICIES)})",
    )
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument(
        "--backward",
        default="recompute",
        choices=pipeline.BACKWARD_MODES,
        help="how a backward runs at other weights than its forward (jaxstale.pipeline.program)",
    )
    p.add_argument(
        "--executor",
        default="emulate",
        choices=pipeline.EXECUTORS,
        help="emulate: one device; mesh: one device per stage on a 'stage' axis "
        "(same program, same results). On a CPU, emulate devices with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=8",
    )
    args = p.parse_args(argv)
    cfg = config_from_args(args)
    for m in cfg["methods"]:
        pipeline.get_policy(m)  # raises for an unknown name, listing the registered ones
    ds = data.load(cfg["dataset"])
    run = runs.RunFolder(EXPERIMENT, cfg, out=args.out)
    t_start = time.perf_counter()
    keys = []
    for model_name in cfg["models"]:
        nblocks = len(
            models.create(
                model_name,
                input_shape=ds.x_train.shape[1:],
                num_classes=ds.num_classes,
                **cfg["model_kw"].get(model_name, {}),
            ).blocks
        )
        for n in cfg["stages_by_model"].get(model_name, cfg["stages"]):
            if n > nblocks:
                print(f"[{EXPERIMENT}] skipping {model_name} at N={n}: it has {nblocks} blocks")
                continue
            for method in cfg["methods"]:
                for seed in range(cfg["seeds"]):
                    keys.append({"model": model_name, "stages": n, "method": method, "seed": seed})
    setups: dict[tuple[str, int], _Setup] = {}

    def cell(key: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        sk = (key["model"], key["stages"])
        if sk not in setups:
            setups.clear()  # one (model, N) at a time: free the previous compiled rounds
            setups[sk] = _Setup(cfg, ds, *sk)
        return setups[sk].run(key["method"], key["seed"])

    rows = run.run(keys, cell)
    table = runs.mean_std_table(rows, index=("model", "method"), columns="stages")
    wall = time.perf_counter() - t_start
    # learning curves at the deepest depth every model ran at
    figs: dict[str, Any] = {}
    deepest = max(cfg["stages"])
    series_models = []
    for model_name in cfg["models"]:
        ns = [r["stages"] for r in rows if r["model"] == model_name]
        if ns:
            series_models.append((model_name, max(ns)))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0 * max(1, len(series_models)), 3.8), layout="constrained")
    axes = fig.subplots(1, max(1, len(series_models)), squeeze=False)[0]
    for ax, (model_name, n) in zip(axes, series_models, strict=False):
        for method in cfg["methods"]:
            curves = []
            for seed in range(cfg["seeds"]):
                ms = run.metrics({"model": model_name, "stages": n, "method": method, "seed": seed})
                if ms:
                    curves.append(ms)
            by: dict[int, list[float]] = {}
            for c in curves:
                for rec in c:
                    if rec.get("test_accuracy") is not None:
                        by.setdefault(rec["step"], []).append(rec["test_accuracy"])
            if by:
                xs = sorted(by)
                ax.plot(
                    xs,
                    [100 * np.mean(by[x]) for x in xs],
                    label=method,
                    ls="--" if method == "sync" else "-",
                )
        ax.set_title(f"{model_name}, N={n} stages (async 1F1B)")
        ax.set_xlabel("step (mini-batches)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    figs["plot"] = fig
    figs["gantt"] = schedules.render(schedules.one_f_one_b(4, 8))
    header = (
        f"Test accuracy (%) on {cfg['dataset']}, mean ± std over {cfg['seeds']} seeds, "
        f"{cfg['steps']} steps of batch {cfg['batch_size']}, SGD lr {cfg['lr']} momentum "
        f"{cfg['momentum']}, asynchronous 1F1B with N stages (sync: GPipe flush), "
        f"backward={cfg['backward']}. "
        f"Wall time {wall:.0f} s (deepest N = {deepest}).\n\n"
    )
    run.finish(header + table, figs)
    print(header + table)
    print(f"[{EXPERIMENT}] wrote {run.path}")
    return {"rows": rows, "table": table, "path": str(run.path), "wall_s": wall}


if __name__ == "__main__":
    main()
