"""Gap-Aware: penalise a stale gradient by the gap it was computed across (Barkai et al.)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxstale._checks import check_range
from jaxstale.transforms._utils import MISSING, current_and_stale

__all__ = ["GapAwareState", "gap_aware"]


class GapAwareState(NamedTuple):
    """State of :func:`gap_aware`.

    Attributes:
      count: ``int32`` number of updates so far (for the bias correction and the schedule).
      v: the running mean of ``u²``, a pytree like the parameters.
      trace: the momentum trace that measures ``u``, or ``None`` when ``momentum == 0`` (then
        ``u = g``, the raw incoming gradient). With ``statistic="lab"`` it is the trace
        ``m ← μ·m + g̃`` of Gap-Aware's own *outputs* (the penalised gradients: the momentum
        buffer of the SGD that follows), read before it is updated; with ``statistic="raw"``
        the trace ``u ← μ·u + g`` of the raw incoming gradients, the current one included.
      eta_max: the largest learning rate seen so far (a scalar).
    """

    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax
    v: optax.Updates
    trace: optax.Updates | None
    eta_max: jax.Array


STATISTICS: tuple[str, ...] = ("lab", "raw")


def gap_aware(
    learning_rate: optax.ScalarOrSchedule,
    *,
    decay: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    momentum: float = 0.0,
    statistic: str = "lab",
) -> optax.GradientTransformationExtraArgs:
    """Gap-Aware: divide a stale gradient, per coordinate, by one plus its gap in typical steps.

    The **gap** of a coordinate is how far it moved between the weights the gradient was
    computed at (``stale_params = w_{t−τ}``) and the weights it is applied to
    (``params = w_t``), measured in units of a typical update step ``C``:

    .. math::

        v_t &= \\gamma v_{t-1} + (1 - \\gamma)\\, u_t^2, \\qquad
            \\hat v_t = v_t / (1 - \\gamma^t) \\\\
        C_t &= \\eta_{max} (\\sqrt{\\hat v_t} + \\epsilon), \\qquad
            G_t = 1 + |w_t - w_{t-\\tau}| / C_t, \\qquad
            \\text{output } \\tilde g_t = g_t / G_t

    with ``η_max`` the largest learning rate seen so far (``learning_rate`` evaluated at the
    update count when it is an optax schedule). A coordinate that did not move gets ``G = 1``;
    after ``τ`` typical steps ``G ≈ 1 + τ``: the staleness-aware ``1/τ`` rule, but per
    coordinate and adaptive.

    **Which ``u``** (the ``statistic`` option). Without momentum (``momentum=0``) both readings
    take the raw incoming gradient, ``u_t = g_t``, and give identical results (bit for bit
    here; the authors' lab code and a port of it agree to ~1e-6). With momentum they differ:

    * ``"lab"`` (default): the authors' lab code (FTPipe's ``gap_aware/sgd_gap_aware.py``)
      updates ``v`` *before* the optimizer step from the optimizer's momentum buffer as it
      stands, i.e. the trace of the previous steps' **penalised** gradients:

      .. math::

          u_t = m_{t-1}, \\qquad m_t = \\mu\\, m_{t-1} + \\tilde g_t, \\qquad m_0 = 0.

      Placed before ``optax.sgd(η, μ)``, this transform keeps ``m`` itself (a trace of its own
      outputs, read before it is updated), which is exactly SGD's momentum buffer.
    * ``"raw"``: a trace of the raw incoming gradients that includes the current one,
      ``u_t = μ·u_{t−1} + g_t``: jaxstale 0.1.0's reading, kept for comparison.

    ``"lab"`` is the default because it is faithful to the authors' own implementation; the two
    readings differ materially with ``momentum=0.9`` (on a noisy quadratic with τ = 3 the final
    weights end ~0.7 of the distance travelled apart; a port of the lab code measured ~1.2 on
    random inputs). The lab reading measures the penalised steps actually taken, so it
    can penalise harder (on the Rosenbrock test with τ = 2 it moves down the valley more
    slowly). With ``"lab"`` the
    first update has ``v̂ = 0`` (``m_0 = 0``), so ``C = η_max·ε``: any gap there is penalised
    almost to zero, as in the lab code (a first update normally has ``τ = 0``).

    Provenance: the per-coordinate ``C`` with ``γ = 0.999``, bias correction, ``ε = 1e-8`` and
    ``η_max`` follow the authors' lab code **[code]**; the linear penalty in the gap is the
    paper's **[paper]**. ``momentum`` should equal the optimizer's ``μ``. The lab divides weight
    decay by ``G`` too: chain ``optax.add_decayed_weights`` *before* ``gap_aware`` to get that
    (the decay then also enters ``u``); chained after it, the decay is neither penalised nor
    measured.

    Staleness semantics: with ``stale_params == params`` (τ = 0) the gap is exactly zero,
    ``G = 1`` exactly and the gradient passes through bit for bit (the statistics ``v``,
    ``trace``, ``η_max`` are still updated).

    Checks: a concrete ``learning_rate`` must be finite and ``> 0`` (a zero rate would make
    every ``C`` zero and zero every moved coordinate), ``decay`` in ``[0, 1)``, ``eps > 0``
    (``ValueError``); ``momentum`` in ``[0, 1)`` and ``statistic`` are always concrete. A
    *traced* ``learning_rate``, ``decay`` or ``eps`` (inside ``jax.jit``, or injected with
    ``optax.inject_hyperparams`` in a jitted step) is checked by ``checkify`` after
    :func:`jaxstale.enable_traced_checks` (off by default: it slows every jitted call); wrap the
    step in ``jax.experimental.checkify.checkify`` to have it reported. A schedule's values are
    not checked.

    Args:
      learning_rate: the optimizer's learning rate ``η``, a float or an optax schedule
        (evaluated at the update count); only its running maximum ``η_max`` is used.
      decay: ``γ``, the decay of the running mean of ``u²``, in ``[0, 1)``.
      eps: ``ε > 0`` added to ``sqrt(v̂)``.
      momentum: ``μ`` in ``[0, 1)`` of the momentum trace that measures ``u`` (``0``: the raw
        gradient); a concrete Python float (it decides the state's structure; with
        ``optax.inject_hyperparams`` pass ``static_args=("momentum",)`` to jit it).
      statistic: which momentum trace measures ``u`` when ``momentum > 0``: ``"lab"`` (the
        authors' lab code, the default) or ``"raw"`` (see above).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose
      ``update(grads, state, params, *, stale_params, **extra_args)`` returns the penalised
      gradient; ``params`` and the keyword ``stale_params`` (same structure as ``grads``) are
      required, other extra arguments are ignored.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxstale import gap_aware
      >>> tx = gap_aware(learning_rate=0.5, decay=0.0, eps=1e-12)   # v̂ = g², C = 0.5·|g|
      >>> g = jnp.array([2.0, 2.0])
      >>> w, w_stale = jnp.array([1.0, 1.0]), jnp.array([0.0, 1.0])
      >>> out, state = tx.update(g, tx.init(w), w, stale_params=w_stale)
      >>> out.tolist()   # gap 1 = one typical step C = 1: G = 2; no gap: G = 1
      [1.0, 2.0]

    References:
      Saar Barkai, Ido Hakimi, Assaf Schuster, "Gap-Aware Mitigation of Gradient Staleness",
      ICLR 2020, https://arxiv.org/abs/1909.10802
    """
    name = "gap_aware"
    if not callable(learning_rate):
        check_range(
            learning_rate,
            "learning_rate",
            name,
            0,
            low_open=True,
            hint=" (a finite float > 0, or an optax schedule)",
        )
    check_range(decay, "decay", name, 0, 1)
    check_range(eps, "eps", name, 0, low_open=True)
    if isinstance(momentum, jax.core.Tracer):
        raise TypeError(
            f"{name}: momentum must be a concrete float (it decides the state's structure), got "
            "a traced value; with optax.inject_hyperparams pass static_args=('momentum',)"
        )
    check_range(momentum, "momentum", name, 0, 1)
    momentum = float(momentum)
    if statistic not in STATISTICS:
        raise ValueError(
            f"{name}: statistic must be one of {', '.join(map(repr, STATISTICS))}, "
            f"got {statistic!r}"
        )
    lab = statistic == "lab"

    def lr_at(count: jax.Array) -> jax.Array:
        if callable(learning_rate):
            return jnp.asarray(learning_rate(count), jnp.float32)
        return jnp.asarray(learning_rate, jnp.float32)

    def init_fn(params: optax.Params) -> GapAwareState:
        return GapAwareState(
            count=jnp.zeros((), jnp.int32),
            v=optax.tree.zeros_like(params),
            trace=optax.tree.zeros_like(params) if momentum > 0 else None,
            eta_max=jnp.zeros((), jnp.float32),
        )

    def update_fn(
        updates: optax.Updates,
        state: GapAwareState,
        params: optax.Params | None = None,
        *,
        stale_params: optax.Params = MISSING,
        **extra_args: Any,
    ) -> tuple[optax.Updates, GapAwareState]:
        del extra_args
        params, stale_params = current_and_stale(params, stale_params, updates, name)

        if momentum == 0:
            u = updates
        elif lab:
            u = state.trace  # m_{t-1}: the previous outputs' trace, before this step
        else:
            u = jax.tree.map(lambda m, g: momentum * m + g, state.trace, updates)
        count = optax.safe_increment(state.count)
        v = optax.tree.update_moment_per_elem_norm(u, state.v, decay, 2)
        v_hat = optax.tree.bias_correction(v, decay, count)
        eta_max = jnp.maximum(state.eta_max, lr_at(state.count))

        def penalise(g, vh, w, w_stale):
            gap = jnp.abs(w - w_stale)
            step = eta_max.astype(vh.dtype) * (jnp.sqrt(vh) + eps)
            # An exact zero penalty where nothing moved (also guards 0/0 when C = 0).
            penalty = jnp.where(gap == 0, jnp.zeros_like(gap), gap / step)
            return (g / (1 + penalty)).astype(g.dtype)

        new_updates = jax.tree.map(penalise, updates, v_hat, params, stale_params)
        if momentum == 0:
            trace = None
        elif lab:
            trace = jax.tree.map(lambda m, o: momentum * m + o, state.trace, new_updates)
        else:
            trace = u
        return new_updates, GapAwareState(count=count, v=v, trace=trace, eta_max=eta_max)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)
