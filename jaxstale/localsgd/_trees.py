"""Pytree helpers the local-SGD executors share (the emulator, the mesh, the overlapped rounds)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["stack", "where"]


def where(pred: jax.Array, a: Any, b: Any) -> Any:
    """``a`` where ``pred`` holds, else ``b``, leaf by leaf."""
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def stack(tree: Any, m: int) -> Any:
    """``m`` copies of every leaf along a new leading axis (one row per worker)."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (m, *jnp.shape(a))).copy(), tree)
