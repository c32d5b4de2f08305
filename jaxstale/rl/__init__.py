"""Asynchronous reinforcement learning: rollouts from a policy τ updates old, and the
off-policy corrections that train on them.

A verifiable-reward task (:mod:`~jaxstale.rl.tasks`), a stale-policy sampler that reads the
weights from a :class:`~jaxstale.VersionBuffer` — one τ per rollout, or one per generated id
(in-flight updates) — and records the behaviour log-probabilities (:mod:`~jaxstale.rl.sampler`),
group-relative advantages (:mod:`~jaxstale.rl.advantages`) and the corrections as pure losses
plus VCPO's step-size rule as an Optax transform (:mod:`~jaxstale.rl.losses`).

Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from jaxstale import rl
    >>> logp = jnp.log(jnp.array([[0.5, 0.25]]))  # under the trained policy
    >>> behav = jnp.log(jnp.array([[0.25, 0.25]]))  # under the one that sampled them
    >>> loss, stats = rl.tis(logp, behav, jnp.array([1.0]), cap=2.0)
    >>> float(stats.weight)  # the ratios 2 and 1, truncated at 2
    1.5
"""

from __future__ import annotations

from jaxstale.rl.advantages import grpo_advantages
from jaxstale.rl.losses import (
    CORRECTIONS,
    Stats,
    decoupled_ppo,
    ess_ratio,
    icepop,
    m2po,
    m2po_clip,
    m2po_clip_bounds,
    m2po_mask,
    mis,
    ppo_clip,
    reinforce,
    scale_by_ess,
    tis,
    vcpo,
)
from jaxstale.rl.sampler import Rollout, logprobs, sample, sample_stale
from jaxstale.rl.tasks import Reverse

__all__ = [
    "CORRECTIONS",
    "Reverse",
    "Rollout",
    "Stats",
    "decoupled_ppo",
    "ess_ratio",
    "grpo_advantages",
    "icepop",
    "logprobs",
    "m2po",
    "m2po_clip",
    "m2po_clip_bounds",
    "m2po_mask",
    "mis",
    "ppo_clip",
    "reinforce",
    "sample",
    "sample_stale",
    "scale_by_ess",
    "tis",
    "vcpo",
]
