"""Argument checks shared by the library: concrete values at once, traced ones on request.

Concrete values (Python and numpy numbers, concrete jax arrays, names) are checked when a
factory or constructor is called, before anything runs: :func:`check_range`, :func:`check_int`,
:func:`static_int` and :func:`check_name` raise one ``ValueError`` (a value out of range, NaN,
``inf``) or ``TypeError`` (a value of the wrong type) whose one-line message starts with the
function that refused it and names the argument, e.g. ``"dc_asgd: lam must be in [0, inf), got
nan"``. A learning rate given as an optax schedule (a callable) is the caller's to skip.

Checks of traced values (``checkify``) are off unless asked for: they slow every jitted call.

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

import math
import operator
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

__all__ = [
    "check_int",
    "check_name",
    "check_range",
    "check_real",
    "debug_check",
    "enable_traced_checks",
    "static_int",
    "traced_checks_enabled",
]

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


def _show(value: Any) -> str:
    """A short one-line rendering of a concrete value for an error message."""
    arr = np.asarray(value)
    if arr.shape == ():
        return repr(arr.item())
    return np.array2string(arr, separator=", ", threshold=6, max_line_width=10**6)


def _is_real(dtype: Any) -> bool:
    """An integer or floating dtype (bool, complex, strings and objects are not)."""
    return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating))


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    """``"in [low, high)"``, or ``"finite"`` when both ends are infinite."""
    if math.isinf(low) and math.isinf(high):
        return "finite"
    left = "(" if low_open or math.isinf(low) else "["
    right = ")" if high_open or math.isinf(high) else "]"
    return f"in {left}{low:g}, {high:g}{right}"


def check_range(
    value: Any,
    name: str,
    where: str,
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = True,
    hint: str = "",
) -> None:
    """Check that a hyper-parameter (a number or an array of numbers) lies in an interval.

    A concrete value (a Python or numpy number, a concrete jax array) is checked now: outside
    the interval raises ``ValueError("<where>: <name> must be in [low, high), got v")``; NaN is
    outside every interval and ``inf`` too (an infinite end is always open: the value must be
    finite; ``low = -inf, high = inf`` reads ``"<name> must be finite"``); a bool or a
    non-numeric value raises ``TypeError``. A *traced* value (inside ``jax.jit``,
    ``lax.scan``, ``jax.vmap``, or injected by ``optax.inject_hyperparams`` in a jitted step)
    cannot be checked on the host: a ``checkify`` check is registered instead (only after
    :func:`enable_traced_checks`), which reports ``"<where>: <name>=v is outside [low, high)"``
    when the caller wraps the computation in ``jax.experimental.checkify.checkify`` and does
    nothing otherwise (as :meth:`jaxstale.VersionBuffer.get` does for a traced τ).

    Raises:
      ValueError: a concrete value outside the interval, NaN or infinite.
      TypeError: a bool, a non-numeric value, or a traced value of a non-real dtype.
    """
    interval = _interval(low, high, low_open, high_open)
    if isinstance(value, jax.core.Tracer):
        if not _is_real(value.dtype):
            raise TypeError(f"{where}: {name} must be a real number, got dtype {value.dtype}")
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        debug_check(
            jnp.all(above & below & jnp.isfinite(value)),
            f"{where}: {name}={{value}} is {'not ' if interval == 'finite' else 'outside '}"
            f"{interval.removeprefix('in ')}",
            value=value,
        )
        return
    arr = np.asarray(value) if not isinstance(value, bool) else np.asarray(value, object)
    if not _is_real(arr.dtype):
        raise TypeError(f"{where}: {name} must be a real number, got {type(value).__name__}")
    inside = (arr > low if low_open else arr >= low) & (arr < high if high_open else arr <= high)
    if not np.all(inside & np.isfinite(arr)):
        raise ValueError(f"{where}: {name} must be {interval}{hint}, got {_show(value)}")


def check_int(value: Any, name: str, where: str, minimum: int | None = None) -> int:
    """``int(value)`` for a concrete integer argument (a Python or numpy int, a 0-d int array).

    Raises:
      TypeError: a bool, a non-integer (a float, even ``2.0``) or a traced value.
      ValueError: below ``minimum``.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{where}: {name} must be a concrete int, got a traced value")
    if isinstance(value, int) and not isinstance(value, bool):
        result = value
    elif isinstance(value, bool) or np.asarray(value).dtype.kind not in "iu" or np.ndim(value):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__}")
    else:
        result = operator.index(np.asarray(value).item())
    if minimum is not None and result < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {result}")
    return result


def static_int(value: Any, name: str, where: str, minimum: int) -> int:
    """``int(value)`` for a hyper-parameter that fixes the state's shapes (must be concrete).

    Like :func:`check_int`; the ``TypeError`` for a traced value names
    ``optax.inject_hyperparams``' ``static_args``.

    Raises:
      TypeError: a bool, a non-integer or a traced value.
      ValueError: below ``minimum``.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{where}: {name} must be a concrete int (it fixes the state's shapes), got a traced "
            f"value; with optax.inject_hyperparams pass static_args=({name!r},)"
        )
    return check_int(value, name, where, minimum)


def check_name(name: Any, where: str, what: str = "name") -> str:
    """``name`` if it can be registered: a non-empty string with no comma and no whitespace.

    Registered names (methods, models, datasets) are given on the command line as
    comma-separated lists (``--methods sgd,my-asgd``), so a name holding a comma or a space
    could never be selected there.

    Raises:
      TypeError: ``name`` is not a non-empty string.
      ValueError: ``name`` holds a comma or whitespace.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"{where}: {what} must be a non-empty string, got {name!r}")
    bad = sorted({c for c in name if c == "," or c.isspace()})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ValueError(
            f"{where}: {what} must not contain commas or whitespace (names are given as "
            f"comma-separated lists on the command line), got {name!r} with {shown}"
        )
    return name


def check_real(
    value: Any, name: str, where: str, low: float, high: float = np.inf, *, low_open: bool = False
) -> float:
    """``float(value)`` for a concrete real argument (a Python or numpy number, not a bool or an
    array): ``TypeError`` otherwise; its range checked by :func:`check_range` (``[low, high]``,
    ``(low, …`` with ``low_open``; an infinite ``high`` is open)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{where}: {name} must be a real number, got {type(value).__name__}")
    check_range(value, name, where, low, high, low_open=low_open, high_open=False)
    return float(value)


def check_transform(tx: Any, name: str, where: str, example: str = "optax.sgd(0.1)") -> None:
    """A ``TypeError`` in one line unless ``tx`` is an Optax transformation (has ``init`` and
    ``update``: an ``optax.GradientTransformation`` or anything shaped like one)."""
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise TypeError(
            f"{where}: {name} must be an optax GradientTransformation (e.g. {example}), got "
            f"{type(tx).__name__}"
        )
