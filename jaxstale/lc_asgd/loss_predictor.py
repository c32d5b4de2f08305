"""LC-ASGD loss predictors: time-series models of the server's loss sequence, trained online.

The server sees a sequence of mini-batch losses ``ℓ_1, ℓ_2, …`` (one per arriving worker). A
loss predictor learns from it online and, given that the newest loss is ``z``, rolls out the
next ``H`` losses ``ℓ̂_1(z), …, ℓ̂_H(z)``. LC-ASGD sums the first ``k_m`` of them
(``ℓ_delay``) and needs ``∂ℓ_delay/∂z``; so ``rollout`` must be differentiable in ``z`` (the
model's fitted parameters are constants there).

A loss predictor is a :class:`LossPredictor` triple of pure, jittable functions
``init() -> state``, ``update(state, loss) -> state`` (observe the next loss and train) and
``rollout(state, latest, horizon) -> [horizon]`` (``horizon`` a static int; ``latest`` replaces
the newest observed loss). Two are provided:

* :func:`ar_loss_predictor` (default): a linear AR(p) model with a bias, fitted by
  exponentially forgetting least squares. A linear trend is predicted exactly.
* :func:`rnn_loss_predictor`: a tiny GRU (Flax NNX) trained online with one Adam step per
  observed loss on next-step prediction over a short window.

References:
    Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
    Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.typing import ArrayLike

from jaxstale._checks import check_int, check_range
from jaxstale.losses import fixed_sum

__all__ = [
    "ARLossState",
    "LossPredictor",
    "RNNLossState",
    "ar_loss_predictor",
    "delay_loss",
    "rnn_loss_predictor",
]


class LossPredictor(NamedTuple):
    """A pluggable loss predictor: three pure, jittable functions.

    Attributes:
        init: ``init() -> state`` (a pytree).
        update: ``update(state, loss) -> state``: append ``loss`` to the sequence and train.
        rollout: ``rollout(state, latest, horizon) -> [horizon]`` float32: the predicted next
            ``horizon`` losses when the newest observed loss is replaced by ``latest``;
            differentiable in ``latest``. ``horizon`` is a static Python int.
    """

    init: Callable[[], Any]
    update: Callable[[Any, ArrayLike], Any]
    rollout: Callable[[Any, ArrayLike, int], jax.Array]


class ARLossState(NamedTuple):
    """State of :func:`ar_loss_predictor`.

    Attributes:
        history: ``[p]`` float32, the last ``p`` losses, newest first.
        count: int32 scalar, the number of losses observed.
        gram: ``[p+1, p+1]`` float32, forgetting-weighted ``Σ x xᵀ``, ``x = (1, history)``.
        moment: ``[p+1]`` float32, forgetting-weighted ``Σ x ℓ``.
        coef: ``[p+1]`` float32, the fitted ``θ`` (bias first).
    """

    history: jax.Array
    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax
    gram: jax.Array
    moment: jax.Array
    coef: jax.Array


def ar_loss_predictor(order: int = 2, *, forget: float = 0.99, rtol: float = 1e-6) -> LossPredictor:
    """Online linear AR(p) loss predictor fitted by forgetting least squares (the default).

    Model: ``ℓ_{t+1} = θ₀ + θ₁ ℓ_t + … + θ_p ℓ_{t−p+1}``. Each observed loss (once ``p`` earlier
    ones exist) adds its regression row with weights decaying by ``f`` per step:

        G ← f G + x xᵀ,   b ← f b + x ℓ,   θ = θ_prior + G⁺ (b − G θ_prior),

    ``G⁺`` the pseudo-inverse (eigenvalues below ``rtol·λ_max`` dropped) and
    ``θ_prior = (0, 1, 0, …)`` the persistence model ``ℓ_{t+1} = ℓ_t``, which is kept in the
    directions the data do not determine (all of them before any data). The rollout iterates
    the model on its own predictions; its derivative in the newest loss is, for ``p = 1``,
    ``∂ℓ̂_j/∂ℓ_t = θ₁^j``. Any exactly linear sequence ``ℓ_t = a + b·t`` is fitted with zero
    residual, so its future is predicted exactly (up to float32 rounding).

    Args:
        order: ``p ≥ 1``.
        forget: forgetting factor ``f`` in ``(0, 1]`` (memory ``≈ 1/(1 − f)`` losses).
        rtol: relative eigenvalue cut-off of the pseudo-inverse, in ``[0, 1)``.

    Returns:
        A :class:`LossPredictor` with state :class:`ARLossState`.

    Raises:
        ValueError: ``order < 1``, ``forget`` outside ``(0, 1]`` or ``rtol`` outside
            ``[0, 1)`` (NaN included).
        TypeError: a non-integer ``order``, a non-numeric ``forget`` or ``rtol``.

    Example:
        >>> import jax
        >>> from jaxstale.lc_asgd import ar_loss_predictor
        >>> lp = ar_loss_predictor(order=2)
        >>> s = lp.init()
        >>> update = jax.jit(lp.update)
        >>> for t in range(20):
        ...     s = update(s, 3.0 - 0.1 * t)         # a falling linear trend, last loss 1.1
        >>> [round(float(v), 4) for v in lp.rollout(s, 1.1, 3)]
        [1.0, 0.9, 0.8]

    References:
        Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
        Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
    """
    name = "ar_loss_predictor"
    p = check_int(order, "order", name, 1)
    check_range(forget, "forget", name, 0, 1, low_open=True, high_open=False)
    check_range(rtol, "rtol", name, 0, 1)
    prior = jnp.zeros((p + 1,), jnp.float32).at[1].set(1.0)

    def init() -> ARLossState:
        return ARLossState(
            history=jnp.zeros((p,), jnp.float32),
            count=jnp.zeros((), jnp.int32),
            gram=jnp.zeros((p + 1, p + 1), jnp.float32),
            moment=jnp.zeros((p + 1,), jnp.float32),
            coef=jnp.array(prior, copy=True),
        )

    def update(state: ARLossState, loss: ArrayLike) -> ARLossState:
        y = jnp.asarray(loss, jnp.float32)
        x = jnp.concatenate([jnp.ones((1,), jnp.float32), state.history])
        use = (state.count >= p).astype(jnp.float32)
        gram = forget * state.gram + use * jnp.outer(x, x)
        moment = forget * state.moment + use * x * y
        evals, evecs = jnp.linalg.eigh(gram)
        keep = evals > rtol * jnp.maximum(evals[-1], 1e-30)
        inv = jnp.where(keep, 1.0 / jnp.where(keep, evals, 1.0), 0.0)
        resid = moment - gram @ prior
        coef = prior + evecs @ (inv * (evecs.T @ resid))
        history = jnp.concatenate([y[None], state.history[:-1]])
        return ARLossState(history, state.count + 1, gram, moment, coef)

    def rollout(state: ARLossState, latest: ArrayLike, horizon: int) -> jax.Array:
        h = check_int(horizon, "horizon", f"{name}.rollout", 1)
        hist = state.history.at[0].set(jnp.asarray(latest, jnp.float32))
        coef = jax.lax.stop_gradient(state.coef)

        def step(hist: jax.Array, _: None) -> tuple[jax.Array, jax.Array]:
            nxt = coef[0] + coef[1:] @ hist
            return jnp.concatenate([nxt[None], hist[:-1]]), nxt

        _, preds = jax.lax.scan(step, hist, None, length=h, unroll=True)
        return preds

    return LossPredictor(init=init, update=update, rollout=rollout)


class _TinyGRU(nnx.Module):
    """GRU cell over scalar inputs and a linear residual head (zero-initialised)."""

    def __init__(self, hidden: int, rngs: nnx.Rngs):
        self.cell = nnx.GRUCell(1, hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)


class RNNLossState(NamedTuple):
    """State of :func:`rnn_loss_predictor`.

    Attributes:
        params: the GRU's parameters (an ``nnx.State``).
        opt_state: the Adam state.
        window: ``[W]`` float32, the last ``W`` losses, oldest first.
        count: int32 scalar, the number of losses observed.
        scale: float32 scalar, the first observed loss (losses are divided by it).
    """

    params: Any
    opt_state: Any
    window: jax.Array
    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax
    scale: jax.Array


def rnn_loss_predictor(
    hidden: int = 8, *, window: int = 8, learning_rate: float = 1e-2, seed: int = 0
) -> LossPredictor:
    """Tiny recurrent loss predictor (a Flax NNX GRU) trained online.

    Losses are divided by the first observed loss ``s``. The GRU reads the last ``W`` losses and
    predicts the next one as a residual on persistence, ``ℓ̂_{t+1} = ℓ_t + s·head(h_t)`` (the
    head starts at zero, so an untrained model predicts persistence). Each observed loss, once
    ``W`` earlier ones exist, is one Adam step on the squared error of that next-step
    prediction. The rollout feeds its own predictions back, ``H`` steps.

    Args:
        hidden: GRU width (keep it tiny; 8 has 240 parameters).
        window: ``W``, the number of past losses the GRU reads.
        learning_rate: Adam learning rate (finite, ``> 0``; an optax schedule is not checked).
        seed: initialisation seed.

    Returns:
        A :class:`LossPredictor` with state :class:`RNNLossState`.

    Raises:
        ValueError: ``hidden < 1``, ``window < 1``, or a ``learning_rate`` that is not finite
            and ``> 0``.
        TypeError: a non-integer ``hidden`` or ``window``, a non-numeric ``learning_rate``.

    Example:
        >>> import jax
        >>> from jaxstale.lc_asgd import rnn_loss_predictor
        >>> lp = rnn_loss_predictor()
        >>> s = jax.jit(lp.update)(lp.init(), 2.0)
        >>> rollout = jax.jit(lp.rollout, static_argnums=2)
        >>> [round(float(v), 3) for v in rollout(s, 2.0, 2)]  # untrained: persistence
        [2.0, 2.0]

    References:
        Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
        Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
    """
    name = "rnn_loss_predictor"
    hidden = check_int(hidden, "hidden", name, 1)
    w_len = check_int(window, "window", name, 1)
    if not callable(learning_rate):
        check_range(learning_rate, "learning_rate", name, 0, low_open=True)
    graphdef, params0 = nnx.split(_TinyGRU(hidden, nnx.Rngs(seed)), nnx.Param)
    tx = optax.adam(learning_rate)

    def cell(params: Any, carry: jax.Array, x: jax.Array) -> jax.Array:
        carry, _ = nnx.merge(graphdef, params).cell(carry, x.reshape(1, 1))
        return carry

    def head(params: Any, carry: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params).head(carry)[0, 0]

    def encode(params: Any, seq: jax.Array) -> jax.Array:
        def body(carry: jax.Array, x: jax.Array) -> tuple[jax.Array, None]:
            return cell(params, carry, x), None

        carry, _ = jax.lax.scan(body, jnp.zeros((1, hidden), jnp.float32), seq)
        return carry

    def init() -> RNNLossState:
        params = jax.tree.map(lambda a: jnp.array(a, copy=True), params0)
        return RNNLossState(
            params=params,
            opt_state=tx.init(params),
            window=jnp.zeros((w_len,), jnp.float32),
            count=jnp.zeros((), jnp.int32),
            scale=jnp.ones((), jnp.float32),
        )

    def update(state: RNNLossState, loss: ArrayLike) -> RNNLossState:
        y = jnp.asarray(loss, jnp.float32)
        scale = jnp.where(state.count == 0, jnp.where(y != 0, jnp.abs(y), 1.0), state.scale)
        seq = state.window / scale

        def mse(params: Any) -> jax.Array:
            pred = seq[-1] + head(params, encode(params, seq))
            return (pred - y / scale) ** 2

        grads = jax.grad(mse)(state.params)
        upd, opt_state = tx.update(grads, state.opt_state, state.params)
        train = state.count >= w_len
        stepped = optax.apply_updates(state.params, upd)
        params = jax.tree.map(lambda a, b: jnp.where(train, a, b), stepped, state.params)
        opt_state = jax.tree.map(lambda a, b: jnp.where(train, a, b), opt_state, state.opt_state)
        window = jnp.concatenate([state.window[1:], y[None]])
        return RNNLossState(params, opt_state, window, state.count + 1, scale)

    def rollout(state: RNNLossState, latest: ArrayLike, horizon: int) -> jax.Array:
        h = check_int(horizon, "horizon", f"{name}.rollout", 1)
        params = jax.lax.stop_gradient(state.params)
        scale = state.scale
        seq = state.window.at[-1].set(jnp.asarray(latest, jnp.float32)) / scale
        carry = encode(params, seq)

        def body(c: tuple[jax.Array, jax.Array], _: None) -> tuple[Any, jax.Array]:
            carry, last = c
            nxt = last + head(params, carry)
            return (cell(params, carry, nxt), nxt), nxt

        _, preds = jax.lax.scan(body, (carry, seq[-1]), None, length=h)
        return preds * scale

    return LossPredictor(init=init, update=update, rollout=rollout)


def delay_loss(
    predictor: LossPredictor,
    state: Any,
    latest: ArrayLike,
    steps: ArrayLike,
    horizon: int,
    *,
    clip_sensitivity: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """``ℓ_delay`` (the predicted losses of the next ``k`` steps, summed) and ``∂ℓ_delay/∂ℓ``.

    With ``ℓ̂_1, …, ℓ̂_H`` the rollout from newest loss ``ℓ = latest`` and ``k = steps`` clipped
    to ``[0, H]``, ``ℓ_delay(ℓ) = Σ_{j=1}^{H} c_j ℓ̂_j(ℓ)`` with ``c_j = clip(k − j + 1, 0, 1)``
    — the sum of the first ``k`` predictions for integer ``k``, linear in between for a
    fractional ``k``. The slope is ``Σ_j c_j ∂ℓ̂_j/∂ℓ`` (one forward-mode pass). With
    ``clip_sensitivity`` each ``∂ℓ̂_j/∂ℓ`` is clipped to ``[0, 1]`` (a future loss moves at
    most one-for-one with the current one, as under persistence): a safeguard against an
    explosive online fit, **ours**; without it the slope is exactly ``dℓ_delay/dℓ``.

    Args:
        predictor: a :class:`LossPredictor`.
        state: its state (already updated with ``latest``, if it is part of the sequence).
        latest: the newest loss ``ℓ`` (the worker's loss in LC-ASGD).
        steps: ``k``, the predicted number of steps (float or int, traced is fine).
        horizon: ``H``, static maximum number of steps.
        clip_sensitivity: clip each step's sensitivity to ``[0, 1]``.

    Returns:
        ``(ℓ_delay, slope)``, two float32 scalars (``slope = ∂ℓ_delay/∂ℓ`` unless clipped).

    Example:
        >>> from jaxstale.lc_asgd import ar_loss_predictor, delay_loss
        >>> lp = ar_loss_predictor(order=1)
        >>> s = lp.init()                          # no data: persistence, ℓ̂_j = ℓ
        >>> [round(float(v), 4) for v in delay_loss(lp, s, 2.0, 3, horizon=8)]
        [6.0, 3.0]
    """
    h = check_int(horizon, "horizon", "delay_loss", 1)
    k = jnp.clip(jnp.asarray(steps, jnp.float32), 0.0, float(h))
    weights = jnp.clip(k - jnp.arange(h, dtype=jnp.float32), 0.0, 1.0)
    z = jnp.asarray(latest, jnp.float32)
    preds, sens = jax.jvp(lambda v: predictor.rollout(state, v, h), (z,), (jnp.ones_like(z),))
    if clip_sensitivity:
        sens = jnp.clip(sens, 0.0, 1.0)
    # fixed-order sums: a reduce's order is XLA's per program (a run alone vs a vmapped lane)
    return fixed_sum(weights * preds), fixed_sum(weights * sens)
