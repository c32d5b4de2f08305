"""Reading prepared TFDS image and text datasets without TensorFlow (``tfds.data_source``),
for :func:`jaxstale.data.load`; tests use ``tfds.testing.mock_data``."""

from __future__ import annotations

from typing import Any

import numpy as np


def _prepare_hint(name: str, data_dir: str | None, prepared: bool) -> str:
    where = f" --data_dir={data_dir}" if data_dir else ""
    state = (
        "is prepared but not readable by tfds.data_source (it needs the array_record format)"
        if prepared
        else "is not prepared"
    )
    return (
        f"TFDS dataset {name!r} {state} in data_dir={data_dir or '~/tensorflow_datasets'} "
        "(jaxstale reads prepared array_record files with tfds.data_source and never downloads). "
        "On a machine with internet access (preparing needs TensorFlow: pip install "
        f"tensorflow-cpu tensorflow-datasets) run `tfds build {name} --file_format=array_record"
        f"{where}` (or tfds.builder({name!r}, data_dir=...).download_and_prepare("
        "file_format='array_record')), then copy that directory here and pass data_dir= "
        "(or set TFDS_DATA_DIR). Offline, use the embedded dataset: load('digits')."
    )


def _is_prepared(tfds: Any, name: str, data_dir: str | None) -> bool:
    try:
        return bool(tfds.builder(name, data_dir=data_dir).is_prepared())
    except Exception:
        return False


def _import_tfds(name: str) -> Any:
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise RuntimeError(
            f"Dataset {name!r} needs TensorFlow Datasets: pip install 'jaxstale[tfds]' "
            "(tensorflow-datasets and importlib_resources; TensorFlow itself is not needed). "
            "Offline, use the embedded dataset: load('digits')."
        ) from e
    return tfds


def _source(tfds: Any, name: str, split: str, data_dir: str | None) -> Any:
    try:
        # download=False: an unprepared dataset fails here at once instead of hanging on a
        # download (under tfds.testing.mock_data this returns mock examples).
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # tfds raises several types (NotImplementedError, AssertionError…)
        hint = _prepare_hint(name, data_dir, _is_prepared(tfds, name, data_dir))
        raise RuntimeError(f"{hint} [tfds: {type(e).__name__}: {e}]") from e


def load_tfds_text(name: str, data_dir: str | None) -> tuple[str, str, str]:
    """The train, validation and test texts of a prepared TFDS text dataset (``{"text": ...}``
    examples, e.g. ``tiny_shakespeare``: one example per split), each split's examples joined
    in order."""
    tfds = _import_tfds(name)
    out = []
    for split in ("train", "validation", "test"):
        source = _source(tfds, name, split, data_dir)
        parts = (source[k]["text"] for k in range(len(source)))
        out.append("".join(p.decode("utf-8") if isinstance(p, bytes) else str(p) for p in parts))
    return out[0], out[1], out[2]


def load_tfds(
    name: str, data_dir: str | None, shape: tuple[int, int, int], num_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(x_train, y_train, x_test, y_test, num_classes)`` of a prepared TFDS image dataset,
    read with ``tfds.data_source`` (never downloading); images float32 NHWC / 255."""
    tfds = _import_tfds(name)
    arrays: list[np.ndarray] = []
    for split in ("train", "test"):
        source = _source(tfds, name, split, data_dir)
        arrays.extend(_read_source(source, shape, name))
    x_train, y_train, x_test, y_test = arrays
    return x_train, y_train, x_test, y_test, num_classes


def _read_source(
    source: Any, shape: tuple[int, int, int], name: str
) -> tuple[np.ndarray, np.ndarray]:
    """All examples of a tfds data source as (float32 NHWC / 255, int32 labels)."""
    n = len(source)
    x = np.empty((n, *shape), dtype=np.float32)
    y = np.empty((n,), dtype=np.int32)
    chunk = 1024
    getitems = getattr(source, "__getitems__", None)
    start = 0
    while start < n:
        keys = list(range(start, min(start + chunk, n)))
        examples = None
        if getitems is not None:
            try:
                examples = getitems(keys)
            except TypeError:  # fails under tfds.testing.mock_data: read one at a time
                getitems = None
        if examples is None:
            examples = [source[k] for k in keys]
        for k, ex in zip(keys, examples, strict=True):
            image = np.asarray(ex["image"])
            if image.shape != shape:
                raise RuntimeError(
                    f"TFDS {name!r} example {k} has image shape {image.shape}, expected {shape}."
                )
            x[k] = image.astype(np.float32) / np.float32(255.0)
            y[k] = int(ex["label"])
        start += chunk
    return x, y
