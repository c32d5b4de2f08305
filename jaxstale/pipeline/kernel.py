"""The stage kernel both pipeline executors run: the whole model from its stages, a stage's
optimizer under a policy, a pass's (predicted) weights, and the residuals of a stage's
linearisation kept by a forward and rebuilt at the backward's weights.

:mod:`jaxstale.pipeline.emulator` (one device) and :mod:`jaxstale.pipeline.mesh` (a ``stage``
device axis) import these and nothing from each other, so the two cannot drift apart.

References:
    Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019.
    Chen, Yang, Cheng, "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform" (SpecTrain), arXiv:1809.02839, 2018.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxstale._compile import memo
from jaxstale.pipeline.program import Program
from jaxstale.transforms import (
    error_feedback,
    find_weight_prediction_state,
    predict_weights,
    weight_prediction,
)

__all__ = [
    "compose",
    "pass_weights",
    "rebuild",
    "split_residuals",
    "stage_optimizer",
    "with_prediction",
]


def _tree_where(c: jax.Array, a: Any, b: Any) -> Any:
    return jax.tree.map(lambda x, y: jnp.where(c, x, y), a, b)


def compose(stages: Sequence[Any]) -> Callable[..., tuple[jax.Array, list[Any]]]:
    """``apply(params, states, x, train)`` of the whole model from its stages (``Functional``
    objects or ``(fn(params, x), params)`` pairs); the same object for the same stages."""
    key = tuple(id(getattr(st, "apply", st)) for st in stages)
    return memo("pipeline.compose", key, lambda: _compose(stages), keep=list(stages))


def _compose(stages: Sequence[Any]) -> Callable[..., tuple[jax.Array, list[Any]]]:
    applies = [
        st.apply if hasattr(st, "apply") else (lambda p, s, x, train, fn=st[0]: (fn(p, x), s))
        for st in stages
    ]

    def apply(params: Sequence[Any], states: Sequence[Any], x: jax.Array, train: bool) -> Any:
        out = []
        for a, p, s in zip(applies, params, states, strict=True):
            x, s = a(p, s, x, train)
            out.append(s)
        return x, out

    return apply


def with_prediction(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` if it already remembers its last update, else ``weight_prediction(tx)``."""
    try:
        find_weight_prediction_state(jax.eval_shape(tx.init, jnp.zeros((1,))))
        return tx
    except ValueError:
        return weight_prediction(tx)


