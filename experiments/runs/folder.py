"""Run folders: config, per-cell results, metrics, summary, table and plots, written atomically.

Every experiment writes one run folder ``results/<experiment>/<run-id>/`` (or exactly ``--out
DIR``)::

    config.json      {"experiment", "run_id", "config", "code", ...}     (see below)
    cells/<h>.json   one file per finished cell: {"key", "code", "host", "row", "metrics"}
    metrics.jsonl    one line per metric record, tagged with its cell's key fields
    summary.json     {"experiment": name, "rows": [...]}                 (written by ``finish``)
    table.md         the experiment's markdown table
    plot.png         the main figure (plus ``<name>.png`` for other named figures)

The run-id is the first 10 hex characters of the SHA-1 of the config's canonical JSON, so the
same config maps to the same folder and a re-run resumes, keeping each cell whose file exists
(``run_grouped``). A cell file holds its row *and* its metrics, written with one ``os.replace``;
metrics.jsonl is derived from the cell files (rebuilt atomically on a run's first record and on
``finish``), so an interrupted run never loses or half-writes anything it had finished. NaN and
infinities are written as JSON ``null``.

**Code fingerprints.** ``config.json`` records the fingerprint of the code computing the run
(:func:`~experiments.runs.code_fingerprint`; ``"code"``, earlier ones in ``"code_history"``) and
each cell file the hash it was computed under: a folder holding cells of other code raises
:class:`StaleResultsError` before anything is computed, unless ``force_resume=True``
(``--force-resume``) accepts them (recorded under ``"force_resumed"``). **Nothing is written
before the inputs are checked**: the constructor validates the name, config, target path and
stored cells' code (:class:`RunFolderError`, naming ``--out``); the folder is created by the
first write. Files get the mode ``0o666 & ~umask`` (as by ``open``).

**Several processes** (:mod:`jaxstale.distributed`): every process builds the same folder and
computes the same cells; only process 0 writes, the others keep their cells in memory (resuming
needs every process to see the folder: one machine or a shared filesystem).

Example:
    >>> import tempfile
    >>> tmp = tempfile.mkdtemp()
    >>> run = RunFolder("demo", {"lr": 0.1}, out=tmp)
    >>> run.run_id
    'edf980217e'
    >>> "source_sha" in run.code  # the fingerprint of the code computing it (config.json)
    True
    >>> run.done({"seed": 0}) is None
    True
    >>> run.record({"seed": 0}, {"final_test_accuracy": float("nan")}, [{"step": 1, "loss": 2.0}])
    >>> run.done({"seed": 0})
    {'seed': 0, 'final_test_accuracy': None}
    >>> from experiments.runs import markdown_table
    >>> paths = run.finish(markdown_table(["seed"], [[0]]), {})
    >>> sorted(p.name for p in paths.values())
    ['metrics.jsonl', 'summary.json', 'table.md']
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from .cli import progress
from .files import (
    RunFolderError,
    StaleResultsError,
    _atomic_savefig,
    _check_target,
    _diverged,
    _fmt_wall,
    _interrupted,
    _join_group,
    _key_order,
    _listen_for_sigint,
    _now,
    _read_json,
    accepted_codes,
    atomic_write_text,
    config_hash,
    to_json,
)
from .fingerprint import code_changes, code_fingerprint, code_hash
from .groups import cell_groups, check_cell, drop_checkpoints, group_checkpoints
from .hosts import other_host_note
from .plots import finish_figure

__all__ = [
    "RESULTS_DIR",
    "RunFolder",
    "RunFolderError",
    "StaleResultsError",
    "atomic_write_text",
    "config_hash",
    "to_json",
]

RESULTS_DIR = "results"

CellFn = Callable[[dict[str, Any]], tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]
GroupFn = Callable[
    [list[dict[str, Any]]], Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]
]


class RunFolder:
    """One experiment run on disk: config, finished cells, metrics, summary, table and plots.

    A *cell* is one unit of work identified by a key dict (e.g. ``{"model": "mlp", "lr": 0.1,
    "seed": 0}``). ``record`` stores the cell's row (the key fields followed by the row fields)
    together with its metric records in ``cells/<sha1(canonical key)>.json`` in one atomic write,
    then rebuilds ``metrics.jsonl``; ``done`` returns the stored row, so a re-run of the same
    config skips it. ``finish`` (or ``report``) writes ``summary.json``, ``table.md`` and the
    figures.

    The constructor only checks and reads; the folder is created by :meth:`create` on the
    first :meth:`record` (or at the end of :meth:`run_grouped`, or by :meth:`finish`), so a
    command that fails on bad input leaves nothing behind. Call :meth:`create` yourself before
    writing other files into :attr:`path`.

    An experiment's ``main``: ``run = RunFolder.from_args(EXPERIMENT, cfg, args, modules=...,
    sources=...)``, ``rows = run.run_grouped(keys, compute_group)``, ``run.report(...)``.

    Args:
      experiment: experiment name (folder ``results/<experiment>/``).
      config: JSON-able dict of everything that determines the results; its hash is the run-id.
      out: if given, the run folder is exactly this path (``--out DIR``): a new path, an empty
        folder, or the folder of an earlier run of the same config (resume).
      root: the results root used when ``out`` is None.
      code: the fingerprint (:func:`code_fingerprint`) of the code computing the cells (not part
        of the run id); default ``code_fingerprint()``: jaxstale's sources and library versions,
        not the experiment's modules or user code — pass your own to cover those.
      force_resume: reuse cells computed under other code instead of raising
        :class:`StaleResultsError` (recorded; later runs of the same code accept them too).
      checkpoint_every: :meth:`run_grouped` saves each group's runs every this many updates
        under ``checkpoints/`` (:func:`~experiments.runs.groups.group_checkpoints`).

    Raises:
      ValueError: an empty ``experiment`` or one with a path separator.
      TypeError: a config that is not JSON-able.
      RunFolderError: the target is a file, not writable, a non-empty folder without a run, or
        a run of another config; :class:`StaleResultsError`: cells of other code.

    Attributes:
      experiment, config, run_id, path, code (the fingerprint), code_hash (its hash),
      reused_cells (number of stored cells computed under other code and accepted),
      disagreements (finished cells :meth:`run_grouped` recomputed and found different).
    """

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Any],
        out: str | os.PathLike[str] | None = None,
        *,
        root: str | os.PathLike[str] = RESULTS_DIR,
        code: Mapping[str, Any] | None = None,
        force_resume: bool = False,
        checkpoint_every: int | None = None,
    ) -> None:
        self._started = time.perf_counter()
        self.checkpoint_every = checkpoint_every
        if not experiment or "/" in experiment or os.sep in experiment:
            raise ValueError(f"experiment must be a non-empty name without '/', got {experiment!r}")
        self.experiment = experiment
        self.config: dict[str, Any] = json.loads(to_json(config))
        self.run_id = config_hash(self.config)
        self.path = Path(out) if out is not None else Path(root) / experiment / self.run_id
        self.cells_dir = self.path / "cells"
        where = "--out" if out is not None else "results folder (choose another with --out)"
        # None: this process writes and reads the folder; else (not process 0 of a group) the
        # cells it found at construction and those it recorded, by file name
        self._store: dict[str, Any] | None = _join_group(self.path)
        _check_target(self.path, where)
        self.code: dict[str, Any] = (
            json.loads(to_json(code)) if code is not None else code_fingerprint()
        )
        self.code_hash = code_hash(self.code)
        self.reused_cells = 0
        self.disagreements: list[str] = []

        config_path = self.path / "config.json"
        old: dict[str, Any] = {}
        if config_path.exists():
            try:
                old = json.loads(config_path.read_text(encoding="utf-8"))
                if not isinstance(old, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                raise RunFolderError(
                    f"{where} {self.path} holds an unreadable config.json ({e}); "
                    "use another --out or delete it"
                ) from None
            if old.get("config") != self.config or old.get("experiment") != experiment:
                raise RunFolderError(
                    f"{where} {self.path} already holds a run of {old.get('experiment')!r} with "
                    f"a different config ({old.get('config')}); use another --out or delete it"
                )
        header = self._header(old)
        cells = self._cells()  # read once: their codes and their machines are checked
        self._check_code(old, header, force_resume, cells)
        if note := other_host_note(experiment, cells, self.code.get("host")):
            print(note, file=sys.stderr)
        self._header_text = to_json(header, indent=2) + "\n"
        self._created = False  # create() not yet called by this object
        self._metrics_synced = False  # metrics.jsonl not yet rebuilt by this process

    @classmethod
    def from_args(
        cls,
        experiment: str,
        config: Mapping[str, Any],
        args: Any,
        *,
        modules: Iterable[Any] = (),
        sources: Iterable[Any] = (),
        data: Iterable[str] = (),
        root: str | os.PathLike[str] = RESULTS_DIR,
    ) -> RunFolder:
        """The run folder of a command-line run: ``code_fingerprint(modules=, sources=, data=)``
        (the experiment's modules; user code such as registered builders; the datasets' content
        digests) with ``args.out`` and
        ``args.force_resume``. A bad ``--out`` or stale results end the program with one line,
        ``<experiment>: error: <message>``, exit status 2 (like argparse), no traceback."""
        fingerprint = code_fingerprint(modules=modules, sources=sources, data=data)
        try:
            return cls(
                experiment,
                config,
                getattr(args, "out", None),
                root=root,
                code=fingerprint,
                force_resume=bool(getattr(args, "force_resume", False)),
            )
        except RunFolderError as e:
            print(f"{experiment}: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    def _header(self, old: Mapping[str, Any]) -> dict[str, Any]:
        """The new config.json content: the current code, earlier fingerprints kept."""
        history: list[dict[str, Any]] = list(old.get("code_history") or [])
        old_code = old.get("code")
        if isinstance(old_code, dict) and old_code.get("hash") != self.code_hash:
            if all(h.get("hash") != old_code.get("hash") for h in history):
                history.append(old_code)
        header: dict[str, Any] = {
            "experiment": self.experiment,
            "run_id": self.run_id,
            "config": self.config,
            "code": {**self.code, "hash": self.code_hash},
        }
        if history:
            header["code_history"] = history
        if old.get("force_resumed"):
            header["force_resumed"] = list(old["force_resumed"])
        return header

    def _check_code(
        self, old: Mapping[str, Any], header: dict[str, Any], force: bool, cells: list[dict]
    ) -> None:
        """Refuses (or, forced, accepts and records) ``cells`` computed under other code."""
        accepted = accepted_codes(header)
        hashes = [c.get("code") for c in cells]
        other = [h for h in hashes if h != self.code_hash]
        self.reused_cells = len(other)
        stale = sorted({h for h in other if h not in accepted}, key=str)
        if not stale:
            return
        earlier = [old.get("code"), *(old.get("code_history") or [])]
        known = {c["hash"]: c for c in earlier if isinstance(c, dict) and c.get("hash")}
        changes: list[str] = []
        for h in stale:
            for change in code_changes(known.get(h), self.code) or [f"code hash {h}"]:
                if change not in changes:
                    changes.append(change)
        n = sum(h in stale for h in hashes)
        if not force:
            raise StaleResultsError(
                f"{self.path} holds {n} of {len(hashes)} finished cells computed under different "
                f"code (changed: {'; '.join(changes)}); not mixing them with new results: re-run "
                f"with --force-resume to reuse them anyway, or use another --out, or delete "
                f"{self.path}"
            )
        event = {
            "time": _now(),
            "reused_cells": n,
            "from": stale,
            "to": self.code_hash,
            "changed": changes,
        }
        header["force_resumed"] = [*header.get("force_resumed", []), event]
        print(
            f"[{self.experiment}] --force-resume: reusing {n} cells computed under different "
            f"code ({'; '.join(changes)})",
            file=sys.stderr,
        )

    def __repr__(self) -> str:
        return f"RunFolder({self.experiment!r}, run_id={self.run_id!r}, path={str(self.path)!r})"

    def create(self) -> Path:
        """Creates the folder (with ``cells/``) and writes ``config.json``; idempotent; returns
        :attr:`path`. Called by :meth:`record`, at the end of :meth:`run_grouped` and by
        :meth:`finish`; call it before writing your own files into :attr:`path`.

        Raises:
          RunFolderError: if the folder cannot be created.
        """
        if self._created or self._store is not None:
            self._created = True
            return self.path
        config_path = self.path / "config.json"
        try:
            self.cells_dir.mkdir(parents=True, exist_ok=True)
            current = config_path.read_text(encoding="utf-8") if config_path.exists() else None
            if current != self._header_text:
                atomic_write_text(config_path, self._header_text)
        except OSError as e:
            raise RunFolderError(
                f"cannot create the run folder {self.path} ({e.strerror or e}); "
                "choose another --out"
            ) from None
        self._created = True
        return self.path

    # -- cells ----------------------------------------------------------------------------------

    def _cell_path(self, key: Mapping[str, Any]) -> Path:
        digest = hashlib.sha1(to_json(key, canonical=True).encode()).hexdigest()[:16]
        return self.cells_dir / f"{digest}.json"

    def _load(self, path: Path) -> dict[str, Any] | None:
        if self._store is not None:
            return self._store.get(path.name)
        return _read_json(path)  # None if vanished or foreign: treat as not done

    def _cells(self) -> list[dict[str, Any]]:
        store = self._store
        names = [p.name for p in self.cells_dir.glob("*.json")] if store is None else list(store)
        cells = [c for n in sorted(names) if (c := self._load(self.cells_dir / n))]
        cells = [c for c in cells if isinstance(c, dict) and isinstance(c.get("key"), dict)]
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

        The stored row is ``{**key, **row}``; the cell file also records :attr:`code_hash`, the
        hash of the code fingerprint it was computed under. Then the cell's metric records,
        each tagged with the key fields, go to ``metrics.jsonl``: the first ``record`` of a
        process (and any re-record of a cell) rebuilds the file atomically from all cell files,
        later ones append (so a long sweep stays linear in time); ``finish`` rebuilds it sorted
        by key. The cell files are the source of truth, so an interrupted append loses nothing.
        NaN/inf values are stored as ``null``. Creates the folder first if needed.

        Args:
          key: the cell key dict (JSON-able scalars).
          row: the cell's result fields (e.g. ``final_test_accuracy``, ``diverged``).
          metrics: per-step/epoch metric records (e.g. ``{"step", "train_loss", ...}``).
        """
        self.create()
        cell_key: dict[str, Any] = dict(key)
        cell_metrics = [dict(m) for m in metrics]
        host = (self.code.get("host") or {}).get("id")  # the machine (experiments.runs.hosts)
        cell = {"key": cell_key, "code": self.code_hash, "host": host, "row": {**key, **row}}
        cell["metrics"] = cell_metrics
        path = self._cell_path(key)
        if self._store is not None:  # not process 0: keep it as it would read it back
            self._store[path.name] = json.loads(to_json(cell))
            return
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
        if self._store is not None:
            return self.path / "metrics.jsonl"
        lines = [to_json({**c["key"], **m}) for c in self._cells() for m in c["metrics"]]
        return atomic_write_text(self.path / "metrics.jsonl", "".join(x + "\n" for x in lines))

    def run(
        self, keys: Iterable[Mapping[str, Any]], fn: CellFn, *, desc: str | None = None
    ) -> list[dict[str, Any]]:
        """Runs ``fn(key) -> (row, metrics)`` for every key not yet done, recording each
        (Ctrl-C and checkpoints as in :meth:`run_grouped`).

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
        fn: GroupFn,
        *,
        vary: Sequence[str] = ("seed",),
        desc: str | None = None,
    ) -> list[dict[str, Any]]:
        """Like :meth:`run`, but cells that differ only in ``vary`` run in one call: a *group*.

        This is how several seeds run together (e.g. under ``jax.vmap``) while each seed is still
        its own cell: ``fn`` receives the keys of a group, returns one ``(row, metrics)`` per key.
        Groups depend on ``keys`` alone (:func:`~experiments.runs.groups.cell_groups`); a group
        with a missing cell is computed in full, in the company a fresh run gives its cells (XLA
        may round a lane by its group: :mod:`jaxstale.loop`), so a resumed sweep writes the same
        table byte for byte. Only missing cells are recorded; a recomputed finished cell unlike its
        file (but for ``TIMING_FIELDS``) is an entry of :attr:`disagreements`; the file is kept.
        With ``checkpoint_every``, a re-run resumes a group mid-run (:func:`group_checkpoints`).
        Ctrl-C keeps every cell recorded so far, prints ``interrupted: N cells saved in <path>;
        re-run the same command to resume`` (N: every finished cell of the folder) on stderr and
        raises ``SystemExit(130)``; one a callback swallowed, after its group.

        Args:
          keys: cell keys.
          fn: computes a group of cells.
          vary: key fields that may differ within a group.
          desc: progress label.

        Returns:
          The rows of ``keys`` in the order of ``keys``.
        """
        key_list = [dict(k) for k in keys]
        done = [self.done(k) is not None for k in key_list]
        todo = [g for g in cell_groups(key_list, vary) if not all(done[i] for i in g)]
        saved, redo = sum(done), sum(done[i] for g in todo for i in g)
        if saved:
            print(
                f"[{self.experiment}] resuming {self.path}: {saved}/{len(key_list)} cells already "
                "done" + (f"; {redo} recomputed with their groups and checked" if redo else ""),
                file=sys.stderr,
            )
        heard, stop_listening = _listen_for_sigint()
        try:
            for group in progress(todo, total=len(todo), desc=desc or self.experiment):
                keys_of = [key_list[i] for i in group]
                every = self.checkpoint_every if self._store is None else None
                if every:
                    self.create()  # config.json before the checkpoints: the folder is a run's
                with group_checkpoints(self.path, self.code_hash, keys_of, every) as where:
                    results = list(fn(keys_of))
                if len(results) != len(group):
                    raise ValueError(
                        f"cell function returned {len(results)} results for {len(group)}"
                    )
                for i, (row, metrics) in zip(group, results, strict=True):
                    if done[i]:  # recomputed with its group: checked against its file, kept
                        stored = self._load(self._cell_path(key_list[i])) or {}
                        if msg := check_cell(self.experiment, stored, key_list[i], row, metrics):
                            self.disagreements.append(msg)
                    else:
                        self.record(key_list[i], row, metrics)
                        saved += 1
                drop_checkpoints(where)  # the group's cells are recorded
                if heard:  # a Ctrl-C that a garbage-collector callback swallowed
                    raise KeyboardInterrupt
        except KeyboardInterrupt:  # the folder's count: a sweep makes several calls
            _interrupted(len(self._cells()), self.path)
        finally:
            stop_listening()
        self.create()
        out = [self.done(key) for key in key_list]
        assert all(row is not None for row in out)
        return cast(list[dict[str, Any]], out)

    # -- finish ---------------------------------------------------------------------------------

    def finish(self, table_md: str, figures: Mapping[str, Any] | None = None) -> dict[str, Path]:
        """Writes ``summary.json``, ``table.md``, ``metrics.jsonl`` and the figures.

        Args:
          table_md: the markdown table (also what the experiment prints).
          figures: name -> matplotlib Figure, saved as ``<name>.png`` (``"plot"`` -> plot.png,
            the main figure) after :func:`~experiments.runs.plots.finish_figure` (legends beside
            the axes; the smoke-run mark when the config has ``"quick": true``). Figures
            managed by pyplot are closed afterwards.

        Returns:
          Name -> path of each written file (``summary``, ``table``, ``metrics``, and each figure
          name).
        """
        for name in figures or {}:
            if not name or "/" in name or name.startswith("."):
                raise ValueError(f"figure name must be a plain file stem, got {name!r}")
        self.create()
        paths = {
            "metrics": self._write_metrics(),
            "summary": atomic_write_text(
                self.path / "summary.json",
                to_json({"experiment": self.experiment, "rows": self.rows()}, indent=2) + "\n",
            ),
            "table": atomic_write_text(self.path / "table.md", table_md.rstrip("\n") + "\n"),
        }
        for name, fig in (figures or {}).items():
            path = self.path / f"{name}.png"
            if self._store is None:
                finish_figure(fig, smoke=bool(self.config.get("quick")))
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
        rows: Sequence[Mapping[str, Any]] | None = None,
        num_runs: int | None = None,
        started: float | None = None,
    ) -> dict[str, Path]:
        """:meth:`finish`, then the same end-of-run summary for every experiment.

        Prints, on stdout, the table and one ``[<experiment>] <name>: <path>`` line per written
        file; on stderr, ``[<experiment>] <n> runs, <d> diverged, <t> wall time, in <path>``
        (plus a note when cells computed under other code were reused by ``--force-resume``).
        A row counts as diverged when its ``"diverged"`` field is true (rows without that field:
        when ``"final_test_accuracy"`` is present and null).

        Args:
          table_md: the markdown table.
          figures: name -> matplotlib Figure, as for :meth:`finish`.
          rows: the rows the experiment reports (default: every finished row in the folder).
          num_runs: the number of runs reported (default: ``len(rows)``).
          started: ``time.perf_counter()`` when the experiment started (default: when this
            object was created).

        Returns:
          What :meth:`finish` returns (on a process other than 0 of a group: the same paths,
          nothing written or printed).
        """
        paths = self.finish(table_md, figures)
        if self._store is not None:
            return paths
        row_list = list(rows) if rows is not None else self.rows()
        n = len(row_list) if num_runs is None else num_runs
        diverged = sum(_diverged(r) for r in row_list)
        elapsed = time.perf_counter() - (self._started if started is None else started)
        print(table_md)
        for name, path in paths.items():
            print(f"[{self.experiment}] {name}: {path}")
        print(
            f"[{self.experiment}] {n} runs, {diverged} diverged, {_fmt_wall(elapsed)} wall time, "
            f"in {self.path}",
            file=sys.stderr,
        )
        if self.reused_cells:
            print(
                f"[{self.experiment}] note: {self.reused_cells} cells were computed under "
                "different code and reused (--force-resume; see config.json)",
                file=sys.stderr,
            )
        return paths
