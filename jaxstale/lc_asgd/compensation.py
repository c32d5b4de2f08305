"""LC-ASGD's loss-compensated gradient as an optax transformation.

**The method** (seed slides; the full paper was not available to us). A worker pulls ``w``,
computes its mini-batch loss ``ℓ_m`` and reports it; the server's *step predictor* predicts
``k_m``, the number of updates that land before this worker's gradient does, and its *loss
predictor* (a time-series model trained online on the losses the server has seen) predicts the
losses of the next ``k_m`` steps; ``ℓ_delay`` is their sum. The worker then computes
``g = ∇_w(ℓ_m + λ·ℓ_delay)`` and the server applies ``w ← w − η g``.

**Our interpretation** (the paper leaves it open). For ``λ·ℓ_delay`` to change the gradient it must
depend on ``w``. We read ``ℓ_delay`` as the loss predictor applied to the worker's own loss:
``ℓ_delay = Σ_{j≤k_m} ℓ̂_j(ℓ_m)``, the rollout of the predictor with its newest input set to
``ℓ_m(w)``. By the chain rule

    ∇_w(ℓ_m + λ·ℓ_delay) = (1 + λ·∂ℓ_delay/∂ℓ_m) · ∇_w ℓ_m,

a per-gradient scalar scale computed by differentiating the predictor's ``k_m``-step rollout
with respect to its newest input (the predictor's fitted parameters are constants). For an AR(1)
predictor with coefficient ``a`` the scale is ``1 + λ(a + a² + … + a^{k_m})``: a persistent
loss sequence (``a ≈ 1``) scales a gradient expected to be ``k_m`` updates stale by about
``1 + λ k_m``; a mean-reverting one (``a`` small) leaves it nearly unchanged. ``λ = 0`` is ASGD
bit for bit.

**What it does in practice.** With ``λ > 0`` a gradient expected to be more stale is
enlarged; ``λ < 0`` damps it. On digits with gamma-timed workers ``λ > 0`` degraded faster than
ASGD as ``M`` grew and ``λ < 0`` helped modestly (measurements in
:mod:`jaxstale.asyncdp.methods`).

**In an emulator.** The loss predictor's and step predictor's states live in the transform's
state; the emulator passes per-update facts as extra arguments (``worker_loss``, ``worker``,
``staleness``, and where the delay model has them ``t_comm``/``t_comp``). The step prediction
used for an update was made when the worker pulled (causal); the loss predictor uses the losses
seen up to the gradient's arrival (an emulator computes a gradient in one piece; the paper's
worker reports its loss after the forward pass, a little earlier).

References:
    Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
    Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from jaxstale._checks import check_int, check_range
from jaxstale.lc_asgd.loss_predictor import LossPredictor, ar_loss_predictor, delay_loss
from jaxstale.lc_asgd.step_predictor import StepObservation, StepPredictor, least_squares_steps

__all__ = ["LCASGDState", "lc_asgd", "lc_asgd_stats"]


class LCASGDState(NamedTuple):
    """State of :func:`lc_asgd`.

    Attributes:
        count: int32, the number of updates applied (the server's version ``t``).
        pull_step: ``[C]`` int32, the version each worker pulled (used when no ``staleness``
            extra argument is given).
        loss_state: the loss predictor's state.
        step_state: the step predictor's state.
        steps: float32, the ``k`` used by the latest update.
        delay_loss: float32, ``ℓ_delay`` of the latest update.
        scale: float32, ``1 + λ·∂ℓ_delay/∂ℓ_m`` of the latest update.
        abs_error: float32, ``Σ |k − τ|`` over all updates (step-predictor error).
        signed_error: float32, ``Σ (k − τ)``.
        sq_error: float32, ``Σ (k − τ)²``.
    """

    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax
    pull_step: jax.Array
    loss_state: Any
    step_state: Any
    steps: jax.Array
    delay_loss: jax.Array
    scale: jax.Array
    abs_error: jax.Array
    signed_error: jax.Array
    sq_error: jax.Array


def lc_asgd(
    lam: ArrayLike = 0.1,
    *,
    num_workers: ArrayLike,
    capacity: int | None = None,
    loss_predictor: LossPredictor | None = None,
    step_predictor: StepPredictor | None = None,
    horizon: int = 32,
    use_true_staleness: bool = False,
    max_scale: float | None = None,
    clip_sensitivity: bool = True,
) -> optax.GradientTransformationExtraArgs:
    """LC-ASGD loss compensation: ``g ← (1 + λ·∂ℓ_delay/∂ℓ_m)·g`` (our interpretation).

    On every update: (1) ``k`` = ``predicted_steps`` if given, else the true ``staleness`` if
    ``use_true_staleness``, else the step predictor's prediction (made when the worker pulled);
    (2) the loss predictor observes ``ℓ_m = worker_loss``; (3) with the rollout
    ``ℓ̂_1(ℓ), …, ℓ̂_H(ℓ)`` from newest loss ``ℓ``,
    ``ℓ_delay(ℓ) = Σ_j clip(k − j + 1, 0, 1)·ℓ̂_j(ℓ)`` (``k`` clipped to ``[0, H]``) and

        g̃ = s·g,   s = max(1 + λ·∂ℓ_delay/∂ℓ at ℓ = ℓ_m, 0)   (clipped to ``max_scale``),

    which is ``∇_w(ℓ_m + λ ℓ_delay)`` when ``g = ∇_w ℓ_m`` (module docstring); (4) the step
    predictor observes the arrival (true staleness ``τ``, ``t_comm``, ``t_comp``) and predicts
    the worker's next ``k``. No learning rate is applied: chain it before an optimizer.

    **Staleness semantics.** ``k`` estimates the gradient's staleness ``τ``; the gradient is
    scaled, never moved. ``λ = 0`` returns the gradient unchanged bit for bit (ASGD), whatever
    the predictors do; the predictors still learn, so their error can be measured at ``λ = 0``.

    Args:
        lam: ``λ``, finite, of either sign (a float or a traced scalar).
        num_workers: ``M`` (an int, or a traced int32 scalar if ``capacity`` is given).
        capacity: static size of per-worker arrays (``≥ M``; default ``num_workers``).
        loss_predictor: default :func:`~jaxstale.lc_asgd.ar_loss_predictor` (AR(2)).
        step_predictor: default :func:`~jaxstale.lc_asgd.least_squares_steps`.
        horizon: ``H``, the static maximum ``k`` (the rollout length).
        use_true_staleness: use the ``staleness`` extra argument as ``k`` (an oracle ablation).
        max_scale: optional upper clip of the scale ``s`` (finite, ``> 0``).
        clip_sensitivity: clip each predicted loss's sensitivity ``∂ℓ̂_j/∂ℓ_m`` to ``[0, 1]``
            (:func:`~jaxstale.lc_asgd.delay_loss`; our safeguard against an explosive online
            fit: then ``1 ≤ s ≤ 1 + λk`` for ``λ ≥ 0``). ``False``: the exact derivative.

    Returns:
        An ``optax.GradientTransformationExtraArgs``; ``update(grads, state, params=None, *,
        worker_loss, worker=0, staleness=None, t_comm=None, t_comp=None,
        predicted_steps=None, **extra)``. ``worker_loss`` (the gradient's mini-batch loss) is
        required. Without ``staleness`` it is tracked from the worker ids (every update must
        then pass through this transform). Without times the server clock is used: the worker
        pulled at ``t_comm = t − τ`` and computed for ``t_comp = τ + 1`` updates.

    Raises:
        ValueError: a concrete ``lam`` that is NaN or infinite, ``horizon < 1``, ``max_scale``
            not finite and ``> 0``, or ``num_workers`` not an int in ``[1, capacity]``.
        TypeError: a non-integer ``horizon`` or ``capacity``, a predictor of the wrong type.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from jaxstale.lc_asgd import lc_asgd
        >>> tx = optax.chain(lc_asgd(0.5, num_workers=2), optax.sgd(0.1))
        >>> params = {"w": jnp.ones(3)}
        >>> state = tx.init(params)
        >>> g = {"w": jnp.full(3, 0.5)}
        >>> u, state = tx.update(g, state, params, worker_loss=2.0, worker=0, staleness=0,
        ...                      predicted_steps=2)
        >>> u["w"]          # untrained predictor = persistence: scale 1 + 0.5·2 = 2
        Array([-0.1, -0.1, -0.1], dtype=float32)
        >>> tx0 = optax.chain(lc_asgd(0.0, num_workers=2), optax.sgd(0.1))
        >>> u0, _ = tx0.update(g, tx0.init(params), params, worker_loss=2.0, worker=0)
        >>> sgd = optax.sgd(0.1)
        >>> bool((u0["w"] == sgd.update(g, sgd.init(params))[0]["w"]).all())   # λ = 0: ASGD
        True

    References:
        Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
        Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
    """
    name = "lc_asgd"
    check_range(lam, "lam", name, -math.inf)  # finite, either sign
    horizon = check_int(horizon, "horizon", name, 1)
    if max_scale is not None:
        check_range(max_scale, "max_scale", name, 0, low_open=True, hint=" (or None)")
    if capacity is None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(
                f"{name}: num_workers must be an int >= 1 when capacity is None, got "
                f"{num_workers!r}"
            )
        capacity = num_workers
    capacity = check_int(capacity, "capacity", name, 1)
    if not isinstance(num_workers, jax.core.Tracer):  # a concrete M: an int in [1, capacity]
        m = check_int(num_workers, "num_workers", name, 1)
        if m > capacity:
            raise ValueError(f"{name}: num_workers must be <= capacity={capacity}, got {m}")
    lp = ar_loss_predictor() if loss_predictor is None else loss_predictor
    sp = least_squares_steps() if step_predictor is None else step_predictor
    if not isinstance(lp, LossPredictor):
        raise TypeError(f"{name}: loss_predictor must be a LossPredictor, got {type(lp).__name__}")
    if not isinstance(sp, StepPredictor):
        raise TypeError(f"{name}: step_predictor must be a StepPredictor, got {type(sp).__name__}")
    static_zero = isinstance(lam, int | float) and lam == 0

    def init_fn(params: Any) -> LCASGDState:
        del params
        # distinct buffers (no aliasing), so a caller may donate the state
        zero = lambda: jnp.zeros((), jnp.float32)
        return LCASGDState(
            count=jnp.zeros((), jnp.int32),
            pull_step=jnp.zeros((capacity,), jnp.int32),
            loss_state=lp.init(),
            step_state=sp.init(num_workers, capacity),
            steps=zero(),
            delay_loss=zero(),
            scale=jnp.ones((), jnp.float32),
            abs_error=zero(),
            signed_error=zero(),
            sq_error=zero(),
        )

    def update_fn(
        updates: Any,
        state: LCASGDState,
        params: Any = None,
        *,
        worker_loss: ArrayLike,
        worker: ArrayLike = 0,
        staleness: ArrayLike | None = None,
        t_comm: ArrayLike | None = None,
        t_comp: ArrayLike | None = None,
        predicted_steps: ArrayLike | None = None,
        **extra_args: Any,
    ) -> tuple[Any, LCASGDState]:
        del params, extra_args
        w = jnp.asarray(worker, jnp.int32)
        loss = jax.lax.stop_gradient(jnp.asarray(worker_loss, jnp.float32))
        if staleness is None:
            tau = state.count - state.pull_step[w]
        else:
            tau = jnp.asarray(staleness, jnp.int32)
        last_step = state.count - tau
        # 1. the horizon k.
        if predicted_steps is not None:
            k = jnp.asarray(predicted_steps, jnp.float32)
        elif use_true_staleness:
            if staleness is None:
                raise TypeError("use_true_staleness=True needs the `staleness` extra argument")
            k = tau.astype(jnp.float32)
        else:
            k = jnp.asarray(sp.predict(state.step_state, w), jnp.float32)
        # 2.–3. the loss predictor sees ℓ_m, then ℓ_delay and its slope in ℓ_m.
        loss_state = lp.update(state.loss_state, loss)
        ell_delay, slope = delay_loss(
            lp, loss_state, loss, k, horizon, clip_sensitivity=clip_sensitivity
        )
        if static_zero:
            scale = jnp.ones((), jnp.float32)
            new_updates = updates
        else:
            raw = 1.0 + jnp.asarray(lam, jnp.float32) * slope
            raw = jnp.maximum(raw, 0.0)
            if max_scale is not None:
                raw = jnp.minimum(raw, max_scale)
            raw = jnp.where(jnp.isfinite(raw), raw, 1.0)
            off = jnp.asarray(lam) == 0
            scale = jnp.where(off, jnp.ones((), jnp.float32), raw)
            # select, not multiply-by-one: XLA may fuse g·s into a later FMA and round otherwise
            new_updates = jax.tree.map(
                lambda g: jnp.where(off, g, g * scale.astype(g.dtype)), updates
            )
        # 4. the step predictor learns from this arrival; the worker pulls version t + 1.
        if t_comm is None:
            t_comm_v = last_step.astype(jnp.float32)
        else:
            t_comm_v = jnp.asarray(t_comm, jnp.float32)
        t_comp_v = (tau + 1).astype(jnp.float32) if t_comp is None else jnp.asarray(t_comp)
        obs = StepObservation(w, state.count, last_step, t_comm_v, t_comp_v)
        step_state = sp.update(state.step_state, obs)
        err = k - tau.astype(jnp.float32)
        new_state = LCASGDState(
            count=state.count + 1,
            pull_step=state.pull_step.at[w].set(state.count + 1),
            loss_state=loss_state,
            step_state=step_state,
            steps=k,
            delay_loss=ell_delay,
            scale=scale,
            abs_error=state.abs_error + jnp.abs(err),
            signed_error=state.signed_error + err,
            sq_error=state.sq_error + err * err,
        )
        return new_updates, new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def lc_asgd_stats(state: Any) -> dict[str, float]:
    """Step-predictor error and the latest compensation, from an :func:`lc_asgd` state.

    Finds the (first) :class:`LCASGDState` inside ``state`` (e.g. an ``optax.chain`` state).

    Args:
        state: an :class:`LCASGDState` or any pytree containing one (not vmapped).

    Returns:
        ``{"updates", "step_mae", "step_bias", "step_rmse", "steps", "delay_loss", "scale"}``
        (errors of ``k`` against the true staleness, averaged over all updates so far).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from jaxstale.lc_asgd import lc_asgd, lc_asgd_stats
        >>> tx = optax.chain(lc_asgd(0.1, num_workers=2), optax.sgd(0.1))
        >>> s = tx.init(jnp.zeros(2))
        >>> _, s = tx.update(jnp.ones(2), s, worker_loss=1.0, worker=1, staleness=0)
        >>> lc_asgd_stats(s)["step_mae"]        # predicted M − 1 = 1, true 0
        1.0
    """
    found = [
        leaf
        for leaf in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, LCASGDState))
        if isinstance(leaf, LCASGDState)
    ]
    if not found:
        raise ValueError("no LCASGDState found in the given state")
    s = found[0]
    n = max(int(s.count), 1)
    return {
        "updates": int(s.count),
        "step_mae": float(s.abs_error) / n,
        "step_bias": float(s.signed_error) / n,
        "step_rmse": (float(s.sq_error) / n) ** 0.5,
        "steps": float(s.steps),
        "delay_loss": float(s.delay_loss),
        "scale": float(s.scale),
    }
