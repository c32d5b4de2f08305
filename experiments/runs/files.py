"""Run-folder files: strict JSON, atomic writes with the umask's modes, and the folder checks.

In a group of JAX processes (:mod:`jaxstale.distributed`) only process 0 writes
(:func:`writes_here`): the others compute the same results and skip every write.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from jaxstale._atomic import write_atomically

__all__ = [
    "RunFolderError",
    "StaleResultsError",
    "accepted_codes",
    "atomic_write_bytes",
    "atomic_write_text",
    "config_hash",
    "to_json",
    "writes_here",
]


def writes_here() -> bool:
    """Whether this process writes run files: always in one process; in a group of JAX
    processes (after ``jax.distributed.initialize()``) only process 0.

    Does not start a JAX backend in a single process (nor import jax if it is not imported).

    Example:
      >>> writes_here()
      True
    """
    if "jax" not in sys.modules:
        return True
    from jaxstale.distributed import is_main_process, process_count

    return process_count() == 1 or is_main_process()


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


def accepted_codes(header: Mapping[str, Any]) -> set[Any]:
    """The code hashes whose cells a run folder with this ``config.json`` header may hold: the
    code it records and those whose cells were reused into it with ``--force-resume`` (the
    header's ``force_resumed`` events whose ``to`` is that code). ``None`` stands for a header
    that records no code."""
    code = header.get("code")
    own = code.get("hash") if isinstance(code, Mapping) else None
    taken = {
        h
        for event in header.get("force_resumed") or []
        if isinstance(event, Mapping) and event.get("to") == own
        for h in event.get("from") or []
    }
    return {own, *taken}


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Writes ``data`` to ``path`` atomically (temporary file in the same folder + ``os.replace``).

    A reader sees either the old file or the complete new one, never a partial write. The file
    gets the mode an ordinary ``open(path, "wb")`` gives a new file: ``0o666 & ~umask``. In a
    group of JAX processes only process 0 writes; on the others this does nothing
    (:func:`writes_here`).

    Args:
      path: destination file; its folder must exist.
      data: content.

    Returns:
      ``Path(path)``.

    Example:
      >>> import tempfile
      >>> with tempfile.TemporaryDirectory() as d:
      ...     atomic_write_bytes(Path(d) / "f.bin", b"PK").read_bytes()
      b'PK'
    """
    if not writes_here():
        return Path(path)
    return write_atomically(path, data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8 (the same modes, the same process rule)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _atomic_savefig(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


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


# ----------------------------------------------------------------------------------------------
# Several processes
# ----------------------------------------------------------------------------------------------


def _folder_digest(path: Path) -> bytes:
    """SHA-1 of what a run folder's constructor reads: ``config.json`` and ``cells/*.json``."""
    h = hashlib.sha1()
    try:
        files = [path / "config.json", *sorted((path / "cells").glob("*.json"))]
        for f in files:
            if f.is_file():
                h.update(f"{f.relative_to(path)}\0".encode())
                h.update(hashlib.sha1(f.read_bytes()).digest())
    except OSError as e:
        h.update(f"unreadable: {e}".encode())
    return h.digest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _join_group(path: Path) -> dict[str, Any] | None:
    """A run folder's start in a group of JAX processes: None if this process writes the
    folder at ``path`` (one process, or process 0), else the cells it holds, by file name.

    Every process of a group constructs the same run folder and computes the same cells; only
    process 0 writes (:func:`writes_here`); the others keep the cells found here plus those
    they record in memory and never read the folder again (``create``, ``record``, ``finish``
    and ``report`` write nothing there, :func:`atomic_write_text` neither). So that every
    process skips the same finished cells on a resume (a cell computed by some processes only
    would wait forever in its collectives), first, before anything is checked or written, the
    processes compare what they find (``config.json`` and the cell files; a collective: every
    process constructs the run folder at the same point of the program) and all raise
    :class:`RunFolderError` if it differs. Resuming therefore needs every process to see the
    same folder: one machine, or a shared filesystem on a cluster; without one, start every
    run with a new ``--out``."""
    if "jax" not in sys.modules:
        return None
    from jaxstale.distributed import allgather_bytes, process_count

    if process_count() == 1:
        return None
    if len(set(allgather_bytes(_folder_digest(path)))) > 1:
        raise RunFolderError(
            f"the processes find different files in the run folder {path}: resuming needs "
            "every process to see the same folder (one machine or a shared filesystem); use a "
            "new --out"
        )
    if writes_here():
        return None
    cells = ((f.name, _read_json(f)) for f in sorted((path / "cells").glob("*.json")))
    return {name: cell for name, cell in cells if cell}


def _diverged(row: Mapping[str, Any]) -> bool:
    if "diverged" in row:
        return bool(row["diverged"])
    return "final_test_accuracy" in row and row["final_test_accuracy"] is None


def _fmt_wall(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


def _interrupted(saved: int, path: Path) -> NoReturn:
    """Ctrl-C in a sweep: one line on stderr (``saved``: the folder's finished cells), then
    ``SystemExit(130)`` without a traceback."""
    end_bar = "\n" if getattr(sys.stderr, "isatty", lambda: False)() else ""
    print(
        f"{end_bar}interrupted: {saved} cells saved in {path}; re-run the same command to resume",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(130) from None


def _listen_for_sigint() -> tuple[list[int], Callable[[], None]]:
    """``(heard, stop)``: notes every SIGINT in ``heard`` until ``stop()``.

    Python raises ``KeyboardInterrupt`` in whatever frame runs when the signal lands; one raised
    inside a garbage-collector callback (jax's ``_xla_gc_callback``) is printed as "Exception
    ignored" and lost, and the sweep ran to its end (``local_sgd --quick``, Ctrl-C at 45 s:
    exit 0 after 72 s). A sweep re-raises a noted interrupt after the group it lands in. Only
    where Python's own handler is installed, in the main thread; elsewhere nothing changes."""
    heard: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return heard, lambda: None

    def handler(signum: int, frame: Any) -> None:
        heard.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return heard, lambda: signal.signal(signal.SIGINT, signal.default_int_handler) and None
