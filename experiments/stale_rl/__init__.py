"""Stale policies: which off-policy correction keeps asynchronous RL on track as rollouts age.

Question: in asynchronous reinforcement learning the rollouts a learner trains on come from a
policy ``τ`` updates older than its own. Which correction — none (REINFORCE), the untruncated
importance weight, PPO-clip against the behaviour policy, token/sequence truncated IS, IcePop
and sequence MIS masking, M2PO's second-moment mask and its authors' adaptive clip (with and
without a dual clip), VCPO's ESS-scaled step, the staleness-aware rate η/τ — stays within a
margin of on-policy training as ``τ`` grows, and how does the largest stable rate fall with
``τ``? (The published answers are at 0.5B–32B on GPUs:
M2PO, arXiv 2510.01161; VCPO, arXiv 2602.17616; PipelineRL, arXiv 2509.19128.)

Task and learner (:mod:`experiments.stale_rl.learner`): reverse 8 symbols of 16
(:class:`jaxstale.rl.Reverse`, per-character reward in [0, 1]; a uniform policy over its 17
ids scores 1/17) with
a 2-block GPT (``gpt-tiny``, 27 k parameters) from a supervised start of 30 AdamW steps (shared
by every run, cached in the run folder as ``inputs/start.npz``, its digest in every row); then 300
GRPO updates of 16 prompts × 8 responses, Adam at rate η, one gradient step per batch, the
rollouts drawn from the weights ``τ`` updates back (``--delays``: ``constant`` off-by-τ,
``inflight`` weights changing mid-response, ``gamma``/``stragglers`` timed samplers).

Protocol (the experiments' common one): every decision is taken on the **validation** reward
(256 fixed prompts, sampled at temperature 1), tables report the **test** reward (512 other
prompts) at the rate each (arm, delay, τ) selects on validation (its own rate); 5 seeds (a seed
fixes the prompt stream and sampling keys, shared by every arm: paired comparisons) with 95 %
intervals; a non-finite loss ends a run, recorded as diverged and scored at chance in the
selection. At τ = 0 every correction is REINFORCE (their ratios are 1), so τ = 0 is run once, as
``reinforce``: the on-policy reference. A rate η is **stable** at τ for an arm when no seed
diverged and its mean validation reward is at least the on-policy best minus ``--tolerance``
(0.05); the largest stable rate per (arm, τ) is the stability cliff (RL4).

Cost: one run (lane) of 300 updates ≈ 9–12 CPU-seconds (lanes run one after another in one
program: vmapped lanes were 1.6× slower per lane on the CPU); the default grid (12 arms × 6
τ × 5 rates × 5 seeds, plus τ = 0) is about 6 CPU-hours; ``--quick`` (τ ∈ {0, 4}, three arms,
one rate, two seeds, 100 updates) about a minute.

Outputs (run folder): rows (arm, delay, tau, lr, seed, final_val_reward, final_test_reward,
mean_val_reward / mean_test_reward: the areas under the curves (the mean over the evaluations
after update 0: how fast a run learned), diverged, mean clipped / kept fraction,
ESS/n, KL to the behaviour policy, cpu_s), table.md (test reward at the selected rate per arm ×
τ, the difference to on-policy paired by seed, the stability cliff, the validation grid),
plot.png (validation reward against update per τ, one line per arm), cliff.png (mean
validation reward over rate × τ per arm, stable cells framed).

Executors: ``--executor mesh`` puts the samplers on a ``"data"`` device axis (each draws its
share of an update's responses from its copy of the version buffer, with those rows' noise)
and the learner, as the server, gathers them and updates replicated: the same ids as the
emulator; the behaviour log-probabilities float32 rounding apart (a forward over a share of
the batch rounds differently from the whole batch's), so a mesh run has its own folder.

Run: ``python -m experiments.stale_rl [--quick] [--out DIR] [--arms a,b] [--taus ...]
[--executor mesh]``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxstale import mesh as jmesh
from jaxstale import models, rl

from .. import config as config_module
from .. import runs, starts
from ..common import group_clock
from ..config import ConfigError, cli, opt, validate
from . import learner, tables
from .tables import make_figures, make_table

EXPERIMENT = "stale_rl"
ARMS = tuple(learner.ARMS)
KEY = ("arm", "delay", "tau", "lr", "seed")
TAUS = (0, 1, 2, 3, 4, 8, 16)
LRS = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)
#: the on-policy reference: τ = 0 is run for this arm only
REFERENCE = tables.REFERENCE


def _gpts() -> list[str]:
    """The zoo's GPTs (a policy must be one)."""
    return [n for n in models.model_names() if n.startswith("gpt")]


