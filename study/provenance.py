"""The report's committed rows and its provenance.

``results/`` is not committed, so a report computed from it could not be audited from the
repository. The report step therefore copies each configuration's small files (``summary.json``
— re-written one row per line, each row with its final weights' test predictions
(``test_correct``, :func:`jaxstale.loop.encode_correct`, or a language model's
``test_losses``, :func:`jaxstale.loop.encode_losses`, from the cell's last metric record) so
that intervals can resample the test set —, ``config.json``, ``table.md`` and the synchronous
reference's convergence read from the cells' curves (``budget.json``, :mod:`.budget`); never
``metrics.jsonl`` or the cells) into a committed folder beside the report
(``study/claims/rows/<name>/``, :func:`snapshot`) with an ``index.json`` naming the commit that
was checked out when they were copied, and then builds the report **from that folder**: so
``python -m study --from-rows`` rebuilds it byte for byte without recomputing.

:func:`section` is the report's "Provenance" section: the commit of the report (checked out
when the rows were copied) and, per configuration, the fingerprint of its runs as its run
folder recorded it (``config.json``'s ``code``: the code hash that decides results, the git
commit the cells were computed at, the jax / jaxlib / flax / optax versions, the datasets'
content digest) and the machines that computed its rows (each cell's ``host``, copied into its
row), with any cells reused from other code (``--force-resume``) named.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import runs
from experiments.runs import fingerprint

from . import budget, cells, speed

__all__ = [
    "INDEX",
    "PREDICTIONS",
    "ROW_FILES",
    "Snapshot",
    "git_state",
    "kept_kind_problem",
    "read_index",
    "section",
    "snapshot",
    "with_predictions",
]

#: a final record's per-example test results a row carries: a classifier's correctness, a
#: language model's loss per test window (:func:`jaxstale.loop.run`)
PREDICTIONS = ("test_correct", "test_losses")

#: the file naming the snapshot (commit, smoke flag, source folder, configurations)
INDEX = "index.json"

#: the files copied verbatim beside ``summary.json`` (small; ``metrics.jsonl`` stays out)
ROW_FILES = ("config.json", "table.md")

_VERSIONS = ("jax", "jaxlib", "flax", "optax", "numpy", "python")


@dataclass(frozen=True)
class Snapshot:
    """Where a report's rows come from: ``rows`` (the committed folder), ``source`` (the run
    folders they were copied from, as given on the command line), ``commit`` (HEAD when they
    were copied; None outside a git checkout), ``dirty`` (the work tree had uncommitted changes
    to tracked files then), ``quick`` (smoke runs), ``sources`` (``(configuration, run folders
    it was copied from)`` pairs: ``source`` for every one, except the configurations a
    ``keep=True`` snapshot kept from an earlier one; empty in an index written before they were
    recorded)."""

    rows: Path
    source: str
    commit: str | None
    dirty: bool
    quick: bool
    sources: tuple[tuple[str, str], ...] = ()

    def index(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "commit": self.commit,
            "dirty": self.dirty,
            "quick": self.quick,
            "sources": dict(self.sources),
        }

    def source_text(self) -> str:
        """The run folders the rows were copied from, in words: ```<source>``` when one place
        gave every configuration's, else each place with its configurations (the place that
        gave most named last, for the other configurations; where no place gave most, each with its
        configurations, in the report's order)."""
        groups: dict[str, list[str]] = {}
        for name, src in self.sources:
            groups.setdefault(src, []).append(name)
        if len(groups) <= 1:
            return f"`{next(iter(groups), self.source)}`"

        def named(src: str) -> str:
            return f"`{src}` for {', '.join(f'`{n}`' for n in groups[src])}"

        sizes = sorted((len(names) for names in groups.values()), reverse=True)
        if sizes[0] == sizes[1]:  # no place gave most: each with its configurations, in order
            parts = [named(src) for src in groups]
            return ", ".join(parts[:-1]) + f" and {parts[-1]}"
        most = max(groups, key=lambda src: len(groups[src]))
        parts = [named(src) for src in groups if src != most]
        return ", ".join(parts) + f" and `{most}` for the other configurations"


