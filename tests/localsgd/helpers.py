"""What the local-SGD tests share: a small MLP with a random mini-batch stream, flat weights."""

import numpy as np
from jax.flatten_util import ravel_pytree

from jaxstale import models


def setup(nb, b=8, hidden=(8,)):
    """An MLP on 4×4×1 inputs, 3 classes, and ``nb`` random mini-batches of ``b``."""
    net = models.create("mlp", input_shape=(4, 4, 1), num_classes=3, hidden=hidden)
    f = models.functional(net)
    rng = np.random.default_rng(0)
    xb = rng.normal(size=(nb, b, 4, 4, 1)).astype(np.float32)
    yb = rng.integers(0, 3, (nb, b)).astype(np.int32)
    return f, xb, yb


def flat(p):
    """A pytree's leaves as one numpy vector."""
    return np.asarray(ravel_pytree(p)[0])


def run(f, inner, outer, sched, xb, yb, **kw):
    """One local-SGD run on the emulator from ``f``'s weights: its ``loop`` result."""
    from jaxstale import loop
    from jaxstale.localsgd import executor

    (res,) = loop.run(executor(f.apply, inner, outer, sched, xb, yb, **kw), f.params, f.state)
    return res
