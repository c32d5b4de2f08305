"""Language-modelling data (``jaxstale.text``): seeded next-token windows, evaluation windows,
the loss conversions."""

import math

import numpy as np
import pytest

from jaxstale import text


def test_batches_are_seeded_windows_of_the_training_split_with_shifted_targets():
    d = text.load_text()
    x, y = d.batches(seed=3, steps=4, batch_size=5, context=16)
    assert x.shape == y.shape == (4, 5, 16) and x.dtype == np.uint8
    np.testing.assert_array_equal(x[..., 1:], y[..., :-1])  # y is x one character on
    again, _ = d.batches(seed=3, steps=4, batch_size=5, context=16)
    other, _ = d.batches(seed=4, steps=4, batch_size=5, context=16)
    assert (x == again).all() and not (x == other).all()
    train = d.train.tobytes()
    assert all(w.tobytes() in train for w in x.reshape(-1, 16)[:5])  # windows of the split
    with pytest.raises(ValueError, match="context must be >= 1"):
        d.batches(seed=0, steps=1, batch_size=1, context=0)


def test_eval_windows_tile_the_split():
    d = text.load_text()
    x, y = d.windows("val", 100)
    n = (len(d.val) - 1) // 100
    assert x.shape == (n, 100) and (x.reshape(-1) == d.val[: n * 100]).all()
    assert (y.reshape(-1) == d.val[1 : n * 100 + 1]).all()


def test_loss_conversions_and_unknown_names():
    assert text.uniform_loss(83) == pytest.approx(math.log(83))
    assert text.bits_per_char(math.log(2)) == pytest.approx(1.0)
    assert text.perplexity(math.log(5)) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="unknown text dataset 'nope'"):
        text.load_text("nope")


def test_reference_losses_are_the_count_models_levels():
    """The n-gram levels the LM tables quote: the test split's by default, the validation
    split's for a validation curve; another split is refused in one line."""
    test = text.reference_losses("shakespeare")
    val = text.reference_losses("shakespeare", split="val")
    assert list(test) == ["unigram", "bigram", "trigram", "uniform"]
    assert round(test["trigram"], 2) == 1.97 and round(val["trigram"], 2) == 2.06
    assert test["uniform"] == val["uniform"] == pytest.approx(math.log(83))
    with pytest.raises(ValueError, match="split must be 'test' or 'val'"):
        text.reference_losses("shakespeare", split="train")
