"""Checks of traced values (``checkify``), off unless asked for: they slow every jitted call.

A hyper-parameter or index that is traced (inside ``jax.jit``, ``lax.scan``, ``jax.vmap``, or
injected by ``optax.inject_hyperparams``) cannot be checked on the host. ``checkify`` can check
it — but a jitted function holding a ``checkify.debug_check`` carries an error effect, and JAX
then dispatches *every* call of it through its slow path (measured here: about 130 µs per call
instead of 8 µs, and 4x the time of a digits-sized emulated update). So the library registers
those checks only after :func:`enable_traced_checks` (or with ``JAXSTALE_TRACED_CHECKS=1`` in
the environment), for debugging: wrap the computation in ``jax.experimental.checkify.checkify``
to have them reported. Concrete values are always checked at once. The switch acts when a
function is traced: set it before the first call of a jitted step.
"""

from __future__ import annotations

import os
from typing import Any

from jax.experimental import checkify

__all__ = ["debug_check", "enable_traced_checks", "traced_checks_enabled"]

_ENABLED = os.environ.get("JAXSTALE_TRACED_CHECKS", "") not in ("", "0")


def enable_traced_checks(enabled: bool = True) -> bool:
    """Register ``checkify`` checks of traced hyper-parameters and indices from now on.

    Off by default (see the module docstring: an effectful check slows every jitted call). It
    applies to functions traced after the call; returns the previous setting.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.experimental import checkify
        >>> from jaxstale import VersionBuffer, enable_traced_checks
        >>> before = enable_traced_checks()
        >>> buf = VersionBuffer.create({"w": jnp.zeros(2)}, capacity=3)
        >>> err, _ = jax.jit(checkify.checkify(lambda b, t: b.get(t)))(buf, jnp.int32(5))
        >>> print(err.get())
        VersionBuffer.get: tau=5 is outside [0, 3) (`check` failed)
        >>> _ = enable_traced_checks(before)
    """
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(enabled)
    return previous


def traced_checks_enabled() -> bool:
    """Whether traced values are checked (:func:`enable_traced_checks`)."""
    return _ENABLED


def debug_check(predicate: Any, message: str, **kwargs: Any) -> None:
    """``checkify.debug_check(predicate, message, **kwargs)`` if traced checks are enabled."""
    if _ENABLED:
        checkify.debug_check(predicate, message, **kwargs)
