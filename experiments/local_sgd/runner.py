"""The runs of :mod:`experiments.local_sgd`: each method's outer optimizer and jobs, and one
(model, method, M, H) group of rates and seeds trained at once (vmapped lanes, or one run after
another on the mesh)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax

from jaxstale import data, localsgd, loop, models, optimizers
from jaxstale.transforms.lookahead import momentum_lookahead
from jaxstale.transforms.outer import cgad, delayed_nesterov, staleness_weight

from .. import runs, starts
from ..common import group_clock, outcome, splits, task_of
from ..precision import gpt_kw
from ..throughput import lm_throughput, log_throughput


def outer_tx(method: str, workers: int, lr: float = 1.0) -> Any:
    """The outer optimizer of a method at rate ``lr`` (lanes set their own ``learning_rate``)."""
    nesterov = optax.inject_hyperparams(optax.sgd)(learning_rate=lr, momentum=0.9, nesterov=True)
    if method == "dp":
        return optax.inject_hyperparams(optax.sgd)(learning_rate=lr)
    if method == "async-delayed":
        dn = optax.inject_hyperparams(delayed_nesterov, static_args=("buffer_size",))
        return dn(learning_rate=lr, beta=0.9, buffer_size=workers)
    if method == "async-lookahead":  # the expected staleness of M equally fast workers
        la = optax.inject_hyperparams(momentum_lookahead, static_args=("horizon",))
        return la(learning_rate=lr, momentum=0.9, horizon=workers - 1)
    if method == "async-poly":
        return optax.chain(staleness_weight("polynomial"), nesterov)
    if method == "async-cgad":
        return optax.inject_hyperparams(cgad)(learning_rate=lr, alpha=0.1, cutoff=2.0 * workers)
    return nesterov


def schedule(cfg: dict[str, Any], method: str, m: int, h: int, seed: int) -> Any:
    """The jobs of one run (its timing drawn from ``seed``)."""
    shape, frac, slow = cfg["timing"]
    timing = {"seed": seed, "shape": shape, "straggler_fraction": frac, "straggler_slowdown": slow}
    rounds = cfg["steps"] // h
    if method == "dp":  # timing of M workers' single steps; one worker of batch M·B trains
        return localsgd.synchronous(m, cfg["steps"], 1, **timing)
    if method.startswith("async"):
        return localsgd.asynchronous(m, rounds * m, h, dynamic=method == "async-delayed", **timing)
    return localsgd.synchronous(m, rounds, h, **timing)


#: the warm start's data stream: ``data.batch_indices`` seeded by the run's seed plus this
#: (a stream of its own, not the first steps of the run's)
WARM_SEED = 7919


class _Runner:
    def __init__(
        self, cfg: dict[str, Any], ds: data.Dataset, folder: runs.RunFolder | None = None
    ) -> None:
        self.cfg, self.ds, self.task, self.folder = cfg, ds, task_of(ds), folder
        self.computed = 0
        self.digests: dict[tuple[str, int], str] = {}

    def warm(self, model: str, seed: int, f: models.Functional) -> Any:
        """The weights every run of ``(model, seed)`` starts from: ``cfg["warm_start"]``
        synchronous steps of the inner optimizer from ``f``'s initial weights (read back from
        the run folder after the first time, :func:`experiments.starts.cached`)."""
        cfg, ds = self.cfg, self.ds
        k, b = cfg["warm_start"], cfg["batch_size"]
        assert self.folder is not None, "a warm start needs the run folder"

        def train() -> Any:
            idx = data.batch_indices(len(ds.x_train), batch_size=b, num_steps=k,
                                     seed=WARM_SEED + seed)  # fmt: skip
            tx = optimizers.per_stage(cfg["optimizer"], cfg["warm_lr"], cfg["momentum"], k)
            sched = localsgd.synchronous(1, k, 1)
            x, y = ds.x_train[idx], ds.y_train[idx]
            ex = localsgd.make("emulate", f.apply, tx, outer_tx("dp", 1), sched, x, y)
            (res,) = loop.run(ex, f.params, f.state)
            if res.diverged:
                raise runs.RunFolderError(
                    f"the warm start of {model}, seed {seed} diverged at step {res.diverged_step}"
                    " (a lower --warm-lr, or a shorter --warm-start)"
                )
            return jax.tree.map(np.asarray, res.params)

        same = lambda row: row.get("model") == model and row.get("seed") == seed
        start, d = starts.cached(self.folder, f"start-{model}-seed{seed}", train,
                                 like=f.params, cells=same)  # fmt: skip
        self.digests[model, seed] = d
        return start

    def group(self, keys: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict]]]:
        """Every pending rate and seed of one (model, method, M, H): vmapped lanes, or one
        run after another on the mesh."""
        cfg, ds = self.cfg, self.ds
        k0 = keys[0]
        method, m, h = k0["method"], k0["workers"], k0["inner_steps"]
        base, _, tau = method.partition(" τ=")
        scheds = [schedule(cfg, base, m, h, k["seed"]) for k in keys]
        dp = base == "dp"
        batch = cfg["batch_size"] * (m if dp else 1)
        nb = cfg["steps"] if dp else max(s.num_batches for s in scheds)
        inits = []
        # every lane's mini-batches as indices into the one training split (Indexed)
        idx = np.empty((len(keys), nb, batch), np.int32)
        for i, k in enumerate(keys):
            net = models.create(
                k0["model"], input_shape=tuple(ds.x_train.shape[1:]),
                num_classes=ds.num_classes, seed=k["seed"], task=ds.task, **gpt_kw(cfg),
            )  # fmt: skip
            f = models.functional(net)
            if cfg.get("warm_start"):
                f = f._replace(params=self.warm(k0["model"], k["seed"], f))
            inits.append(f)
            idx[i] = data.batch_indices(
                len(ds.x_train), batch_size=batch, num_steps=nb, seed=k["seed"]
            )
        xs, ys = data.indexed(ds.x_train, idx), data.indexed(ds.y_train, idx)
        # the inner schedule's horizon: a worker's inner steps
        inner = optimizers.per_stage(
            cfg["optimizer"], cfg["inner_lr"], cfg["momentum"], cfg["steps"]
        )
        run_sched = [localsgd.synchronous(1, cfg["steps"], 1)] * len(keys) if dp else scheds
        kw: dict[str, Any] = {}
        if base in ("diloco-delayed", "diloco-eager"):
            kw = {"outer_overlap": base.partition("-")[2]}
        if base.startswith("streaming"):
            kw = {"fragments": cfg["fragments"], "overlap": int(tau), "alpha": cfg["alpha"]}
            kw["exchange"] = base.partition("-")[2] or "fp32"
        clock = group_clock()
        if cfg.get("executor") == "mesh":
            results = [
                self._on_mesh(
                    f, base, m, k["lr"], inner, sched, xs._replace(idx=i), ys._replace(idx=i), kw
                )
                for k, f, sched, i in zip(keys, inits, run_sched, idx, strict=True)
            ]
        else:
            results = self._lanes(keys, inits, base, m, inner, run_sched, xs, ys, kw)
        streams = base.startswith("streaming")
        updates = run_sched[0].num_updates * (cfg["fragments"] if streams else 1)
        wall, cpu = clock(len(keys))
        self.computed += len(keys)
        out = self._rows(results, scheds, base, m, updates, streams, (wall, cpu))
        for i, ((row, _), s) in enumerate(zip(out, scheds, strict=True)):  # a GPT's rate, MFU
            speed = lm_throughput(k0["model"], ds, int(s.steps.sum()), cfg["batch_size"], wall)
            row.update(speed)
            if i == 0:
                what = f"{k0['model']} {method} M={m} H={h}"
                log_throughput("local_sgd", what, len(keys), speed)
        if cfg.get("warm_start"):
            for (row, _), k in zip(out, keys, strict=True):
                row["start_digest"] = self.digests[k0["model"], k["seed"]]
        return out

    def _on_mesh(self, f: Any, base: str, m: int, lr: float, inner: Any, sched: Any,
                 x: Any, y: Any, kw: dict) -> Any:  # fmt: skip
        """One run on the mesh executor (``dp``: one worker, on one device; its ``Indexed``
        stream materialised there)."""
        ex = localsgd.make("mesh", f.apply, inner, outer_tx(base, m, lr), sched, x, y, **kw)
        every = max(1, ex.num_updates // 10)
        (res,) = loop.run(
            ex, f.params, f.state, eval_every=every, eval_data=splits(self.ds),
            metric=self.task.metric,
        )  # fmt: skip
        return res

    def _lanes(self, keys: list[dict], inits: list, base: str, m: int, inner: Any,
               run_sched: list, xs: data.Indexed, ys: data.Indexed, kw: dict) -> list:  # fmt: skip
        """Every key's run at once, as vmapped lanes (``xs``, ``ys``: the lanes' mini-batches,
        indices ``[L, nb, B]`` into the training split)."""
        stack = lambda trees: jax.tree.map(lambda *a: np.stack(a), *trees)
        ex = localsgd.make(
            "emulate", inits[0].apply, inner, outer_tx(base, m), run_sched, xs, ys,
            lanes=len(keys), hyperparams={"outer": {"learning_rate": [k["lr"] for k in keys]}},
            **kw,
        )  # fmt: skip
        every = max(1, ex.num_updates // 10)
        results = loop.run(
            ex, stack([f.params for f in inits]), stack([f.state for f in inits]),
            eval_every=every, eval_data=splits(self.ds), metric=self.task.metric,
        )  # fmt: skip
        return results

    def _rows(self, results: list, scheds: list, base: str, m: int, updates: int,
              streaming: bool, times: tuple[float, float],
              ) -> list[tuple[dict[str, Any], list[dict]]]:  # fmt: skip
        """The summary rows and curves of a group's runs (``times``: each run's wall and CPU
        seconds)."""
        cfg, (wall, cpu) = self.cfg, times
        # outer updates per whole model a worker sends: an asynchronous arrival is one worker's,
        # a streaming exchange one fragment
        per_send = m if base.startswith("async") else cfg["fragments"] if streaming else 1
        # overlapped rounds: the mean arrives a round late (delayed), or the other replicas'
        # share of it does (eager)
        late = {"diloco-delayed": 1.0, "diloco-eager": (m - 1) / m}.get(base)
        out = []
        for res, s in zip(results, scheds, strict=True):
            tau_all = np.asarray(s.staleness)
            row = {
                **outcome(res, cfg["target"], self.task),
                "updates": updates,
                "exchanges": updates,
                "models_sent": updates / per_send,
                "tokens": int(s.steps.sum()) * cfg["batch_size"],
                "wall_time": round(s.wall_time, 3),
                "mean_staleness": (
                    late if late is not None else float(tau_all.mean()) if len(tau_all) else 0.0
                ),
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
            }
            out.append((row, res.curve))
        return out
