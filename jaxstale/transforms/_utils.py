"""Helpers shared by the transforms: required extra arguments, pytree and index checks.

The range checks of hyper-parameters (:func:`~jaxstale._checks.check_range`,
:func:`~jaxstale._checks.static_int`) live in :mod:`jaxstale._checks`, shared by the library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstale._checks import check_range
from jaxstale.versions import conform_structure

PyTree = Any


class _Missing:
    """Sentinel for a required keyword-only extra argument that was not given."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


def require_extra(value: Any, name: str, transform: str, meaning: str) -> Any:
    """Return ``value``, or raise a ``TypeError`` naming the missing extra argument."""
    if value is MISSING:
        raise TypeError(
            f"{transform}.update() missing required keyword argument {name!r} ({meaning}). "
            f"Pass it as an extra argument, e.g. tx.update(grads, state, params, {name}=...); "
            "optax.chain, optax.inject_hyperparams and nnx.Optimizer.update forward it."
        )
    return value


def require_params(params: Any, transform: str) -> Any:
    """Return ``params``, or raise a ``ValueError`` if the transform was called without them."""
    if params is None:
        raise ValueError(
            f"{transform}.update() needs params (the current weights w_t): call "
            "tx.update(grads, state, params, ...)"
        )
    return params


def check_like(tree: PyTree, reference: PyTree, name: str, ref_name: str, transform: str) -> PyTree:
    """``tree`` in ``reference``'s structure; ``ValueError`` unless structure and shapes match.

    ``flax.nnx`` ``Variable`` wrappers may differ (e.g. ``stale_params`` given as
    ``nnx.state(model, nnx.Param)`` while the gradients are plain arrays): the leaves are then
    rebuilt into ``reference``'s structure.
    """
    conformed = conform_structure(tree, reference)
    if conformed is None:
        raise ValueError(
            f"{transform}: {name} must have the same pytree structure as {ref_name}.\n"
            f"  {ref_name}: {jax.tree.structure(reference)}\n"
            f"  {name}: {jax.tree.structure(tree)}"
        )
    ref_leaves = jax.tree_util.tree_leaves_with_path(reference)
    for (path, ref), leaf in zip(ref_leaves, jax.tree.leaves(conformed), strict=True):
        if jnp.shape(leaf) != jnp.shape(ref):
            raise ValueError(
                f"{transform}: leaf {jax.tree_util.keystr(path)} of {name} has shape "
                f"{jnp.shape(leaf)}, but {ref_name} has shape {jnp.shape(ref)}"
            )
    return conformed


def current_and_stale(
    params: Any, stale_params: Any, updates: PyTree, transform: str
) -> tuple[PyTree, PyTree]:
    """``(params, stale_params)`` of a transform that compares them, both in ``updates``' structure.

    Raises a ``TypeError`` naming ``stale_params`` when it was not passed, a ``ValueError`` when
    ``params`` is missing or either tree does not match the gradients (see :func:`check_like`).
    """
    stale_params = require_extra(
        stale_params, "stale_params", transform, "the weights the gradient was computed at"
    )
    params = require_params(params, transform)
    stale_params = check_like(stale_params, updates, "stale_params", "grads", transform)
    params = check_like(params, updates, "params", "grads", transform)
    return params, stale_params


def broadcast_prefix(prefix: PyTree, tree: PyTree, name: str, transform: str) -> PyTree:
    """Broadcast ``prefix`` (a scalar or a pytree prefix of ``tree``) to one value per leaf."""
    try:
        return jax.tree.map(lambda value, sub: jax.tree.map(lambda _: value, sub), prefix, tree)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{transform}: {name} must be a scalar or a pytree prefix of the parameters "
            f"(same container types, e.g. one value per stage sub-tree); got structure "
            f"{jax.tree.structure(prefix)} for parameters {jax.tree.structure(tree)}"
        ) from err


def scale_by_staleness(
    updates: PyTree,
    staleness: Any,
    transform: str,
    meaning: str,
    fn: Callable[[jax.Array, jax.Array], jax.Array],
) -> PyTree:
    """``fn(leaf, τ)`` for every leaf, ``staleness`` the required extra argument (a scalar or a
    pytree prefix of ``updates``; a concrete negative value raises ``ValueError``)."""
    staleness = require_extra(staleness, "staleness", transform, meaning)
    for tau in jax.tree.leaves(staleness):
        check_range(tau, "staleness", transform, 0)
    per_leaf = broadcast_prefix(staleness, updates, "staleness", transform)
    return jax.tree.map(fn, updates, per_leaf)


def check_index(value: Any, name: str, where: str, size: int) -> jax.Array:
    """An integer scalar in ``[0, size)`` as an ``int32`` array, checked like :func:`check_range`.

    A concrete value out of range raises ``ValueError``; a traced one registers a ``checkify``
    check and is clamped into ``[0, size - 1]`` when not run under ``checkify``.
    """
    if isinstance(value, bool) or not (
        isinstance(value, jax.core.Tracer) or np.asarray(value).dtype.kind in "iu"
    ):
        raise TypeError(f"{where}: {name} must be an integer scalar, got {type(value).__name__}")
    if jnp.shape(value) != () or not jnp.issubdtype(jnp.result_type(value), jnp.integer):
        raise TypeError(
            f"{where}: {name} must be an integer scalar, got shape {jnp.shape(value)} and dtype "
            f"{jnp.result_type(value)}"
        )
    check_range(value, name, where, 0, size)
    return jnp.clip(jnp.asarray(value), 0, size - 1).astype(jnp.int32)


def sparse_cond(pred: Any, fn: Callable[[PyTree], PyTree], operands: PyTree) -> PyTree:
    """``lax.cond(pred, fn, identity, operands)`` that stays a branch under ``jax.vmap``.

    ``vmap`` turns a ``cond`` whose predicate is batched into a ``select``: both branches run
    for every lane at every call. Where ``fn`` is expensive and rarely taken (an optimizer's
    periodic refresh, whose step count every lane shares), that makes the rare cost a per-step
    one. Here a batched ``pred`` runs ``vmap(fn)`` only when some lane takes it (then keeps
    ``fn``'s result on the lanes that take it, the operands on the others), at every level of
    nested ``vmap``. ``fn`` must return a tree shaped like ``operands``; pass every array it
    reads as an operand (closed-over batched values would be outside the rule).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda p, x: sparse_cond(p, lambda o: o * 10.0, x)
        >>> jax.vmap(f)(jnp.array([True, False]), jnp.array([1.0, 2.0])).tolist()
        [10.0, 2.0]
    """

    @jax.custom_batching.custom_vmap
    def run(pred: Any, operands: PyTree) -> PyTree:
        return jax.lax.cond(pred, fn, lambda o: o, operands)

    @run.def_vmap
    def rule(axis_size: int, in_batched: Any, pred: Any, operands: PyTree) -> Any:
        pred_b, ops_b = in_batched
        ops = jax.tree.map(
            lambda x, b: x if b else jnp.broadcast_to(x, (axis_size, *jnp.shape(x))),
            operands,
            ops_b,
        )
        pred = pred if pred_b else jnp.broadcast_to(pred, (axis_size,))
        out = sparse_cond(jnp.any(pred), jax.vmap(fn), ops)
        pick = lambda a, b: jnp.where(pred.reshape((axis_size,) + (1,) * (a.ndim - 1)), a, b)
        out = jax.tree.map(pick, out, ops)
        return out, jax.tree.map(lambda _: True, out)

    return run(pred, operands)
