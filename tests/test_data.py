"""Datasets (embedded digits, TFDS through mock_data), validation split, standardisation,
registered datasets, and seeded batching."""

import hashlib
import sys
import time

import numpy as np
import pytest

from jaxstale import data


@pytest.fixture(scope="module")
def digits():
    """The raw train/test arrays, as load() gave them before validation/standardisation."""
    return data.load("digits", validation=0.0, standardize="none")


@pytest.fixture(scope="module")
def default():
    return data.load("digits")


@pytest.fixture(scope="module")
def raw_split():
    """The default validation split of the raw arrays."""
    return data.load("digits", standardize="none")


def test_datasets_tuple():
    assert data.DATASETS == (
        "digits", "mnist1d", "mnist", "fashion_mnist", "cifar10", "shakespeare",
        "tiny_shakespeare",
        "tokens",
    )  # fmt: skip


def test_shakespeare_is_a_language_model_task_of_token_windows():
    ds = data.load("shakespeare")
    assert ds.task == "language_model" and ds.num_classes == 83 and ds.stats is None
    assert ds.x_train.shape == (68152, 64) and ds.x_val.shape == (256, 64)
    assert ds.x_test.shape == (3786, 64)  # the whole test split: 242,321 characters
    assert ds.x_train.dtype == ds.y_train.dtype == np.int32
    # y is x shifted by one character: a window's targets are the next window's first ids
    np.testing.assert_array_equal(ds.x_train[0, 1:], ds.y_train[0, :-1])
    assert ds.y_train[0, -1] == ds.x_train[1, 0]
    assert ds.preprocessing["context"] == 64 and len(ds.preprocessing["digest"]) == 64
    assert data.load("digits").task == "classification"
    with pytest.raises(ValueError, match="fixed validation split"):
        data.load("shakespeare", validation=0.2)
    with pytest.raises(ValueError, match="token ids"):
        data.load("shakespeare", standardize="channel")


def test_digits_shapes_dtypes_ranges(digits):
    assert isinstance(digits, data.Dataset)
    assert digits.name == "digits" and digits.num_classes == 10
    assert digits.x_train.shape == (1438, 8, 8, 1) and digits.x_test.shape == (359, 8, 8, 1)
    assert digits.y_train.shape == (1438,) and digits.y_test.shape == (359,)
    assert digits.x_train.dtype == np.float32 and digits.x_test.dtype == np.float32
    assert digits.y_train.dtype == np.int32 and digits.y_test.dtype == np.int32
    for x in (digits.x_train, digits.x_test):
        assert x.min() == 0.0 and x.max() == 1.0
    assert set(np.unique(digits.y_train)) == set(range(10)) == set(np.unique(digits.y_test))


def test_digits_split_is_stratified_and_a_partition(digits):
    from sklearn.datasets import load_digits

    raw = load_digits()
    per_class = np.bincount(raw.target, minlength=10)
    np.testing.assert_array_equal(
        np.bincount(digits.y_test, minlength=10), np.round(0.2 * per_class).astype(int)
    )
    # train + test is exactly the 1,797 sklearn images with their labels (as a multiset).
    ours = np.concatenate(
        [
            np.concatenate([digits.x_train, digits.x_test]).reshape(-1, 64) * 16,
            np.concatenate([digits.y_train, digits.y_test])[:, None],
        ],
        axis=1,
    )
    theirs = np.concatenate([raw.data, raw.target[:, None]], axis=1)
    np.testing.assert_array_equal(
        ours[np.lexsort(ours.T[::-1])], theirs[np.lexsort(theirs.T[::-1])]
    )