def _rescaled(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """``tx`` with its updates multiplied by the ``lr_scale`` extra argument (default 1)."""
    inner = optax.with_extra_args_support(tx)

    def update_fn(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        scale = extra.pop("lr_scale", 1.0)
        upd, state = inner.update(updates, state, params, **extra)
        return jax.tree.map(lambda u: (u * scale).astype(u.dtype), upd), state

    return optax.GradientTransformationExtraArgs(inner.init, update_fn)


def stage_optimizer(
    tx: optax.GradientTransformation, program: Program
) -> optax.GradientTransformationExtraArgs:
    """The per-stage optimizer ``program`` runs: ``tx``, its updates scaled by the ``lr_scale``
    extra argument where the policy reschedules the learning rate, and — where passes predict —
    remembering the update applied (scaled), with PipeMare's average ``δ`` for its rule.

    Both executors call ``update(g, state, w, lr_scale=program's lr_scale)``; without
    rescheduling ``lr_scale`` is ignored and the updates are ``tx``'s bit for bit.
    """
    pol = program.policy
    if pol.feedback:  # error feedback corrects the optimizer's own update, first
        tx = error_feedback(tx, pol.feedback)
    if pol.predict is None:
        return _rescaled(tx) if program.rescales else optax.with_extra_args_support(tx)
    if not program.rescales and pol.predict != "pipemare":
        return with_prediction(optax.with_extra_args_support(tx))
    if with_prediction(tx) is tx:
        raise ValueError(
            f"policy {pol.name!r} wraps the optimizer itself: pass tx without weight_prediction"
        )
    decay = pol.decay if pol.predict == "pipemare" else None
    return weight_prediction(_rescaled(tx), velocity_decay=decay)


def pass_weights(cur: Any, opt_state: Any, horizon: Any, rule: Any, momentum: float) -> Any:
    """A pass's predicted weights: SpecTrain's (``rule`` 0), NAG's (1) extrapolation of
    ``horizon`` updates from the optimizer's last update, or PipeMare's (2) ``horizon`` updates
    back along the update average where the optimizer keeps it (``horizon`` 0: ``cur``)."""
    w_s = predict_weights(cur, opt_state, horizon, rule="spectrain")
    w_n = predict_weights(cur, opt_state, horizon, rule="nesterov", momentum=momentum)
    out = _tree_where(rule == 1, w_n, w_s)
    if find_weight_prediction_state(opt_state).velocity is not None:
        w_p = predict_weights(cur, opt_state, horizon, rule="pipemare")
        out = _tree_where(rule == 2, w_p, out)
    return out


def lookback_weights(
    cur: Any, prev: Any, fresh: Any, tau: Any, horizon: Any, rule: Any, momentum: float
) -> Any:
    """A predicting pass's weights where it reads a version ``tau > 0`` updates old (``cur``,
    ``prev`` the version before it): that version extrapolated along *its own* last update,
    ``cur + c·(cur − prev)`` with ``c = s`` (SpecTrain, ``rule`` 0) or ``μ + … + μ^s`` (NAG, 1),
    ``s`` = ``horizon`` — what the stage knew when the version was its newest. The optimizer's
    last update (``fresh``'s ``Δw_last``) is newer than the version read: extrapolating the old
    version along it would reach the current weights, a prediction that sees the future.
    ``tau = 0``: ``fresh`` (:func:`pass_weights`). Before the version has a predecessor both
    reads are ``w_0``: no extrapolation.

    Example:
        >>> import jax.numpy as jnp
        >>> w = lookback_weights(jnp.array(2.0), jnp.array(1.5), jnp.array(9.0), 1, 2, 0, 0.0)
        >>> float(w)  # 2 + 2·(2 − 1.5)
        3.0
    """
    h = jnp.asarray(horizon, jnp.float32)
    mu = float(momentum)
    nag = h if mu == 1.0 else mu * (1.0 - jnp.power(mu, h)) / (1.0 - mu)
    coef = jnp.where(jnp.asarray(rule) == 1, nag, h)
    old = jax.tree.map(lambda c, p: c + (coef * (c - p)).astype(c.dtype), cur, prev)
    return _tree_where(jnp.asarray(tau) > 0, old, fresh)


def split_residuals(vjp_fn: Any, w: Any, x: Any) -> tuple[Any, list, list]:
    """A VJP's ``(treedef, kinds, rest)``: which residual leaves are the weights, the input, or
    other residuals (``rest``: what a forward must keep for a ``"saved"`` backward)."""
    leaves, treedef = jax.tree.flatten(vjp_fn)
    wl = jax.tree.leaves(w)
    kinds: list[tuple[str, int]] = []
    rest: list[Any] = []
    for leaf in leaves:
        i = next((i for i, a in enumerate(wl) if a is leaf), None)
        if i is not None:
            kinds.append(("w", i))
        elif leaf is x:
            kinds.append(("x", 0))
        else:
            kinds.append(("r", len(rest)))
            rest.append(leaf)
    return treedef, kinds, rest


def rebuild(dead: Any, w: Any, x: Any, saved: Iterator[Any]) -> Any:
    """The forward's linearisation from its ``saved`` residuals, with the backward weights ``w``
    where the weights themselves are residuals (``dead``: a VJP of the same function for the
    structure; XLA removes its computation)."""
    treedef, kinds, _ = split_residuals(dead, w, x)
    wl = jax.tree.leaves(w)
    leaves = [wl[i] if kind == "w" else x if kind == "x" else next(saved) for kind, i in kinds]
    return jax.tree.unflatten(treedef, leaves)
