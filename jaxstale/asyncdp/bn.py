"""Asynchronous batch-norm (Async-BN): the server merges the workers' batch statistics by an EMA.

In asynchronous data parallelism every worker normalises with its own mini-batch's statistics
and pushes them with its gradient; what the server keeps for evaluation is a choice:

* **Ordinary BN** (our baseline definition, the executors' default): *last writer wins*: the
  server keeps the running statistics returned with the applied gradient, i.e. the worker's copy
  (pulled with its stale weights, advanced by the model's own momentum ``m`` with its batch):
  ``E ← m·E_worker + (1 − m)·μ_batch``. Updates other workers made to ``E`` since this worker
  pulled are overwritten, so ``E`` lags the weights by about ``M`` times the model's window.
* **Async-BN** (LC-ASGD): the server keeps its own statistics and merges each arriving worker's
  batch statistics into them, ``E ← (1 − d)·E + d·μ_batch`` (the same for the variance), with a
  decay ``d`` of its choosing; nothing is overwritten.

:func:`merge_batch_stats` is the EMA over the ``nnx.BatchStat`` variables of an ``nnx.State``
(or any pytree of arrays); :func:`batch_stats_from_update` recovers a worker's batch statistics
from the running statistics it returned (Flax NNX ``BatchNorm`` updates
``ra ← m·ra + (1 − m)·batch``); :func:`async_bn_update` and :func:`ordinary_bn_update` are the
two server policies. With a fresh worker (pulled == server) and ``d = 1 − m`` the two coincide.
:func:`recompute_batch_stats` gives the reference both approximate: the statistics of a whole
data set at the final weights ("precise BN").

References:
    Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
    Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import ArrayLike

__all__ = [
    "async_bn_update",
    "batch_stats_from_update",
    "merge_batch_stats",
    "ordinary_bn_update",
    "recompute_batch_stats",
]


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _map_stats(fn: Callable[..., jax.Array], first: Any, *rest: Any) -> Any:
    """Apply ``fn`` to matching BatchStat leaves (or plain array leaves).

    Non-BatchStat Variables (e.g. RNG counters) are taken from the last tree in ``rest`` (the
    worker's), which is what ordinary last-writer-wins would keep.
    """

    def leaf(a: Any, *bs: Any) -> Any:
        if isinstance(a, nnx.Variable):
            if isinstance(a, nnx.BatchStat):
                return a.replace(fn(a.get_value(), *(b.get_value() for b in bs)))
            return bs[-1]
        return fn(a, *bs)

    return jax.tree.map(leaf, first, *rest, is_leaf=_is_var)


def merge_batch_stats(server: Any, worker: Any, decay: ArrayLike) -> Any:
    """EMA-merge a worker's batch statistics into the server's: ``E ← (1 − d)·E + d·x``.

    Applied to every ``nnx.BatchStat`` variable (batch-norm means and variances) of an
    ``nnx.State``, or to every leaf of a plain pytree of arrays. Other variables are taken from
    ``worker``. ``d = 1`` keeps the worker's values; ``d = 0`` keeps the server's.

    Args:
        server: the server's statistics (``nnx.State`` or pytree of arrays).
        worker: the worker's statistics, same structure.
        decay: ``d`` in ``[0, 1]`` (a float or traced scalar).

    Returns:
        The merged statistics, same structure and dtypes as ``server``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from jaxstale.asyncdp.bn import merge_batch_stats
        >>> bn = nnx.BatchNorm(2, rngs=nnx.Rngs(0))       # mean 0, var 1
        >>> server = nnx.state(bn, nnx.BatchStat)
        >>> worker = nnx.State({"mean": nnx.BatchStat(jnp.array([1.0, 2.0])),
        ...                     "var": nnx.BatchStat(jnp.array([3.0, 5.0]))})
        >>> out = merge_batch_stats(server, worker, 0.25)
        >>> out["mean"][...], out["var"][...]
        (Array([0.25, 0.5 ], dtype=float32), Array([1.5, 2. ], dtype=float32))

    References:
        Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
        Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
    """
    d = jnp.asarray(decay, jnp.float32)

    def ema(e: jax.Array, x: jax.Array) -> jax.Array:
        return ((1.0 - d) * e + d * x).astype(e.dtype)

    return _map_stats(ema, server, worker)


def batch_stats_from_update(pulled: Any, updated: Any, momentum: float) -> Any:
    """Recover the mini-batch statistics from a BatchNorm running-average update.

    Flax NNX ``BatchNorm`` (train mode) updates ``ra ← m·ra + (1 − m)·batch``; so
    ``batch = (ra_new − m·ra_old)/(1 − m)``, for the means and the variances alike.

    Args:
        pulled: the statistics before the worker's forward pass (``nnx.State`` or pytree).
        updated: the statistics it returned.
        momentum: the BatchNorm momentum ``m`` in ``[0, 1)`` (NNX default 0.99).

    Returns:
        The batch statistics, same structure as ``updated``.

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale.asyncdp.bn import batch_stats_from_update
        >>> batch_stats_from_update({"mean": jnp.array(0.0)}, {"mean": jnp.array(0.5)}, 0.75)
        {'mean': Array(2., dtype=float32)}
    """
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")

    def recover(new: jax.Array, old: jax.Array) -> jax.Array:
        return ((new - momentum * old) / (1.0 - momentum)).astype(new.dtype)

    return _map_stats(recover, updated, pulled)


def async_bn_update(
    server: Any, pulled: Any, updated: Any, *, decay: ArrayLike, momentum: float = 0.99
) -> Any:
    """Async-BN server policy: merge the worker's *batch* statistics into the server's by EMA.

    ``E ← (1 − d)·E + d·batch`` with ``batch`` recovered from the worker's update of the
    statistics it pulled (:func:`batch_stats_from_update`). The server's ``E`` is never
    overwritten by a stale copy.

    Args:
        server: the server's current statistics.
        pulled: the statistics the worker computed with (its pulled copy).
        updated: the statistics the worker returned.
        decay: ``d`` in ``[0, 1]``.
        momentum: the model's BatchNorm momentum ``m``.

    Returns:
        The server's new statistics.

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale.asyncdp.bn import async_bn_update
        >>> server, pulled = {"mean": jnp.array(1.0)}, {"mean": jnp.array(0.0)}
        >>> updated = {"mean": jnp.array(0.5)}           # batch mean 2 at momentum 0.75
        >>> async_bn_update(server, pulled, updated, decay=0.5, momentum=0.75)
        {'mean': Array(1.5, dtype=float32)}
    """
    return merge_batch_stats(server, batch_stats_from_update(pulled, updated, momentum), decay)


def ordinary_bn_update(server: Any, pulled: Any, updated: Any) -> Any:
    """Ordinary-BN server policy (our baseline): last writer wins, ``E ← E_returned``.

    Args:
        server: the server's current statistics (discarded).
        pulled: the worker's pulled copy (unused; same signature as :func:`async_bn_update`).
        updated: the statistics the worker returned with its gradient.

    Returns:
        ``updated``.

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale.asyncdp.bn import ordinary_bn_update
        >>> ordinary_bn_update({"mean": jnp.float32(1.0)}, None, {"mean": jnp.float32(0.5)})
        {'mean': Array(0.5, dtype=float32)}
    """
    del server, pulled
    return updated


def recompute_batch_stats(
    apply: Callable[..., tuple[jax.Array, Any]],
    params: Any,
    model_state: Any,
    x: ArrayLike,
    *,
    momentum: float,
) -> Any:
    """The batch-norm statistics of a whole data set at fixed weights ("precise BN").

    One training-mode forward pass of ``x`` as a single batch normalises every layer with the
    data set's own statistics and moves the running averages to ``m·E + (1 − m)·stat(x)``;
    :func:`batch_stats_from_update` recovers ``stat(x)`` exactly. The result is what any server
    policy for the running statistics approximates: the statistics the final weights produce.

    Args:
        apply: ``apply(params, model_state, x, train) -> (logits, new_model_state)``.
        params: the weights.
        model_state: the model state (its batch-norm statistics are replaced).
        x: the data, one batch (e.g. the training set).
        momentum: the model's batch-norm momentum ``m``.

    Returns:
        ``model_state`` with every ``nnx.BatchStat`` set to the statistics of ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from jaxstale import models
        >>> from jaxstale.asyncdp.bn import recompute_batch_stats
        >>> f = models.functional(nnx.BatchNorm(1, momentum=0.9, rngs=nnx.Rngs(0)))
        >>> x = jnp.array([[1.0], [3.0]])
        >>> st = nnx.to_pure_dict(recompute_batch_stats(f.apply, f.params, f.state, x,
        ...                                            momentum=0.9))
        >>> [round(float(st[k][0]), 4) for k in ("mean", "var")]
        [2.0, 1.0]

    References:
        Wu, Johnson. "Rethinking 'Batch' in BatchNorm", arXiv 2105.07576 (precise BN).
    """
    to_dev = lambda t: jax.tree.map(jnp.asarray, t)  # host copies may be read-only
    state = to_dev(model_state)
    _, updated = apply(to_dev(params), state, jnp.asarray(x), True)
    return batch_stats_from_update(state, updated, momentum)
