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
    >>> paths = run.finish(markdown_table(["seed"], [[0]]), {})
    >>> sorted(p.name for p in paths.values())
    ['metrics.jsonl', 'summary.json', 'table.md']
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "RunFolder",
    "atomic_write_text",
    "cli_parser",
    "config_hash",
    "curves_figure",
    "format_mean_std",
    "markdown_table",
    "mean_std_table",
    "progress",
    "to_json",
]

T = TypeVar("T")

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


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Writes ``text`` to ``path`` atomically (temporary file in the same folder + ``os.replace``).

    A reader sees either the old file or the complete new one, never a partial write.

    Args:
      path: destination file; its folder must exist.
      text: content (UTF-8).

    Returns:
      ``Path(path)``.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
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


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        v = float(v)
        if math.isfinite(v):
            out.append(v)
    return out


def format_mean_std(values: Iterable[Any], *, scale: float = 100.0, digits: int = 1) -> str:
    """Formats ``mean ± std`` of the finite values (None/NaN are diverged runs, left out).

    The std is the sample standard deviation (ddof=1; 0 for one value). When some values are
    missing, ``(k/n)`` says how many of the n runs count; when all are missing, ``"diverged"``.

    Args:
      values: numbers (e.g. test accuracies as fractions), None or NaN for diverged runs.
      scale: multiplier applied first (100 turns fractions into percent).
      digits: decimals.

    Returns:
      e.g. ``"98.1 ± 0.3"``.

    Example:
      >>> format_mean_std([0.978, 0.984, 0.981])
      '98.1 ± 0.3'
      >>> format_mean_std([0.5, None, float("nan")])
      '50.0 ± 0.0 (1/3)'
      >>> format_mean_std([None])
      'diverged'
    """
    values = list(values)
    ok = [scale * v for v in _finite(values)]
    if not ok:
        return "diverged" if values else "–"
    std = float(np.std(ok, ddof=1)) if len(ok) > 1 else 0.0
    text = f"{np.mean(ok):.{digits}f} ± {std:.{digits}f}"
    return text if len(ok) == len(values) else f"{text} ({len(ok)}/{len(values)})"


def markdown_table(headers: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """Builds a GitHub markdown table.

    Args:
      headers: column names.
      rows: rows of cells (anything ``str()``-able; None is written as an empty cell).

    Returns:
      The table text (no trailing newline).

    Example:
      >>> print(markdown_table(["model", "acc"], [["mlp", "97.0 ± 0.1"]]))
      | model | acc |
      |---|---|
      | mlp | 97.0 ± 0.1 |
    """
    cell = lambda v: "" if v is None else str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "---|" * len(headers))
    for row in rows:
        row = list(row)
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells, the header has {len(headers)}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def mean_std_table(
    rows: Iterable[Mapping[str, Any]],
    *,
    index: Sequence[str],
    columns: str,
    value: str = "final_test_accuracy",
    scale: float = 100.0,
    digits: int = 1,
) -> str:
    """Pivots rows into a markdown table of ``mean ± std`` of ``value`` over the other fields.

    Args:
      rows: result rows (e.g. from :meth:`RunFolder.rows`); one per seed.
      index: fields that make the table's rows (e.g. ``("model",)``).
      columns: field whose values make the columns (e.g. ``"lr"``).
      value: the field aggregated (None/NaN = diverged, see :func:`format_mean_std`).
      scale: multiplier (100: percent).
      digits: decimals.

    Returns:
      The markdown table, rows and columns in first-seen order.

    Example:
      >>> rows = [{"model": "mlp", "lr": 0.1, "seed": s, "final_test_accuracy": a}
      ...         for s, a in enumerate([0.9, 0.92])]
      >>> print(mean_std_table(rows, index=("model",), columns="lr"))
      | model | lr=0.1 |
      |---|---|
      | mlp | 91.0 ± 1.4 |
    """
    rows = list(rows)
    cols: list[Any] = []
    table: dict[tuple[Any, ...], dict[Any, list[Any]]] = {}
    for row in rows:
        idx = tuple(row.get(k) for k in index)
        col = row.get(columns)
        if col not in cols:
            cols.append(col)
        table.setdefault(idx, {}).setdefault(col, []).append(row.get(value))
    body = [
        [*idx, *(format_mean_std(cells.get(c, []), scale=scale, digits=digits) for c in cols)]
        for idx, cells in table.items()
    ]
    return markdown_table([*index, *(f"{columns}={c}" for c in cols)], body)


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------


