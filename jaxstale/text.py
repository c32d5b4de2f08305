r"""Character-level language-modelling data: next-token batches from the embedded corpus.

:func:`load_text` gives the corpus (:mod:`jaxstale._shakespeare`) as :class:`TextData`: ``uint8``
id arrays for the contiguous train / validation / test splits over a fixed vocabulary.
Training batches are windows of ``context + 1`` characters at offsets drawn from the training
split by the seed (:meth:`TextData.batches`): inputs ``x = w[:-1]`` and next-token targets
``y = w[1:]``, ``[steps, B, T]`` each, so a seed fixes the data order for every method.
Evaluation uses the split's non-overlapping windows (:meth:`TextData.windows`).

The metric is the mean next-token cross-entropy in nats per character; :func:`bits_per_char`
and :func:`perplexity` convert it, and a model that predicts no better than the uniform
distribution has the loss ``log V`` (:func:`uniform_loss`), the "chance level" of the task;
:func:`reference_losses` adds the count unigram, bigram and trigram models' levels.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from jaxstale import _shakespeare, ngram

__all__ = [
    "CONTEXT",
    "EVAL_WINDOWS",
    "TEXTS",
    "TFDS_TEXTS",
    "TextData",
    "bits_per_char",
    "from_texts",
    "load_text",
    "ngram_levels",
    "perplexity",
    "spaced",
    "uniform_loss",
    "unigram_entropy",
]

#: the built-in text datasets
TEXTS = ("shakespeare",)

#: the text datasets read from TensorFlow Datasets (prepared offline; :func:`from_texts`)
TFDS_TEXTS = ("tiny_shakespeare",)

#: the context (characters per window) of :func:`jaxstale.data.load`'s text datasets
CONTEXT = 64

#: validation windows of :func:`jaxstale.data.load`'s text datasets (64 × 256 = 16,384
#: characters: an evaluation costs about what 5 training steps of 16 windows do); the test
#: split is scored whole (:func:`jaxstale.data.load`)
EVAL_WINDOWS = 256


@dataclass(frozen=True)
class TextData:
    """A character corpus as ids over ``vocabulary`` (id ``i`` is ``vocabulary[i]``)."""

    name: str
    vocabulary: str
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def batches(
        self, *, seed: int, steps: int, batch_size: int, context: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)``, ``uint8 [steps, batch_size, context]``: windows of the training split at
        offsets drawn uniformly by ``seed``; ``y`` is ``x`` shifted by one character.

        Raises:
            ValueError: a non-positive size, or a context the training split cannot hold.
        """
        for name, v in (("steps", steps), ("batch_size", batch_size), ("context", context)):
            if v < 1:
                raise ValueError(f"batches: {name} must be >= 1, got {v}")
        if context + 1 > len(self.train):
            raise ValueError(f"batches: context {context} exceeds the training split")
        rng = np.random.default_rng(seed)
        starts = rng.integers(0, len(self.train) - context, size=(steps, batch_size))
        w = self.train[starts[..., None] + np.arange(context + 1)]
        return w[..., :-1], w[..., 1:]

    def windows(self, split: str, context: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)``, ``[n, context]``: the split's consecutive non-overlapping windows (the
        tail shorter than a window is left out), targets shifted by one."""
        ids = {"train": self.train, "val": self.val, "test": self.test}[split]
        n = (len(ids) - 1) // context
        if n < 1:
            raise ValueError(f"windows: the {split} split is shorter than context {context} + 1")
        x = ids[: n * context].reshape(n, context)
        y = ids[1 : n * context + 1].reshape(n, context)
        return x, y

    def sampled_windows(
        self, split: str, context: int, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``count`` of the split's :meth:`windows`, evenly spaced over it (all of them when
        there are fewer): an evaluation set that covers the whole split at a fixed cost."""
        x, y = self.windows(split, context)
        if count < 1:
            raise ValueError(f"sampled_windows: count must be >= 1, got {count}")
        pick = spaced(len(x), count)
        return (x, y) if len(pick) == len(x) else (x[pick], y[pick])


def spaced(n: int, count: int) -> np.ndarray:
    """``count`` evenly spaced indices of ``range(n)``, ends included (all of them when
    ``count ≥ n``): the evaluation windows of :meth:`TextData.sampled_windows` and of a token
    folder (:mod:`jaxstale.tokens`)."""
    if count >= n:
        return np.arange(n)
    return np.linspace(0, n - 1, count).round().astype(np.int64)