def test_digits_split_is_deterministic_and_shuffled(digits):
    again = data.load("digits", validation=0.0, standardize="none")
    for a, b in zip(digits, again, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
    # shuffled: the labels are not in sklearn's original cyclic order
    assert not np.array_equal(digits.y_train[:20], np.arange(20) % 10)


def test_unknown_dataset_lists_names():
    with pytest.raises(ValueError, match="digits, mnist1d, mnist, fashion_mnist, cifar10"):
        data.load("imagenet")


# --- validation split and standardisation -----------------------------------------------------

RAW_DIGITS_SHA256 = "0029c3fe937018b7c1b0c34280071c842e2c6c85b566dc98c1c630d540a86531"


def test_raw_mode_is_bit_for_bit_the_original_split(digits):
    # sha256 of (x_train, y_train, x_test, y_test) as load("digits") returned them before the
    # validation split and standardisation existed (recorded at that commit).
    h = hashlib.sha256()
    for a in (digits.x_train, digits.y_train, digits.x_test, digits.y_test):
        h.update(np.ascontiguousarray(a).tobytes())
    assert h.hexdigest() == RAW_DIGITS_SHA256
    assert digits.x_val is None and digits.y_val is None and digits.stats is None
    assert digits.preprocessing["validation"] == 0.0
    assert digits.preprocessing["standardize"] == "none"


def test_validation_split_sizes_and_stratification(digits, default):
    assert (len(default.x_train), len(default.x_val), len(default.x_test)) == (1295, 143, 359)
    assert default.y_val.shape == (143,) and default.x_val.shape == (143, 8, 8, 1)
    assert default.x_val.dtype == np.float32 and default.y_val.dtype == np.int32
    per_class = np.bincount(digits.y_train, minlength=10)
    expected = [round(0.1 * n) for n in per_class]
    assert np.bincount(default.y_val, minlength=10).tolist() == expected
    assert np.bincount(default.y_train, minlength=10).tolist() == (per_class - expected).tolist()
    p = default.preprocessing
    assert (p["num_train"], p["num_validation"], p["num_test"]) == (1295, 143, 359)
    assert p["validation"] == 0.1 and p["validation_seed"] == data.VALIDATION_SEED


def test_train_val_test_partition_without_overlap(digits, raw_split):
    def rows(x, y):
        return [tuple(r) for r in np.concatenate([x.reshape(len(x), -1), y[:, None]], axis=1)]

    # train + val is exactly the original training set, in its original order (two
    # subsequences), and the test set is untouched.
    original = rows(digits.x_train, digits.y_train)
    train, val = rows(raw_split.x_train, raw_split.y_train), rows(raw_split.x_val, raw_split.y_val)
    assert sorted(train + val) == sorted(original)
    it = iter(original)
    assert all(r in it for r in train)  # a subsequence
    np.testing.assert_array_equal(raw_split.x_test, digits.x_test)
    np.testing.assert_array_equal(raw_split.y_test, digits.y_test)


def test_validation_split_is_deterministic(default):
    again = data.load("digits")
    for a, b in zip(default, again, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
    # pinned, so a different machine or numpy drawing another split fails here
    assert default.y_val[:12].tolist() == [8, 8, 9, 7, 0, 4, 9, 6, 1, 7, 3, 5]


def test_feature_statistics_come_from_the_training_portion_only(raw_split, default):
    mu = raw_split.x_train.astype(np.float64).mean(axis=0)
    sd = raw_split.x_train.astype(np.float64).std(axis=0)
    varying = sd > data.STANDARDIZE_EPS
    np.testing.assert_allclose(default.stats.mean, mu, rtol=1e-6)
    np.testing.assert_allclose(default.stats.scale, np.where(varying, sd, 1.0), rtol=1e-6)
    for name in ("x_train", "x_val", "x_test"):
        expected = (getattr(raw_split, name) - mu) / np.where(varying, sd, 1.0)
        np.testing.assert_allclose(getattr(default, name), expected, atol=1e-5)
    np.testing.assert_allclose(default.x_train.mean(axis=0, dtype=np.float64), 0.0, atol=1e-6)
    np.testing.assert_allclose(
        default.x_train.std(axis=0, dtype=np.float64)[varying], 1.0, atol=1e-6
    )
    # validation and test data were not used: their statistics are visibly not 0 / 1
    for x in (default.x_val, default.x_test):
        assert np.abs(x.mean(axis=0)[varying]).max() > 0.05
        assert np.abs(x.std(axis=0)[varying] - 1.0).max() > 0.05


def test_zero_variance_features_are_centred_and_finite(raw_split, default):
    constant = raw_split.x_train.std(axis=0) == 0.0
    assert int(constant.sum()) == default.preprocessing["constant_features"] == 3
    for x in (default.x_train, default.x_val, default.x_test):
        assert np.all(np.isfinite(x))
    assert np.all(default.x_train[:, constant] == 0.0)
    np.testing.assert_array_equal(default.stats.scale[constant], 1.0)
    np.testing.assert_array_equal(  # divided by 1: just centred
        default.x_test[:, constant], raw_split.x_test[:, constant] - default.stats.mean[constant]
    )


def test_channel_mode_has_one_statistic_per_channel(raw_split):
    ds = data.load("digits", standardize="channel")
    assert ds.stats.mean.shape == ds.stats.scale.shape == (1,)
    np.testing.assert_allclose(ds.stats.mean, raw_split.x_train.mean(), rtol=1e-5)
    np.testing.assert_allclose(ds.stats.scale, raw_split.x_train.std(), rtol=1e-5)
    assert abs(float(ds.x_train.mean())) < 1e-5 and abs(float(ds.x_train.std()) - 1) < 1e-5
    assert ds.preprocessing["standardize"] == "channel"


def test_feature_mode_without_validation_split():
    ds = data.load("digits", validation=0.0)
    assert len(ds.x_train) == 1438 and ds.x_val is None and ds.y_val is None
    assert ds.preprocessing["num_validation"] == 0 and ds.stats.mean.shape == (8, 8, 1)


@pytest.mark.parametrize("validation", [1.0, -0.1, 1.5, True, "0.1", None])
def test_bad_validation(validation):
    with pytest.raises(ValueError, match=r"validation must be a fraction in \[0, 1\)"):
        data.load("digits", validation=validation)


@pytest.mark.parametrize("standardize", ["pixel", "", None, True])
def test_bad_standardize(standardize):
    with pytest.raises(ValueError, match="standardize must be one of 'feature', 'channel', 'none'"):
        data.load("digits", standardize=standardize)


# --- TFDS (never reaches the network) --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape"),
    [("mnist", (28, 28, 1)), ("fashion_mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))],
)
def test_tfds_through_mock_data(name, shape, tmp_path, no_network):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=12):
        ds = data.load(name, data_dir=str(tmp_path), validation=0.0, standardize="none")
        # raw mode: exactly the mock examples as uint8 / 255, in order
        for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
            source = tfds.data_source(name, split=split, data_dir=str(tmp_path))
            for k in range(len(source)):
                np.testing.assert_array_equal(x[k], source[k]["image"] / np.float32(255))
                assert y[k] == source[k]["label"]
    assert ds.name == name and ds.num_classes == 10 and ds.x_val is None
    assert ds.x_train.shape == (12, *shape) and ds.x_test.shape == (12, *shape)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
    assert ds.y_test.shape == (12,) and ds.y_test.dtype == np.int32
    for x in (ds.x_train, ds.x_test):
        assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5  # uint8 / 255
        np.testing.assert_allclose(x * 255, np.round(x * 255), atol=1e-3)
    for y in (ds.y_train, ds.y_test):
        assert 0 <= y.min() and y.max() < 10


@pytest.mark.parametrize(("name", "mode"), [("mnist", "feature"), ("cifar10", "channel")])
def test_tfds_split_and_standardisation_under_mock_data(name, mode, tmp_path, no_network):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=20):
        raw = data.load(name, data_dir=str(tmp_path), validation=0.0, standardize="none")
        ds = data.load(name, data_dir=str(tmp_path), validation=0.5, standardize=mode)
    per_class = np.bincount(raw.y_train, minlength=10)
    expected = [round(0.5 * n) for n in per_class]
    assert np.bincount(ds.y_val, minlength=10).tolist() == expected
    assert len(ds.x_train) + len(ds.x_val) == 20 and len(ds.x_val) == sum(expected) > 0
    is_val = np.zeros(20, dtype=bool)  # the same split, computed from the raw labels
    is_val[data._stratified_holdout(raw.y_train, 0.5, data.VALIDATION_SEED)[1]] = True
    train = raw.x_train[~is_val].astype(np.float64)
    axes = (0,) if mode == "feature" else (0, 1, 2)
    mu, sd = train.mean(axis=axes), train.std(axis=axes)
    scale = np.where(sd > data.STANDARDIZE_EPS, sd, 1.0)
    np.testing.assert_allclose(ds.x_train, (train - mu) / scale, atol=1e-4)
    np.testing.assert_allclose(ds.x_val, (raw.x_train[is_val] - mu) / scale, atol=1e-4)
    np.testing.assert_allclose(ds.x_test, (raw.x_test - mu) / scale, atol=1e-4)
    np.testing.assert_array_equal(ds.y_test, raw.y_test)
    assert all(np.all(np.isfinite(x)) for x in (ds.x_train, ds.x_val, ds.x_test))


def test_tfds_missing_dataset_fails_fast_with_instructions(tmp_path, no_network):
    pytest.importorskip("tensorflow_datasets")
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        data.load("mnist", data_dir=str(tmp_path / "empty"))
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert "not prepared" in message and "tfds build mnist" in message
    assert "array_record" in message and "load('digits')" in message


def test_tfds_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import raises ImportError
    with pytest.raises(RuntimeError, match=r"pip install 'jaxstale\[tfds\]'"):
        data.load("cifar10")


# --- batches ----------------------------------------------------------------------------------


def _toy(n=10):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    return x, np.arange(n, dtype=np.int32)


def test_batches_shapes_and_alignment():
    x, y = _toy()
    xb, yb = data.batches(x, y, batch_size=3, num_steps=7, seed=0)
    assert xb.shape == (7, 3, 3) and yb.shape == (7, 3)
    assert xb.dtype == np.float32 and yb.dtype == np.int32
    np.testing.assert_array_equal(xb, x[yb])  # each x stays with its own label


def test_batches_every_epoch_is_a_permutation_remainder_dropped():
    x, y = _toy(10)
    _, yb = data.batches(x, y, batch_size=3, num_steps=7, seed=5)
    flat = yb.reshape(-1)
    for epoch in range(2):  # 3 batches per epoch (10 // 3), one example dropped each epoch
        seen = flat[epoch * 9 : (epoch + 1) * 9]
        assert len(set(seen.tolist())) == 9
    assert len(set(flat[18:].tolist())) == 3  # the partial third epoch
    # The epochs are the successive permutations of one default_rng(seed).
    rng = np.random.default_rng(5)
    expected = np.concatenate([rng.permutation(10)[:9] for _ in range(3)])[:21]
    np.testing.assert_array_equal(flat, expected)


def test_batches_determinism():
    x, y = _toy(50)
    a = data.batches(x, y, batch_size=8, num_steps=20, seed=1)
    b = data.batches(x, y, batch_size=8, num_steps=20, seed=1)
    c = data.batches(x, y, batch_size=8, num_steps=20, seed=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])


