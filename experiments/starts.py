"""Starts that the cells of a run folder share: weights trained once (a supervised start, a
synchronous warm start) and read back by every cell that starts from them.

A start is an *input* of its cells, so it lives in the run folder (``inputs/<name>.npz``, the
leaves and their content digest) and travels with them (``python -m study --pack`` archives
``inputs/``): on XLA:CPU a start trained on another CPU differs in its last bits, and cells that
should share one must. Each cell records the digest it started from, so a folder whose cells were
restored without their start refuses a start computed here that is not theirs.

Example:
    >>> import tempfile, numpy as np
    >>> from experiments import runs
    >>> folder = runs.RunFolder("demo", {"x": 1}, tempfile.mkdtemp())
    >>> calls = []
    >>> train = lambda: calls.append(1) or {"w": np.arange(3.0)}
    >>> like = {"w": np.zeros(3)}                # the start's structure
    >>> a, d = cached(folder, "start", train, like=like)
    >>> b, e = cached(folder, "start", train, like=like)   # read back: not trained again
    >>> len(calls), d == e, bool((a["w"] == b["w"]).all())
    (1, True, True)
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from . import runs

__all__ = ["cached", "digest"]


def digest(params: Any) -> str:
    """A short content digest of a pytree of arrays (its leaves' shapes, dtypes and bytes, in
    order)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        a = np.asarray(leaf)
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def cached(
    folder: runs.RunFolder,
    name: str,
    compute: Callable[[], Any],
    *,
    like: Any,
    key: str = "start_digest",
    cells: Callable[[Mapping[str, Any]], bool] = lambda row: True,
) -> tuple[Any, str]:
    """``(start, digest)``: ``folder``'s ``inputs/<name>.npz`` when it has one (its digest
    checked; its leaves put back in ``like``'s structure: the initial weights, say), else
    ``compute()``, saved there atomically.

    A start computed here must be the one the folder's rows that ``cells`` selects record under
    ``key`` (if any do): else :class:`~experiments.runs.RunFolderError` names both digests and
    how to restore the start."""
    path = folder.create() / "inputs" / f"{name}.npz"
    if path.exists():
        with np.load(path) as z:
            leaves = [z[f"a{i}"] for i in range(len(z.files) - 1)]
            want = str(z["digest"])
        start = jax.tree.unflatten(jax.tree.structure(like), leaves)
        if digest(start) != want:
            raise runs.RunFolderError(f"{path}: the start does not match its digest")
        return start, want
    start = compute()
    d = digest(start)
    others = {r.get(key) for r in folder.rows() if cells(r)} - {d, None}
    if others:
        raise runs.RunFolderError(
            f"{folder.path}: its cells started from {', '.join(sorted(others))}, this machine's "
            f"start is {d} (its inputs/{name}.npz is missing: restore it with "
            "python -m study --restore, or run it in another --out)"
        )
    path.parent.mkdir(exist_ok=True)
    buf = io.BytesIO()
    np.savez(
        buf,
        digest=np.array(d),
        **{f"a{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(start))},
    )
    runs.atomic_write_bytes(path, buf.getvalue())
    return start, d
