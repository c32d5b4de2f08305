"""Count n-gram reference levels (jaxstale.ngram): hand-computed cases, normalisation, the
validation-chosen smoothing, and the embedded corpus's levels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxstale import ngram, text


def test_bigram_hand_computed() -> None:
    """train 0 1 0 1 0 1: N(0,1) = 3, N(1,0) = 2, N(0) = 3, N(1) = 2; with k = 0.5 and V = 2,
    p(1|0) = 3.5 / 4 and p(0|1) = 2.5 / 3."""
    train = np.array([0, 1, 0, 1, 0, 1])
    got = ngram.ngram_loss(train, np.array([0, 1, 0]), 2, 2, k=0.5)
    assert got == pytest.approx(-(math.log(3.5 / 4) + math.log(2.5 / 3)) / 2, rel=1e-12)
    # a context never seen in training: the uniform 1 / V whatever k
    assert ngram.ngram_loss(train, np.array([2, 0]), 2, 3, k=0.7) == pytest.approx(math.log(3))


def test_probabilities_sum_to_one() -> None:
    """For every seen and unseen context, exp(-loss) over all V next symbols sums to 1."""
    rng = np.random.default_rng(1)
    v = 5
    train = rng.integers(0, v, 400)
    for order in (1, 2, 3):
        for h in [(), (0,), (4, 4), (1, 2)][:order]:
            if len(h) != order - 1:
                continue
            total = sum(
                math.exp(-ngram.ngram_loss(train, np.array([*h, c]), order, v, k=0.3))
                for c in range(v)
            )
            assert total == pytest.approx(1.0, rel=1e-10)


def test_unigram_is_add_k_frequencies() -> None:
    train = np.array([0, 0, 0, 1])
    # p(0) = (3 + 1) / (4 + 2), p(1) = (1 + 1) / (4 + 2)
    got = ngram.ngram_loss(train, np.array([0, 1]), 1, 2, k=1.0)
    assert got == pytest.approx(-(math.log(4 / 6) + math.log(2 / 6)) / 2)


def test_fit_chooses_k_on_validation_and_scores_every_test_character() -> None:
    """The chosen k is the validation minimum of the grid (no grid point is better), and the
    test level is the mean over all test characters: the head scored by lower orders."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, 5000)
    ids[1::2] = (ids[::2] + 1) % 6  # a learnable bigram structure
    train, val, test = ids[:3000], ids[3000:4000], ids[4000:]
    lv = ngram.fit(train, val, test, 2, 6)
    best_grid = min(ngram.ngram_loss(train, val, 2, 6, float(k)) for k in ngram.K_GRID)
    assert ngram.ngram_loss(train, val, 2, 6, lv.k) <= best_grid + 1e-12
    uni = ngram.fit(train, val, test, 1, 6)
    head = ngram.ngram_loss(train, test[:1], 1, 6, uni.k)
    body = ngram.ngram_loss(train, test, 2, 6, lv.k)
    assert lv.test == pytest.approx((head + body * (len(test) - 1)) / len(test), rel=1e-12)
    assert lv.test < uni.test  # the structure is found


def test_embedded_corpus_levels() -> None:
    """The Shakespeare levels the LM claims are read against (test split, nats/char)."""
    lv = text.ngram_levels()
    assert list(lv) == ["unigram", "bigram", "trigram"]
    assert [round(v.test, 2) for v in lv.values()] == [3.29, 2.57, 1.97]
    assert lv["unigram"].test > lv["bigram"].test > lv["trigram"].test


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.arange(4), np.arange(2), 0, 4, 1.0), "order must be >= 1"),
        ((np.arange(4), np.arange(2), 2, 4, 0.0), "k must be > 0"),
        ((np.arange(4), np.arange(1), 2, 4, 1.0), "hold no 2-gram"),
        ((np.arange(4), np.arange(40), 40, 4, 1.0), "overflows int64"),
    ],
)
def test_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ngram.ngram_loss(*args)


def test_ids_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 2\)"):
        ngram.ngram_loss(np.array([0, 1, 2]), np.array([0, 1]), 2, 2, k=1.0)
    with pytest.raises(ValueError, match="1-D integer"):
        ngram.ngram_loss(np.array([0.0, 1.0]), np.array([0, 1]), 1, 2, k=1.0)
