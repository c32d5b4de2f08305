"""Streaming DiLoCo: fragments of the model synchronise in turn, overlapped with inner steps.

The weights are cut into ``P`` **fragments** (groups of whole layers); every fragment has its
own global copy ``g_p`` and its **own outer optimizer state** (one optimizer over every fragment
would step the fragments not being synchronised with their momentum — torchft's trap). The
``M`` replicas ``x_m`` run inner steps in lockstep; every ``H/P`` inner steps one fragment
synchronises, fragment ``k mod P`` at the ``k``-th sync (``k = 0, 1, …``; each fragment every
``H`` steps), as torchft schedules it::

    at step (k+1)·H/P − τ:   Δ = mean_m(g_p − x_{m,p})           (snapshot; fp8/fp4 optional)
                             g_p ← g_p + outer_p.update(Δ)         (outer step, staleness 0)
    at step (k+1)·H/P:       x_{m,p} ← α·x_{m,p} + (1 − α)·g_p     (merge, every replica)

``τ`` (``overlap``, ``0 ≤ τ < H/P``) inner steps hide the exchange; the replica keeps the
progress it made meanwhile through the merge; the next ``Δ`` is measured from the pure global
copy, not the merged point. ``P = 1, τ = 0, α = 0`` is synchronous DiLoCo (tested equal).
MaxText's schedule differs in order only — snapshots at multiples of ``round(H/P)`` with
fragment 0 (the non-layer weights) last — and is not built.

Fragments: ``P`` (an int) groups the model's blocks (``params["blocks"][i]``; any other leaf
is a unit of its own) into ``P`` contiguous groups balanced by parameter count, as pipeline
stages are cut; or a fragment id per leaf (``jax.tree.leaves`` order).

References:
    Douillard et al., "Streaming DiLoCo with overlapping communication", arXiv:2501.18512
    (Algorithm 2). meta-pytorch/torchft ``torchft/local_sgd.py`` (``DiLoCo``,
    ``_StreamingDiLoCoFragment``: ``fragment_sync_delay``, ``fragment_update_alpha``) at
    commit 7eb7087.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxstale.localsgd.quantize import exchange_mean
from jaxstale.models.staged import balanced_bounds

__all__ = ["fragment_ids", "init_outer", "round_fn", "sync_step"]


def _unit(path: tuple) -> tuple:
    keys = tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))) for k in path)
    return keys[:2] if len(keys) > 2 and keys[0] == "blocks" else keys


def fragment_ids(params: Any, fragments: int | Sequence[int]) -> list[int]:
    """The fragment of every leaf of ``params`` (``jax.tree.leaves`` order).

    Example:
        >>> from jaxstale import models
        >>> f = models.functional(models.create("mlp", input_shape=(4, 1), num_classes=3,
        ...                                     hidden=(8, 8)))
        >>> fragment_ids(f.params, 2)  # blocks (bias, kernel): 40 | 72 + 27 weights
        [0, 0, 1, 1, 1, 1]
    """
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves = jax.tree.leaves(params)
    if isinstance(fragments, bool):
        raise ValueError(f"fragments must be an int or one id per weight tensor, got {fragments}")
    if not isinstance(fragments, int):
        ids = [int(i) for i in fragments]
        p = max(ids, default=-1) + 1
        if len(ids) != len(leaves) or sorted(set(ids)) != list(range(p)):
            raise ValueError(
                f"fragments: one id per weight tensor ({len(leaves)}), each of 0..P-1 used; "
                f"got {list(fragments)}"
            )
        return ids
    units: list[tuple] = []
    sizes: list[int] = []
    of_leaf = []
    for path, leaf in zip(paths, leaves, strict=True):
        u = _unit(path)
        if not units or units[-1] != u:
            units.append(u)
            sizes.append(0)
        sizes[-1] += int(jnp.size(leaf))
        of_leaf.append(len(units) - 1)
    if fragments < 1 or fragments > len(units):
        raise ValueError(
            f"fragments must be in 1..{len(units)} (the model's layers), got {fragments}"
        )
    group = [0] * len(units)
    for p, (i, j) in enumerate(balanced_bounds(sizes, fragments)):
        group[i:j] = [p] * (j - i)
    return [group[u] for u in of_leaf]


def init_outer(outer: Any, params: Any, frag: Sequence[int]) -> tuple:
    """One outer state per fragment, over that fragment's leaves."""
    leaves = jax.tree.leaves(params)
    p = max(frag) + 1
    return tuple(
        outer.init([x for x, f in zip(leaves, frag, strict=True) if f == q]) for q in range(p)
    )


