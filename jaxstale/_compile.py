"""How every executor compiles: :func:`jit` with :func:`compiler_options` (re-exported by
:mod:`jaxstale.loop`, which documents why, under "Compiled steps")."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = ["compiler_options", "jit"]

#: XLA:CPU's default YNNPACK fusions less ``REDUCE`` (see "Compiled steps" above)
_CPU_OPTIONS = {
    "xla_cpu_experimental_ynn_fusion_type": ",".join(
        f"LIBRARY_FUSION_TYPE_{t}" for t in ("DOT", "INDIVIDUAL_DOT", "INDIVIDUAL_CONVOLUTION")
    )
}


@functools.cache
def compiler_options() -> dict[str, str] | None:
    """The XLA options :func:`jit` compiles with: on XLA:CPU, YNNPACK without its reduce
    fusion; None on other backends, or where this jaxlib does not know the option (then lanes
    agree with runs alone only to float32 rounding)."""
    if jax.default_backend() != "cpu":
        return None
    try:  # an experimental option: a jaxlib without it refuses to compile
        jax.jit(lambda v: v + 1, compiler_options=_CPU_OPTIONS).lower(np.float32(0)).compile()
    except Exception:  # any refusal means: compile without it
        return None
    return dict(_CPU_OPTIONS)


def jit(fun: Callable[..., Any], **kwargs: Any) -> Any:
    """``jax.jit(fun, **kwargs)`` with :func:`compiler_options`: how the executors compile
    their steps, so that a run's numbers do not depend on the lanes it runs with.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jaxstale.loop import jit
        >>> f = lambda g: jnp.sum(g, axis=0)      # a bias gradient: a sum over the batch
        >>> g = np.random.default_rng(0).normal(size=(4, 32, 64)).astype(np.float32)
        >>> alone = np.stack([jit(f)(g[i]) for i in range(4)])
        >>> bool((alone == jit(jax.vmap(f))(g)).all())   # plain jax.jit on CPU: 176 differ
        True
    """
    return jax.jit(fun, compiler_options=compiler_options(), **kwargs)
