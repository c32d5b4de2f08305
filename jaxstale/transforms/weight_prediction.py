"""Weight prediction for pipelines: SpecTrain's constant-velocity and NAG's decaying predictor."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxstale.transforms._utils import broadcast_prefix, check_like, check_range

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
    """

    inner_state: optax.OptState
    last_update: optax.Updates
    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax


def weight_prediction(
    inner: optax.GradientTransformation,
) -> optax.GradientTransformationExtraArgs:
    """Wrap an optax optimizer so that it remembers the last update it applied, for prediction.

    ``update`` is exactly ``inner.update`` (extra arguments are forwarded) and additionally
    stores its output ``Δw_last = w_{t} − w_{t−1}`` (the update that ``optax.apply_updates``
    adds). :func:`predict_weights` then extrapolates the weights ``s`` updates ahead from it.

    Built on "the last update applied", one predictor covers several optimizers: with
    ``optax.sgd(η, μ)`` ``Δw_last = −η·v`` (``v`` the momentum buffer after the latest gradient),
    so ``w + s·Δw_last = w − s·η·v`` is SpecTrain's prediction exactly; with Adam it is
    ``w − s·η·m̂/(sqrt(v̂)+ε)``, the XPipe / PipeOptim predictor.

    Staleness semantics: the wrapper itself never changes the updates: the chain is bit for bit
    the inner optimizer. Staleness enters only through the horizon ``steps`` of
    :func:`predict_weights` (``steps = 0`` returns the weights unchanged).

    Args:
      inner: any ``optax.GradientTransformation`` (typically a full optimizer such as
        ``optax.sgd(0.1, momentum=0.9)`` or ``optax.adam(1e-3)``).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` with a :class:`WeightPredictionState`.

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
      Parallelism for Multi-GPU DNN Training", arXiv 2019, https://arxiv.org/abs/1911.04610
    """
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: optax.Params) -> WeightPredictionState:
        return WeightPredictionState(
            inner_state=inner.init(params),
            last_update=optax.tree.zeros_like(params),
            count=jnp.zeros((), jnp.int32),
        )

    def update_fn(
        updates: optax.Updates,
        state: WeightPredictionState,
        params: optax.Params | None = None,
        **extra_args: Any,
    ) -> tuple[optax.Updates, WeightPredictionState]:
        new_updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
        return new_updates, WeightPredictionState(
            inner_state=inner_state,
            last_update=new_updates,
            count=optax.safe_increment(state.count),
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
RULES: tuple[str, ...] = ("spectrain", "nesterov")


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
    """Predict the weights ``steps`` updates ahead from the last update applied.

    .. math::

        \\text{spectrain:}\\quad \\hat w = w + s\\,\\Delta w_{last}
        \\qquad\\qquad
        \\text{nesterov:}\\quad \\hat w = w + \\Delta w_{last}\\,(\\mu + \\mu^2 + \\dots + \\mu^s)
        = w + \\Delta w_{last}\\,\\frac{\\mu (1 - \\mu^s)}{1 - \\mu}

    (``0 ≤ μ < 1``). With ``optax.sgd(η, μ)`` as the inner optimizer ``Δw_last = −η v``:
    SpecTrain's ``w − s·η·v`` (constant velocity) and NAG's decaying extrapolation
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
      rule: ``"spectrain"`` (constant velocity) or ``"nesterov"`` (geometric decay with ``μ``).
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
    # flax.nnx states (nnx.Optimizer.opt_state, nnx.state(model, nnx.Param)) may hold Variables
    last = check_like(wp_state.last_update, params, "the state's last_update", "params", name)
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
        coef = s.astype(jnp.float32) if rule == "spectrain" else _geometric(mu, s)
        predicted = (w + coef.astype(delta.dtype) * delta).astype(w.dtype)
        return jnp.where(s == 0, w, predicted)

    return jax.tree.map(predict, params, last, per_leaf)
