"""Synchronous DiLoCo with its whole outer exchange overlapped with the next inner phase:
naive delayed outer updates and Kale et al.'s **eager updates**.

In synchronous DiLoCo every worker waits at the end of its ``H`` inner steps for the replicas'
mean pseudo-gradient ``Δ̄_t`` before round ``t + 1`` starts. If the exchange runs during the next
round's inner steps instead, ``Δ̄_t`` is one round late (round ``t`` is 0-based; ``Δ_{m,t}`` is
worker ``m``'s pseudo-gradient of round ``t``):

- ``"delayed"`` (the naive overlap, the paper's baseline): one global ``θ``; round ``t`` starts
  from ``θ_t`` and ends with ``θ_{t+1} = θ_t + OuterOpt(Δ̄_{t−1})`` (nothing at ``t = 0``,
  ``staleness = 1``); the last round's mean is still in flight when training stops.
- ``"eager"``: worker ``m`` keeps its own outer weights ``θ_m`` and outer-optimizer state, runs
  its inner steps from ``θ_m`` (``Δ_{m,t} = θ_{m,t} − θ_{m,local}``), and at the end of round
  ``t`` applies, without waiting,

      Δ̃_{m,t} = Δ_{m,t} / M + (Δ̄_{t−1} − Δ_{m,t−1} / M),        Δ̄_{−1} = Δ_{m,−1} = 0,

  its own fresh pseudo-gradient's share of the mean and the other replicas' shares one round
  late (the mean that just arrived, less the worker's own stale share): every replica's ``Δ``
  enters every ``θ_m`` exactly once. ``staleness = 0``. The executor's weights (evaluation) are
  the mean of the ``θ_m``, which stay within a round's local share of each other.

One worker (``M = 1``): eager is synchronous DiLoCo to the bit (``Δ̃ = Δ + (Δ − Δ)``; tested).
With a low-precision ``exchange`` the mean is the wire's (:func:`~jaxstale.localsgd.quantize.
exchange_mean`) and a worker's own share stays in fp32 (it never travels). The emulated wall
clock of :mod:`~jaxstale.localsgd.schedule` counts inner steps only, so it is the same as
synchronous DiLoCo's: the overlap hides communication time the schedule does not model.

What was verified: the paper's abstract and its public summaries describe eager updates as
mixing the current local outer gradient with the delayed non-local ones, a proxy the outer
optimizer applies before the all-reduce completes; its algorithm box could not be read here and
no public code of it was found, so the ``1/M`` weights above are our reading (the replicas' mean
with the worker's own term replaced by its fresh one), and so is each worker keeping its own
outer state.

References:
    Kale, Douillard and Donchev, "Eager Updates For Overlapped Communication and Computation in
    DiLoCo", arXiv:2502.12996. Douillard et al., "DiLoCo", arXiv:2311.08105.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxstale.localsgd._trees import stack, where
from jaxstale.localsgd.quantize import exchange_mean

__all__ = ["OUTER_OVERLAPS", "ROW_KEYS", "check_overlap", "init_state", "sync_step"]

#: how a synchronous round's outer exchange is scheduled: ``"none"`` (DiLoCo: wait for it),
#: ``"delayed"`` or ``"eager"`` (overlapped with the next round)
OUTER_OVERLAPS = ("none", "delayed", "eager")


def check_overlap(outer_overlap: str, synchronous: bool, streaming: int) -> str:
    """``outer_overlap``, or ``ValueError`` in one line: an unknown name, or an overlap given to
    an asynchronous schedule or to Streaming DiLoCo (each has its own)."""
    if outer_overlap not in OUTER_OVERLAPS:
        raise ValueError(
            f"unknown outer_overlap {outer_overlap!r}; choose from {', '.join(OUTER_OVERLAPS)}"
        )
    if outer_overlap != "none" and not synchronous:
        raise ValueError(
            f"outer_overlap={outer_overlap!r} overlaps synchronous rounds; an asynchronous "
            "schedule's arrivals are already applied as they come"
        )
    if outer_overlap != "none" and streaming:
        raise ValueError(
            f"outer_overlap={outer_overlap!r} cannot combine with Streaming DiLoCo's fragments "
            "(its overlap is per fragment: overlap=τ)"
        )
    return outer_overlap


def init_state(state: dict[str, Any], mode: str, m: int) -> dict[str, Any]:
    """The synchronous executor state ``state`` with what ``mode`` keeps: the mean in flight
    (``"pending"``), and for eager each worker's outer weights ``"rows"``, outer state
    (``"outer"``, stacked ``[M, ...]``) and last pseudo-gradient ``"own"``."""
    if mode == "none":
        return state
    zeros = jax.tree.map(jnp.zeros_like, state["theta"])
    out = {**state, "pending": zeros}
    if mode == "eager":
        out["rows"] = stack(state["theta"], m)
        out["outer"] = stack(state["outer"], m)
        out["own"] = stack(zeros, m)
    return out


#: the keys of :func:`init_state` that hold one row per worker (sharded on a mesh)
ROW_KEYS = ("rows", "outer", "own")


def sync_step(
    st: dict[str, Any],
    run: Callable[[Any, bool], tuple[Any, Any, jax.Array]],
    outer: optax.GradientTransformationExtraArgs,
    mode: str,
    *,
    exchange: str,
    gather: Callable[[Any], Any] | None = None,
) -> tuple[dict[str, Any], jax.Array]:
    """One overlapped round, for both executors: ``run(starts, per_worker) -> (p_end [M, ...],
    inner states, mean loss)`` runs the workers' jobs from ``starts`` (``θ``, or ``[M, ...]``
    rows when ``per_worker``); ``gather`` brings ``[M, ...]`` rows to every device (a mesh)
    before the replicas' mean. Returns ``(state, loss)``."""
    gather = gather or (lambda t: t)
    version = st["version"]
    if mode == "delayed":
        p_end, inner, loss = run(st["theta"], False)
        deltas = jax.tree.map(lambda t, p: t[None] - p, st["theta"], p_end)
        fresh = exchange_mean(gather(deltas), exchange)
        u, o = outer.update(st["pending"], st["outer"], st["theta"], staleness=jnp.int32(1))
        arrived = version > 0  # round 0 has nothing in flight
        theta = where(arrived, optax.apply_updates(st["theta"], u), st["theta"])
        o = where(arrived, o, st["outer"])
        new = {**st, "theta": theta, "outer": o, "inner": inner, "pending": fresh}
        return {**new, "version": version + 1}, loss
    rows = st["rows"]
    p_end, inner, loss = run(rows, True)
    deltas = jax.tree.map(jnp.subtract, rows, p_end)
    fresh = exchange_mean(gather(deltas), exchange)
    m = jax.tree.leaves(deltas)[0].shape[0]
    mixed = jax.tree.map(
        lambda d, pend, own: d / m + (pend[None] - own / m), deltas, st["pending"], st["own"]
    )
    step = lambda g, o, p: outer.update(g, o, p, staleness=jnp.int32(0))
    u, o = jax.vmap(step)(mixed, st["outer"], rows)
    rows = optax.apply_updates(rows, u)
    theta = jax.tree.map(lambda a: jnp.mean(a, axis=0), rows)
    new = {**st, "rows": rows, "theta": theta, "outer": o, "inner": inner}
    return {**new, "own": deltas, "pending": fresh, "version": version + 1}, loss