def test_batches_on_digits(digits):
    xb, yb = data.batches(digits.x_train, digits.y_train, batch_size=128, num_steps=25, seed=0)
    assert xb.shape == (25, 128, 8, 8, 1) and yb.shape == (25, 128)
    # 1438 // 128 = 11 batches per epoch: no example repeats within an epoch.
    idx = data.batch_indices(1438, batch_size=128, num_steps=25, seed=0)
    assert len(np.unique(idx[:11])) == 11 * 128
    np.testing.assert_array_equal(yb, digits.y_train[idx])


def test_batches_zero_steps():
    x, y = _toy()
    xb, yb = data.batches(x, y, batch_size=4, num_steps=0, seed=0)
    assert xb.shape == (0, 4, 3) and yb.shape == (0, 4)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0, "num_steps": 1},
        {"batch_size": 11, "num_steps": 1},
        {"batch_size": 2, "num_steps": -1},
    ],
)
def test_batches_bad_sizes(kwargs):
    x, y = _toy()
    with pytest.raises(ValueError):
        data.batches(x, y, seed=0, **kwargs)


def test_batches_bad_types_and_lengths():
    x, y = _toy()
    with pytest.raises(TypeError):
        data.batches(x, y, batch_size=2.0, num_steps=1, seed=0)
    with pytest.raises(ValueError, match="same N"):
        data.batches(x, y[:-1], batch_size=2, num_steps=1, seed=0)


