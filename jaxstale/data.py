r"""Datasets as in-memory NumPy arrays, and deterministic seeded batching for ``lax.scan``.

:func:`load` returns a :class:`Dataset` of NHWC float32 images (or ``[N, D]`` features) and int32
labels, split into train / validation / test and standardised with training-set statistics:

- ``"digits"``: scikit-learn's handwritten digits (1,797 real 8x8x1 images, 10 classes), shipped
  inside the scikit-learn wheel, so it works offline. The embedded default.
- ``"mnist1d"``: MNIST-1D (25,000 sequences of 40 points, ``[N, 40, 1]``, 10 classes; 20,000
  train / 5,000 test), generated offline by the ``mnist1d`` package with its default arguments
  and cached on disk (:mod:`jaxstale._mnist1d`). Harder than digits: where staleness costs
  accuracy.
- ``"mnist"``, ``"fashion_mnist"`` (28x28x1) and ``"cifar10"`` (32x32x3): read from TensorFlow
  Datasets through ``tfds.data_source`` (random access to prepared ``array_record`` files; no
  TensorFlow needed). Install with ``pip install 'jaxstale[tfds]'``. :func:`load` never downloads:
  the dataset must already be prepared in ``data_dir`` (see :func:`load`).
- ``"shakespeare"``: 37 plays of Shakespeare as characters, embedded (:mod:`jaxstale.text`):
  a *language-modelling* task (``Dataset.task``): ``[N, 64]`` int32 windows with next-token
  targets, from the corpus's contiguous train / validation / test parts (90 / 5 / 5 %); 256
  evenly spaced windows of validation (rates are chosen on them at every evaluation) and every
  window of the test split (3,786: every target of the whole split but its last 16). Its
  splits are fixed: the two steps below do not apply (``validation`` must stay 0.1,
  ``standardize`` "feature" or "none").
- ``"tiny_shakespeare"``: the common 1 MB character benchmark (40,000 lines of the plays; 65
  characters, its training text's) from TFDS, the full-size text path: TFDS's own train /
  validation / test texts, windowed as above; prepared offline like the TFDS images.
- ``"tokens"``: token ids on disk in nanoGPT's format (``train.bin``, ``val.bin``, ``meta.json``
  in ``data_dir``), read through memory maps (:mod:`jaxstale.tokens`), windowed as above.
- your own: :func:`register_dataset` adds a name whose loader returns raw arrays;
  :func:`dataset_names` lists every name :func:`load` accepts.

Every dataset, built-in or registered, goes through the same two steps in :func:`load`:

1. **Validation split** (``validation=0.1``): a class-stratified fraction of the *training* set,
   drawn with a fixed ``np.random.default_rng`` (the same on every machine), becomes
   ``x_val, y_val``. The test set is never touched, so model and hyper-parameter choices can be
   made on validation data only.
2. **Standardisation** (``standardize="feature"``): with mean :math:`\mu` and standard deviation
   :math:`\sigma` computed on the training portion only (after the validation split),
   ``x' = (x - μ) / s`` with ``s = σ`` where ``σ > ε`` and ``s = 1`` where the feature is
   constant on the training portion (``σ <= ε = 1e-6``), applied to train, validation and test.
   ``"feature"`` has one ``(μ, σ)`` per input feature (pixel and channel), ``"channel"`` one per
   channel (the CIFAR convention), ``"none"`` keeps the raw inputs (images in ``[0, 1]``).

What was done is recorded on the :class:`Dataset` (``preprocessing``, a JSON-ready dict for run
configs, and ``stats``, the arrays used). ``load(name, validation=0.0, standardize="none")`` gives
the raw train/test arrays, bit for bit the same as before these steps existed.

:func:`batches` turns arrays into pre-batched ``[num_steps, batch_size, ...]`` arrays, one seeded
permutation per epoch, so a whole training run's data can be fed to a jitted loop or ``lax.scan``.

Example:
    >>> from jaxstale import data
    >>> ds = data.load("digits")  # validation=0.1, standardize="feature"
    >>> len(ds.x_train), len(ds.x_val), len(ds.x_test)
    (1295, 143, 359)
    >>> round(float(ds.x_train.mean()), 6), ds.preprocessing["constant_features"]
    (0.0, 3)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from jaxstale._batching import Indexed, batch_indices, batches, indexed
from jaxstale._checks import check_name
from jaxstale._mnist1d import load_mnist1d
from jaxstale._tfds import load_tfds
from jaxstale.text import CONTEXT, EVAL_WINDOWS, TEXTS, TFDS_TEXTS, load_text

__all__ = [
    "DATASETS",
    "STANDARDIZE_EPS",
    "STANDARDIZE_MODES",
    "VALIDATION_SEED",
    "Dataset",
    "Indexed",
    "Stats",
    "batch_indices",
    "batches",
    "check_dataset",
    "dataset_names",
    "indexed",
    "load",
    "register_dataset",
    "registered_loader",
]

DATASETS: tuple[str, ...] = (
    "digits",
    "mnist1d",
    "mnist",
    "fashion_mnist",
    "cifar10",
    *TEXTS,
    *TFDS_TEXTS,
    "tokens",
)
"""The built-in dataset names (see :func:`dataset_names` for the registered ones too)."""

STANDARDIZE_MODES: tuple[str, ...] = ("feature", "channel", "none")
"""The values of :func:`load`'s ``standardize`` argument."""

