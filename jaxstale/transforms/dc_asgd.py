"""DC-ASGD: delay-compensated asynchronous SGD (Zheng et al., ICML 2017)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxstale._checks import check_range, static_int
from jaxstale.transforms._utils import MISSING, check_index, current_and_stale, require_extra

__all__ = ["DCASGDState", "dc_asgd"]


class DCASGDState(NamedTuple):
    """State of :func:`dc_asgd`.

    Attributes:
      ms: the running mean square of the gradients, ``MS ← m·MS + (1 − m)·g²`` (DC-ASGD-a): a
        pytree like the parameters (one ``MS`` shared by all workers), or, with
        ``num_workers=M``, like the parameters with a leading ``[M]`` axis on every leaf (row
        ``i`` is worker ``i``'s ``MS``); ``None`` for the constant variant DC-ASGD-c.
    """

    ms: optax.Updates | None


def dc_asgd(
    lam: jax.typing.ArrayLike = 0.04,
    *,
    adaptive: bool = False,
    decay: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-7,
    num_workers: int | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Delay compensation of a stale gradient by a diagonal first-order Taylor correction.

    A worker computed ``g = ∇f(w_bak)`` at the weights ``w_bak`` it pulled (``stale_params``);
    by the time ``g`` is applied the weights are ``w_t`` (``params``). DC-ASGD approximates the
    fresh gradient ``∇f(w_t)`` by a Taylor step whose Hessian is replaced by the cheap,
    diagonal outer-product approximation ``λ·g⊙g``:

    .. math::

        \\tilde g = g + \\lambda_t \\, g \\odot g \\odot (w_t - w_{bak}).

    **DC-ASGD-c** (``adaptive=False``): ``λ_t = λ0 = lam`` (paper default ``0.04``).
    **DC-ASGD-a** (``adaptive=True``): ``MS ← m·MS + (1 − m)·g²`` (updated with the current
    gradient first, ``m = decay``), then ``λ_t = λ0 / sqrt(MS + ε)`` element-wise; the paper's
    default is ``λ0 = 2`` (pass ``lam=2.0``; the ``lam`` default ``0.04`` is DC-ASGD-c's),
    ``m = 0.95``, ``ε = 1e-7``.

    **One MS or one per worker** (``num_workers``). The paper writes one ``MS`` for all
    workers; Microsoft's DC-ASGD server code keeps one per worker. ``num_workers=None`` (the
    default) is the paper's single shared ``MS``: it is the published algorithm, and every
    gradient, whoever sent it, refreshes the statistic. ``num_workers=M`` keeps ``M`` of them
    (state leaves ``[M, *shape]``): the gradient of worker ``i`` (the ``worker`` extra argument
    of ``update``, an integer scalar such as the ``int32`` the emulator passes) updates and
    reads ``MS_i`` only. ``num_workers=1`` with ``worker=0`` is bit for bit the shared ``MS``.

    No learning rate is applied: chain it before an optimizer, e.g.
    ``optax.chain(dc_asgd(), optax.sgd(0.1, 0.9))``.

    Staleness semantics: "stale" means ``stale_params = w_{t−τ}`` are the weights the gradient was
    computed at, ``params = w_t`` the weights it is applied to. With ``stale_params == params``
    (τ = 0) the correction is exactly zero and the gradient passes through bit for bit, so the
    chain reduces to the plain optimizer (DC-ASGD-a still updates ``MS``).

    Checks: a concrete ``lam`` must be finite and ``≥ 0``, ``decay`` in ``[0, 1)``, ``eps > 0``
    (``ValueError``); ``num_workers`` (only with ``adaptive=True``) an int ``≥ 1``; a concrete
    ``worker`` in ``[0, num_workers)``. Traced values (inside ``jax.jit``, or ``lam``/``decay``/
    ``eps`` injected with ``optax.inject_hyperparams`` in a jitted step) are checked by
    ``checkify`` after :func:`jaxstale.enable_traced_checks` (wrap the step in
    ``jax.experimental.checkify.checkify``); otherwise a traced out-of-range ``worker`` is
    clamped into range.

    Args:
      lam: ``λ0``, the variance-control parameter (finite, ``≥ 0``; ``0`` gives plain ASGD).
      adaptive: ``False`` for DC-ASGD-c (constant λ), ``True`` for DC-ASGD-a (λ scaled by the
        inverse root mean square of the gradients).
      decay: ``m`` in ``[0, 1)``, the decay of the mean square (adaptive only; the paper used 0
        on ImageNet).
      eps: ``ε > 0`` inside the square root (adaptive only).
      num_workers: ``None`` for one shared ``MS`` (the paper's), or ``M ≥ 1`` for one ``MS``
        per worker (Microsoft's server; adaptive only; a concrete int: with
        ``optax.inject_hyperparams`` pass ``static_args=("num_workers",)``).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose
      ``update(grads, state, params, *, stale_params, worker, **extra_args)`` returns the
      compensated gradient; ``params`` and the keyword ``stale_params`` (same structure as
      ``grads``) are required, ``worker`` too when ``num_workers`` is set (otherwise it is
      ignored), other extra arguments are ignored.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from jaxstale import dc_asgd
      >>> tx = dc_asgd(lam=0.5)
      >>> g, w, w_bak = jnp.array([2.0, 1.0]), jnp.array([1.0, 1.0]), jnp.array([0.0, 1.0])
      >>> state = tx.init(w)
      >>> g_tilde, state = tx.update(g, state, w, stale_params=w_bak)
      >>> g_tilde.tolist()   # 2 + 0.5*2*2*(1-0) = 4; the second coordinate did not move
      [4.0, 1.0]
      >>> tx = optax.chain(dc_asgd(), optax.sgd(0.1, momentum=0.9))
      >>> upd, _ = tx.update(g, tx.init(w), w, stale_params=w)   # fresh: plain SGD
      >>> upd.tolist()
      [-0.20000000298023224, -0.10000000149011612]
      >>> tx = dc_asgd(2.0, adaptive=True, decay=0.0, num_workers=2)   # one MS per worker
      >>> state = tx.init(w)
      >>> _, state = tx.update(g, state, w, stale_params=w_bak, worker=1)
      >>> state.ms.tolist()   # worker 1's row holds g²; worker 0's is untouched
      [[0.0, 0.0], [4.0, 1.0]]

    References:
      Shuxin Zheng, Qi Meng, Taifeng Wang, Wei Chen, Nenghai Yu, Zhi-Ming Ma, Tie-Yan Liu,
      "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017,
      https://arxiv.org/abs/1609.08326
    """
    name = "dc_asgd"
    check_range(lam, "lam", name, 0)
    check_range(decay, "decay", name, 0, 1)
    check_range(eps, "eps", name, 0, low_open=True)
    per_worker = num_workers is not None
    m_workers = 0
    if per_worker:
        if not adaptive:
            raise ValueError(
                f"{name}: num_workers (one MS per worker) applies to DC-ASGD-a only: pass "
                f"adaptive=True, or num_workers=None; got num_workers={num_workers!r}"
            )
        m_workers = static_int(num_workers, "num_workers", name, 1)

    def init_fn(params: optax.Params) -> DCASGDState:
        if not adaptive:
            return DCASGDState(ms=None)
        if per_worker:
            return DCASGDState(
                ms=jax.tree.map(
                    lambda p: jnp.zeros((m_workers, *jnp.shape(p)), jnp.result_type(p)), params
                )
            )
        return DCASGDState(ms=optax.tree.zeros_like(params))

    def update_fn(
        updates: optax.Updates,
        state: DCASGDState,
        params: optax.Params | None = None,
        *,
        stale_params: optax.Params = MISSING,
        worker: jax.typing.ArrayLike = MISSING,
        **extra_args: Any,
    ) -> tuple[optax.Updates, DCASGDState]:
        del extra_args
        params, stale_params = current_and_stale(params, stale_params, updates, name)

        if adaptive and per_worker:
            worker = require_extra(
                worker, "worker", name, "the index of the worker that sent the gradient"
            )
            i = check_index(worker, "worker", name, m_workers)
            ms_i = jax.tree.map(lambda m: jax.lax.dynamic_index_in_dim(m, i, 0, False), state.ms)
            ms_i = optax.tree.update_moment_per_elem_norm(updates, ms_i, decay, 2)
            lam_t = jax.tree.map(lambda s: lam / jnp.sqrt(s + eps), ms_i)
            ms = jax.tree.map(
                lambda m, row: jax.lax.dynamic_update_index_in_dim(m, row, i, 0), state.ms, ms_i
            )
        elif adaptive:
            ms = optax.tree.update_moment_per_elem_norm(updates, state.ms, decay, 2)
            lam_t = jax.tree.map(lambda s: lam / jnp.sqrt(s + eps), ms)
        else:
            ms = None
            lam_t = jax.tree.map(lambda _: lam, updates)

        def compensate(g, lt, w, w_bak):
            # g + (λ g g (w - w_bak)): the correction is computed first and added, so a zero gap
            # adds an exact zero and g passes through unchanged.
            correction = lt * g * g * (w - w_bak)
            return (g + correction).astype(g.dtype)

        new_updates = jax.tree.map(compensate, updates, lam_t, params, stale_params)
        return new_updates, DCASGDState(ms=ms)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