def git_state(where: Path | None = None) -> tuple[str | None, bool]:
    """``(HEAD, dirty)`` of the git checkout holding ``where`` (default: this package);
    ``(None, False)`` outside one or without git (never raises)."""
    folder = where or Path(__file__).resolve().parent
    head = fingerprint.git_head(folder)
    if head is None:
        return None, False
    status = fingerprint.git(folder, "status", "--porcelain", "--untracked-files=no")
    return head, bool(status and status.strip())


def _summary_text(summary: Mapping[str, Any]) -> str:
    """``summary.json`` with one row per line (the same JSON values; diffs read row by row)."""

    def dump(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

    head = [f"  {dump(k)}: {dump(v)}," for k, v in summary.items() if k != "rows"]
    rows = [f"    {dump(r)}" for r in summary.get("rows", [])]
    body = ",\n".join(rows)
    return "\n".join(["{", *head, '  "rows": [', *([body] if rows else []), "  ]", "}"]) + "\n"


def with_predictions(folder: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """``summary`` with each row's ``test_correct`` taken from its cell file's last metric
    record, and the speed readings of its test curve (:func:`.speed.curve_facts`);
    rows whose cell has neither are left as they are."""
    found = []
    for path in sorted((folder / "cells").glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return with_cells(found, summary)


def with_cells(found: Sequence[Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`with_predictions` from cells already read (a run folder's, or an archived sweep's:
    :func:`.cells.sweep`)."""
    extras: dict[str, dict[str, Any]] = {}
    fields: tuple[str, ...] = ()
    for cell in found:
        try:
            key, metrics = cell["key"], cell.get("metrics") or [{}]
        except (KeyError, TypeError):
            continue
        fields = tuple(sorted(key))
        last = metrics[-1]
        extra = dict(speed.curve_facts(metrics, (cell.get("row") or {}).get("steps")))
        for field in PREDICTIONS:
            if isinstance(last, dict) and last.get(field):
                extra[field] = last[field]
        if isinstance(cell.get("host"), str):  # the machine (experiments.runs.hosts)
            extra["host"] = cell["host"]
        if extra:
            extras[json.dumps([key[k] for k in fields])] = extra
    rows = []
    for r in summary.get("rows", []):
        got = extras.get(json.dumps([r.get(k) for k in fields])) if fields else None
        rows.append({**r, **got} if got else dict(r))
    return {**summary, "rows": rows}


def with_archived_curves(rows: Path, cells_dir: Path | None, names: Sequence[str]) -> list[str]:
    """Adds the speed readings (:func:`.speed.curve_facts`) to the committed rows of each
    configuration of ``names`` whose rows lack them, from the cells of the same sweep packed
    under ``cells_dir`` (:func:`.cells.sweep`: the configuration and code its ``config.json``
    records), rows copied before those readings existed and whose run folders are gone;
    returns the names it rewrote. A row keeps every field it had (its ``test_correct``
    included): only the readings are added."""
    done = []
    for name in names:
        path = rows / name / "summary.json"
        if cells_dir is None or not path.exists() or not (rows / name / "config.json").exists():
            continue
        summary = json.loads(path.read_text())
        if all(speed.FIELDS[0] in r for r in summary.get("rows", []) if not r.get("diverged")):
            continue  # a diverged run has no finite curve to read
        header = json.loads((rows / name / "config.json").read_text())
        found = [{**c, "metrics": _no_predictions(c)} for c in cells.sweep(cells_dir, name, header)]
        if not found:
            continue
        out = with_cells(found, summary)
        if out != summary:
            runs.atomic_write_text(path, _summary_text(out))
            done.append(name)
    return done


def _no_predictions(cell: Mapping[str, Any]) -> list[Any]:
    """A cell's metric records without the test predictions (kept rows have theirs)."""
    return [{k: v for k, v in m.items() if k not in PREDICTIONS} if isinstance(m, dict) else m
            for m in cell.get("metrics") or []]  # fmt: skip


def kept_kind_problem(rows: Path, quick: bool, earlier: Snapshot | None = None) -> str | None:
    """Why the committed rows in ``rows`` cannot be kept beside runs of this kind (``quick``:
    smoke runs), or None when they can: smoke rows and full rows are never mixed in one report.
    ``earlier`` is the folder's index when the caller has read it already."""
    earlier = earlier if earlier is not None else read_index(rows)
    if earlier is None or earlier.quick == quick:
        return None
    kind = "smoke (--quick)" if earlier.quick else "full"
    return f"{rows} holds rows of {kind} runs: not mixed with these"


def snapshot(
    results: Path,
    rows: Path,
    names: Sequence[str],
    *,
    quick: bool,
    source: str | None = None,
    keep: bool = False,
) -> Snapshot:
    """Copies the small files of each configuration of ``names`` finished under ``results``
    into ``rows/<name>/`` and writes ``rows/index.json``. The folder becomes an exact copy: a
    configuration no longer under ``results`` has its copy removed (the report reads it as not
    run, as it would read the results folder). With ``keep``, a configuration not finished under
    ``results`` keeps the copy an earlier snapshot made (and the index says where that one came
    from): a configuration finished in another session, whose run folders are gone, is added
    to the committed rows without the others being recomputed. The commit and whether the work
    tree had uncommitted changes are read first, before this writes anything into it.

    Raises:
      ValueError: ``keep`` over committed rows of the other kind (smoke runs and full runs are
        not mixed in one report).
    """
    commit, dirty = git_state()
    have = [n for n in names if (results / n / "summary.json").exists()]
    src_of = source or str(results)
    earlier = read_index(rows)
    kept: dict[str, str] = {}
    if keep and earlier is not None:
        if problem := kept_kind_problem(rows, quick, earlier):
            raise ValueError(problem)
        before = dict(earlier.sources)
        for name in names:
            if name not in have and (rows / name / "summary.json").exists():
                kept[name] = before.get(name, earlier.source)
    rows.mkdir(parents=True, exist_ok=True)
    for old in sorted(rows.iterdir()):
        if old.is_dir() and old.name not in have and (old / "summary.json").exists():
            if old.name not in kept:
                shutil.rmtree(old)
    for name in have:
        src, dst = results / name, rows / name
        dst.mkdir(exist_ok=True)
        summary = with_predictions(src, json.loads((src / "summary.json").read_text()))
        runs.atomic_write_text(dst / "summary.json", _summary_text(summary))
        for f in ROW_FILES:
            if (src / f).exists():
                runs.atomic_write_text(dst / f, (src / f).read_text())
            elif (dst / f).exists():
                (dst / f).unlink()
        if found := budget.facts(src):  # from the cells' curves, which are not committed
            runs.atomic_write_text(dst / budget.FILE, json.dumps(found, indent=1) + "\n")
        elif (dst / budget.FILE).exists():
            (dst / budget.FILE).unlink()
    sources = tuple((n, kept[n] if n in kept else src_of) for n in names if n in kept or n in have)
    snap = Snapshot(rows, src_of, commit, dirty, quick, sources)
    runs.atomic_write_text(rows / INDEX, json.dumps(snap.index(), indent=2) + "\n")
    return snap


def read_index(rows: Path) -> Snapshot | None:
    """The snapshot recorded in ``rows/index.json`` (None when there is none)."""
    try:
        index = json.loads((rows / INDEX).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    found = index.get("sources")
    return Snapshot(
        rows,
        str(index.get("source") or ""),
        index.get("commit"),
        bool(index.get("dirty")),
        bool(index.get("quick")),
        tuple((str(k), str(v)) for k, v in found.items()) if isinstance(found, dict) else (),
    )


def _short(sha: Any, n: int = 12) -> str:
    return f"`{sha[:n]}`" if isinstance(sha, str) and sha else "–"


def _header(path: Path) -> dict[str, Any]:
    try:
        got = json.loads((path / "config.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return got if isinstance(got, dict) else {}


def _rows(path: Path) -> list[Any]:
    try:
        got = json.loads((path / "summary.json").read_text()).get("rows", [])
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return []
    return got if isinstance(got, list) else []


def _seconds(rows: list[Any], field: str) -> tuple[float, int]:
    """The sum of the rows' ``field`` (a run's share of its group's time) and how many rows
    carry it."""
    got = [
        r[field] for r in rows if isinstance(r, Mapping) and isinstance(r.get(field), int | float)
    ]
    return float(sum(got)), len(got)


def _hours(rows: list[Any], field: str) -> str:
    """``field`` summed over the rows, in hours (``–`` when no row records it; with how many
    rows do when only some do)."""
    total, n = _seconds(rows, field)
    if not n:
        return "–"
    return f"{total / 3600:.1f}" + ("" if n == len(rows) else f" ({n} of {len(rows)} rows)")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _versions(code: Mapping[str, Any]) -> str:
    v = _mapping(code.get("versions"))
    return ", ".join(f"{k} {v[k]}" for k in _VERSIONS if v.get(k)) or "not recorded"


def _reuse(header: Mapping[str, Any]) -> str:
    """Cells of other code in the folder: force-resumed events and earlier fingerprints."""
    events = header.get("force_resumed") or []
    cells = sum(int(e.get("reused_cells") or 0) for e in events if isinstance(e, Mapping))
    earlier = len(header.get("code_history") or [])
    parts = [f"{cells} cells reused from other code (--force-resume)"] if events else []
    parts += [f"{earlier} earlier fingerprint(s) in config.json"] if earlier else []
    return "; ".join(parts) or "–"


def _machines(rows: list[Any]) -> str:
    """The machines that computed ``rows`` (their cells' ``host`` ids, with counts when there
    are several) and how many rows record none; "–" when none does."""
    counts: dict[str, int] = {}
    for r in rows:
        if isinstance(r, Mapping) and isinstance(r.get("host"), str):
            counts[r["host"]] = counts.get(r["host"], 0) + 1
    if not counts:
        return "–"
    several = len(counts) > 1
    parts = [f"`{h}`" + (f" ×{n}" if several else "") for h, n in sorted(counts.items())]
    if missing := len(rows) - sum(counts.values()):
        parts.append(f"{missing} of {len(rows)} rows unrecorded")
    return ", ".join(parts)


def _time_text(rows: list[Any]) -> str:
    """Wall and CPU hours summed over ``rows`` (CPU over the rows that record it)."""
    wall, _ = _seconds(rows, "wall_s")
    cpu, n_cpu = _seconds(rows, "cpu_s")
    return f"{wall / 3600:.1f} hours of wall time" + (
        f"; {cpu / 3600:.1f} CPU-hours (user + system, every thread) over the "
        f"{n_cpu} of {len(rows)} rows that record it"
        if n_cpu
        else "; no row records its CPU time"
    )


def section(
    folders: Mapping[str, Path],
    snap: Snapshot | None,
    rows_link: str | None,
    families: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """The report's "Provenance" section: the commit of the report and, per configuration (by
    name, its folder), the fingerprint of its runs and the hours its rows sum to; the hours of
    each of ``families`` (a label: its configurations' names) with a folder (markdown lines)."""
    lines = ["## Provenance", ""]
    if snap is not None and rows_link is not None:
        at = (
            f"`{snap.commit}`" + (" (with uncommitted changes)" if snap.dirty else "")
            if snap.commit
            else "none recorded (not a git checkout)"
        )
        lines += [
            f"**Commit of the report**: {at} — the commit checked out when the rows were "
            f"copied from the run folders in {snap.source_text()} into "
            f"[`{rows_link}/`]({rows_link}/index.json): "
            "each configuration's `summary.json` (the rows behind every table, one per line), "
            "`config.json` and `table.md`; each row's speed readings (its test curve's "
            "mean and its value at a third of the budget) are read from its cell's curve, in the "
            "run folder or, for rows kept from an earlier copy, in the same sweep's packed cells "
            "(`claims/cells/`). `python -m study --from-rows` rebuilds this report "
            "(and the forest plots) from them byte for byte, without recomputing.",
            "",
        ]
    else:
        lines += ["Read directly from the run folders (no committed copy of the rows).", ""]
    headers = {n: _header(p) for n, p in folders.items()}
    codes = {n: _mapping(h.get("code")) for n, h in headers.items()}
    lines += [
        "**Fingerprint of the runs**, as each run folder recorded it (`config.json`, `code`): "
        "the code hash that decides results (jaxstale, experiment and user sources, the datasets' "
        "content digest, jax / jaxlib / optax / flax versions and, in run folders that record it, "
        "the backend: platform, device kind, matmul precision, GPU deterministic ops), the git "
        "commit checked out when "
        "the run folder was last started (the fingerprint's `git_commit`; it does not enter the "
        "hash, so cells computed at an earlier commit with the same code hash are kept), the "
        "datasets' content digest, and the machines that computed the rows (each cell's `host` "
        "id, `experiments.runs.hosts`: a cell is bit for bit reproducible on its own machine; rows "
        "computed before machines were recorded count as unrecorded, –).",
        "",
    ]
    if not folders:
        return [*lines, "No configuration was run."]
    versions = {n: _versions(c) for n, c in codes.items()}
    same = len(set(versions.values())) == 1
    if same:
        lines += [f"Library versions (every configuration): {next(iter(versions.values()))}.", ""]
    rows = {n: _rows(p) for n, p in folders.items()}
    head = ["configuration", "rows", "wall h", "CPU h", "code hash", "commit of the runs"]
    head += ["dataset digest", "machines"]
    head += [] if same else ["versions"]
    body = []
    for name in folders:
        code = codes[name]
        row = [
            f"`{name}`",
            str(len(rows[name])),
            _hours(rows[name], "wall_s"),
            _hours(rows[name], "cpu_s"),
            _short(code.get("hash"), 16),
            _short(code.get("git_commit")),
            _short(code.get("data_sha")),
            _machines(rows[name]),
        ]
        body.append(row if same else [*row, versions[name]])
    lines.append(runs.markdown_table(head, body))
    every = [r for rs in rows.values() for r in rs]
    lines += [
        "",
        f"Time, summed over the rows (a row carries its run group's time over the group's "
        f"runs, so the sums cover every session of a resumed sweep, compiles and evaluations "
        f"included, process start-up not; wall time depends on what else shared the machine): "
        f"{_time_text(every)}.",
    ]
    each = []
    for label, names in (families or {}).items():
        if have := [n for n in names if n in folders]:
            part = [r for n in have for r in rows[n]]
            listed = ", ".join(f"`{n}`" for n in have)
            each.append(f"- {label} ({listed}): {_time_text(part)}.")
    lines += ["", "The same sums by family of claims:", "", *each] if each else []
    reused = [(n, r) for n in folders if (r := _reuse(headers[n])) != "–"]
    if reused:
        lines += ["", *(f"- `{n}`: {r}." for n, r in reused)]
    return lines


def drift(now: Mapping[str, Any], rows: Mapping[str, Any]) -> list[str]:
    """The fields in which a configuration's rows (``rows``: the ``config`` of their
    config.json) differ from the configuration the code declares now (``now``: its resolved
    config), as ``"field old → new"``, sorted; empty when they are the same run. A report
    must not present a run's numbers under a command that did not produce them.

    Example:
        >>> drift({"updates": 27000, "seeds": 10}, {"updates": 9000, "seeds": 10})
        ['updates 9000 → 27000']
    """
    # as config.json spells them (runs.to_json: lists, string keys, NaN as null)
    now, rows = json.loads(runs.to_json(now)), json.loads(runs.to_json(rows))
    return [
        f"{k} {_plain(rows.get(k))} → {_plain(now.get(k))}"
        for k in sorted(set(now) | set(rows))
        if now.get(k) != rows.get(k)
    ]


def _plain(value: Any) -> str:
    """A config value as a flag would spell it (lists comma-separated, absent as "unset")."""
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ",".join(_plain(v) for v in value)
    return json.dumps(value) if isinstance(value, dict) else str(value)