def round_fn(
    job: Callable[..., tuple],
    outer: Any,
    fragments: int | Sequence[int],
    *,
    inner_steps: int,
    overlap: int,
    alpha: float,
    exchange: str,
) -> Callable[..., tuple]:
    """The emulator's step for sync ``k``: ``(state, k, tables, data) -> (state, loss)``.

    ``job(p, s, first, steps, model_state, data, length) -> (p, s, loss_sum)`` runs ``length``
    inner steps of one replica (vmapped here over the ``M`` replicas).
    """

    def step(st: dict[str, Any], k: jax.Array, tabs: dict, data: tuple) -> tuple:
        p = max(fragment_ids(st["theta"], fragments)) + 1
        length = inner_steps // p
        first = tabs["first_batch"][k // p] + (k % p) * length  # [M]

        def run(x: Any, s: Any, offset: int, n: int) -> tuple:
            jobs = jax.vmap(job, in_axes=(0, 0, 0, None, None, None, None))
            return jobs(x, s, first + offset, jnp.int32(n), st["model_state"], data, n)

        return sync_step(
            st, k % p, run, outer, fragments, inner_steps=inner_steps, overlap=overlap,
            alpha=alpha, exchange=exchange,
        )  # fmt: skip

    return step


def sync_step(
    st: dict[str, Any],
    j: jax.Array,
    run: Callable[[Any, Any, int, int], tuple],
    outer: Any,
    fragments: int | Sequence[int],
    *,
    inner_steps: int,
    overlap: int,
    alpha: float,
    exchange: str,
    gather: Callable[[Any], Any] = lambda x: x,
) -> tuple:
    """One sync of fragment ``j`` (both executors): ``H/P − τ`` inner steps of every replica, the
    fragment's snapshot and outer step, ``τ`` more inner steps, the merge.

    ``run(x, s, offset, n) -> (x, s, loss sums [M])`` runs ``n`` inner steps of the ``M``
    replicas from the sync's ``offset``-th mini-batch on; ``gather`` brings the replicas'
    ``[M, ...]`` leaves to where the mean is taken (the mesh: every device).
    """
    treedef = jax.tree.structure(st["theta"])
    frag = fragment_ids(st["theta"], fragments)
    p = max(frag) + 1
    length = inner_steps // p
    x, s, total = run(st["replicas"], st["inner"], 0, length - overlap)
    g = jax.tree.leaves(st["theta"])
    xs = gather(jax.tree.leaves(x))

    def sync(q: int) -> Callable[..., tuple]:
        idx = [i for i, f in enumerate(frag) if f == q]

        def go(operands: tuple) -> tuple:
            g, xs, states = operands
            deltas = [g[i][None] - xs[i] for i in idx]  # this fragment's only
            delta = exchange_mean(deltas, exchange)
            u, o = outer.update(delta, states[q], [g[i] for i in idx], staleness=jnp.int32(0))
            g = list(g)
            for i, ui in zip(idx, u, strict=True):
                g[i] = (g[i] + ui).astype(g[i].dtype)
            return g, (*states[:q], o, *states[q + 1 :])

        return go

    g, outer_states = jax.lax.switch(j, [sync(q) for q in range(p)], (g, xs, st["outer"]))
    if overlap:
        x, s, more = run(x, s, length - overlap, overlap)
        total = total + more
    ids = jnp.asarray(frag, jnp.int32)
    merged = [
        jnp.where(ids[i] == j, alpha * xl + (1.0 - alpha) * gl[None], xl).astype(xl.dtype)
        for i, (gl, xl) in enumerate(zip(g, jax.tree.leaves(x), strict=True))
    ]
    new = {
        **st,
        "theta": jax.tree.unflatten(treedef, g),
        "replicas": jax.tree.unflatten(treedef, merged),
        "outer": outer_states,
        "inner": s,
        "version": st["version"] + 1,
    }
    return new, jnp.mean(total) / length
