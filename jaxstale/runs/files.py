"""Run-folder files: strict JSON, atomic writes with the umask's modes, and the folder checks."""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RunFolderError",
    "StaleResultsError",
    "atomic_write_text",
    "config_hash",
    "to_json",
]


# ----------------------------------------------------------------------------------------------
# JSON helpers
# ----------------------------------------------------------------------------------------------


def _jsonable(obj: Any) -> Any:
    """Converts ``obj`` to plain JSON types (NaN/inf -> None, numpy scalars -> Python)."""
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
        arr = np.asarray(obj)
        return _jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(
        f"cannot write {type(obj).__name__} to JSON; allowed: None, bool, int, float, str, "
        "numpy scalars/arrays, and lists/tuples/dicts of these"
    )


def to_json(obj: Any, *, indent: int | None = None, canonical: bool = False) -> str:
    """Serialises ``obj`` as strict JSON: NaN and ±inf are written as ``null``.

    Args:
      obj: nested dicts/lists/tuples of None, bool, int, float, str, numpy scalars or arrays.
      indent: passed to :func:`json.dumps`.
      canonical: sort keys and use compact separators (the form that is hashed).

    Returns:
      The JSON text.

    Example:
      >>> to_json({"b": float("nan"), "a": np.float32(0.5)}, canonical=True)
      '{"a":0.5,"b":null}'
    """
    data = _jsonable(obj)
    if canonical:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return json.dumps(data, indent=indent, allow_nan=False)


def config_hash(config: Mapping[str, Any], length: int = 10) -> str:
    """Short id of a config: SHA-1 of its canonical JSON, first ``length`` hex characters.

    Args:
      config: the config dict (JSON-able).
      length: number of hex characters kept.

    Returns:
      The hex id; equal configs (any key order) give the same id.

    Example:
      >>> config_hash({"lr": 0.1, "seeds": 3}) == config_hash({"seeds": 3, "lr": 0.1})
      True
    """
    return hashlib.sha1(to_json(config, canonical=True).encode()).hexdigest()[:length]


def _create_temp(path: Path) -> tuple[int, Path]:
    """Creates a new hidden temporary file beside ``path`` with mode ``0o666 & ~umask``.

    (``tempfile.mkstemp`` would create it ``0o600`` whatever the umask, and ``os.replace`` keeps
    that mode.)
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name beside {path}")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Writes ``text`` to ``path`` atomically (temporary file in the same folder + ``os.replace``).

    A reader sees either the old file or the complete new one, never a partial write. The file
    gets the mode an ordinary ``open(path, "w")`` gives a new file: ``0o666 & ~umask``.

    Args:
      path: destination file; its folder must exist.
      text: content (UTF-8).

    Returns:
      ``Path(path)``.
    """
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _atomic_savefig(fig: Any, path: Path) -> None:
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=120, bbox_inches="tight")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _sort_value(value: Any) -> tuple[int, Any]:
    if value is None:
        return (2, "")
    if isinstance(value, bool | int | float):
        return (0, value)
    return (1, str(value))


def _key_order(key: Mapping[str, Any]) -> tuple[Any, ...]:
    """Sort key of a cell key: its fields in their own order, numbers numerically."""
    return tuple((k, _sort_value(v)) for k, v in key.items())


# ----------------------------------------------------------------------------------------------
# Errors and checks
# ----------------------------------------------------------------------------------------------


class RunFolderError(ValueError):
    """The run folder cannot be used as given: a bad ``--out``, or a folder of another run.

    Raised by :class:`RunFolder` before anything is written; the message is one line that names
    the folder and says what to do. :meth:`RunFolder.from_args` turns it into a one-line
    command-line error.
    """


class StaleResultsError(RunFolderError):
    """The run folder holds cells computed under different code (see :func:`code_fingerprint`).

    Raised before anything is computed, so old and new results are never mixed silently. The
    message says which parts changed (jaxstale source, experiment source, user sources,
    jax/jaxlib/optax/flax versions) and how to go on: ``--force-resume``
    (``RunFolder(..., force_resume=True)``) to reuse the old cells anyway, another ``--out``, or
    deleting the folder.
    """


def _check_target(path: Path, where: str) -> None:
    """Fails (RunFolderError) unless a run folder can be created at / reused from ``path``."""
    try:
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise RunFolderError(f"{where} {path} is an existing file, not a folder")
            if not (path / "config.json").is_file() and any(path.iterdir()):
                raise RunFolderError(
                    f"{where} {path} is a non-empty folder that holds no run (no config.json); "
                    "choose a new or empty folder"
                )
            if not os.access(path, os.W_OK | os.X_OK):
                raise RunFolderError(f"{where} {path} is not writable; choose another folder")
            return
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise RunFolderError(f"{where} {path} cannot be created: {parent} is not a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise RunFolderError(f"{where} {path} cannot be created: {parent} is not writable")
    except OSError as e:
        raise RunFolderError(f"{where} {path} cannot be used: {e.strerror or e}") from None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
