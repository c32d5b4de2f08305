"""Groups of cells: which cells of a sweep are computed together, and whether a recomputed cell
agrees with its stored result.

A sweep computes the cells that differ only in some key fields (seeds, rates, worker counts) in
one call, typically as the lanes of one ``jax.vmap``. Where XLA's arithmetic for a lane depends on
its company (:mod:`jaxstale.loop`, "Compiled steps": on GPUs, for methods whose fused update XLA
rewrites per program), a cell's numbers are a function of its configuration *and of its group*.
:meth:`experiments.runs.RunFolder.run_grouped` therefore makes the group a function of the
configuration alone: :func:`cell_groups` forms the same groups from the same keys whichever cells
are already done, a resume recomputes every group that has a missing cell in full — the lanes a
fresh run computes — records the missing cells, and :func:`first_difference` checks the
recomputed finished cells against their files.

Example:
    >>> keys = [{"lr": lr, "seed": s} for lr in (0.1, 0.3) for s in (0, 1)]
    >>> cell_groups(keys, vary=("seed",))
    [[0, 1], [2, 3]]
    >>> stored = {"row": {"seed": 0, "acc": 0.5, "wall_s": 3.0}, "metrics": [{"step": 1}]}
    >>> first_difference(stored, {"seed": 0}, {"acc": 0.5, "wall_s": 9.0}, [{"step": 1}]) is None
    True
    >>> first_difference(stored, {"seed": 0}, {"acc": 0.75, "wall_s": 3.0}, [{"step": 1}])
    'acc 0.5 → 0.75'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .files import to_json

__all__ = [
    "TIMING_FIELDS",
    "cell_groups",
    "check_cell",
    "drop_checkpoints",
    "first_difference",
    "group_checkpoints",
]

#: row and metric fields that measure time, not results: left out of the agreement check
TIMING_FIELDS: tuple[str, ...] = ("wall_s", "cpu_s", "tokens_per_s", "mfu")


def cell_groups(keys: Sequence[Mapping[str, Any]], vary: Sequence[str]) -> list[list[int]]:
    """The indices of ``keys`` grouped by their fields outside ``vary``: groups in the order of
    their first key, keys in the order given. Depends on the keys alone (not on which cells are
    done), so a fresh run and every resume of it form the same groups."""
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        fixed = {k: v for k, v in key.items() if k not in vary}
        groups.setdefault(to_json(fixed, canonical=True), []).append(i)
    return list(groups.values())


def _plain(obj: Any, ignore: Sequence[str]) -> Any:
    """``obj`` as stored (JSON: NaN as null, tuples as lists), ``ignore`` fields left out."""
    value = json.loads(to_json(obj))
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ignore}
    return [{k: v for k, v in r.items() if k not in ignore} for r in value]


def first_difference(
    stored: Mapping[str, Any],
    key: Mapping[str, Any],
    row: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
    ignore: Sequence[str] = TIMING_FIELDS,
) -> str | None:
    """None when a recomputed cell, ``(row, metrics)`` of ``key``, is its ``stored`` cell
    (``{"row", "metrics"}`` as :meth:`~experiments.runs.RunFolder.record` wrote it) bit for bit
    in every field but ``ignore``; else the first difference, ``"<field> <stored> → <new>"``
    (a metric field: ``"metrics[<i>].<field> ..."``)."""
    old_row, new_row = _plain(stored.get("row", {}), ignore), _plain({**key, **row}, ignore)
    for k in dict.fromkeys([*old_row, *new_row]):
        if old_row.get(k, "∅") != new_row.get(k, "∅"):
            return f"{k} {old_row.get(k, '∅')} → {new_row.get(k, '∅')}"
    old_m, new_m = _plain(stored.get("metrics", []), ignore), _plain(list(metrics), ignore)
    if len(old_m) != len(new_m):
        return f"metrics: {len(old_m)} records → {len(new_m)}"
    for i, (a, b) in enumerate(zip(old_m, new_m, strict=True)):
        for k in dict.fromkeys([*a, *b]):
            if a.get(k, "∅") != b.get(k, "∅"):
                return f"metrics[{i}].{k} {a.get(k, '∅')} → {b.get(k, '∅')}"
    return None


def check_cell(
    experiment: str,
    stored: Mapping[str, Any],
    key: Mapping[str, Any],
    row: Mapping[str, Any],
    metrics: Sequence[Mapping[str, Any]],
) -> str | None:
    """:func:`first_difference` of a recomputed finished cell; a difference is printed as a
    warning on stderr (the stored cell is kept) and returned as ``"<key>: <difference>"``."""
    diff = first_difference(stored, key, row, metrics)
    if diff is None:
        return None
    message = f"{to_json(key)}: {diff}"
    print(
        f"[{experiment}] warning: a finished cell recomputed with its group differs from its "
        f"stored result ({message}); the stored cell is kept",
        file=sys.stderr,
    )
    return message


@contextlib.contextmanager
def group_checkpoints(
    folder: Path, code_hash: str, keys: Sequence[Mapping[str, Any]], every: int | None
) -> Iterator[Path | None]:
    """The checkpoints of one group of cells (:mod:`jaxstale.checkpoint`): every
    :func:`jaxstale.loop.run` call inside saves every ``every`` updates under
    ``folder/checkpoints/<sha1 of the group's keys>/<code hash>/run-<n>``, so a killed sweep
    resumes its group mid-run — only under the same keys (the config's fields, the group's
    seeds and rates) and the same code (the fingerprint's hash): a checkpoint of other code is
    never read. Yields the group's folder (the caller removes it once its cells are recorded),
    or None without checkpoints (``every`` None)."""
    if every is None:
        yield None
        return
    from jaxstale import checkpoint

    digest = hashlib.sha1(to_json(list(keys), canonical=True).encode()).hexdigest()[:16]
    where = folder / "checkpoints" / digest
    with checkpoint.checkpointing(where / code_hash[:16], every):
        yield where


def drop_checkpoints(where: Path | None) -> None:
    """Removes a finished group's checkpoints (:func:`group_checkpoints`' folder), and the
    run folder's ``checkpoints/`` once no group is left in it."""
    if where is None:
        return
    shutil.rmtree(where, ignore_errors=True)
    with contextlib.suppress(OSError):  # other groups' checkpoints are still there
        where.parent.rmdir()
