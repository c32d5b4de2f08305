"""Shared by the pipeline emulator's tests: a small MLP, its stages and data."""

import numpy as np

from jaxstale import models

LR, MOM = 0.2, 0.9


def model(seed=0, blocks=4):
    return models.create(
        "mlp", input_shape=(4, 4, 1), num_classes=3, hidden=(8,) * (blocks - 1), seed=seed
    )


def data(nb, bs=8, seed=0):
    rng = np.random.default_rng(seed)
    xb = rng.normal(size=(nb, bs, 4, 4, 1)).astype(np.float32)
    yb = rng.integers(0, 3, size=(nb, bs)).astype(np.int32)
    return xb, yb


_STAGES: dict = {}


def stages(blocks, n):
    """The stages of ``model(blocks=blocks)`` cut in ``n`` (one object per shape: runs of one
    structure share a compiled round)."""
    if (blocks, n) not in _STAGES:
        _STAGES[(blocks, n)] = models.functional_stages(model(blocks=blocks), n)
    return _STAGES[(blocks, n)]