STANDARDIZE_EPS: float = 1e-6
"""Features whose training standard deviation is ``<=`` this are only centred (divided by 1)."""

VALIDATION_SEED: int = 1
"""Seed of the ``np.random.default_rng`` that draws every validation split (digits' test split
uses 0)."""

# name -> (image shape, number of classes) for the TFDS datasets.
_TFDS: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist": ((28, 28, 1), 10),
    "fashion_mnist": ((28, 28, 1), 10),
    "cifar10": ((32, 32, 3), 10),
}

# (x_train, y_train, x_test, y_test, num_classes): what a loader returns.
_Raw = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]

# Registered datasets (not the built-ins), in registration order.
_REGISTRY: dict[str, Callable[[str | None], _Raw]] = {}


class Stats(NamedTuple):
    """The standardisation applied: ``x' = (x - mean) / scale`` (so ``x = x' * scale + mean``).

    Attributes:
      mean: float32 training-portion mean, shaped to broadcast against ``x``: one example's
        shape (``[H, W, C]`` or ``[D]``) for ``"feature"``, ``[C]`` (the last axis) for
        ``"channel"``.
      scale: float32 divisor of the same shape: the training-portion standard deviation
        (population, ``ddof=0``), or 1 where it is ``<=`` :data:`STANDARDIZE_EPS`.
    """

    mean: np.ndarray
    scale: np.ndarray