# --- registered datasets -----------------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch):
    """An empty private dataset registry, so registrations do not leak between tests (or in
    from the doctests)."""
    monkeypatch.setattr(data, "_REGISTRY", {})


def _random_loader(calls=None, *, n_train=60, n_test=20, shape=(4, 4, 3)):
    def loader(data_dir):
        if calls is not None:
            calls.append(data_dir)
        rng = np.random.default_rng(0)
        x = rng.uniform(size=(n_train + n_test, *shape)) * 5 + 2
        y = np.arange(n_train + n_test) % 3
        return x[:n_train], y[:n_train], x[n_train:], y[n_train:], 3

    return loader


def test_registered_dataset_gets_split_and_standardisation(registry):
    calls = []
    data.register_dataset("blobs", _random_loader(calls))
    assert data.dataset_names() == (*data.DATASETS, "blobs")
    assert data.DATASETS == (
        "digits", "mnist1d", "mnist", "fashion_mnist", "cifar10", "shakespeare",
        "tiny_shakespeare",
        "tokens",
    )  # fmt: skip
    raw = data.load("blobs", data_dir="/somewhere", validation=0.0, standardize="none")
    assert calls == ["/somewhere"]
    assert raw.name == "blobs" and raw.num_classes == 3
    assert raw.x_train.dtype == np.float32 and raw.y_train.dtype == np.int32  # converted
    np.testing.assert_array_equal(raw.x_train, _random_loader()(None)[0].astype(np.float32))
    ds = data.load("blobs")
    assert (len(ds.x_train), len(ds.x_val), len(ds.x_test)) == (54, 6, 20)
    assert np.bincount(ds.y_val).tolist() == [2, 2, 2]  # round(0.1 * 20) per class
    mu = ds.stats.mean
    assert mu.shape == (4, 4, 3) and float(np.abs(ds.x_train.mean(axis=0)).max()) < 1e-5
    np.testing.assert_allclose(ds.x_train.std(axis=0), 1.0, atol=1e-5)
    assert ds.preprocessing["standardize"] == "feature" and ds.preprocessing["num_train"] == 54


