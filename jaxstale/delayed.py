r"""Training with a constant gradient delay: any optax optimizer, a delay per parameter group,
optionally with weight prediction — the controlled experiment behind the staleness studies.

Update :math:`t` (from 0) of :func:`delayed_update` takes its gradient at stale weights and
applies it to the current ones:

.. math::

    g_t = \nabla L(\tilde\theta_t;\ B_t), \qquad
    \theta_{t+1} = \theta_t + \mathrm{tx}(g_t, \theta_t), \qquad
    \tilde\theta_t^{(k)} = \theta^{(k)}_{\max(t - \tau_k,\ 0)},

group :math:`k` of the parameters read at its own delay :math:`\tau_k` (the first
:math:`\tau_k` gradients at :math:`\theta_0`, as :func:`jaxstale.delays.constant`). With
``predict=True`` each group is extrapolated over its delay from the optimizer's own last update
as of that version (SpecTrain's rule, which covers SGD, the Adam family and Muon alike because
it reads the update the optimizer applied, not its state):

.. math::

    \tilde\theta_t^{(k)} = \theta^{(k)}_{t-\tau_k}
        + \tau_k\,\bigl(\theta^{(k)}_{t-\tau_k} - \theta^{(k)}_{t-\tau_k-1}\bigr)

(no extrapolation before the first update). Delay profiles: one ``τ`` for every parameter
(Jain et al.'s and marin's constant delay), one per stage of a staged model,
``τ_s = N − 1 − s`` (:func:`stage_profile`: the ages of PipeDream's stashed weight versions in
an ``N``-stage 1F1B pipeline), or ``τ = 1`` (PipeDream-2BW's one-step-stale updates). At
``τ = 0`` it is the optimizer itself, to the bit. The past versions are kept in the optimizer
state (:class:`DelayedState`, ``max τ + 1`` copies, one more with ``predict``), so the update
is an ordinary step for :func:`jaxstale.train.update_executor`, vmapped over seeds and rates.

References:
    Jain et al., "Effect of gradient staleness on SGD", ICLR 2018 workshop; Chen et al.,
    "Efficient and Robust Parallel DNN Training through Model Parallelism on Multi-GPU
    Platform" (SpecTrain), arXiv 1809.02839; Narayanan et al., "Memory-Efficient Pipeline-
    Parallel DNN Training" (PipeDream-2BW), ICML 2021; marin-community/marin issues 6423, 6431
    (constant delay with Muon, weight prediction).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import optax

from jaxstale import train
from jaxstale.loop import Executor
from jaxstale.losses import cross_entropy
from jaxstale.optimizers import set_hyperparams
from jaxstale.transforms._utils import broadcast_prefix
from jaxstale.versions import VersionBuffer

__all__ = ["DelayedState", "capacity", "delayed_update", "executor", "stage_profile"]


class DelayedState(NamedTuple):
    """The optimizer state of :func:`delayed_update`.

    Attributes:
      inner: the optimizer's state.
      versions: the parameters' last ``K`` versions (:class:`jaxstale.VersionBuffer`; its
        ``count`` is the number of updates so far).
    """

    inner: optax.OptState
    versions: VersionBuffer


def _check(delay: Any) -> None:
    for tau in jax.tree.leaves(delay):
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 0:
            raise ValueError(f"delayed_update: a delay must be an int >= 0, got {tau!r}")


def _delays(delay: Any, params: Any) -> Any:
    return broadcast_prefix(delay, params, "delay", "delayed_update")


def capacity(delay: Any, predict: bool = False) -> int:
    """Versions kept: ``max τ + 1``, one more with ``predict`` (the version before)."""
    return max(jax.tree.leaves(delay), default=0) + 1 + int(predict)


def stage_profile(num_stages: int) -> list[int]:
    """``[N − 1, …, 1, 0]``: stage ``s`` of an ``N``-stage 1F1B pipeline reads weights
    ``N − 1 − s`` updates old (PipeDream's stashed versions).

    Example:
        >>> stage_profile(4)
        [3, 2, 1, 0]
    """
    if num_stages < 1:
        raise ValueError(f"stage_profile: num_stages must be >= 1, got {num_stages}")
    return [num_stages - 1 - s for s in range(num_stages)]


def delayed_update(
    apply: Callable[..., Any],
    tx: optax.GradientTransformation,
    delay: Any,
    *,
    predict: bool = False,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
) -> tuple[Callable[..., tuple[Any, Any, Any, jax.Array]], Callable[[Any], DelayedState]]:
    """``(update, init)``: the delayed step ``update(params, opt_state, state, x, y) ->
    (params, opt_state, state, loss)`` of the module docstring and ``init(params)``, its
    :class:`DelayedState` with every version :math:`\\theta_0`.

    Args:
      apply: ``apply(params, state, x, train) -> (logits, new_state)``.
      tx: any optax transformation (it sees the current weights as ``params``).
      delay: an int ``τ ≥ 0`` for every parameter, or a pytree prefix of the parameters with
        one per group (e.g. a list, one per stage: :func:`stage_profile`).
      predict: extrapolate each group over its delay (module docstring).
      loss_fn: ``loss_fn(logits, labels) -> scalar``.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> apply = lambda p, s, x, train: (x * p, s)
        >>> sq = lambda out, y: jnp.mean((out - y) ** 2) / 2
        >>> update, init = delayed_update(apply, optax.sgd(0.5), 1, loss_fn=sq)
        >>> p, st = jnp.zeros(()), init(jnp.zeros(()))
        >>> x, y = jnp.ones(()), jnp.ones(())
        >>> for _ in range(3):  # gradients at w_0, w_0, w_1: 0 → 0.5 → 1.0 → 1.25
        ...     p, st, _, loss = update(p, st, {}, x, y)
        >>> float(p)
        1.25
    """
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"tx must be an optax GradientTransformation, got {type(tx).__name__}")
    _check(delay)

    def init(params: Any) -> DelayedState:
        k = capacity(_delays(delay, params), predict)
        return DelayedState(tx.init(params), VersionBuffer.create(params, k))

    def read(versions: VersionBuffer, taus: Any, back: int) -> Any:
        """Each leaf at its own age ``τ + back`` (``w_{max(t − τ − back, 0)}``)."""
        ages = sorted({tau + back for tau in jax.tree.leaves(taus)})
        trees = [versions.get(a) for a in ages]
        return jax.tree.map(lambda tau, *vs: vs[ages.index(tau + back)], taus, *trees)

    def update(params: Any, opt_state: DelayedState, state: Any, x: Any, y: Any) -> Any:
        taus = _delays(delay, params)
        inner, versions = opt_state
        stale = read(versions, taus, 0)
        if predict:
            before = read(versions, taus, 1)
            stale = jax.tree.map(
                lambda tau, w, w0: w if tau == 0 else w + tau * (w - w0), taus, stale, before
            )

        def objective(p: Any) -> tuple[jax.Array, Any]:
            logits, new_state = apply(p, state, x, True)
            return loss_fn(logits, y), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(stale)
        updates, inner = tx.update(grads, inner, params)
        params = optax.apply_updates(params, updates)
        return params, DelayedState(inner, versions.push(params)), new_state, loss

    return update, init


def executor(
    apply: Callable[..., Any],
    tx: optax.GradientTransformation,
    x_train: Any,
    y_train: Any,
    indices: Any,
    *,
    delay: Any,
    predict: bool = False,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    loop: str = "scan",
    vmap: bool = False,
    max_chunk: int = 100,
    hyperparams: Mapping[str, Sequence[float]] | None = None,
) -> Executor:
    """:func:`jaxstale.train.executor` with the delayed step: step ``t`` trains on
    ``x_train[indices[t]]`` (``[L, steps, B]`` lanes with ``vmap``) with gradients ``delay``
    updates stale (module docstring); :func:`jaxstale.loop.run` drives it. ``hyperparams``
    (``{name: [L] values}``, with ``vmap``) sets hyper-parameters of a ``tx`` built with
    ``optax.inject_hyperparams`` per lane, e.g. a learning-rate grid in one compiled program."""
    update, init = delayed_update(apply, tx, delay, predict=predict, loss_fn=loss_fn)
    if hyperparams and not vmap:
        raise ValueError("executor: hyperparams are per lane: pass vmap=True with them")
    lanes = len(indices) if vmap else 1
    for k, v in (hyperparams or {}).items():
        if len(v) != lanes:
            raise ValueError(f"executor: hyperparams[{k!r}] has {len(v)} values for {lanes} lanes")
    ex = train.update_executor(
        update, init, apply, x_train, y_train, indices, loop=loop, vmap=vmap, max_chunk=max_chunk
    )
    if not hyperparams:
        return ex

    def init_lanes(params: Any, state: Any) -> Any:
        p, opt, s, alive = ex.init(params, state)
        return p, set_hyperparams(opt, hyperparams), s, alive

    return ex._replace(init=init_lanes)