def _draw_curves(ax: Any, series: Mapping[str, Any], x: str, metric: str, log: bool) -> None:
    for label, runs in series.items():
        by_x: dict[float, list[float]] = {}
        for run in runs:
            for rec in run:
                v = rec.get(metric)
                if v is not None and math.isfinite(float(v)) and rec.get(x) is not None:
                    by_x.setdefault(float(rec[x]), []).append(float(v))
        if not by_x:
            continue
        xs = sorted(by_x)
        mean = [float(np.mean(by_x[k])) for k in xs]
        (line,) = ax.plot(xs, mean, label=label)
        if any(len(by_x[k]) > 1 for k in xs):
            lo = [min(by_x[k]) for k in xs]
            hi = [max(by_x[k]) for k in xs]
            ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color(), linewidth=0)
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    if log and ax.has_data():
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def curves_figure(
    series: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]
    | Mapping[str, Mapping[str, Sequence[Sequence[Mapping[str, Any]]]]],
    *,
    x: str = "step",
    ys: Sequence[str] = ("train_loss", "test_accuracy"),
    title: str | None = None,
    logy: Sequence[str] = ("train_loss",),
) -> Any:
    """Learning curves: one panel per metric, one line (mean over seeds, min–max band) per label.

    Uses ``matplotlib.figure.Figure`` directly (no pyplot, no GUI backend needed).

    Args:
      series: label -> list (one per seed) of metric records (dicts with ``x`` and ``ys``); or,
        for a grid with one row of panels per group, group -> (label -> list of records).
        None/NaN values (diverged runs) are left out of the mean.
      x: the x-axis field.
      ys: the metrics, one panel (column) each.
      title: figure title.
      logy: metrics drawn on a log y-axis.

    Returns:
      A ``matplotlib.figure.Figure`` (pass it to :meth:`RunFolder.finish`).

    Example:
      >>> runs_ = [[{"step": 1, "train_loss": 2.0, "test_accuracy": 0.5},
      ...           {"step": 2, "train_loss": 1.0, "test_accuracy": 0.7}]]
      >>> fig = curves_figure({"mlp": {"lr=0.1": runs_}, "cnn": {"lr=0.1": runs_}})
      >>> len(fig.axes)
      4
    """
    from matplotlib.figure import Figure

    first = next(iter(series.values()), None)
    grouped = isinstance(first, Mapping)
    groups: Mapping[str, Any] = series if grouped else {"": series}
    fig = Figure(figsize=(4.8 * len(ys), 3.4 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(ys), squeeze=False)
    for r, (group, group_series) in enumerate(groups.items()):
        for c, metric in enumerate(ys):
            ax = axes[r][c]
            _draw_curves(ax, group_series, x, metric, metric in logy)
            if group:
                ax.set_title(f"{group}: {metric}", fontsize="medium")
        if axes[r][-1].get_legend_handles_labels()[0]:  # none when every run diverged at once
            axes[r][-1].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return fig


# ----------------------------------------------------------------------------------------------
# Progress and command line
# ----------------------------------------------------------------------------------------------


def _fmt_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}min"


def progress(
    iterable: Iterable[T],
    total: int | None = None,
    desc: str = "",
    *,
    file: Any = None,
) -> Iterator[T]:
    """Iterates with progress: a tqdm bar on a terminal, else one log line per item with ETA.

    The log line (``[desc] 3/24 done, 12s elapsed, ETA 84s``) suits CI logs and files, where a
    redrawn bar would be noise. Output goes to stderr.

    Args:
      iterable: the items.
      total: number of items (default: ``len(iterable)`` when available).
      desc: label.
      file: stream (default ``sys.stderr``).

    Returns:
      An iterator over the items.
    """
    stream = file if file is not None else sys.stderr
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if getattr(stream, "isatty", lambda: False)():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, total=total, desc=desc, file=stream)
        return
    start = time.perf_counter()
    for i, item in enumerate(iterable, 1):
        yield item
        elapsed = time.perf_counter() - start
        eta = f", ETA {_fmt_s(elapsed / i * (total - i))}" if total else ""
        of = f"/{total}" if total else ""
        print(f"[{desc}] {i}{of} done, {_fmt_s(elapsed)} elapsed{eta}", file=stream, flush=True)


class _ListAction(argparse.Action):
    """Collects values given space- and/or comma-separated: ``--model mlp cnn`` or ``mlp,cnn``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = [v for value in values for v in str(value).split(",") if v]
        setattr(namespace, self.dest, items)


def cli_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The common experiment command line; experiments add their own flags to it.

    Flags (None means "the experiment's default"):

    - ``--quick``: a smaller configuration that finishes in well under a minute.
    - ``--out DIR``: write the run folder exactly here (default ``results/<experiment>/<id>/``).
    - ``--seeds N``: number of seeds (seeds ``0 .. N-1``).
    - ``--dataset NAME``: one of ``jaxstale.data.DATASETS`` (default ``digits``).
    - ``--model NAME [NAME ...]``: one or more model names (``--model mlp cnn`` or ``mlp,cnn``);
      a list of str, or None.
    - ``--steps N``: training steps per run.

    Args:
      description: the experiment's one-line description (shown by ``--help``).

    Returns:
      An ``argparse.ArgumentParser``.

    Example:
      >>> args = cli_parser("demo").parse_args(["--quick", "--model", "mlp,cnn", "--seeds", "2"])
      >>> args.quick, args.model, args.seeds, args.dataset, args.steps, args.out
      (True, ['mlp', 'cnn'], 2, 'digits', None, None)
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small configuration (< 1 minute)")
    p.add_argument("--out", default=None, help="run folder (default results/<experiment>/<id>/)")
    p.add_argument("--seeds", type=_positive_int, default=None, help="number of seeds")
    p.add_argument("--dataset", default="digits", help="dataset name (default: digits)")
    p.add_argument(
        "--model", nargs="+", action=_ListAction, default=None, help="model name(s), e.g. mlp cnn"
    )
    p.add_argument("--steps", type=_positive_int, default=None, help="training steps per run")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
