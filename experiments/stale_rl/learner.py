r"""The learner of ``stale_rl``: a supervised start, then GRPO on rollouts from a stale policy.

**Supervised start.** From the model's initial weights, ``sup_steps`` AdamW steps of teacher
forced cross-entropy on the task's correct responses (batches of 64 prompts): short enough that
the policy is partly right (the reverse task's reward ≈ 0.4 at 30 steps, where a uniform policy
over the vocabulary — the symbols and the separator — scores ``1 / (symbols + 1)``), so
reinforcement learning has most of the way still to go.

**One update** ``t`` (every lane the same program; lanes are (learning rate, seed) pairs run
under ``jax.vmap``):

1. push ``θ_t`` into a :class:`~jaxstale.VersionBuffer` of ``τ_max + 1`` versions;
2. draw ``P`` prompts, repeat each ``G`` times, sample responses from the buffer at the
   update's per-position staleness ``τ_{t,i}`` (:func:`jaxstale.rl.sample_stale`; versions
   before 0 are version 0), storing the behaviour log-probabilities;
3. rewards, group-relative advantages (:func:`jaxstale.rl.grpo_advantages`);
4. the correction's loss at ``θ_t`` (teacher-forced log-probabilities), its gradient, Adam's
   direction, then the correction's step rule — VCPO's ``sqrt(min(1, ESS/n))``
   (:func:`jaxstale.rl.scale_by_ess`) or the staleness-aware ``1 / max(τ̄, 1)``
   (:func:`jaxstale.staleness_aware`, ``τ̄`` the rollout's mean staleness) — and
   ``θ_{t+1} = θ_t − η·u``.

The prompts and sampling keys of update ``t`` are functions of (seed, ``t``) alone, so every
correction, delay and rate of a seed sees the same prompt stream (paired comparisons). A
non-finite loss marks the lane diverged from that update on (its later updates are skipped).

References:
    Shao et al., "DeepSeekMath" (GRPO), arXiv 2402.03300 (2024); Noukhovitch et al.,
    "Asynchronous RLHF", ICLR 2025, arXiv 2410.18252 (off-by-τ sampling); Piché et al.,
    "PipelineRL", arXiv 2509.19128 (2025) (in-flight weight updates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxstale import delays, models, rl, staleness_aware
from jaxstale.versions import VersionBuffer

SUP_BATCH = 64
SUP_LR = 1e-3

#: the arms: (the loss, its step rule). "is" is the untruncated importance weight (no
#: correction of its variance); "sa-reinforce" REINFORCE at the staleness-aware rate η / τ̄.
ARMS: dict[str, tuple[Callable[..., Any], str | None]] = {
    "reinforce": (rl.reinforce, None),
    "is": (lambda *a, **k: rl.tis(*a, cap=math.inf, **k), None),
    "ppo-clip": (rl.ppo_clip, None),
    "tis": (rl.tis, None),
    "tis-seq": (rl.CORRECTIONS["tis-seq"], None),
    "icepop": (rl.icepop, None),
    "mis": (rl.mis, None),
    "m2po": (rl.m2po, None),
    "m2po-clip": (rl.m2po_clip, None),
    "m2po-clip-dual": (lambda *a, **k: rl.m2po_clip(*a, dual_clip=3.0, **k), None),
    "vcpo": (rl.vcpo, "ess"),
    "sa-reinforce": (rl.reinforce, "staleness"),
}


def policy(model: str, task: rl.Reverse) -> tuple[Callable[[Any, jax.Array], jax.Array], Any]:
    """``(apply, params)`` of the zoo model ``model`` built for ``task``."""
    m = models.create(model, input_shape=(task.context,), num_classes=task.vocab)
    f = models.functional(m)
    return (lambda p, x: f.apply(p, f.state, x, False)[0]), f.params


def supervised_start(apply: Any, params: Any, task: rl.Reverse, steps: int, seed: int) -> Any:
    """``steps`` AdamW steps (rate :data:`SUP_LR`, batches of :data:`SUP_BATCH`) of teacher
    forced cross-entropy on the correct responses."""
    opt = optax.adamw(SUP_LR)

    def loss(p: Any, prompts: jax.Array) -> jax.Array:
        return -jnp.mean(rl.logprobs(apply, p, task, prompts, task.targets(prompts)))

    def body(c: tuple[Any, Any], k: jax.Array) -> tuple[tuple[Any, Any], None]:
        p, o = c
        g = jax.grad(loss)(p, task.prompts(k, SUP_BATCH))
        u, o = opt.update(g, o, p)
        return (optax.apply_updates(p, u), o), None

    keys = jax.random.split(jax.random.key(seed), max(steps, 1))[:steps]
    (p, _), _ = jax.jit(lambda p: jax.lax.scan(body, (p, opt.init(p)), keys))(params)
    return p


DELAYS = ("constant", "inflight", "gamma", "stragglers")


def schedule(delay: str, tau: int, steps: int, length: int) -> np.ndarray:
    """The staleness ``[steps, length]`` of each update's response positions:

    * ``constant``: ``τ`` everywhere (off-by-τ), ``min(t, τ)`` in the warm-up;
    * ``inflight``: falling from ``τ`` at the first id to 0 at the last (the weights change
      while a response is generated, as in PipelineRL), capped at ``t``;
    * ``gamma``: ``τ + 1`` samplers with Gamma-distributed generation times
      (:func:`jaxstale.delays.gamma_timed`, seed 0), the finisher's rollout trained next: each
      update's staleness is its schedule's (mean ≈ ``τ``), the same for every position;
    * ``stragglers``: the same with a quarter of the samplers (at least one) 4× slower.
    """
    t = np.arange(steps)[:, None]
    if delay == "constant":
        return np.minimum(np.full((1, length), tau), t).astype(np.int32)
    if delay == "inflight":
        prof = np.zeros(length) if length == 1 else tau * (length - 1 - np.arange(length))
        prof = np.rint(prof / max(length - 1, 1)).astype(np.int32)
        return np.minimum(prof[None, :], t).astype(np.int32)
    if delay in ("gamma", "stragglers"):
        kw = (
            {"straggler_fraction": max(0.25, 1 / (tau + 1)), "straggler_slowdown": 4.0}
            if delay == "stragglers"
            else {}
        )
        s = delays.gamma_timed(tau + 1, steps, batch_size=1, seed=0, **kw)
        return np.repeat(np.asarray(s.staleness, np.int32)[:, None], length, axis=1)
    raise ValueError(f"delay must be one of {', '.join(DELAYS)}, got {delay!r}")


def _sampler(apply: Any, task: rl.Reverse, n: int, mesh: Mesh | None) -> Callable[..., Any]:
    """``draw(buffer, taus, prompts, key) -> Rollout``: one program, or samplers on a mesh."""
    if mesh is None:
        return lambda buf, taus, pr, key: rl.sample_stale(apply, buf, taus, task, pr, key)
    d = mesh.shape["data"]
    if n % d:
        raise ValueError(f"{n} responses per update do not split over {d} samplers")
    share = n // d

    def local(buf: Any, taus: Any, pr: jax.Array, key: jax.Array) -> rl.Rollout:
        first = jax.lax.axis_index("data") * share
        return rl.sample_stale(apply, buf, taus, task, pr, key, rows=(first, n))

    rows = P("data")
    spread = jax.shard_map(
        local, mesh=mesh, in_specs=(P(), P(), rows, P()),
        out_specs=rl.Rollout(rows, rows, rows, P()),
    )  # fmt: skip
    whole = NamedSharding(mesh, P())
    return lambda *a: jax.lax.with_sharding_constraint(spread(*a), whole)  # the learner's copy


def _eval_reward(apply: Any, p: Any, task: rl.Reverse, prompts: jax.Array, key: jax.Array) -> Any:
    r = rl.sample(apply, p, task, prompts, key)
    return jnp.mean(task.reward(prompts, r.responses))


def make_train(
    apply: Any,
    task: rl.Reverse,
    arm: str,
    *,
    taus: np.ndarray,
    prompts: int,
    group: int,
    eval_every: int,
    eval_prompts: tuple[jax.Array, jax.Array],
    mesh: Mesh | None = None,
) -> Callable[[Any, jax.Array, jax.Array], dict[str, jax.Array]]:
    """``train(start, lrs [n], seeds [n]) -> {name: [n, ...]}``: ``n`` lanes, jitted.

    Returned per lane: ``val`` and ``test`` reward every ``eval_every`` updates (``[E]``, the
    first at update 0), ``train`` (each update's mean rollout reward), ``clipped``, ``kept``,
    ``weight`` (the correction's :class:`~jaxstale.rl.Stats`), ``ess`` (ESS / n of the
    sequences' weights), ``kl`` (``E_b[log b − log π]`` over the response ids), ``diverged``
    (the first update whose loss or gradient was not finite, or −1: that update and every
    later one are not applied, so the weights stay those of the last good update).

    ``mesh`` (a ``"data"`` axis of ``D`` devices): the samplers on the axis, each generating
    ``n / D`` of the update's responses from its own copy of the version buffer (with those
    rows' noise: the batch's ids, :func:`jaxstale.rl.sample_stale`'s ``rows``); the learner, as
    the server, gathers them and computes the update replicated."""
    loss_fn, rule = ARMS[arm]
    steps = taus.shape[0]
    if steps % eval_every or taus.shape[1] != task.length:
        raise ValueError(
            f"make_train: staleness {taus.shape} for {eval_every}-update segments of "
            f"{task.length} ids"
        )
    sched, capacity = jnp.asarray(taus, jnp.int32), int(taus.max()) + 1
    adam = optax.scale_by_adam()
    scale_by: Any = None
    if rule == "ess":
        scale_by = rl.scale_by_ess()
    elif rule == "staleness":
        scale_by = staleness_aware()
    val_p, test_p = eval_prompts
    draw = _sampler(apply, task, prompts * group, mesh)

    def lane(start: Any, lr: jax.Array, seed: jax.Array) -> dict[str, jax.Array]:
        base = jax.random.fold_in(jax.random.key(0), seed)
        buf = VersionBuffer.create(start, capacity)

        def update(carry: Any, t: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
            p, o, buf, dead = carry
            buf = buf.push(p)
            k = jax.random.fold_in(base, t)
            kp, ks = jax.random.split(k)
            pr = jnp.repeat(task.prompts(kp, prompts), group, axis=0)
            taus = sched[t]
            ro = draw(buf, taus, pr, ks)
            rew = task.reward(pr, ro.responses)
            adv = rl.grpo_advantages(rew, group)

            def loss(q: Any) -> tuple[jax.Array, Any]:
                lp = rl.logprobs(apply, q, task, pr, ro.responses)
                return loss_fn(lp, ro.logp, adv)[0], lp

            (value, lp), g = jax.value_and_grad(loss, has_aux=True)(p)
            stats = loss_fn(lp, ro.logp, adv)[1]
            ess = rl.ess_ratio(lp, ro.logp)
            u, o2 = adam.update(g, o, p)
            if rule == "ess":
                u, _ = scale_by.update(u, scale_by.init(p), ess_ratio=ess)
            elif rule == "staleness":
                u, _ = scale_by.update(u, scale_by.init(p), staleness=jnp.mean(taus))
            finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
            bad = dead | ~jnp.isfinite(value) | ~finite
            new = jax.tree.map(lambda a, b: jnp.where(bad, a, a - lr * b), p, u)
            o2 = jax.tree.map(lambda a, b: jnp.where(bad, a, b), o, o2)
            rec = {
                "train": jnp.mean(rew),
                "clipped": stats.clipped,
                "kept": stats.kept,
                "weight": stats.weight,
                "ess": ess,
                "kl": jnp.mean(ro.logp - lp),
                "bad": bad,
            }
            return (new, o2, buf, bad), rec

        def evaluate(p: Any) -> tuple[jax.Array, jax.Array]:
            ke = jax.random.key(1)  # one key: every lane evaluated on the same draws
            return (
                _eval_reward(apply, p, task, val_p, ke),
                _eval_reward(apply, p, task, test_p, jax.random.fold_in(ke, 1)),
            )

        def segment(carry: Any, e: jax.Array) -> tuple[Any, Any]:
            carry, recs = jax.lax.scan(update, carry, e * eval_every + jnp.arange(eval_every))
            return carry, (recs, evaluate(carry[0]))

        carry = (start, adam.init(start), buf, jnp.asarray(False))
        v0, t0 = evaluate(start)
        _, (recs, (vals, tests)) = jax.lax.scan(segment, carry, jnp.arange(steps // eval_every))
        out = {k: v.reshape(-1) for k, v in recs.items()}
        bad = out.pop("bad")
        out["diverged"] = jnp.where(jnp.any(bad), jnp.argmax(bad), -1)
        out["val"] = jnp.concatenate([v0[None], vals])
        out["test"] = jnp.concatenate([t0[None], tests])
        return out

    # lanes one after another in one program: vmapped lanes ran 1.6x slower per lane on the
    # CPU (the per-lane version reads become gathers)
    return jax.jit(lambda start, lrs, seeds: jax.lax.map(lambda a: lane(start, *a), (lrs, seeds)))
