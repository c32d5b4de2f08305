"""The run folders' finished cells, committed: so a sweep longer than one machine's session
resumes on the next one, and every per-seed number of the report can be audited.

``results/`` is not committed, and the report's committed rows (:mod:`.provenance`) hold only
finished configurations' summaries. :func:`pack` copies each configuration's run folder
``<results>/<name>/`` — its ``config.json`` (the configuration and the code fingerprint) and every
``cells/<h>.json`` (a cell's key, row, learning curve and the code hash it was computed under) —
into ``<cells>/<name>/NNNN.jsonl.xz``, one JSON value per line. Files are only ever added, each
holding the cells the earlier ones do not (so committing after every pack adds only what is
new to the repository's history); unfinished configurations are packed too: that is the point.
A run folder's ``inputs/`` (files every cell depends on and that another machine could not
recompute bit for bit, e.g. the RL family's supervised start) travel with its cells, base64 in
the same archives, whenever one is new or changed.
:func:`restore` writes them back into run folders, never over a file that exists, one sweep (a
configuration under one code hash) at a time, and then the experiments' own checks decide: a run
folder refuses cells of other code (other sources, data or jax / jaxlib / flax / optax versions)
with :class:`~experiments.runs.StaleResultsError` before anything is computed, exactly as for cells
computed on this machine.

Command line (``python -m study``): ``--pack`` after (or while) running,
``--restore`` before ``--run``; the default folder is ``claims/cells`` beside ``--out``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from experiments import runs
    >>> tmp = Path(tempfile.mkdtemp())
    >>> folder = runs.RunFolder("demo", {"lr": 0.1}, out=tmp / "results" / "demo")
    >>> folder.record({"seed": 0}, {"acc": 0.5}, [{"step": 1, "loss": 2.0}])
    >>> pack(tmp / "results", tmp / "cells", ["demo", "other"])  # (new, total) cells
    {'demo': (1, 1)}
    >>> pack(tmp / "results", tmp / "cells", ["demo"])  # nothing new: nothing written
    {'demo': (0, 1)}
    >>> sorted(p.name for p in (tmp / "cells" / "demo").iterdir())
    ['0000.jsonl.xz']
    >>> restore(tmp / "cells", tmp / "copy", ["demo", "other"])  # (written, left out)
    {'demo': Restored(written=1, other=0)}
    >>> runs.RunFolder("demo", {"lr": 0.1}, out=tmp / "copy" / "demo").done({"seed": 0})
    {'seed': 0, 'acc': 0.5}
"""

from __future__ import annotations

import base64
import json
import lzma
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from experiments import runs

__all__ = ["SUFFIX", "CellsError", "Restored", "pack", "read", "read_inputs", "restore", "sweep"]

#: an archive's name is ``<configuration><SUFFIX>``
SUFFIX = ".jsonl.xz"


class CellsError(ValueError):
    """An archive that cannot be read, or that belongs to another configuration than the run
    folder it would be restored into (one line, naming the file)."""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _folder_cells(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((folder / "cells").glob("*.json")):
        try:
            cell = json.loads(path.read_text())
        except json.JSONDecodeError:  # cell files are replaced atomically: not ours, skip it
            continue
        if isinstance(cell, dict) and "key" in cell and "row" in cell:
            out.append((path.name, cell))
    return out


def _folder_inputs(folder: Path) -> dict[str, bytes]:
    """The run folder's ``inputs/`` files (one level, regular files), by name."""
    found = sorted((folder / "inputs").glob("*"))
    return {p.name: p.read_bytes() for p in found if p.is_file() and not p.name.startswith(".")}


def _shards(cells: Path, name: str) -> list[Path]:
    """The configuration's archive files, in the order they were written."""
    return sorted((cells / name).glob(f"*{SUFFIX}"))


#: one archive file, read: its ``config.json`` and its ``(file name, cell)`` pairs
_Shard = tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], dict[str, bytes]]


def _code(header: Mapping[str, Any]) -> Any:
    """The code hash a run folder's ``config.json`` records (None when it records none)."""
    code = header.get("code")
    return code.get("hash") if isinstance(code, Mapping) else None


def _sweep_of(header: Mapping[str, Any]) -> tuple[str, Any]:
    """What one sweep's files share: its configuration and the code it computes under."""
    return _dump(header.get("config")), _code(header)


