"""Weight prediction for pipelines: SpecTrain's constant-velocity, NAG's decaying and PipeMare's
backward predictor."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxstale._checks import check_range
from jaxstale.transforms._utils import broadcast_prefix, check_like

__all__ = [
    "WeightPredictionState",
    "find_weight_prediction_state",
    "predict_weights",
    "weight_prediction",
]


class WeightPredictionState(NamedTuple):
    """State of :func:`weight_prediction`.

    Attributes:
      inner_state: the wrapped optimizer's state.
      last_update: ``Δw_last``, the update the wrapped optimizer returned last (the quantity
        added to the parameters by ``optax.apply_updates``); zeros before the first update.
      count: ``int32`` number of updates so far.
      velocity: ``δ``, the exponential moving average of the updates
        (``weight_prediction(..., velocity_decay=γ)``), or ``None``.
    """

    inner_state: optax.OptState
    last_update: optax.Updates
    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax
    velocity: optax.Updates | None = None


def weight_prediction(
    inner: optax.GradientTransformation,
    *,
    velocity_decay: float | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Wrap an optax optimizer so that it remembers the last update it applied, for prediction.

    ``update`` is exactly ``inner.update`` (extra arguments are forwarded) and additionally
    stores its output ``Δw_last = w_{t} − w_{t−1}`` (the update that ``optax.apply_updates``
    adds). :func:`predict_weights` then extrapolates the weights ``s`` updates ahead from it.

    Built on "the last update applied", one predictor covers several optimizers: with
    ``optax.sgd(η, μ)`` ``Δw_last = −η·v`` (``v`` the momentum buffer after the latest gradient),
    so ``w + s·Δw_last = w − s·η·v`` is SpecTrain's prediction exactly; with ``optax.adam`` it is
    ``w − s·η·m̂_t/(sqrt(v̂_t)+ε)`` with the moments and bias corrections of the last step ``t``,
    PipeOptim's predictor (official code, ``optimizer.py::load_predicted_weights``; XPipe's own
    formula was not reachable). The two coincide mathematically for ``optax.adam`` and for
    ``optax.adamw`` with ``weight_decay=0`` (float rounding aside: PipeOptim divides
    ``sqrt(v)/sqrt(1−β2^t)`` where optax takes ``sqrt(v/(1−β2^t))``). They differ for
    ``optax.adamw`` by the last step's decoupled decay, ``Δw_last`` including ``−η·λ·w_{t−1}``
    that PipeOptim leaves out (a relative difference of about ``λ·|w|`` per coordinate, small for
    the usual ``λ ≤ 0.1``); for ``optax.nadam(w)`` by the fresh-gradient term NAdam adds to
    ``m̂``; and, under a learning-rate schedule, in which step's rate multiplies.

    With ``velocity_decay=γ`` the state also keeps ``δ ← γ·δ + (1 − γ)·Δw`` (``δ_0 = 0``), the
    weight velocity of PipeMare's backward correction (``rule="pipemare"`` of
    :func:`predict_weights`).

    Staleness semantics: the wrapper itself never changes the updates: the chain is bit for bit
    the inner optimizer. Staleness enters only through the horizon ``steps`` of
    :func:`predict_weights` (``steps = 0`` returns the weights unchanged).

    Args:
      inner: any ``optax.GradientTransformation`` (typically a full optimizer such as
        ``optax.sgd(0.1, momentum=0.9)`` or ``optax.adam(1e-3)``).
      velocity_decay: ``γ`` in ``[0, 1)`` of the update average ``δ``; ``None``: no ``δ``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` with a :class:`WeightPredictionState`.

    Raises:
      TypeError: ``inner`` is not an optax ``GradientTransformation`` (e.g. the name
        ``"sgd"``, or the factory ``optax.sgd`` rather than ``optax.sgd(0.1)``).
      ValueError: ``velocity_decay`` outside ``[0, 1)`` or NaN.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from jaxstale import predict_weights, weight_prediction
      >>> tx = weight_prediction(optax.sgd(0.1, momentum=0.5))
      >>> w = jnp.array([1.0])
      >>> state = tx.init(w)
      >>> upd, state = tx.update(jnp.array([2.0]), state, w)   # v = 2, Δw = -0.2
      >>> w = optax.apply_updates(w, upd)
      >>> round(float(predict_weights(w, state, 3)[0]), 6)   # 0.8 + 3·(-0.2)
      0.2
      >>> round(float(predict_weights(w, state, 3, rule="nesterov", momentum=0.5)[0]), 6)
      0.625

    References:
      Chi-Chung Chen, Chia-Lin Yang, Hsiang-Yun Cheng, "Efficient and Robust Parallel DNN
      Training through Model Parallelism on Multi-GPU Platform" (SpecTrain), arXiv 2018,
      https://arxiv.org/abs/1809.02839;
      Lei Guan, Wotao Yin, Dongsheng Li, Xicheng Lu, "XPipe: Efficient Pipeline Model
      Parallelism for Multi-GPU DNN Training", arXiv 2019, https://arxiv.org/abs/1911.04610;
      Lei Guan et al., "PipeOptim: Ensuring Effective 1F1B Schedule with Optimizer-Dependent
      Weight Prediction", arXiv 2023, https://arxiv.org/abs/2312.00839,
      code https://github.com/guanleics/PipeOptim
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        hint = " (call the factory: optax.sgd(0.1), not optax.sgd)" if callable(inner) else ""
        raise TypeError(
            "weight_prediction: inner must be an optax GradientTransformation (the optimizer "
            f"it wraps, e.g. optax.sgd(0.1, momentum=0.9)){hint}, got {type(inner).__name__}"
        )
    inner = optax.with_extra_args_support(inner)
    if velocity_decay is not None:
        check_range(velocity_decay, "velocity_decay", "weight_prediction", 0, 1)
    gamma = velocity_decay

    def init_fn(params: optax.Params) -> WeightPredictionState:
        return WeightPredictionState(
            inner_state=inner.init(params),
            last_update=optax.tree.zeros_like(params),
            count=jnp.zeros((), jnp.int32),
            velocity=None if gamma is None else optax.tree.zeros_like(params),
        )

    def update_fn(
        updates: optax.Updates,
        state: WeightPredictionState,
        params: optax.Params | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, WeightPredictionState]:
        new_updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
        velocity = state.velocity
        if gamma is not None:
            velocity = optax.tree.update_moment(new_updates, state.velocity, gamma, 1)
        return new_updates, WeightPredictionState(
            inner_state=inner_state,
            last_update=new_updates,
            count=optax.safe_increment(state.count),
            velocity=velocity,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def find_weight_prediction_state(state: Any) -> WeightPredictionState:
    """The single :class:`WeightPredictionState` inside an optimizer state (e.g. of a chain).

    Args:
      state: a ``WeightPredictionState`` or any optax state containing exactly one (a chain's
        tuple, ``inject_hyperparams``' state, ...).

    Returns:
      The ``WeightPredictionState``.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from jaxstale import dc_asgd, find_weight_prediction_state, weight_prediction
      >>> tx = optax.chain(dc_asgd(), weight_prediction(optax.sgd(0.1)))
      >>> state = tx.init(jnp.zeros(2))
      >>> int(find_weight_prediction_state(state).count)
      0
    """
    found = [
        s
        for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, WeightPredictionState))
        if isinstance(s, WeightPredictionState)
    ]
    if len(found) != 1:
        raise ValueError(
            "predict_weights: state must be (or contain exactly one) WeightPredictionState, the "
            f"state of jaxstale.weight_prediction(...); found {len(found)} in a "
            f"{type(state).__name__}"
        )
    return found[0]


#: The prediction rules of :func:`predict_weights`.
RULES: tuple[str, ...] = ("spectrain", "nesterov", "pipemare")


def _geometric(mu: jax.typing.ArrayLike, steps: jax.Array) -> jax.Array:
    """``μ + μ² + … + μ^s = μ(1 − μ^s)/(1 − μ)`` (``s`` for ``μ = 1``), exact at ``s ∈ {0, 1}``."""
    mu = jnp.asarray(mu, jnp.float32)
    s = steps.astype(jnp.float32)
    one = jnp.ones_like(mu)
    safe_denominator = jnp.where(mu == 1, one, one - mu)
    closed = jnp.where(mu == 1, s, mu * (one - mu**s) / safe_denominator)
    return jnp.where(s == 0, jnp.zeros_like(closed), jnp.where(s == 1, mu, closed))


def predict_weights(
    params: optax.Params,
    state: Any,
    steps: Any,
    *,
    rule: str = "spectrain",
    momentum: jax.typing.ArrayLike | None = None,
) -> optax.Params:
    """Predict the weights ``steps`` updates ahead from the last update applied (or back).

    .. math::

        \\text{spectrain:}\\quad \\hat w = w + s\\,\\Delta w_{last}
        \\qquad\\qquad
        \\text{nesterov:}\\quad \\hat w = w + \\Delta w_{last}\\,(\\mu + \\mu^2 + \\dots + \\mu^s)
        = w + \\Delta w_{last}\\,\\frac{\\mu (1 - \\mu^s)}{1 - \\mu}

    (``0 ≤ μ < 1``), and ``"pipemare"``, ``ŵ = w − s·δ``: ``s`` updates *back* with the average
    update ``δ`` of ``weight_prediction(..., velocity_decay=γ)`` — PipeMare's discrepancy
    correction as we read it (no public code; :mod:`jaxstale.pipeline.policies`). With
    ``optax.sgd(η, μ)`` as the inner optimizer ``Δw_last = −η v``: SpecTrain's ``w − s·η·v``
    (constant velocity) and NAG's decaying extrapolation
    ``w − η·v·(μ + … + μ^s)``, whose ``s = 1`` point ``w − η μ v`` is Nesterov's look-ahead.

    Staleness semantics: ``steps = s`` is the number of updates between the weights available
    now and the target version the pass should have used (``target − current`` from a pipeline
    schedule's version table). ``steps = 0`` returns ``params`` exactly (bit for bit).
    ``Δw_last`` is taken as is: under a learning-rate schedule it carries the last step's rate.

    Checks: an unknown ``rule`` and a missing ``momentum`` for ``"nesterov"`` raise
    ``ValueError``; so do a concrete negative ``steps`` and a concrete ``momentum`` outside
    ``[0, 1)`` (``"nesterov"`` only). A *traced* ``steps`` or ``momentum`` (inside ``jax.jit``,
    ``lax.scan``, ``jax.vmap``) is checked by ``checkify`` after
    :func:`jaxstale.enable_traced_checks` (wrap the computation in ``checkify.checkify``);
    otherwise a traced negative horizon predicts ``0`` steps (the weights unchanged).

    Args:
      params: the current weights ``w`` (a pytree like the optimizer's parameters; ``flax.nnx``
        ``Variable`` wrappers may differ from the state's).
      state: the :class:`WeightPredictionState` of :func:`weight_prediction` or an optimizer
        state containing exactly one (e.g. of ``optax.chain(dc_asgd(), weight_prediction(...))``
        or an ``nnx.Optimizer``'s ``opt_state``).
      steps: the horizon ``s ≥ 0``: an int scalar (may be traced) or a pytree prefix of
        ``params`` of such scalars (per-leaf horizons, e.g. one per pipeline-stage sub-tree).
      rule: ``"spectrain"`` (constant velocity), ``"nesterov"`` (geometric decay with ``μ``) or
        ``"pipemare"`` (back along ``δ``; the state must keep ``δ``).
      momentum: ``μ`` in ``[0, 1)``, required for ``rule="nesterov"`` (use the optimizer's
        momentum); ignored by ``"spectrain"``.

    Returns:
      The predicted weights, a pytree with the structure of ``params``.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from jaxstale import predict_weights, weight_prediction
      >>> tx = weight_prediction(optax.sgd(1.0))
      >>> params = {"stage0": jnp.array([0.0]), "stage1": jnp.array([0.0])}
      >>> state = tx.init(params)
      >>> grads = {"stage0": jnp.array([1.0]), "stage1": jnp.array([1.0])}
      >>> upd, state = tx.update(grads, state, params)          # Δw_last = -1
      >>> pred = predict_weights(params, state, {"stage0": 3, "stage1": 0})
      >>> float(pred["stage0"][0]), float(pred["stage1"][0])    # one horizon per stage
      (-3.0, 0.0)

    References:
      Chi-Chung Chen, Chia-Lin Yang, Hsiang-Yun Cheng, "Efficient and Robust Parallel DNN
      Training through Model Parallelism on Multi-GPU Platform" (SpecTrain), arXiv 2018,
      https://arxiv.org/abs/1809.02839;
      Yurii Nesterov, "A method for solving the convex programming problem with convergence rate
      O(1/k²)", Soviet Mathematics Doklady, 1983 (the look-ahead point).
    """
    name = "predict_weights"
    if rule not in RULES:
        raise ValueError(f"{name}: unknown rule {rule!r}; known: {', '.join(map(repr, RULES))}")
    if rule == "nesterov":
        if momentum is None:
            raise ValueError(
                f"{name}: rule='nesterov' needs momentum=μ (the optimizer's momentum), got None"
            )
        check_range(momentum, "momentum", name, 0, 1)
    wp_state = find_weight_prediction_state(state)
    if rule == "pipemare" and wp_state.velocity is None:
        raise ValueError(
            f"{name}: rule='pipemare' needs the update average δ: build the optimizer with "
            "weight_prediction(..., velocity_decay=γ)"
        )
    # flax.nnx states (nnx.Optimizer.opt_state, nnx.state(model, nnx.Param)) may hold Variables
    delta = wp_state.velocity if rule == "pipemare" else wp_state.last_update
    last = check_like(delta, params, "the state's last_update", "params", name)
    per_leaf = broadcast_prefix(steps, params, "steps", name)
    mu: jax.typing.ArrayLike = 0.0 if momentum is None else momentum

    def predict(w, delta, s):
        s = jnp.asarray(s)
        if not jnp.issubdtype(s.dtype, jnp.integer) or s.shape != ():
            raise TypeError(
                f"{name}: steps must be integer scalars, got dtype {s.dtype}, shape {s.shape}"
            )
        check_range(s, "steps", name, 0)
        s = jnp.maximum(s, 0)  # a traced negative horizon (reported under checkify) predicts 0
        if rule == "nesterov":
            coef = _geometric(mu, s)
        else:
            coef = s.astype(jnp.float32) * (-1.0 if rule == "pipemare" else 1.0)
        predicted = (w + coef.astype(delta.dtype) * delta).astype(w.dtype)
        return jnp.where(s == 0, w, predicted)

    return jax.tree.map(predict, params, last, per_leaf)
