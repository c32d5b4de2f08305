"""How every executor compiles: :func:`jit` with :func:`compiler_options` (re-exported by
:mod:`jaxstale.loop`, which documents why, under "Compiled steps"), and the one memo of the
compiled cores that runs of a sweep share (:func:`memo`, :func:`clear_memo`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import jax
import numpy as np

__all__ = ["clear_memo", "compiler_options", "jit", "memo"]

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


T = TypeVar("T")

#: every shared compiled core by ``(kind, key)``, with the objects its key names by identity
_MEMO: dict[tuple[Hashable, ...], tuple[Any, Any]] = {}


def memo(kind: str, key: tuple[Hashable, ...], build: Callable[[], T], keep: Any = ()) -> T:
    """The object ``build()`` made for ``(kind, key)``, built the first time: how runs of one
    structure share a compiled program (the pipelines' cores, a composed model, a remat
    wrapper). ``key`` names functions and optimizers by ``id``; ``keep`` holds those objects
    alive beside the entry, so an id is never reused for another object while it is cached.

    Example:
        >>> f = lambda x: x
        >>> a = memo("demo", (id(f),), lambda: [f], keep=f)
        >>> a is memo("demo", (id(f),), lambda: [f], keep=f)
        True
        >>> clear_memo("demo")   # entries dropped
        1
    """
    k = (kind, *key)
    if k not in _MEMO:
        _MEMO[k] = (build(), keep)
    return _MEMO[k][0]


def clear_memo(kind: str | None = None) -> int:
    """Forget the memo's entries (of ``kind``, or all): a long session that built many models
    frees their compiled programs. Returns how many were dropped."""
    drop = [k for k in _MEMO if kind is None or k[0] == kind]
    for k in drop:
        del _MEMO[k]
    return len(drop)