def test_registered_features_dataset_channel_mode(registry):
    data.register_dataset("table", _random_loader(shape=(5,)))
    ds = data.load("table", standardize="channel")  # [N, D]: the last axis is the "channel"
    assert ds.x_train.shape == (54, 5) and ds.stats.mean.shape == (5,)
    np.testing.assert_allclose(ds.x_train.mean(axis=0), 0.0, atol=1e-5)


def test_register_dataset_errors(registry):
    data.register_dataset("mine", _random_loader())
    with pytest.raises(ValueError, match="already registered; pass overwrite=True"):
        data.register_dataset("mine", _random_loader())
    data.register_dataset("mine", _random_loader(shape=(2,)), overwrite=True)
    assert data.load("mine").x_train.shape == (54, 2)
    for builtin in data.DATASETS:
        with pytest.raises(ValueError, match="built-in dataset"):
            data.register_dataset(builtin, _random_loader(), overwrite=True)
    with pytest.raises(TypeError, match="non-empty string"):
        data.register_dataset("", _random_loader())
    with pytest.raises(TypeError, match="callable"):
        data.register_dataset("x", "not a function")
    with pytest.raises(
        ValueError,
        match=r"registered datasets: digits, mnist1d, mnist, fashion_mnist, cifar10, "
        r"shakespeare, tiny_shakespeare, tokens, mine\.",
    ):
        data.load("yours")


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (None, "must return"),
        ((np.zeros((4, 2)), np.zeros(4, int), np.zeros((2, 2)), np.zeros(2, int)), "must return"),
        ((np.zeros((4, 2)), np.zeros(3, int), np.zeros((2, 2)), np.zeros(2, int), 2), "same N"),
        ((np.zeros((4, 2)), np.zeros(4), np.zeros((2, 2)), np.zeros(2, int), 2), "integers"),
        ((np.zeros((4, 2)), np.full(4, 2), np.zeros((2, 2)), np.zeros(2, int), 2), r"\[0, 2\)"),
        ((np.zeros((4, 2)), np.zeros(4, int), np.zeros((2, 3)), np.zeros(2, int), 2), "differ"),
        ((np.zeros((4, 2)), np.zeros(4, int), np.zeros((2, 2)), np.zeros(2, int), 2.0), "int"),
    ],
)
def test_registered_loader_results_are_checked(registry, result, match):
    data.register_dataset("bad", lambda data_dir: result)
    with pytest.raises(ValueError, match=match):
        data.load("bad")


def test_tiny_shakespeare_through_mock_data(tmp_path, no_network):
    tfds = pytest.importorskip("tensorflow_datasets")
    texts = {"train": "to be or not to be\n" * 20, "validation": "or not\n" * 30}
    texts["test"] = "be to\n" * 30

    def source(self, split, **kw):  # the real dataset: one example, a whole text, per split
        return [{"text": texts[split].encode()}]

    with tfds.testing.mock_data(as_data_source_fn=source):
        ds = data.load("tiny_shakespeare", data_dir=str(tmp_path))
    vocab = "\n benort"
    assert ds.task == "language_model" and ds.num_classes == len(vocab)
    assert ds.preprocessing["vocabulary"] == vocab
    ids = np.array([vocab.index(c) for c in texts["train"]])
    n = (len(ids) - 1) // 64
    np.testing.assert_array_equal(ds.x_train, ids[: n * 64].reshape(n, 64))
    np.testing.assert_array_equal(ds.y_train, ids[1 : n * 64 + 1].reshape(n, 64))
    assert ds.x_val.shape == (3, 64) and ds.x_test.shape == (2, 64)  # 209 and 179 targets
    assert ds.x_train.dtype == np.int32
    texts["test"] = "be, or not\n" * 30  # a comma the training text never had
    with (
        tfds.testing.mock_data(as_data_source_fn=source),
        pytest.raises(ValueError, match=r"the test text has characters outside .* \[','\]"),
    ):
        data.load("tiny_shakespeare", data_dir=str(tmp_path))
