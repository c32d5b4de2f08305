"""The asynchronous methods: what the parameter server applies, as a registry of builders.

A method is a builder ``build(hp: HParams) -> optax transformation | MethodSpec``, built inside
the executors' compiled step from traced hyper-parameters (one program per method serves every
learning rate and worker count of a sweep). The server calls the transformation as
``tx.update(g, state, w_t, stale_params=w_worker, staleness=τ, worker=i, worker_loss=ℓ, ...)``:
staleness-aware transforms read the extra arguments, plain optax ignores them.

**Built-in methods** (:data:`METHODS`; ``opt = optax.sgd(η, μ)``):

================  =======  ====================================================================
name              mode     server chain
================  =======  ====================================================================
sgd, asgd         async    ``opt`` (``sgd`` is meant for M = 1, ``asgd`` for M > 1)
ssgd              sync     ``opt`` on the average of M fresh gradients
sa-asgd           async    ``chain(staleness_aware(), opt)``: ``g / max(τ, 1)`` (Zhang et al.)
dc-asgd-c         async    ``chain(dc_asgd(0.04), opt)`` (Zheng et al., constant λ)
dc-asgd-a         async    ``chain(dc_asgd(2.0, adaptive=True), opt)`` (adaptive λ, m = 0.95)
dc-asgd-a-pw      async    the same with one ``MS`` per worker (Microsoft's server code)
gap-aware         async    ``chain(gap_aware(η, momentum=μ), opt)`` (Barkai et al.; the
                           statistic of the authors' lab code, a trace of penalised updates)
gap-aware-raw     async    the same with ``statistic="raw"`` (jaxstale 0.1.0's reading: a
                           trace of the raw gradients; kept for comparison)
dana              dana     DANA's per-worker momentum and look-ahead (Hakimi et al.)
dana-dc           dana     ``dc_asgd(2.0, adaptive=True)`` against the look-ahead, then DANA
                           (the LC-ASGD paper's "DC with λ = 2", read as adaptive λ0 = 2 **[ours]**)
ga-dana           dana     ``at_lookahead(gap_aware(η, momentum=μ))``, then DANA (Barkai et al.'s
                           pairing; :func:`build_ga_dana`)
lc-asgd           async    ``chain(lc_asgd(λ), opt)``, ordinary batch norm (Li et al.)
lc-asgd-async-bn  async    the same chain; the server merges batch statistics by Async-BN
================  =======  ====================================================================

**Adding a method** = its transform module plus one line, ``register_method("my-asgd", build)``;
combinations too: ``ga-dana`` is the line ``lambda hp: MethodSpec(at_lookahead(gap_aware(
hp.learning_rate, momentum=hp.momentum)), "dana", hp.learning_rate, hp.momentum)``. In
``"dana"`` mode the server passes a transform the master ``θ`` as ``params``, the look-ahead the
worker computed at as ``stale_params`` and the look-ahead a worker pulling now would get as the
``lookahead`` extra argument; :func:`at_lookahead` makes the latter the transform's ``params``.

**LC-ASGD's λ** (``LC_LAMBDA = 0.1``): in our reading (:mod:`jaxstale.lc_asgd`) the compensation
scales a gradient by ``1 + λ·∂ℓ_delay/∂ℓ_m``, so ``λ > 0`` (the seed's sign as we read it)
enlarges gradients expected to be more stale and ``λ < 0`` damps them; pass ``lam`` to
:func:`build_lc_asgd` for the other sign.

References:
    Zheng et al. "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017,
    arXiv 1609.08326. Zhang et al. "Staleness-aware Async-SGD for Distributed Deep Learning",
    IJCAI 2016, arXiv 1511.05950. Hakimi et al. "Taming Momentum in a Distributed Asynchronous
    Environment", arXiv 1907.11612. Barkai, Hakimi, Schuster. "Gap-Aware Mitigation of Gradient
    Staleness", ICLR 2020, arXiv 1909.10802. Li, He, Ren, Mao. "Developing a Loss Prediction-based
    Asynchronous Stochastic Gradient Descent Algorithm for Distributed Training of Deep Neural
    Networks", ICPP 2020.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale._checks import check_int, check_name, check_range
from jaxstale.asyncdp.bn import async_bn_update
from jaxstale.lc_asgd.compensation import lc_asgd
from jaxstale.transforms import dc_asgd, gap_aware, staleness_aware

__all__ = [
    "DC_LAMBDA0",
    "LC_BN_MOMENTUM",
    "LC_CAPACITY",
    "LC_LAMBDA",
    "METHODS",
    "METHOD_MODES",
    "MODES",
    "HParams",
    "MethodSpec",
    "as_spec",
    "at_lookahead",
    "build_dc_asgd",
    "build_ga_dana",
    "build_lc_asgd",
    "build_lc_asgd_async_bn",
    "build_method",
    "check_hyperparameters",
    "lr_warmup",
    "method_mode",
    "method_names",
    "register_method",
    "resolve",
]

MODES: tuple[str, ...] = ("async", "sync", "dana")

Schedule = Callable[[jax.Array], jax.Array]
LearningRate = float | jax.Array | Schedule

LC_LAMBDA = 0.1
#: DC-ASGD's λ0 by method: the paper's defaults (Zheng et al.: 0.04 constant, 2 adaptive)
DC_LAMBDA0 = {"dc-asgd-c": 0.04, "dc-asgd-a": 2.0}
LC_BN_MOMENTUM = 0.9  # the models' batch-norm momentum (jaxstale.models)
LC_CAPACITY = 256  # static size of LC-ASGD's per-worker arrays (the builder sees M traced)


class HParams(NamedTuple):
    """What a method builder receives: ``learning_rate`` and ``num_workers`` may be traced jax
    scalars (use them in arithmetic, never in Python control flow); ``momentum`` is static.

    Attributes:
        learning_rate: ``η``: a float, a traced scalar, or an optax schedule of the update count
            (the executors' warm-up, :func:`lr_warmup`, arrives here as a schedule).
        momentum: ``μ`` (0.0 = plain SGD), a Python float.
        num_workers: ``M`` of this run (an int or a traced int32 scalar).
        capacity: the executor's static worker capacity ``C ≥ M`` (a Python int; None outside
            an executor): the size of per-worker state, e.g. one DC-ASGD ``MS`` per worker.
    """

    learning_rate: LearningRate | jax.Array
    momentum: float
    num_workers: int | jax.Array
    capacity: int | None = None

    def validate(self, where: str = "HParams") -> HParams:
        """``self``, after checking its concrete fields (traced ones and schedules are skipped).

        Raises:
            ValueError: ``learning_rate`` negative, NaN or infinite; ``momentum`` outside
                ``[0, 1)``; ``num_workers < 1``; ``capacity < num_workers``.
            TypeError: a field of the wrong type (e.g. ``num_workers=2.0``).

        Example:
            >>> from jaxstale.asyncdp import HParams
            >>> HParams(0.1, 0.9, 4).validate().num_workers
            4
        """
        check_hyperparameters(where, self.learning_rate, self.momentum)
        m = None
        if not isinstance(self.num_workers, jax.core.Tracer):
            m = check_int(self.num_workers, "num_workers", where, 1)
        if self.capacity is not None:
            cap = check_int(self.capacity, "capacity", where, 1)
            if m is not None and cap < m:
                raise ValueError(f"{where}: capacity must be >= num_workers={m}, got {cap}")
        return self


def check_hyperparameters(where: str, learning_rate: Any = None, momentum: Any = None) -> None:
    """Refuse a concrete learning rate that is negative, NaN or infinite and a momentum outside
    ``[0, 1)``, with one line that starts with ``where`` (the function called).

    ``learning_rate`` may be one value, a list or tuple of them (one per run), ``None`` (not
    given) or an optax schedule (a callable: not checked); a traced value is not checked
    (:func:`jaxstale._checks.check_range`). ``momentum`` (``None``: not given) is static: a
    Python float.

    Raises:
        ValueError: a value out of range, NaN or infinite.
        TypeError: a value that is not a real number.

    Example:
        >>> from jaxstale.asyncdp.methods import check_hyperparameters
        >>> check_hyperparameters("emulate_async", -0.1)
        Traceback (most recent call last):
        ...
        ValueError: emulate_async: learning_rate must be in [0, inf), got -0.1
    """
    many = isinstance(learning_rate, list | tuple)
    for lr in learning_rate if many else [learning_rate]:
        if lr is not None and not callable(lr):
            check_range(lr, "learning_rate", where, 0)
    if momentum is not None:
        check_range(momentum, "momentum", where, 0, 1)


class MethodSpec(NamedTuple):
    """How the server runs one method.

    Attributes:
        tx: the server's optax chain (in ``"dana"`` mode it only pre-processes the gradient).
        mode: ``"async"`` (the gradient is applied through ``tx``), ``"sync"`` (SSGD: M
            gradients at the same weights averaged, one update) or ``"dana"``.
        learning_rate: ``η`` for ``"dana"`` mode (float or schedule).
        momentum: ``μ`` for ``"dana"`` mode.
        merge_model_state: optional ``merge(server, pulled, returned)`` of batch-norm
            statistics (e.g. Async-BN, :mod:`jaxstale.asyncdp.bn`); ``None``: ordinary BN,
            the server keeps ``returned`` (last writer wins).
    """

    tx: optax.GradientTransformation
    mode: str = "async"
    learning_rate: LearningRate = 0.0
    momentum: float = 0.0
    merge_model_state: Callable[[Any, Any, Any], Any] | None = None


MethodBuilder = Callable[[HParams], "optax.GradientTransformation | MethodSpec"]
Method: TypeAlias = "str | MethodBuilder | optax.GradientTransformation | MethodSpec"


def _sgd(hp: HParams) -> optax.GradientTransformation:
    return optax.sgd(hp.learning_rate, momentum=hp.momentum or None)


def _capacity(hp: HParams, name: str) -> int:
    """The static size of a method's per-worker state: the executor's capacity, else a concrete
    ``M``."""
    if hp.capacity is not None:
        return int(hp.capacity)
    if isinstance(hp.num_workers, int | np.integer):
        return int(hp.num_workers)
    raise ValueError(f"{name} keeps per-worker state: build it with HParams(capacity=C)")


def build_dc_asgd(
    hp: HParams, *, lam: float | None = None, adaptive: bool = False
) -> optax.GradientTransformation:
    """The ``dc-asgd-c`` (``adaptive=False``) and ``dc-asgd-a`` methods at ``λ0 = lam``:
    ``chain(dc_asgd(λ0, adaptive=adaptive), sgd(η, μ))``; ``lam=None``: the paper's ``λ0``
    (:data:`DC_LAMBDA0`: 0.04 constant, 2 adaptive), the registered methods.

    Example:
        >>> from jaxstale.asyncdp.methods import HParams, build_dc_asgd
        >>> tx = build_dc_asgd(HParams(0.1, 0.9, 4), lam=0.4)
        >>> type(tx.init({"w": 0.0})[0]).__name__
        'DCASGDState'
    """
    lam0 = DC_LAMBDA0["dc-asgd-a" if adaptive else "dc-asgd-c"] if lam is None else lam
    return optax.chain(dc_asgd(lam0, adaptive=adaptive), _sgd(hp))


def build_lc_asgd(hp: HParams, *, lam: float = LC_LAMBDA) -> optax.GradientTransformation:
    """The ``lc-asgd`` method: ``chain(lc_asgd(λ), sgd(η, μ))`` with ordinary batch norm.

    Example:
        >>> from jaxstale.asyncdp.methods import HParams, build_lc_asgd
        >>> tx = build_lc_asgd(HParams(0.1, 0.9, 4))
        >>> type(tx.init({"w": 0.0})[0]).__name__
        'LCASGDState'
    """
    comp = lc_asgd(lam, num_workers=hp.num_workers, capacity=LC_CAPACITY)
    return optax.chain(comp, _sgd(hp))


def build_lc_asgd_async_bn(
    hp: HParams,
    *,
    lam: float = LC_LAMBDA,
    decay: float | Callable[[jax.Array], jax.Array] | None = None,
    momentum: float = LC_BN_MOMENTUM,
) -> MethodSpec:
    """The ``lc-asgd-async-bn`` method: the ``lc-asgd`` chain plus the Async-BN server merge.

    ``merge_model_state`` is ``async_bn_update(server, pulled, returned, decay=d, momentum=m)``
    with ``d`` a float or a function of the traced ``M``; default ``1 − m``, the model's own
    time constant (so at ``M = 1`` the merge is ordinary BN).

    Example:
        >>> from jaxstale.asyncdp.methods import HParams, build_lc_asgd_async_bn
        >>> build_lc_asgd_async_bn(HParams(0.1, 0.0, 4)).merge_model_state is not None
        True
    """
    check_range(momentum, "momentum", "build_lc_asgd_async_bn", 0, 1)
    if decay is not None and not callable(decay):
        check_range(decay, "decay", "build_lc_asgd_async_bn", 0, 1, high_open=False)
    if decay is None:
        d: jax.typing.ArrayLike = 1.0 - momentum
    elif callable(decay):
        d = decay(jnp.asarray(hp.num_workers, jnp.float32))
    else:
        d = decay
    merge = functools.partial(async_bn_update, decay=d, momentum=momentum)
    return MethodSpec(build_lc_asgd(hp, lam=lam), merge_model_state=merge)


def at_lookahead(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """``tx`` with the ``lookahead`` extra argument as its ``params`` (``"dana"`` mode).

    The DANA server passes the look-ahead a worker pulling now would get, ``θ_t − η·μ·Σ_t``;
    with it as ``params`` and the worker's look-ahead as ``stale_params`` a transform measures
    its gap between look-ahead points, which is exactly zero with one worker.

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale import gap_aware
        >>> from jaxstale.asyncdp.methods import at_lookahead
        >>> tx = at_lookahead(gap_aware(0.1))
        >>> w = jnp.ones(2)
        >>> out, _ = tx.update(jnp.ones(2), tx.init(w), w + 5, stale_params=w, lookahead=w)
        >>> out.tolist()   # no gap between the look-aheads: the gradient passes unchanged
        [1.0, 1.0]
    """
    inner = optax.with_extra_args_support(tx)

    def update_fn(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if "lookahead" not in extra:
            raise TypeError("at_lookahead: update needs the lookahead=... extra argument")
        return inner.update(updates, state, extra.pop("lookahead"), **extra)

    return optax.GradientTransformationExtraArgs(inner.init, update_fn)


def build_ga_dana(hp: HParams) -> MethodSpec:
    r"""The ``ga-dana`` method: Gap-Aware on the gradient, then DANA's per-worker momentum.

    A worker ``i`` computes ``g`` at the look-ahead ``θ̂_i`` it was sent; the server divides it,
    per coordinate, by Gap-Aware's ``G = 1 + |θ̂ − θ̂_i| / C`` (:func:`jaxstale.gap_aware`, lab
    statistic: ``C = η_max·(sqrt(v̂) + ε)`` from the trace ``m ← μ·m + g̃`` of its outputs), where
    ``θ̂ = θ_t − η·μ·Σ_t`` is the look-ahead a worker pulling now would get; then DANA:

    .. math::

        v^i \leftarrow \mu v^i + g / G, \quad \Sigma \leftarrow \Sigma + \Delta v^i, \quad
        \theta \leftarrow \theta - \eta v^i, \quad \hat\theta_i \leftarrow \theta - \eta\mu\Sigma.

    Confirmed: the pairing (the Gap-Aware paper's abstract: GA "especially when combined with
    DANA"); DANA's update and look-ahead, and that the authors' lab measures its DC gap
    against the look-ahead the worker used (the lab's DANA-DC simulator). **Our reading**
    (no reachable text states it): the GA division before the momentum, as the authors' FTPipe
    code does; the gap's other end, the *current look-ahead* ``θ̂`` rather than the master
    ``θ`` — with ``θ`` a single worker would be penalised by ``|η·μ·v|`` at every step, while
    with ``θ̂`` the gap is exactly zero at ``M = 1``; and GA's step statistic from one trace of
    its outputs (at ``M = 1`` exactly DANA's momentum; the lab may use worker ``i``'s ``v^i``).

    Staleness semantics: with one worker ``G = 1`` exactly and the method is DANA, i.e.
    Nesterov's momentum (Sutskever form): the look-aheads ``θ̂`` are the iterates of
    ``optax.sgd(η, μ, nesterov=True)`` and ``θ = θ̂ + η·μ·v``.

    Example:
        >>> from jaxstale.asyncdp.methods import HParams, build_ga_dana
        >>> build_ga_dana(HParams(0.1, 0.9, 4)).mode
        'dana'

    References:
        Barkai, Hakimi, Schuster, "Gap-Aware Mitigation of Gradient Staleness", ICLR 2020,
        arXiv:1909.10802. Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed
        Asynchronous Environment", arXiv:1907.11612.
    """
    ga = gap_aware(hp.learning_rate, momentum=hp.momentum)
    return MethodSpec(at_lookahead(ga), "dana", hp.learning_rate, hp.momentum)


#: name -> builder: the built-in methods (one line each); ``register_method`` adds yours.
METHODS: dict[str, MethodBuilder] = {
    "sgd": _sgd,
    "ssgd": lambda hp: MethodSpec(_sgd(hp), mode="sync"),
    "asgd": _sgd,
    "sa-asgd": lambda hp: optax.chain(staleness_aware(), _sgd(hp)),
    "dc-asgd-c": build_dc_asgd,
    "dc-asgd-a": functools.partial(build_dc_asgd, adaptive=True),
    "dc-asgd-a-pw": lambda hp: optax.chain(
        dc_asgd(2.0, adaptive=True, num_workers=_capacity(hp, "dc-asgd-a-pw")), _sgd(hp)
    ),
    "gap-aware": lambda hp: optax.chain(
        gap_aware(hp.learning_rate, momentum=hp.momentum), _sgd(hp)
    ),
    "gap-aware-raw": lambda hp: optax.chain(
        gap_aware(hp.learning_rate, momentum=hp.momentum, statistic="raw"), _sgd(hp)
    ),
    "dana": lambda hp: MethodSpec(optax.identity(), "dana", hp.learning_rate, hp.momentum),
    "dana-dc": lambda hp: MethodSpec(
        dc_asgd(2.0, adaptive=True), "dana", hp.learning_rate, hp.momentum
    ),
    "ga-dana": build_ga_dana,
    "lc-asgd": build_lc_asgd,
    "lc-asgd-async-bn": build_lc_asgd_async_bn,
}
BUILTIN = frozenset(METHODS)  # the names register_method cannot replace

#: name -> mode (:data:`MODES`) of every registered method, declared, not learnt by building it:
#: ``"sync"`` (all M workers in lockstep), ``"dana"`` (per-worker momentum, look-aheads sent),
#: else ``"async"``. :func:`build_method` checks that a builder returns what it declared.
METHOD_MODES: dict[str, str] = {
    **dict.fromkeys(METHODS, "async"),
    "ssgd": "sync",
    "dana": "dana",
    "dana-dc": "dana",
    "ga-dana": "dana",
}


def register_method(
    name: str, build: MethodBuilder, *, mode: str = "async", overwrite: bool = False
) -> None:
    """Register ``build(hp: HParams) -> transformation | MethodSpec`` under ``name`` for both
    executors and the experiments (``--methods name``; built-ins cannot be replaced).

    ``mode`` declares what the builder returns (:data:`MODES`: a bare transformation or an
    ``"async"`` spec; a ``MethodSpec`` of mode ``"sync"`` or ``"dana"``), so that experiments
    know a method's mode without building it (:func:`method_mode`); :func:`build_method`
    refuses a builder whose spec differs from its declaration.

    Raises:
        TypeError: ``name`` is not a non-empty string, or ``build`` is not callable.
        ValueError: ``name`` holds a comma or whitespace (``--methods`` takes a comma-separated
            list), is a built-in, or is taken and ``overwrite`` is False; ``mode`` unknown.

    Example:
        >>> import optax
        >>> from jaxstale.asyncdp import register_method, build_method, HParams
        >>> register_method("plain-doc", lambda hp: optax.sgd(hp.learning_rate), overwrite=True)
        >>> build_method("plain-doc", HParams(0.1, 0.0, 4)).mode
        'async'
    """
    check_name(name, "register_method", "method name")
    if not callable(build):
        raise TypeError(f"build must be callable(HParams) -> transformation, got {build!r}")
    if name in BUILTIN or (name in METHODS and not overwrite):
        raise ValueError(f"method {name!r} is already registered (pass overwrite=True for yours)")
    if mode not in MODES:
        raise ValueError(f"register_method: mode must be one of {', '.join(MODES)}, got {mode!r}")
    METHODS[name] = build
    METHOD_MODES[name] = mode


def method_mode(name: str) -> str:
    """The declared mode of a registered method (:data:`METHOD_MODES`), without building it.

    Example:
        >>> from jaxstale.asyncdp import method_mode
        >>> method_mode("ssgd"), method_mode("dana"), method_mode("dc-asgd-a")
        ('sync', 'dana', 'async')
    """
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
    return METHOD_MODES[name]


def method_names() -> tuple[str, ...]:
    """The registered method names, built-ins first."""
    return tuple(METHODS)


def resolve(method: Method) -> MethodBuilder:
    """The builder of a method given by name, builder, transformation or :class:`MethodSpec`."""
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; registered: {', '.join(METHODS)}")
        return METHODS[method]
    if isinstance(method, optax.GradientTransformation | MethodSpec):
        return lambda hp: method
    if callable(method):
        return method
    raise TypeError(
        "method must be a registered name, a builder(HParams), an optax transformation or a "
        f"MethodSpec; got {type(method).__name__}"
    )


def build_method(name: str, hp: HParams) -> MethodSpec:
    """Build a registered method into a :class:`MethodSpec` (a bare transformation: ``"async"``).

    Raises:
        ValueError, TypeError: an unknown ``name``, or bad hyper-parameters
            (:meth:`HParams.validate`).

    Example:
        >>> from jaxstale.asyncdp import build_method, HParams
        >>> build_method("ssgd", HParams(0.1, 0.9, 4)).mode
        'sync'
    """
    build = resolve(name)
    spec = as_spec(build(hp.validate("build_method")))
    declared = METHOD_MODES.get(name) if isinstance(name, str) else None
    if declared is not None and spec.mode != declared:
        raise ValueError(
            f"build_method: method {name!r} was registered as mode {declared!r} but its builder "
            f"returned a {spec.mode!r} MethodSpec (register_method(..., mode={spec.mode!r}))"
        )
    return spec


def as_spec(method: optax.GradientTransformation | MethodSpec) -> MethodSpec:
    """Wrap a bare optax transformation as an ``"async"`` :class:`MethodSpec`; check modes."""
    if isinstance(method, MethodSpec):
        if method.mode not in MODES:
            raise ValueError(f"unknown mode {method.mode!r}; allowed: {', '.join(MODES)}")
        return method._replace(tx=optax.with_extra_args_support(method.tx))
    if isinstance(method, optax.GradientTransformation):
        return MethodSpec(optax.with_extra_args_support(method))
    raise TypeError(f"expected an optax transformation or MethodSpec, got {type(method).__name__}")


def lr_warmup(
    learning_rate: float | jax.Array, num_workers: int | jax.Array, warmup_steps: int
) -> LearningRate:
    """Linear warm-up ``η_t = η · (1/M + (1 − 1/M) · min(t / warmup_steps, 1))`` (the DANA and
    Gap-Aware authors ramp over 5 epochs); ``warmup_steps = 0`` returns ``η`` unchanged and
    ``M = 1`` gives ``η`` bit for bit. ``η`` and ``M`` may be traced.

    Example:
        >>> from jaxstale.asyncdp import lr_warmup
        >>> s = lr_warmup(0.4, 4, 10)
        >>> [round(float(s(t)), 3) for t in (0, 5, 10, 20)]
        [0.1, 0.25, 0.4, 0.4]
    """
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int | np.integer):
        raise TypeError(f"warmup_steps must be an int, got {type(warmup_steps).__name__}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if isinstance(num_workers, int | np.integer) and num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    check_range(learning_rate, "learning_rate", "lr_warmup", 0.0)
    if warmup_steps == 0:
        return learning_rate

    def schedule(count: jax.Array) -> jax.Array:
        inv = 1.0 / jnp.asarray(num_workers, jnp.float32)
        frac = jnp.minimum(jnp.asarray(count, jnp.float32) / warmup_steps, 1.0)
        return learning_rate * (inv + (1.0 - inv) * frac)

    return schedule