@dataclass(frozen=True)
class Config:
    """stale_rl's configuration (``None``: the default of :meth:`resolved`)."""

    quick: bool = opt(False, "small configuration (about a minute): a smoke run, marked as such")
    model: str = opt("gpt-tiny", "the policy: a zoo GPT", choices=_gpts, kind="model")
    length: int = opt(8, "symbols to reverse (the response length)", low=1)
    symbols: int = opt(16, "the alphabet", low=2)
    sup_steps: int = opt(30, "supervised steps of the start (AdamW 1e-3, batches of 64)", low=0)
    steps: int | None = opt(None, "RL updates per run (default 300; --quick 100)", low=1)
    prompts: int = opt(16, "prompts per update", low=1)
    group: int = opt(8, "responses per prompt (GRPO's group, >= 2)", low=2)
    seeds: int | None = opt(None, "seeds (default 5; --quick 2)", low=1)
    lrs: tuple[float, ...] | None = opt(
        None, "Adam rates (default 5e-4,1e-3,2e-3,4e-3,8e-3; --quick 2e-3)", low=0, low_open=True
    )
    arms: tuple[str, ...] | None = opt(
        None,
        "corrections (default all; --quick reinforce,is,ppo-clip)",
        choices=lambda: ARMS,
        kind="arm",
    )
    taus: tuple[int, ...] | None = opt(
        None, "staleness τ, including 0 (default 0,1,2,3,4,8,16; --quick 0,4)", low=0
    )
    delays: tuple[str, ...] = opt(
        ("constant",), "delay models", choices=lambda: learner.DELAYS, kind="delay model"
    )
    eval_every: int | None = opt(
        None, "updates between evaluations, dividing --steps (default about steps / 6)", low=1
    )
    tolerance: float = opt(
        0.05, "stable: mean validation reward >= on-policy best - this", low=0, high=1
    )
    executor: str = opt(
        "emulate",
        "emulate: one program; mesh: the samplers on a 'data' device axis, the learner as the "
        "server (CPU: XLA_FLAGS=--xla_force_host_platform_device_count=8); the same ids, the "
        "behaviour log-probabilities float32 rounding apart",
        choices=("emulate", "mesh"),
        kind="executor",
    )
    samplers: int | None = opt(
        None, "--executor mesh: samplers (devices; default all, dividing prompts × group)", low=1
    )
    out: str | None = opt(None, "run folder (default results/stale_rl/<id>/)", run_id=False)
    force_resume: bool = opt(
        False, "reuse finished cells of --out computed under different code", run_id=False
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.taus is not None and 0 not in self.taus:
            raise ConfigError(
                "taus", f"must include 0 (the on-policy reference), got {list(self.taus)}"
            )
        if not self.model.startswith("gpt"):
            raise ConfigError("model", f"the policy must be a zoo GPT (gpt-...), got {self.model}")
        if self.out is not None and not self.out.strip():
            raise ConfigError("out", "expected a folder path, got an empty string")
        if self.samplers is not None and self.executor != "mesh":
            raise ConfigError("samplers", "only --executor mesh has samplers to place")

    def resolved(self) -> dict[str, Any]:
        """The run's config (decides its results; its hash names the folder)."""
        q = self.quick
        steps = self.steps or (100 if q else 300)
        # the default: the largest divisor of the steps at most a sixth of them
        every = self.eval_every or next(
            d for d in range(max(1, steps // 6), 0, -1) if steps % d == 0
        )
        if steps % every:
            raise ConfigError("eval_every", f"must divide --steps {steps}, got {every}")
        return {
            "quick": q,
            "model": self.model,
            "length": self.length,
            "symbols": self.symbols,
            "sup_steps": self.sup_steps,
            "steps": steps,
            "prompts": self.prompts,
            "group": self.group,
            "seeds": self.seeds or (2 if q else 5),
            "lrs": list(self.lrs or ((2e-3,) if q else LRS)),
            "arms": list(self.arms or (("reinforce", "is", "ppo-clip") if q else ARMS)),
            "taus": sorted(self.taus or ((0, 4) if q else TAUS)),
            "delays": list(self.delays),
            "eval_every": every,
            "tolerance": self.tolerance,
            "val_prompts": 256,
            "test_prompts": 512,
            # the mesh only where chosen: an emulated run's config (and folder) stays the same
            **(
                {"executor": "mesh", "samplers": self._samplers()}
                if self.executor == "mesh"
                else {}
            ),
        }

    def _samplers(self) -> int | None:
        """The mesh's samplers: ``--samplers`` or every device, checked against the devices and
        the responses per update."""
        if self.executor != "mesh":
            return None
        have, n = len(jax.devices()), self.prompts * self.group
        k = self.samplers or have
        if k > have:
            raise ConfigError("samplers", f"{k} samplers need {k} devices, this process has {have}")
        if n % k:
            raise ConfigError("samplers", f"{n} responses per update do not split over {k}")
        return k


def cells(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (arm, delay, τ, rate, seed); τ = 0 once, for the reference (on-policy)."""
    out = []
    for tau in cfg["taus"]:
        for delay in cfg["delays"] if tau else ["constant"]:
            for arm in cfg["arms"] if tau else [REFERENCE]:
                out += [
                    {"arm": arm, "delay": delay, "tau": tau, "lr": lr, "seed": s}
                    for lr in cfg["lrs"]
                    for s in range(cfg["seeds"])
                ]
    return out


def task_of(cfg: dict[str, Any]) -> rl.Reverse:
    return rl.Reverse(length=cfg["length"], symbols=cfg["symbols"])


def _start(cfg: dict[str, Any], folder: runs.RunFolder) -> tuple[Any, Any, str]:
    """``(apply, start, digest)``: the supervised start, shared by every cell of the folder
    (:func:`experiments.starts.cached`: ``inputs/start.npz``, trained here when absent)."""
    task = task_of(cfg)
    apply, params = learner.policy(cfg["model"], task)
    train = lambda: learner.supervised_start(apply, params, task, cfg["sup_steps"], 0)
    start, d = starts.cached(folder, "start", train, like=params)
    return apply, start, d


def _eval_prompts(cfg: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
    task = task_of(cfg)
    return (
        task.prompts(jax.random.key(10_001), cfg["val_prompts"]),
        task.prompts(jax.random.key(10_002), cfg["test_prompts"]),
    )


def _run_group(cfg: dict[str, Any], folder: runs.RunFolder, keys: list[dict]) -> list[Any]:
    """One (arm, delay, τ): its (rate, seed) lanes in one program."""
    arm, delay, tau = keys[0]["arm"], keys[0]["delay"], keys[0]["tau"]
    task = task_of(cfg)
    apply, start, digest = _start(cfg, folder)
    clock = group_clock()
    taus = learner.schedule(delay, tau, cfg["steps"], task.length)
    train = learner.make_train(
        apply, task, arm, taus=taus, prompts=cfg["prompts"], group=cfg["group"],
        eval_every=cfg["eval_every"], eval_prompts=_eval_prompts(cfg),
        mesh=jmesh.make_mesh(cfg["samplers"], "data") if cfg.get("executor") == "mesh" else None,
    )  # fmt: skip
    out = train(
        start,
        np.asarray([k["lr"] for k in keys], np.float32),
        np.asarray([k["seed"] for k in keys], np.int32),
    )
    out = {k: np.asarray(v) for k, v in out.items()}
    wall, cpu = clock(len(keys))
    every = cfg["eval_every"]
    results = []
    for i, _ in enumerate(keys):
        div = int(out["diverged"][i])
        val, test = out["val"][i].astype(float), out["test"][i].astype(float)
        if div >= 0:  # the weights stopped before the bad update: their evaluations are not
            first = div // every + 1  # a trained run's
            val[first:], test[first:] = math.nan, math.nan
        seg = lambda name: out[name][i].reshape(-1, every).mean(axis=1)
        upto = div if div >= 0 else cfg["steps"]  # the diagnostics of the applied updates
        mean = lambda name: float(np.mean(out[name][i][:upto])) if upto else None
        metrics = [
            {"step": e * every, "val_reward": _num(val[e]), "test_reward": _num(test[e])}
            for e in range(len(val))
        ]
        for e, (tr, cl, ess, kl) in enumerate(
            zip(seg("train"), seg("clipped"), seg("ess"), seg("kl"), strict=True)
        ):
            if div >= 0 and (e + 1) * every > div:  # a segment with updates not applied
                continue
            metrics[e + 1].update(
                train_reward=float(tr), clipped=float(cl), ess=float(ess), kl=float(kl)
            )
        results.append(
            (
                {
                    "final_val_reward": None if div >= 0 else float(val[-1]),
                    "final_test_reward": None if div >= 0 else float(test[-1]),
                    "mean_val_reward": None if div >= 0 else float(np.mean(val[1:])),
                    "mean_test_reward": None if div >= 0 else float(np.mean(test[1:])),
                    "start_val_reward": float(val[0]),
                    "diverged": div >= 0,
                    "diverged_step": div if div >= 0 else None,
                    "mean_staleness": float(taus.mean()),
                    "clipped": mean("clipped"),
                    "kept": mean("kept"),
                    "ess": mean("ess"),
                    "kl": mean("kl"),
                    "start_digest": digest,
                    "updates": cfg["steps"],
                    "wall_s": wall,
                    "cpu_s": round(cpu, 3),
                },
                metrics,
            )
        )
    return results


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _folder(config: Config) -> tuple[dict[str, Any], runs.RunFolder]:
    cfg = config.resolved()
    modules = (sys.modules[__name__], learner, tables, config_module, runs)
    code = runs.code_fingerprint(modules=modules)
    folder = runs.RunFolder(
        EXPERIMENT, cfg, config.out, code=code,
        force_resume=config.force_resume,
    )  # fmt: skip
    return cfg, folder


def run(config: Config) -> list[dict[str, Any]]:
    """Runs every cell not already in the run folder; returns the rows.

    Raises:
      ConfigError: a value the experiment cannot run (names the field).
      experiments.runs.RunFolderError: ``out`` holds another config or results of other code.
    """
    cfg, folder = _folder(config)
    compute = lambda ks: _run_group(cfg, folder, ks)
    return folder.run_grouped(cells(cfg), compute, vary=("lr", "seed"), desc=EXPERIMENT)


def report(
    rows: list[dict[str, Any]], config: Config, started: float | None = None
) -> dict[str, Any]:
    """Tables and figures into the run folder; returns ``{"rows", "paths", "table",
    "selected", "stable"}``."""
    cfg, folder = _folder(config)
    table, selected, stable = make_table(rows, cfg)
    curves = [{**r, "_metrics": folder.metrics({k: r[k] for k in KEY}) or []} for r in rows]
    figs = make_figures(curves, cfg, selected, stable)
    paths = folder.report(table, figs, num_runs=len(rows), started=started)
    cpu = sum(float(r.get("cpu_s") or 0.0) for r in rows)
    print(f"[{EXPERIMENT}] {len(rows)} runs, {cpu / 3600:.2f} CPU-hours", file=sys.stderr)
    return {"rows": rows, "paths": paths, "table": table, "selected": selected, "stable": stable}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line over :func:`run` and :func:`report` (flags from :class:`Config`)."""
    return cli(Config, run, report, argv, __doc__.splitlines()[0])