class Dataset(NamedTuple):
    """A classification dataset held in memory.

    The first six fields are positional (``Dataset("toy", x_tr, y_tr, x_te, y_te, 2)`` is a
    dataset without a validation split or recorded preprocessing); :func:`load` fills them all.

    Attributes:
      name: the dataset's name (see :func:`dataset_names`).
      x_train: ``[N, H, W, C]`` float32 images (or ``[N, D]`` features): the training portion,
        i.e. the training set minus the validation split, standardised as :func:`load` was told.
      y_train: ``[N]`` int32 labels in ``[0, num_classes)``.
      x_test: ``[M, H, W, C]`` float32 test inputs, standardised with the *training* statistics.
      y_test: ``[M]`` int32 labels.
      num_classes: number of classes.
      x_val: ``[V, H, W, C]`` float32 validation inputs carved from the training set (standardised
        with the training statistics), or None when there is no validation split.
      y_val: ``[V]`` int32 labels, or None.
      preprocessing: JSON-ready record of what :func:`load` did (write it into a run's config):
        ``validation`` (the fraction), ``validation_seed``, ``num_train``, ``num_validation``,
        ``num_test``, ``standardize`` (the mode), ``eps``, ``constant_features`` (how many
        statistics had ``σ <= eps`` and were only centred) and ``digest`` (sha256 of the
        prepared arrays, class count and this record: the dataset's part of a run's code
        fingerprint); None if not built by :func:`load`.
      stats: the :class:`Stats` used to standardise, or None (``standardize="none"``).
      task: ``"classification"``, or ``"language_model"`` for a text dataset: ``x`` and ``y``
        are ``[N, T]`` int32 token ids (``y`` the next token of ``x``), ``num_classes`` the
        vocabulary size (:mod:`jaxstale.tasks`).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    preprocessing: dict[str, Any] | None = None
    stats: Stats | None = None
    task: str = "classification"


def dataset_names() -> tuple[str, ...]:
    """Every name :func:`load` accepts: the built-in :data:`DATASETS`, then registered ones.

    Returns:
      The names, built-ins first, registered datasets in registration order.

    Example:
      >>> from jaxstale import data
      >>> data.dataset_names()[:5]
      ('digits', 'mnist1d', 'mnist', 'fashion_mnist', 'cifar10')
    """
    return DATASETS + tuple(_REGISTRY)


def register_dataset(
    name: str,
    loader: Callable[[str | None], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]],
    *,
    overwrite: bool = False,
) -> None:
    """Make ``load(name)`` use your own data.

    ``loader(data_dir)`` returns ``(x_train, y_train, x_test, y_test, num_classes)``: NumPy
    arrays of NHWC float32 images ``[N, H, W, C]`` (or ``[N, D]`` features) and integer labels in
    ``[0, num_classes)``. :func:`load` calls it (with its ``data_dir``) on every load, checks and
    converts the arrays (inputs to float32, labels to int32), then applies the same validation
    split and standardisation as to the built-in datasets. Experiments then take the name like any
    built-in one.

    Args:
      name: a new dataset name (a non-empty string; not one of :data:`DATASETS`).
      loader: the function described above.
      overwrite: replace a dataset registered earlier under ``name`` (built-ins can never be
        replaced).

    Raises:
      ValueError: ``name`` holds a comma or whitespace (as every registered name: the command
        line takes comma-separated lists), is a built-in, or is registered and not ``overwrite``.
      TypeError: ``name`` is not a non-empty string or ``loader`` is not callable.

    Example:
      >>> import numpy as np
      >>> from jaxstale import data
      >>> def blobs(data_dir):
      ...     rng = np.random.default_rng(0)
      ...     y = np.arange(200) % 2
      ...     x = (rng.normal(size=(200, 3)) + 3 * y[:, None]).astype(np.float32)
      ...     return x[:150], y[:150], x[150:], y[150:], 2
      >>> data.register_dataset("blobs", blobs)
      >>> ds = data.load("blobs")  # 75 per class: round(7.5) = 8 of each for validation
      >>> ds.x_train.shape, ds.x_val.shape, ds.x_test.shape, "blobs" in data.dataset_names()
      ((134, 3), (16, 3), (50, 3), True)
    """
    check_name(name, "register_dataset", "dataset name")
    if not callable(loader):
        raise TypeError(f"loader must be callable, got {type(loader).__name__}.")
    if name in DATASETS:
        raise ValueError(f"{name!r} is a built-in dataset and cannot be replaced.")
    if name in _REGISTRY and not overwrite:
        raise ValueError(
            f"Dataset {name!r} is already registered; pass overwrite=True to replace it."
        )
    _REGISTRY[name] = loader


def check_dataset(ds: Any, where: str = "dataset") -> Any:
    """``ds`` if it is well formed, else one ``ValueError`` line starting with ``where``:
    inputs ``[N, ...]`` with finite values, integer labels ``[N]`` in ``[0, num_classes)``, the
    same example shape in every split (a language model's: token ids ``[N, T]`` in
    ``[0, V)`` for inputs and next-token targets alike). A bad label or a NaN feature otherwise
    shows up much later as a "diverged" run.

    Example:
      >>> import numpy as np
      >>> x, y = np.zeros((4, 2, 2, 1), np.float32), np.array([0, 1, 2, 1])
      >>> check_dataset(Dataset("toy", x, y, x, y, 2), "fit")
      Traceback (most recent call last):
      ValueError: fit: dataset 'toy': y_train must be in [0, 2), got [0, 2]
    """
    what = f"{where}: dataset {getattr(ds, 'name', '?')!r}:"
    k, lm = ds.num_classes, getattr(ds, "task", "classification") == "language_model"
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"{what} num_classes must be a positive int, got {k!r}")
    shape = None
    for part in ("train", "val", "test"):
        x, y = getattr(ds, f"x_{part}", None), getattr(ds, f"y_{part}", None)
        if x is None and y is None and part == "val":
            continue
        x, y = np.asarray(x), np.asarray(y)
        if lm and (x.ndim != 2 or y.shape != x.shape or not np.issubdtype(x.dtype, np.integer)):
            raise ValueError(
                f"{what} a language model's x_{part} and y_{part} must be token ids [N, T] of "
                f"one shape, got {x.shape} ({x.dtype}) and {y.shape}"
            )
        if lm and len(x) and not (0 <= x.min() and x.max() < k):
            raise ValueError(f"{what} x_{part} must be in [0, {k}), got [{x.min()}, {x.max()}]")
        if not lm and (x.ndim < 2 or y.ndim != 1 or len(x) != len(y)):
            raise ValueError(
                f"{what} x_{part} must be [N, ...] and y_{part} [N] with the same N, got shapes "
                f"{x.shape} and {y.shape}"
            )
        if shape is not None and x.shape[1:] != shape:
            raise ValueError(
                f"{what} x_{part} and x_train differ in shape: {x.shape[1:]} vs {shape}"
            )
        shape = x.shape[1:]
        if not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{what} y_{part} must hold integers, got {y.dtype}")
        if len(y) and not (0 <= y.min() and y.max() < k):
            raise ValueError(f"{what} y_{part} must be in [0, {k}), got [{y.min()}, {y.max()}]")
        if not np.issubdtype(x.dtype, np.number) or not np.isfinite(x).all():
            raise ValueError(f"{what} x_{part} must hold finite numbers (NaN or inf found)")
    return ds


def registered_loader(name: str) -> Callable[[str | None], Any] | None:
    """The loader registered under ``name`` with :func:`register_dataset`; None for a built-in
    or unknown name (what a run's code fingerprint records as user code).

    Example:
      >>> registered_loader("digits") is None
      True
    """
    return _REGISTRY.get(name)


def load(
    name: str,
    *,
    data_dir: str | None = None,
    validation: float = 0.1,
    standardize: str = "feature",
) -> Dataset:
    r"""Load a dataset by name, split off a validation set, standardise with training statistics.

    **Raw data.** ``"digits"`` (scikit-learn's ``load_digits``: pixel values 0..16 divided by 16)
    is split into train/test once, deterministically: a stratified 20% test split drawn with
    ``np.random.default_rng(0)`` (1,438 train / 359 test images, every class within one image of
    20%), the same on every machine. ``"mnist1d"``: the ``mnist1d`` package's train/test split of
    25,000 generated sequences (:mod:`jaxstale._mnist1d`).

    The TFDS names are read with ``tfds.data_source(name, split=..., data_dir=data_dir,
    download=False)`` and converted example by example (uint8 / 255). Nothing is ever downloaded:
    if the prepared ``array_record`` files are not in ``data_dir`` (default
    ``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``) a ``RuntimeError`` says how to prepare them
    on a machine with internet access. Under ``tfds.testing.mock_data`` random mock examples are
    returned (that is how the tests exercise this path).

    A name added with :func:`register_dataset` calls its loader with ``data_dir``.

    **Validation split.** From every class :math:`c` of the training set (:math:`n_c` examples),
    :math:`k_c = \mathrm{round}(\texttt{validation} \cdot n_c)` examples (Python's ``round``,
    halves to even) go to ``x_val, y_val``: the first :math:`k_c` of that class in the order of
    ``np.random.default_rng(VALIDATION_SEED).permutation(N)``. Both parts keep the training set's
    order. Same data, same split, on every machine. Digits: 143 validation images (14 or 15 per
    class), 1,295 left for training. ``validation=0.0``: no split (``x_val = y_val = None``). A
    tiny dataset may get an empty validation set (every :math:`k_c = 0`).

    **Standardisation.** With the training portion :math:`x_1, \dots, x_N` (after the validation
    split; validation and test data are never looked at),

    .. math::

        \mu = \frac{1}{N} \sum_i x_i, \qquad
        \sigma = \sqrt{\frac{1}{N} \sum_i (x_i - \mu)^2}, \qquad
        x' = \frac{x - \mu}{s}, \quad
        s = \begin{cases} \sigma & \sigma > \varepsilon \\ 1 & \sigma \le \varepsilon \end{cases}

    (``ε =`` :data:`STANDARDIZE_EPS` ``= 1e-6``), applied to train, validation and test, with the
    sums over examples only (``"feature"``: one :math:`\mu, \sigma` per pixel and channel) or over
    examples and all but the last axis (``"channel"``: one per channel). So every training
    feature has mean 0 and standard deviation 1, except features constant on the training portion
    (digits: 3 always-zero border pixels), which are only centred: exactly 0 on the training data,
    never NaN or inf, and ``x - μ`` elsewhere (dividing them by a tiny ε, as
    :math:`x' = (x - \mu) / \max(\sigma, \varepsilon)` would, turns a pixel that is off in every
    training image but on in a test image into a value around :math:`10^6`). Nearly constant
    features are standardised as usual and can take large values in validation and test data
    (digits: up to about 87). Statistics are computed in float64, the results are float32.
    ``standardize="none"``: the raw inputs (images in ``[0, 1]``).

    Args:
      name: one of :func:`dataset_names` (the built-in :data:`DATASETS` or a registered name).
      data_dir: TFDS data directory (ignored for ``"digits"`` and ``"mnist1d"``; passed to
        registered loaders).
      validation: fraction of each class of the training set held out for validation, in
        ``[0, 1)``; ``0.0`` for none.
      standardize: ``"feature"`` (default), ``"channel"`` or ``"none"`` (see above).

    Returns:
      A :class:`Dataset` with ``x_val``, ``y_val`` (None if ``validation=0.0``),
      ``preprocessing`` and ``stats`` (None if ``standardize="none"``) filled in.

    Raises:
      ValueError: unknown ``name`` (the message lists the registered names), ``validation`` not
        in ``[0, 1)``, ``standardize`` not one of :data:`STANDARDIZE_MODES`, a registered loader
        returning inconsistent arrays, or a split that leaves no training example.
      RuntimeError: a TFDS dataset is requested but ``tensorflow_datasets`` is not installed, or
        the dataset is not prepared in ``data_dir``; ``"mnist1d"`` without the ``mnist1d``
        package.

    Example:
      >>> import numpy as np
      >>> from jaxstale import data
      >>> ds = data.load("digits")
      >>> ds.x_train.shape, ds.x_val.shape, ds.x_test.shape, ds.x_train.dtype, ds.num_classes
      ((1295, 8, 8, 1), (143, 8, 8, 1), (359, 8, 8, 1), dtype('float32'), 10)
      >>> sd = ds.x_train.std(axis=0)  # 1 for every pixel except the 3 constant ones (0)
      >>> int(np.sum(np.isclose(sd, 1.0, atol=1e-4))), int(np.sum(sd == 0.0))
      (61, 3)
      >>> ds.preprocessing["standardize"], ds.preprocessing["num_validation"]
      ('feature', 143)
      >>> raw = data.load("digits", validation=0.0, standardize="none")  # as before
      >>> raw.x_train.shape, float(raw.x_train.min()), float(raw.x_train.max()), raw.x_val
      ((1438, 8, 8, 1), 0.0, 1.0, None)
    """
    if name not in DATASETS and name not in _REGISTRY:
        raise ValueError(
            f"Unknown dataset {name!r}; registered datasets: {', '.join(dataset_names())}."
        )
    if (
        isinstance(validation, bool)
        or not isinstance(validation, int | float | np.integer | np.floating)
        or not 0.0 <= float(validation) < 1.0
    ):
        raise ValueError(f"validation must be a fraction in [0, 1), got {validation!r}.")
    if standardize not in STANDARDIZE_MODES:
        raise ValueError(
            f"standardize must be one of {', '.join(map(repr, STANDARDIZE_MODES))}, "
            f"got {standardize!r}."
        )
    if name in TEXTS or name in TFDS_TEXTS or name == "tokens":
        if validation != 0.1:
            raise ValueError(f"{name!r} has a fixed validation split; got validation={validation}")
        return _load_text(name, standardize, data_dir)
    if name == "digits":
        raw = _load_digits()
    elif name == "mnist1d":
        raw = load_mnist1d()
    elif name in _TFDS:
        raw = load_tfds(name, data_dir, *_TFDS[name])
    else:
        raw = _check_raw(name, _REGISTRY[name](data_dir))
    return _prepare(name, raw, float(validation), standardize)


def _prepare(name: str, raw: _Raw, validation: float, standardize: str) -> Dataset:
    """Validation split, then standardisation with the training portion's statistics."""
    x_train, y_train, x_test, y_test, num_classes = raw
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    if validation > 0.0:
        is_val = _stratified_holdout(y_train, validation, VALIDATION_SEED)[1]
        x_val, y_val = x_train[is_val], y_train[is_val]
        x_train, y_train = x_train[~is_val], y_train[~is_val]
        if len(x_train) == 0:
            raise ValueError(
                f"validation={validation} leaves no training example of dataset {name!r}."
            )
    stats: Stats | None = None
    constant = 0
    if standardize != "none":
        stats, constant = _statistics(x_train, per_feature=standardize == "feature")
        x_train, x_test = _standardize(x_train, stats), _standardize(x_test, stats)
        if x_val is not None:
            x_val = _standardize(x_val, stats)
    preprocessing = {
        "validation": validation,
        "validation_seed": VALIDATION_SEED if validation > 0.0 else None,
        "num_train": len(x_train),
        "num_validation": 0 if x_val is None else len(x_val),
        "num_test": len(x_test),
        "standardize": standardize,
        "eps": STANDARDIZE_EPS if standardize != "none" else None,
        "constant_features": constant,
    }
    preprocessing["digest"] = _digest(
        num_classes, x_train, y_train, x_val, y_val, x_test, y_test, preprocessing
    )
    return Dataset(
        name, x_train, y_train, x_test, y_test, num_classes, x_val, y_val, preprocessing, stats
    )


def _load_text(name: str, standardize: str, data_dir: str | None) -> Dataset:
    """A text dataset as next-token windows of :data:`~jaxstale.text.CONTEXT` characters: every
    non-overlapping window of the training split (a seed's batches are drawn from them) and of
    the test split (the whole split is scored, as the count n-gram levels are, but the tail
    shorter than a window), and :data:`~jaxstale.text.EVAL_WINDOWS` evenly spaced windows of
    validation (what rates are chosen on, at every evaluation: a fixed, cheaper set)."""
    if standardize == "channel":
        raise ValueError(f"{name!r} holds token ids: standardize='channel' does not apply to it")
    if name == "tokens":  # a token folder on disk (jaxstale.tokens), read lazily
        from jaxstale import tokens

        *arrays, vocab, pre = tokens.dataset_parts(data_dir)
        xt, yt, xv, yv, xs, ys = arrays
        return Dataset(name, xt, yt, xs, ys, vocab, xv, yv, pre, None, "language_model")
    t = load_text(name, data_dir)
    x_tr, y_tr = t.windows("train", CONTEXT)
    x_va, y_va = t.sampled_windows("val", CONTEXT, EVAL_WINDOWS)
    x_te, y_te = t.windows("test", CONTEXT)
    parts = [np.ascontiguousarray(a, np.int32) for a in (x_tr, y_tr, x_va, y_va, x_te, y_te)]
    pre = {"context": CONTEXT, "eval_windows": EVAL_WINDOWS, "test_windows": "all"}
    pre["standardize"] = "none"
    pre["vocabulary"] = t.vocabulary
    pre |= {"num_train": len(x_tr), "num_validation": len(x_va), "num_test": len(x_te)}
    pre["digest"] = _digest(t.vocab_size, *parts, pre)
    xt, yt, xv, yv, xs, ys = parts
    return Dataset(name, xt, yt, xs, ys, t.vocab_size, xv, yv, pre, None, "language_model")


def _digest(num_classes: int, *parts: Any) -> str:
    """sha256 of the prepared data: the class count, every array's dtype, shape and bytes, and
    the preprocessing record (a fingerprint part of every run that reads it)."""
    h = hashlib.sha256(f"classes={num_classes}".encode())
    for part in parts:
        if part is None:
            h.update(b"|none")
        elif isinstance(part, dict):
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        else:
            a = np.ascontiguousarray(part)
            h.update(f"|{a.dtype.str}{a.shape}".encode())
            h.update(a.data)
    return h.hexdigest()


def _stratified_holdout(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, held)``: ``perm = default_rng(seed).permutation(N)`` and a boolean mask holding
    out the first ``round(fraction * n_c)`` examples of every class ``c`` in ``perm``'s order."""
    perm = np.random.default_rng(seed).permutation(len(y))
    held = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        members = perm[y[perm] == c]
        held[members[: round(fraction * len(members))]] = True
    return perm, held


def _statistics(x: np.ndarray, *, per_feature: bool) -> tuple[Stats, int]:
    """Mean and divisor (σ, or 1 where σ <= eps) over the examples (and, per channel, all but
    the last axis), in float64 over row chunks (no float64 copy of the whole array)."""
    axes = (0,) if per_feature else tuple(range(x.ndim - 1))
    n = len(x) * int(np.prod([x.shape[a] for a in axes[1:]], dtype=np.int64))
    chunk = max(1, (1 << 20) // max(1, int(np.prod(x.shape[1:], dtype=np.int64))))
    total = np.zeros(x.shape[1:] if per_feature else x.shape[-1:], dtype=np.float64)
    for start in range(0, len(x), chunk):
        total += x[start : start + chunk].sum(axis=axes, dtype=np.float64)
    mean = total / n
    squares = np.zeros_like(mean)
    for start in range(0, len(x), chunk):
        squares += np.square(x[start : start + chunk].astype(np.float64) - mean).sum(axis=axes)
    std = np.sqrt(squares / n)
    constant = std <= STANDARDIZE_EPS
    scale = np.where(constant, 1.0, std)
    return Stats(mean.astype(np.float32), scale.astype(np.float32)), int(constant.sum())


def _standardize(x: np.ndarray, stats: Stats) -> np.ndarray:
    return ((x - stats.mean) / stats.scale).astype(np.float32, copy=False)


def _check_raw(name: str, raw: Any) -> _Raw:
    """A registered loader's result, checked and converted to float32 inputs / int32 labels."""
    if not isinstance(raw, tuple | list) or len(raw) != 5:
        raise ValueError(
            f"The loader of dataset {name!r} must return (x_train, y_train, x_test, y_test, "
            f"num_classes), got {type(raw).__name__}."
        )
    x_train, y_train, x_test, y_test = (np.asarray(a) for a in raw[:4])
    num_classes = raw[4]
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer):
        raise ValueError(f"Dataset {name!r}: num_classes must be an int, got {num_classes!r}.")
    num_classes = int(num_classes)
    check_dataset(Dataset(name, x_train, y_train, x_test, y_test, num_classes), "load")
    if len(x_train) == 0:
        raise ValueError(f"Dataset {name!r} has no training example.")
    return (
        np.ascontiguousarray(x_train, dtype=np.float32),
        y_train.astype(np.int32),
        np.ascontiguousarray(x_test, dtype=np.float32),
        y_test.astype(np.int32),
        num_classes,
    )


def _load_digits() -> _Raw:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (np.asarray(digits.images, dtype=np.float32) / np.float32(16.0))[..., None]
    y = np.asarray(digits.target, dtype=np.int32)
    perm, is_test = _stratified_holdout(y, 0.2, 0)  # round(20%) of each class, in permuted order
    train_idx = perm[~is_test[perm]]
    test_idx = perm[is_test[perm]]
    return x[train_idx], y[train_idx], x[test_idx], y[test_idx], 10