def _groups(cells: Path, name: str) -> list[tuple[tuple[str, Any], list[_Shard]]]:
    """The archive files of ``name``, each read once, grouped by sweep (configuration and code
    hash, :func:`_sweep_of`), ordered by each sweep's latest file: a configuration changed in
    the code (a larger budget, say), or the same configuration under changed code, is swept
    again under the same name, and its files follow the old ones."""
    groups: dict[tuple[str, Any], list[_Shard]] = {}
    last: dict[tuple[str, Any], int] = {}
    for i, path in enumerate(_shards(cells, name)):
        shard = _parse(path)
        sweep = _sweep_of(shard[0])
        groups.setdefault(sweep, []).append(shard)
        last[sweep] = i
    return sorted(groups.items(), key=lambda item: last[item[0]])


def pack(results: Path, cells: Path, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Appends to ``cells/<name>/`` one file ``NNNN.jsonl.xz`` holding the cells of the run
    folder ``results/<name>/`` that the earlier files of the same configuration do not hold
    (new, or re-recorded), for every configuration of ``names`` with a run folder; returns
    ``(new, total)`` cells per name. Nothing is written when nothing changed: files are only
    ever added, so a commit of the folder adds only what is new (git keeps every earlier
    version of a rewritten file). Files of another sweep of that name (another configuration,
    or the same one under other code: :func:`_sweep_of`) are left as they are, so two run
    folders of one configuration at two commits never pack each other's cells again."""
    counts: dict[str, tuple[int, int]] = {}
    for name in names:
        folder = results / name
        if not (folder / "config.json").exists():
            continue
        header = json.loads((folder / "config.json").read_text())
        mine = [files for sweep, files in _groups(cells, name) if sweep == _sweep_of(header)]
        shards = mine[0] if mine else []
        last_header = shards[-1][0] if shards else None
        old = {f: _dump(c) for _, found, _ in shards for f, c in found}
        here = _folder_cells(folder)
        new = [(f, c) for f, c in here if old.get(f) != _dump(c)]
        had = _inputs_of(shards)
        fresh = {f: b for f, b in _folder_inputs(folder).items() if had.get(f) != b}
        changed = last_header is None or last_header != header
        if new or fresh or changed:
            lines = [_dump({"config": header})]
            lines += [_dump({"input": f, "base64": _b64(b)}) for f, b in sorted(fresh.items())]
            lines += [_dump({"file": f, "cell": c}) for f, c in new]
            data = lzma.compress(("\n".join(lines) + "\n").encode(), preset=9)
            number = len(_shards(cells, name))
            (cells / name).mkdir(parents=True, exist_ok=True)
            runs.atomic_write_bytes(cells / name / f"{number:04d}{SUFFIX}", data)
        counts[name] = (len(new), len({**old, **{f: "" for f, _ in here}}))
    return counts


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _values(path: Path) -> list[Any]:
    try:
        text = lzma.decompress(path.read_bytes()).decode()
        return [json.loads(line) for line in text.splitlines() if line]
    except (lzma.LZMAError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CellsError(f"{path}: not a cells archive ({type(e).__name__}: {e})") from None


def _parse(path: Path) -> _Shard:
    """``(config.json, [(file name, cell), ...], {input name: bytes})`` of one archive, checked.

    Raises:
      CellsError: the file is not an archive written by :func:`pack`.
    """
    values = _values(path)
    try:
        header = values[0]["config"]
        found = [(v["file"], v["cell"]) for v in values[1:] if "input" not in v]
    except (IndexError, KeyError, TypeError) as e:
        raise CellsError(f"{path}: not a cells archive ({type(e).__name__}: {e})") from None
    bad = [f for f, _ in found if Path(f).name != f or not f.endswith(".json")]
    if not isinstance(header, dict) or bad:
        raise CellsError(f"{path}: not a cells archive (bad entries: {bad[:3]})")
    inputs = {}
    for v in values[1:]:
        if isinstance(v, dict) and "input" in v:
            name = v["input"]
            try:
                data = base64.b64decode(v["base64"], validate=True)
            except (KeyError, TypeError, ValueError) as e:
                raise CellsError(f"{path}: input {name!r} is not base64 ({e})") from None
            if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
                raise CellsError(f"{path}: not a cells archive (bad input name {name!r})")
            inputs[name] = data
    return header, found, inputs


def read(path: Path) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """``(config.json, [(file name, cell), ...])`` of one archive (its inputs:
    :func:`read_inputs`).

    Raises:
      CellsError: the file is not an archive written by :func:`pack`.
    """
    header, found, _ = _parse(path)
    return header, found


def read_inputs(path: Path) -> dict[str, bytes]:
    """The run-folder ``inputs/`` files one archive holds, by name (empty for most).

    Raises:
      CellsError: the file is not an archive written by :func:`pack`.
    """
    return _parse(path)[2]


def _inputs_of(shards: Sequence[_Shard]) -> dict[str, bytes]:
    """The inputs one sweep's archives hold (a file packed twice: its latest)."""
    return {f: b for _, _, inputs in shards for f, b in inputs.items()}


def sweep(cells: Path, name: str, header: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The archived cells of ``name``'s sweep that a run folder's ``config.json`` ``header``
    records (its configuration and code, :func:`_sweep_of`; a file packed twice: its latest
    version); empty when none is archived.

    Raises:
      CellsError: an archive that cannot be read.
    """
    want = _sweep_of(header)
    latest: dict[str, dict[str, Any]] = {}
    for got, shards in _groups(cells, name):
        if got == want:
            for _, found, _ in shards:
                latest.update(found)
    return list(latest.values())


class Restored(NamedTuple):
    """What :func:`restore` did for one configuration."""

    written: int  #: cell files written into the run folder
    other: int  #: archived cell files of that name not restored (other code or configuration)


def restore(
    cells: Path,
    results: Path,
    names: Sequence[str],
    want: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Restored]:
    """Writes the archived config and cells of one sweep of every configuration of ``names``
    that has an archive into ``results/<name>/`` (a cell packed twice: its latest version),
    leaving every file that exists as it is; returns, per name, the cell files written and the
    archived cells left out. Checks every archive before writing anything.

    A sweep is a configuration computed under one code hash (:func:`_sweep_of`); a name's
    archive holds several when the configuration, or the code, was changed and swept again.
    The one restored is the run folder's own when it has a ``config.json`` (nothing, when the
    archive holds no cell of its configuration and code), else the latest sweep of ``want[name]``
    (the configuration the checkout declares; nothing when none is archived: a configuration
    changed since its last sweep starts afresh, where the old sweep's ``config.json`` would make
    its ``--run`` refuse the folder), else, with no ``want[name]``, the latest sweep. Only the
    cells of that sweep's code are written (and those its run folder had reused with
    ``--force-resume``): a run folder never receives cells of two codes from an archive, so
    ``--restore --run`` at the archive's latest code resumes, and at other code the run folder
    refuses the restored cells by name of what changed.

    Raises:
      CellsError: an archive that cannot be read, or a run folder holding a configuration that
        its archive does not.
    """
    todo = []
    for name in names:
        groups = _groups(cells, name)
        if not groups:
            continue
        folder = results / name
        total = len({f for _, shards in groups for _, found, _ in shards for f, _ in found})
        if (folder / "config.json").exists():
            have = json.loads((folder / "config.json").read_text())
            if not any(sweep[0] == _dump(have.get("config")) for sweep, _ in groups):
                raise CellsError(
                    f"{cells / name}: {folder} holds another configuration; restore into an "
                    "empty --results folder"
                )
            chosen = [shards for sweep, shards in groups if sweep == _sweep_of(have)]
            if not chosen:
                todo.append((name, None, {}, total, {}))
                continue
            shards = chosen[0]
        else:
            asked = want.get(name) if want else None
            if asked is None:
                shards = groups[-1][1]
            else:
                config = _dump(json.loads(runs.to_json(asked)))
                chosen = [shards for sweep, shards in groups if sweep[0] == config]
                if not chosen:  # a changed configuration: the old sweep would block its run
                    todo.append((name, None, {}, total, {}))
                    continue
                shards = chosen[-1]
        header = shards[-1][0]
        ok = runs.accepted_codes(header)
        merged = {f: c for _, found, _ in shards for f, c in found}
        merged = {f: c for f, c in merged.items() if c.get("code") in ok}
        todo.append((name, header, merged, total, _inputs_of(shards)))
    counts: dict[str, Restored] = {}
    for name, header, merged, total, inputs in todo:
        folder = results / name
        written = 0
        if header is not None:
            (folder / "cells").mkdir(parents=True, exist_ok=True)
            if not (folder / "config.json").exists():
                text = runs.to_json(header, indent=2) + "\n"
                runs.atomic_write_text(folder / "config.json", text)
            for file, data in inputs.items():
                target = folder / "inputs" / file
                if not target.exists():
                    target.parent.mkdir(exist_ok=True)
                    runs.atomic_write_bytes(target, data)
            for file, cell in sorted(merged.items()):
                target = folder / "cells" / file
                if not target.exists():
                    runs.atomic_write_text(target, runs.to_json(cell) + "\n")
                    written += 1
        counts[name] = Restored(written, total - len(merged))
    return counts
