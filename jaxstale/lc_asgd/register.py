"""LC-ASGD as methods of the asynchronous data-parallel emulator: ``lc-asgd``, ``lc-asgd-async-bn``.

:func:`register` adds two methods to :data:`jaxstale.emulate.METHODS` (so
``experiments/async_workers.py --methods lc-asgd,lc-asgd-async-bn`` runs them):

* ``lc-asgd``: ``chain(lc_asgd(λ), sgd(η, μ))`` with ordinary BN (the emulator's default: the
  server keeps the statistics returned with the applied gradient, last writer wins).
* ``lc-asgd-async-bn``: the same chain, and the server merges the workers' batch statistics by
  an EMA (:func:`~jaxstale.lc_asgd.async_bn_update`, decay ``d``) instead of keeping the
  statistics returned with the applied gradient (Async-BN).

**Ordinary BN vs Async-BN.** In the emulator each worker pulls the server's batch-norm running
statistics with its weights and pushes its advanced copy with its gradient (per-worker
snapshots, like the weights). ``lc-asgd`` keeps the emulator's default, ordinary BN: the server
takes the copy that arrives (last writer wins), an EMA along a chain of stale copies.
``lc-asgd-async-bn`` merges each worker's batch statistics into the server's own EMA with decay
``d``; our default ``d = 1 − m`` (the slides give no value) is the model's own time constant,
so at ``M = 1`` the two coincide. Gradients never read the running statistics in training mode,
so both methods train the same weights and differ only in the statistics the server evaluates
with. ``experiments/async_bn.py`` compares them on ResNet-20 (README, "Async-BN vs ordinary
BN").

**The sign of λ** (measured with ``experiments/async_workers.py``: digits, MLP, gamma-timed
workers with their real times, 8 epochs, 3 seeds; test error %, mean over seeds):

==================  ======  ======  =======  ==========  ===========
method              μ=0     μ=0     μ=0      μ=0.9       μ=0.9
                    M=4     M=8     M=16     M=4         M=16
==================  ======  ======  =======  ==========  ===========
sgd (M = 1)         3.2     3.2     3.2      2.9         2.9
asgd                2.9     4.5     69.4     7.4         88.2
sa-asgd             3.8     8.2     12.9     –           –
dc-asgd-c           2.8     3.5     74.2     7.3         87.2
dc-asgd-a           2.9     5.3     46.2     6.8         57.6
lc-asgd, λ = 0.1    3.0     11.2    78.6     5.6         88.0
lc-asgd, λ = −0.05  2.9     4.8     59.7     –           –
lc-asgd, λ = −0.1   3.1     7.0     12.2     5.9         28.3
==================  ======  ======  =======  ==========  ===========

(μ = 0: lr 0.1; μ = 0.9: lr 0.01, the ``--quick`` configuration.)

In our reading the compensation is a per-gradient scale ``1 + λ·∂ℓ_delay/∂ℓ_m``: with ``λ > 0``
(the seed's sign, as we read it) a gradient expected to be more stale is *enlarged*, which hurts
as ``M`` grows; ``λ < 0`` damps stale gradients (a loss-model-driven cousin of SA-ASGD) and
helped most where ASGD nearly diverges. The seeds' spread is large (M = 16 sits at the edge of
divergence; standard deviations up to 20 points). ``LAMBDA`` keeps the seed's sign; pass
``lam`` to :func:`build_lc_asgd` (or register your own method) for the other.

**What the emulator passes.** LC-ASGD needs each gradient's mini-batch loss and worker id:
the emulator's ``tx.update`` call passes the extra arguments ``worker_loss=`` and ``worker=``
(and, where the delay model has real times, ``t_comm=``/``t_comp=``; without them the step
predictor runs on the server's update clock). Async-BN is the model-state merge hook of
:class:`~jaxstale.emulate.MethodSpec` (``merge_model_state(server, pulled, returned)``).

Defaults: ``λ = LAMBDA``, Async-BN decay ``1 − m``, the model's batch-norm momentum
``BN_MOMENTUM`` (``jaxstale.models`` uses 0.9), per-worker arrays of ``CAPACITY`` rows (the
builder sees ``M`` only as a traced number).

References:
    Li, He, Ren, Mao. "Developing a Loss Prediction-based Asynchronous Stochastic Gradient
    Descent Algorithm for Distributed Training of Deep Neural Networks", ICPP 2020.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxstale.lc_asgd.async_bn import async_bn_update
from jaxstale.lc_asgd.compensation import lc_asgd

__all__ = [
    "BN_MOMENTUM",
    "CAPACITY",
    "LAMBDA",
    "METHOD_NAMES",
    "build_lc_asgd",
    "build_lc_asgd_async_bn",
    "register",
]

LAMBDA = 0.1
BN_MOMENTUM = 0.9
CAPACITY = 256
METHOD_NAMES: tuple[str, ...] = ("lc-asgd", "lc-asgd-async-bn")


def _chain(hp: Any, lam: float) -> optax.GradientTransformation:
    inner = optax.sgd(hp.learning_rate, momentum=hp.momentum or None)
    comp = lc_asgd(lam, num_workers=hp.num_workers, capacity=CAPACITY)
    return optax.chain(comp, inner)


def build_lc_asgd(hp: Any, *, lam: float = LAMBDA) -> optax.GradientTransformation:
    """The ``lc-asgd`` method: ``chain(lc_asgd(λ), sgd(η, μ))``.

    Args:
        hp: the emulator's ``HParams`` (``learning_rate``, ``momentum``, ``num_workers``).
        lam: ``λ``.

    Returns:
        The server's optax chain.

    Example:
        >>> from jaxstale.emulate import HParams
        >>> from jaxstale.lc_asgd.register import build_lc_asgd
        >>> tx = build_lc_asgd(HParams(0.1, 0.9, 4))
        >>> type(tx.init({"w": 0.0})[0]).__name__
        'LCASGDState'
    """
    return _chain(hp, lam)


def build_lc_asgd_async_bn(
    hp: Any,
    *,
    lam: float = LAMBDA,
    decay: float | Callable[[jax.Array], jax.Array] | None = None,
    momentum: float = BN_MOMENTUM,
) -> Any:
    """The ``lc-asgd-async-bn`` method: the ``lc-asgd`` chain plus the Async-BN server merge.

    Args:
        hp: the emulator's ``HParams``.
        lam: ``λ``.
        decay: Async-BN EMA decay ``d`` (a float, or a function of the traced ``M``);
            ``None``: ``1 − m`` (module docstring).
        momentum: the model's batch-norm momentum (to recover batch statistics).

    Returns:
        A ``MethodSpec`` whose ``merge_model_state`` is
        ``async_bn_update(server, pulled, returned, decay=d, momentum=m)``.
    """
    from jaxstale.emulate import MethodSpec

    if decay is None:
        d: jax.typing.ArrayLike = 1.0 - momentum
    elif callable(decay):
        d = decay(jnp.asarray(hp.num_workers, jnp.float32))
    else:
        d = decay
    merge = functools.partial(async_bn_update, decay=d, momentum=momentum)
    return MethodSpec(_chain(hp, lam), merge_model_state=merge)


def register(overwrite: bool = True) -> tuple[str, ...]:
    """Register ``lc-asgd`` and ``lc-asgd-async-bn`` with the async emulator (idempotent).

    Args:
        overwrite: replace earlier registrations of these names.

    Returns:
        The registered names.

    Example:
        >>> from jaxstale.emulate import method_names
        >>> from jaxstale.lc_asgd.register import register
        >>> register()
        ('lc-asgd', 'lc-asgd-async-bn')
        >>> "lc-asgd" in method_names()
        True
    """
    from jaxstale.emulate import register_method

    register_method("lc-asgd", build_lc_asgd, overwrite=overwrite)
    register_method("lc-asgd-async-bn", build_lc_asgd_async_bn, overwrite=overwrite)
    return METHOD_NAMES
