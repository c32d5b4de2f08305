"""Run folders: config, per-cell results, metrics, summary, table and plots, written atomically.

Every experiment writes one run folder ``results/<experiment>/<run-id>/`` (or exactly ``--out
DIR``)::

    config.json      {"experiment": ..., "run_id": ..., "config": {...}}   (written on creation)
    cells/<h>.json   one file per finished cell: {"key": ..., "row": ..., "metrics": [...]}
    metrics.jsonl    one line per metric record, tagged with its cell's key fields
    summary.json     {"experiment": name, "rows": [...]}                 (written by ``finish``)
    table.md         the experiment's markdown table
    plot.png         the main figure (plus ``<name>.png`` for other named figures)

The run-id is the first 10 hex characters of the SHA-1 of the canonical JSON of the config (the
experiment name is not part of it, it is the parent folder), so the same config always maps to the
same folder, and a re-run skips every cell whose file already exists (resume). A cell file holds
the cell's row *and* its metrics, written together with one ``os.replace``; ``metrics.jsonl`` is
derived from the cell files (rebuilt atomically on a run's first record and on ``finish``,
appended in between), so an interrupted run never loses or half-writes anything it had finished.
NaN and infinities are written as JSON ``null``.

Example:
    >>> import tempfile
    >>> tmp = tempfile.mkdtemp()
    >>> run = RunFolder("demo", {"lr": 0.1}, out=tmp)
    >>> run.run_id
    'edf980217e'
    >>> run.done({"seed": 0}) is None
    True
    >>> run.record({"seed": 0}, {"final_test_accuracy": float("nan")}, [{"step": 1, "loss": 2.0}])
    >>> run.done({"seed": 0})
    {'seed': 0, 'final_test_accuracy': None}
    >>> from jaxstale.runs import markdown_table
    >>> paths = run.finish(markdown_table(["seed"], [[0]]), {})
    >>> sorted(p.name for p in paths.values())
    ['metrics.jsonl', 'summary.json', 'table.md']
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxstale.runs.cli import progress

__all__ = ["RESULTS_DIR", "RunFolder", "atomic_write_text", "config_hash", "to_json"]

RESULTS_DIR = "results"

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
# Run folder
# ----------------------------------------------------------------------------------------------


class RunFolder:
    """One experiment run on disk: config, finished cells, metrics, summary, table and plots.

    A *cell* is one unit of work identified by a key dict (e.g. ``{"model": "mlp", "lr": 0.1,
    "seed": 0}``). ``record`` stores the cell's row (the key fields followed by the row fields)
    together with its metric records in ``cells/<sha1(canonical key)>.json`` in one atomic write,
    then rebuilds ``metrics.jsonl``; ``done`` returns the stored row, so a re-run of the same
    config skips it. ``finish`` writes ``summary.json``, ``table.md`` and the figures.

    Args:
      experiment: experiment name (folder ``results/<experiment>/``).
      config: JSON-able dict of everything that determines the results; its hash is the run-id.
      out: if given, the run folder is exactly this path (``--out DIR``).
      root: the results root used when ``out`` is None.

    Raises:
      ValueError: if ``experiment`` is empty or contains a path separator, or if the folder
        already holds a run with a different config (choose another ``out`` or delete it).

    Attributes:
      experiment, config, run_id, path.
    """

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Any],
        out: str | os.PathLike[str] | None = None,
        *,
        root: str | os.PathLike[str] = RESULTS_DIR,
    ) -> None:
        if not experiment or "/" in experiment or os.sep in experiment:
            raise ValueError(f"experiment must be a non-empty name without '/', got {experiment!r}")
        self.experiment = experiment
        self.config: dict[str, Any] = json.loads(to_json(config))
        self.run_id = config_hash(self.config)
        self.path = Path(out) if out is not None else Path(root) / experiment / self.run_id
        self.cells_dir = self.path / "cells"
        self.cells_dir.mkdir(parents=True, exist_ok=True)
        header = {"experiment": experiment, "run_id": self.run_id, "config": self.config}
        config_path = self.path / "config.json"
        if config_path.exists():
            old = json.loads(config_path.read_text(encoding="utf-8"))
            if old.get("config") != self.config or old.get("experiment") != experiment:
                raise ValueError(
                    f"{self.path} already holds a run of {old.get('experiment')!r} with a "
                    f"different config ({old.get('config')}); use another --out or delete it"
                )
        else:
            atomic_write_text(config_path, to_json(header, indent=2) + "\n")
        self._metrics_synced = False  # metrics.jsonl not yet rebuilt by this process

    def __repr__(self) -> str:
        return f"RunFolder({self.experiment!r}, run_id={self.run_id!r}, path={str(self.path)!r})"

    # -- cells ----------------------------------------------------------------------------------

    def _cell_path(self, key: Mapping[str, Any]) -> Path:
        digest = hashlib.sha1(to_json(key, canonical=True).encode()).hexdigest()[:16]
        return self.cells_dir / f"{digest}.json"

    def _load(self, path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None  # vanished or foreign file: treat as not done

    def _cells(self) -> list[dict[str, Any]]:
        cells = [c for p in sorted(self.cells_dir.glob("*.json")) if (c := self._load(p))]
        cells = [c for c in cells if isinstance(c.get("key"), dict)]
        return sorted(cells, key=lambda c: _key_order(c["key"]))

    def done(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """Returns the stored row of the finished cell ``key``, or None if it has not finished.

        Args:
          key: the cell key dict (field order does not matter).

        Returns:
          The row dict written by :meth:`record` (key fields first), or None.
        """
        cell = self._load(self._cell_path(key))
        if cell is None or cell.get("key") != json.loads(to_json(key)):
            return None
        return cell["row"]

    def metrics(self, key: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """Returns the metric records stored for cell ``key`` (None if not finished)."""
        cell = self._load(self._cell_path(key))
        if cell is None or cell.get("key") != json.loads(to_json(key)):
            return None
        return cell["metrics"]

    def record(
        self,
        key: Mapping[str, Any],
        row: Mapping[str, Any],
        metrics: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Stores a finished cell: its row and metric records in one atomic file write.

        The stored row is ``{**key, **row}``. Then the cell's metric records, each tagged with
        the key fields, go to ``metrics.jsonl``: the first ``record`` of a process (and any
        re-record of a cell) rebuilds the file atomically from all cell files, later ones append
        (so a long sweep stays linear in time); ``finish`` rebuilds it sorted by key. The cell
        files are the source of truth, so an interrupted append loses nothing. NaN/inf values
        are stored as ``null``.

        Args:
          key: the cell key dict (JSON-able scalars).
          row: the cell's result fields (e.g. ``final_test_accuracy``, ``diverged``).
          metrics: per-step/epoch metric records (e.g. ``{"step", "train_loss", ...}``).
        """
        cell_key: dict[str, Any] = dict(key)
        cell_metrics = [dict(m) for m in metrics]
        cell = {"key": cell_key, "row": {**key, **row}, "metrics": cell_metrics}
        path = self._cell_path(key)
        existed = path.exists()
        atomic_write_text(path, to_json(cell) + "\n")
        if existed or not self._metrics_synced:
            self._write_metrics()
            self._metrics_synced = True
        else:
            text = "".join(to_json({**cell_key, **m}) + "\n" for m in cell_metrics)
            with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())

    def rows(self) -> list[dict[str, Any]]:
        """All finished rows, sorted by their keys (fields in key order, numbers numerically)."""
        return [c["row"] for c in self._cells()]

    def _write_metrics(self) -> Path:
        lines = [to_json({**c["key"], **m}) for c in self._cells() for m in c["metrics"]]
        return atomic_write_text(self.path / "metrics.jsonl", "".join(x + "\n" for x in lines))

    def run(
        self,
        keys: Iterable[Mapping[str, Any]],
        fn: Callable[[dict[str, Any]], tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]],
        *,
        desc: str | None = None,
    ) -> list[dict[str, Any]]:
        """Runs ``fn(key) -> (row, metrics)`` for every key not yet done, recording each.

        Args:
          keys: cell keys, in the order to run them.
          fn: computes one cell.
          desc: progress label (default: the experiment name).

        Returns:
          The rows of ``keys`` (stored or new), in the order of ``keys``.
        """
        return self.run_grouped(
            keys, lambda ks: [fn(k) for k in ks], vary=(), desc=desc or self.experiment
        )

    def run_grouped(
        self,
        keys: Iterable[Mapping[str, Any]],
        fn: Callable[
            [list[dict[str, Any]]], Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]
        ],
        *,
        vary: Sequence[str] = ("seed",),
        desc: str | None = None,
    ) -> list[dict[str, Any]]:
        """Like :meth:`run`, but pending cells that differ only in ``vary`` run in one call.

        This is how several seeds run together (e.g. under ``jax.vmap``) while each seed is still
        its own cell: ``fn`` receives the list of pending keys of a group and returns one
        ``(row, metrics)`` per key, in order. Finished cells are never passed to ``fn``.

        Args:
          keys: cell keys.
          fn: computes a group of cells.
          vary: key fields that may differ within a group.
          desc: progress label.

        Returns:
          The rows of ``keys`` in the order of ``keys``.
        """
        key_list = [dict(k) for k in keys]
        groups: dict[Hashable, list[dict[str, Any]]] = {}
        for key in key_list:
            if self.done(key) is None:
                fixed = {k: v for k, v in key.items() if k not in vary}
                groups.setdefault(to_json(fixed, canonical=True), []).append(key)
        pending = sum(len(g) for g in groups.values())
        if pending < len(key_list):
            print(
                f"[{self.experiment}] resuming {self.path}: {len(key_list) - pending}/"
                f"{len(key_list)} "
                "cells already done",
                file=sys.stderr,
            )
        for group in progress(
            list(groups.values()), total=len(groups), desc=desc or self.experiment
        ):
            results = list(fn(group))
            if len(results) != len(group):
                raise ValueError(f"cell function returned {len(results)} results for {len(group)}")
            for key, (row, metrics) in zip(group, results, strict=True):
                self.record(key, row, metrics)
        out: list[dict[str, Any]] = []
        for key in key_list:
            stored = self.done(key)
            assert stored is not None
            out.append(stored)
        return out

    # -- finish ---------------------------------------------------------------------------------

    def finish(self, table_md: str, figures: Mapping[str, Any] | None = None) -> dict[str, Path]:
        """Writes ``summary.json``, ``table.md``, ``metrics.jsonl`` and the figures.

        Args:
          table_md: the markdown table (also what the experiment prints).
          figures: name -> matplotlib Figure, saved as ``<name>.png`` (``"plot"`` -> plot.png,
            the main figure). Figures managed by pyplot are closed afterwards.

        Returns:
          Name -> path of each written file (``summary``, ``table``, ``metrics``, and each figure
          name).
        """
        paths = {
            "metrics": self._write_metrics(),
            "summary": atomic_write_text(
                self.path / "summary.json",
                to_json({"experiment": self.experiment, "rows": self.rows()}, indent=2) + "\n",
            ),
            "table": atomic_write_text(self.path / "table.md", table_md.rstrip("\n") + "\n"),
        }
        for name, fig in (figures or {}).items():
            if not name or "/" in name:
                raise ValueError(f"figure name must be a plain file stem, got {name!r}")
            path = self.path / f"{name}.png"
            _atomic_savefig(fig, path)
            paths[name] = path
            if "matplotlib.pyplot" in sys.modules:
                sys.modules["matplotlib.pyplot"].close(fig)
        return paths

    def report(
        self,
        table_md: str,
        figures: Mapping[str, Any] | None = None,
        *,
        num_runs: int,
        started: float,
    ) -> dict[str, Path]:
        """:meth:`finish`, then print the table and every written path, and the wall time.

        What an experiment's ``main`` ends with: the table and ``[<experiment>] <name>: <path>``
        lines on stdout, ``[<experiment>] <n> runs, <s>s`` on stderr.

        Args:
          table_md: the markdown table.
          figures: name -> matplotlib Figure, as for :meth:`finish`.
          num_runs: the number of runs (cells) the experiment reports.
          started: ``time.perf_counter()`` when the experiment started.

        Returns:
          What :meth:`finish` returns.
        """
        paths = self.finish(table_md, figures)
        print(table_md)
        for name, path in paths.items():
            print(f"[{self.experiment}] {name}: {path}")
        elapsed = time.perf_counter() - started
        print(f"[{self.experiment}] {num_runs} runs, {elapsed:.0f}s", file=sys.stderr)
        return paths
