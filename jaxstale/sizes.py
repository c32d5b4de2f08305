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