def load_text(name: str = "shakespeare", data_dir: str | None = None) -> TextData:
    """A text dataset by name: the embedded :data:`TEXTS` (offline) or a prepared TFDS one
    (:data:`TFDS_TEXTS`, read from ``data_dir`` with ``tfds.data_source``, never downloaded;
    its vocabulary is its training text's characters, :func:`from_texts`).

    Example:
        >>> d = load_text()
        >>> d.vocab_size, d.train.dtype.name
        (83, 'uint8')
    """
    if name in TFDS_TEXTS:
        from jaxstale._tfds import load_tfds_text

        return from_texts(name, *load_tfds_text(name, data_dir))
    if name not in TEXTS:
        choices = ", ".join((*TEXTS, *TFDS_TEXTS))
        raise ValueError(f"unknown text dataset {name!r}; choose from: {choices}")
    c = _shakespeare.load_corpus()
    return TextData(name, c.vocabulary, c.train, c.val, c.test)


def from_texts(name: str, train: str, val: str, test: str) -> TextData:
    """:class:`TextData` of three split texts over the training text's characters (sorted), the
    vocabulary of a character-level model of that corpus (TFDS's ``tiny_shakespeare``: 65).

    Raises:
        ValueError: an empty split, a non-ASCII character, or a validation or test character
        that the training text does not have (its id would be out of the model's range).

    Example:
        >>> d = from_texts("toy", "abcab", "ba", "ca")
        >>> d.vocabulary, d.val.tolist()
        ('abc', [1, 0])
    """
    texts = {"train": train, "val": val, "test": test}
    for split, text in texts.items():
        if not text:
            raise ValueError(f"{name}: the {split} split is empty")
        if not text.isascii():
            bad = sorted({c for c in text if not c.isascii()})[:5]
            raise ValueError(f"{name}: the {split} text has non-ASCII characters {bad!r}")
    vocabulary = "".join(sorted(set(train)))
    for split, text in texts.items():
        if bad := sorted(set(text) - set(vocabulary)):
            raise ValueError(
                f"{name}: the {split} text has characters outside the training text's "
                f"vocabulary: {bad!r}"
            )
    ids = {split: _shakespeare.encode(text, vocabulary) for split, text in texts.items()}
    return TextData(name, vocabulary, ids["train"], ids["val"], ids["test"])


def uniform_loss(vocab_size: int) -> float:
    """``log V`` nats: the loss of the uniform prediction (a run above it learned nothing)."""
    return math.log(vocab_size)


def unigram_entropy(ids: np.ndarray, vocab_size: int) -> float:
    r"""The entropy of the characters' frequencies in ``ids``, nats: the loss of the best
    prediction that ignores the context, :math:`-\sum_c p_c \log p_c` (a model that beats it
    has learned more than character frequencies).

    Example:
        >>> round(unigram_entropy(np.array([0, 0, 1, 1]), 3), 4)  # two equally frequent: log 2
        0.6931
    """
    counts = np.bincount(np.asarray(ids).ravel(), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def reference_losses(
    name: str, data_dir: str | None = None, split: str = "test"
) -> dict[str, float]:
    """A corpus's reference losses on ``split`` (``"test"`` or ``"val"``), nats per character:
    ``"unigram"``, ``"bigram"``, ``"trigram"``, the count n-gram models of its training split
    (add-k smoothing chosen on validation, :mod:`jaxstale.ngram`), and ``"uniform"``, ``log V``.
    The one place they are computed (the experiments' tables and figures and the claims quote
    them; a validation loss is read against the validation levels: the splits differ by
    0.05-0.08 nats).

    Example:
        >>> {k: round(v, 2) for k, v in reference_losses("shakespeare").items()}
        {'unigram': 3.29, 'bigram': 2.57, 'trigram': 1.97, 'uniform': 4.42}
    """
    if split not in ("test", "val"):
        raise ValueError(f"reference_losses: split must be 'test' or 'val', got {split!r}")
    t = load_text(name, data_dir)
    levels = {k: getattr(v, split) for k, v in ngram_levels(name, data_dir=data_dir).items()}
    return {**levels, "uniform": uniform_loss(t.vocab_size)}


@functools.lru_cache(maxsize=8)
def ngram_levels(
    name: str = "shakespeare", orders: tuple[int, ...] = (1, 2, 3), data_dir: str | None = None
) -> dict[str, ngram.NGramLevel]:
    """A text dataset's n-gram levels by name (``"unigram"``, ``"bigram"``, ``"trigram"``,
    ``"4-gram"`` …), fitted on its training split (:func:`jaxstale.ngram.fit`; cached per
    process: a fit of the 4.4 M training characters takes a few seconds).

    Example:
        >>> {k: round(v.test, 2) for k, v in ngram_levels().items()}
        {'unigram': 3.29, 'bigram': 2.57, 'trigram': 1.97}
    """
    t = load_text(name, data_dir)
    names = {1: "unigram", 2: "bigram", 3: "trigram"}
    return {
        names.get(n, f"{n}-gram"): ngram.fit(t.train, t.val, t.test, n, t.vocab_size)
        for n in orders
    }


def bits_per_char(nats: float) -> float:
    """Nats per character in bits per character."""
    return nats / math.log(2)


def perplexity(nats: float) -> float:
    """``exp(loss)``."""
    return math.exp(nats)
