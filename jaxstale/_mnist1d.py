"""MNIST-1D for :func:`jaxstale.data.load`: generated offline by the ``mnist1d`` package, once
per machine, then read from a cache file.

MNIST-1D (Greydanus and Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024) draws
each example from one of ten 1-D digit templates (12 points) by padding, shearing, scaling,
translating and adding correlated and i.i.d. noise, then resamples it to 40 points. It is small
enough to train on a CPU in minutes, and hard: an MLP reaches about 60–70 % test accuracy, a
small 1-D CNN more, so the differences between training procedures show, where digits saturates.

The generation arguments are the package's defaults (``mnist1d.data.get_dataset_args``) except
the size: :data:`NUM_SAMPLES` examples (2,500 per class), the package's 80/20 train/test split
(20,000 / 5,000; :func:`jaxstale.data.load` then holds out its validation split from the 20,000).
``mnist1d`` standardises the whole array by one global mean and standard deviation before it
splits (a single scalar pair that includes the test examples); ``load`` standardises again with
training statistics. Inputs are ``[N, 40, 1]`` float32 (length, one channel), labels int32.

Generating takes about 20 s on one CPU core (``mnist1d`` transforms example by example with
SciPy), so the arrays are written once to ``$JAXSTALE_CACHE`` (default
``$XDG_CACHE_HOME/jaxstale`` or ``~/.cache/jaxstale``) under a name that holds the ``mnist1d``
version and the arguments, and read from there afterwards. ``mnist1d`` seeds NumPy's and
Python's global generators; the state of both is restored after it ran. The prepared data's
content digest (``Dataset.preprocessing["digest"]``) is part of every run's fingerprint, so a
``mnist1d`` or SciPy release that generated other numbers would refuse old run folders.

References:
    S. Greydanus, D. Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024,
    arXiv:2011.14439 (package ``mnist1d``, Apache-2.0).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import random
from pathlib import Path

import numpy as np

from jaxstale._atomic import write_atomically

NUM_SAMPLES: int = 25_000
"""Examples generated (2,500 per class): 20,000 train and 5,000 test."""

LENGTH: int = 40
"""Points per example (the package's ``final_seq_length``)."""


def _args() -> dict[str, object]:
    """The generation arguments: the package's defaults, :data:`NUM_SAMPLES` examples."""
    from mnist1d.data import get_dataset_args

    args = dict(get_dataset_args(as_dict=True))
    args.pop("url", None)  # where the package's own pickle lives: never used here
    args["num_samples"] = NUM_SAMPLES
    return args


def cache_dir() -> Path:
    """Where the generated arrays are kept (see the module docstring)."""
    root = os.environ.get("JAXSTALE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "jaxstale",
    )
    return Path(root)


def _generate(args: dict[str, object]) -> dict[str, np.ndarray]:
    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    # mnist1d seeds the legacy global generators: keep the caller's state
    np_state, py_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    try:
        d = make_dataset(ObjectView(dict(args)))
    finally:
        np.random.set_state(np_state)  # noqa: NPY002
        random.setstate(py_state)
    return {
        "x_train": np.asarray(d["x"], np.float32)[..., None],
        "y_train": np.asarray(d["y"], np.int32),
        "x_test": np.asarray(d["x_test"], np.float32)[..., None],
        "y_test": np.asarray(d["y_test"], np.int32),
    }


def load_mnist1d() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(x_train, y_train, x_test, y_test, 10)``, generated on first use and cached.

    Raises:
        RuntimeError: the ``mnist1d`` package is not installed.
    """
    try:
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            "dataset 'mnist1d' needs the mnist1d package: pip install mnist1d"
        ) from None
    args = _args()
    key = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / f"mnist1d-{version}-{key}.npz"
    arrays: dict[str, np.ndarray] | None = None
    if path.exists():
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        except (OSError, ValueError, KeyError):  # a damaged file: generate again
            arrays = None
    if arrays is None:
        arrays = _generate(args)
        _write(path, arrays)
    return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], 10


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes the cache file atomically (a concurrent reader sees all or nothing); a folder that
    cannot be written leaves the data uncached (generated again next time), not an error."""
    buf = io.BytesIO()
    np.savez(buf, *(), **arrays)  # type: ignore[arg-type]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, buf.getvalue())
    except OSError:
        return
