r"""Count n-gram models of a corpus: the reference levels a language model's loss is read against.

An order-:math:`n` model predicts a character from the :math:`n-1` before it with add-:math:`k`
(Lidstone) smoothing,

.. math::

    p(c \mid h) = \frac{N(h, c) + k}{N(h) + k V},

where :math:`N` counts the training split's n-grams, :math:`N(h)` its contexts and :math:`V`
is the vocabulary size. :math:`k` is chosen on the validation split from a log grid
(:data:`K_GRID`, 20 points per decade, refined once around the best) and the level is the test
split's mean cross-entropy in nats per character. A model that is not below the bigram level
has learned little more than which character follows which; the synchronous GPT of the
1,000-update runs sits just below the trigram level.

Every position of a split is scored from the :math:`n-1` characters before it *in that split*;
the first :math:`n-1` are scored with the context the split has (a shorter n-gram, backing off
to the next lower order's model at its own chosen :math:`k`), so every order scores the same
characters as :func:`jaxstale.evaluation` does on the whole split.

References:
    Chen & Goodman, "An empirical study of smoothing techniques for language modeling",
    Harvard TR-10-98 (1998) (additive smoothing, §2.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["K_GRID", "NGramLevel", "fit", "ngram_loss"]

#: the smoothing constants tried on validation (then refined ×10^±0.05 around the best)
K_GRID = np.logspace(-4, 2, 121)


@dataclass(frozen=True)
class NGramLevel:
    """One order's fitted level: ``k`` chosen on validation, its validation and test losses
    (nats per character)."""

    order: int
    k: float
    val: float
    test: float


def _codes(ids: np.ndarray, order: int, vocab_size: int) -> np.ndarray:
    """The n-grams ending at positions ``order - 1 ...`` as int64 codes (oldest digit first)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ngram: ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ngram: ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    ids = ids.astype(np.int64)
    n = len(ids) - order + 1
    code = np.zeros(max(n, 0), np.int64)
    for j in range(order):
        code = code * vocab_size + ids[j : j + n]
    return code


class _Counts:
    """The training split's n-gram and context counts, looked up by code."""

    def __init__(self, train: np.ndarray, order: int, vocab_size: int):
        if vocab_size**order >= 2**62:
            raise ValueError(f"ngram: order {order} over {vocab_size} symbols overflows int64")
        self.order, self.vocab_size = order, vocab_size
        self.grams, self.gram_n = np.unique(_codes(train, order, vocab_size), return_counts=True)
        # a context's count is the number of n-grams it starts (the split's last context
        # starts none, so N(h) = sum_c N(h, c) holds exactly and p sums to 1)
        ctx = self.grams // vocab_size
        self.ctxs, first = np.unique(ctx, return_index=True)
        self.ctx_n = np.add.reduceat(self.gram_n, first) if len(first) else first

    @staticmethod
    def _lookup(keys: np.ndarray, table: np.ndarray, counts: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(table, keys), 0, max(len(table) - 1, 0))
        hit = table[i] == keys if len(table) else np.zeros(len(keys), bool)
        return np.where(hit, counts[i] if len(table) else 0, 0).astype(np.float64)

    def counts(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(N(h, c), N(h))`` for every n-gram of ``ids`` (positions ``order - 1 ...``)."""
        codes = _codes(ids, self.order, self.vocab_size)
        return (
            self._lookup(codes, self.grams, self.gram_n),
            self._lookup(codes // self.vocab_size, self.ctxs, self.ctx_n),
        )


def _nll(joint: np.ndarray, ctx: np.ndarray, k: float, vocab_size: int) -> np.ndarray:
    return -(np.log(joint + k) - np.log(ctx + k * vocab_size))


def _best_k(joint: np.ndarray, ctx: np.ndarray, vocab_size: int) -> tuple[float, float]:
    """The grid's (then the refined grid's) ``k`` of least mean loss, and that loss."""
    grid = K_GRID
    for _ in range(2):
        losses = [float(_nll(joint, ctx, k, vocab_size).mean()) for k in grid]
        i = int(np.argmin(losses))
        best = (float(grid[i]), losses[i])
        grid = grid[i] * np.logspace(-0.05, 0.05, 11)
    return best


def ngram_loss(train: np.ndarray, ids: np.ndarray, order: int, vocab_size: int, k: float) -> float:
    """The mean loss, nats per character, of the order-``order`` add-``k`` model of ``train`` on
    the characters ``ids[order - 1:]`` (each from its ``order - 1`` predecessors).

    Example:
        >>> train = np.array([0, 1, 0, 1, 0, 1])
        >>> # p(1|0) = (3 + 1) / (3 + 2), p(0|1) = (2 + 1) / (2 + 2): -(log .8 + log .75) / 2
        >>> round(ngram_loss(train, np.array([0, 1, 0]), 2, 2, k=1.0), 4)
        0.2554
    """
    if order < 1:
        raise ValueError(f"ngram_loss: order must be >= 1, got {order}")
    if not k > 0:
        raise ValueError(f"ngram_loss: k must be > 0, got {k}")
    if len(ids) < order:
        raise ValueError(f"ngram_loss: {len(ids)} ids hold no {order}-gram")
    joint, ctx = _Counts(train, order, vocab_size).counts(ids)
    return float(_nll(joint, ctx, k, vocab_size).mean())


def fit(
    train: np.ndarray, val: np.ndarray, test: np.ndarray, order: int, vocab_size: int
) -> NGramLevel:
    """The order-``order`` model of ``train``, ``k`` chosen on ``val``, scored on ``test``.

    Every character of a split is scored: the first ``order - 1`` from the shorter contexts the
    split has, each by the lower order's model at that order's own chosen ``k``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> ids = rng.integers(0, 4, 3000)
        >>> lv = fit(ids[:2000], ids[2000:2500], ids[2500:], 1, 4)
        >>> bool(abs(lv.test - np.log(4)) < 0.02)  # uniform random symbols: about log V
        True
    """
    if order < 1:
        raise ValueError(f"fit: order must be >= 1, got {order}")
    for name, split in (("val", val), ("test", test)):
        if len(split) < order:
            raise ValueError(f"fit: the {name} split ({len(split)} ids) holds no {order}-gram")
    totals = {"val": 0.0, "test": 0.0}
    k = 1.0
    for n in range(1, order + 1):
        counts = _Counts(train, n, vocab_size)
        vj, vc = counts.counts(val)
        k, _ = _best_k(vj, vc, vocab_size)
        # order n scores the split's characters from index n - 1 on; a lower order scores only
        # its first (index n - 1), which the higher orders cannot reach
        for name, (j, c) in (("val", (vj, vc)), ("test", counts.counts(test))):
            nll = _nll(j, c, k, vocab_size)
            totals[name] += float(nll.sum() if n == order else nll[0])
    return NGramLevel(order, k, totals["val"] / len(val), totals["test"] / len(test))
