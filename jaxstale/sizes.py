"""The bytes a pytree holds: what the memory checks and the memory benchmarks add up."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np


def tree_bytes(tree: Any) -> int:
    """The bytes of a pytree's leaves, ``Σ_leaf prod(shape) · itemsize(dtype)``.

    The leaves may be arrays (jax or numpy) or abstract shapes (``jax.ShapeDtypeStruct``, as
    ``jax.eval_shape`` returns them), so a state's size is known without allocating it.

    Example:
        >>> import jax, numpy as np
        >>> tree_bytes({"w": np.zeros((3, 4), np.float32), "b": jax.ShapeDtypeStruct((4,), "int8")})
        52
    """
    return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def residual_bytes(fn: Any, *args: Any) -> int:
    """The bytes ``jax.vjp(fn, *args)`` keeps for the backward pass (its residuals: saved
    activations and whatever else the reverse sweep reads), from abstract shapes — nothing is
    allocated or compiled, so a training step's activation memory is known before it runs.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct``; differentiation is with respect to all of
    them (pass the rest through a closure). XLA may fuse or rematerialise inside a jitted step,
    so this is what autodiff asks for, the step's activation floor without recompute.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> w = jax.ShapeDtypeStruct((64, 32), "float32")
        >>> residual_bytes(lambda w: jnp.sin(w).sum(), w)  # cos(w): 64 x 32 floats
        8192
        >>> residual_bytes(lambda w: w.sum(), w)  # a linear function needs none
        0
    """
    vjp = jax.eval_shape(lambda *a: jax.vjp(fn, *a)[1], *args)
    return tree_bytes(vjp)
