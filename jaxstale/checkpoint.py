"""Checkpoints mid-run: :func:`jaxstale.loop.run`'s progress saved every ``K`` updates, so a
killed run resumes from its last checkpoint and ends bit for bit where an uninterrupted run ends.

A checkpoint is taken at the end of an evaluation interval (the loop's only boundary), once
``every`` updates have passed since the last one, and holds everything the loop carries: the
executor's state (weights, optimizer states, weight-version buffers, delay models' random keys,
…), every lane's training losses so far, its learning curve, its divergence and the round it
stopped at. Resuming restores them and goes on over the same intervals, so every later round
sees what it would have seen (the executors are pure functions of their state and the round
index) and the run's numbers do not depend on where it was killed.

On disk (``directory``)::

    <rounds>/          the arrays, written by orbax-checkpoint (its own atomic commit)
    <rounds>.json      the loop's records and the run's identity, written after the arrays
                       (write-then-rename): a checkpoint exists only once both do

The newest complete checkpoint is read; older ones are removed once a newer one is complete,
so a kill at any instant leaves one readable checkpoint. A checkpoint written by another run
(other round count, lanes, evaluation cadence, metric, or state shapes) is refused with one
line, never silently used; where it lives decides what it belongs to (a run folder keys it by
its cells and the code's fingerprint: :class:`experiments.runs.RunFolder`).

Two ways to turn them on: :func:`jaxstale.loop.run`'s ``checkpoint=Checkpoints(dir, every)``,
or :func:`checkpointing`, a context under which each :func:`~jaxstale.loop.run` call takes its
own numbered sub-folder (a sweep's group of runs, in the order it runs them).

One process only: with several (:mod:`jaxstale.distributed`) the state is not all on one
host, and :func:`jaxstale.loop.run` refuses checkpoints there.

Example:
    >>> import tempfile, numpy as np, optax
    >>> from jaxstale import loop, train
    >>> x, y = np.eye(2, dtype=np.float32), np.array([0, 1], np.int32)
    >>> apply = lambda p, s, xb, train: (xb @ p, s)
    >>> ex = train.executor(apply, optax.sgd(0.1), x, y, np.zeros((6, 2), np.int64))
    >>> ck = Checkpoints(tempfile.mkdtemp(), every=2)
    >>> (res,) = loop.run(ex, np.zeros((2, 2), np.float32), {}, eval_every=2, checkpoint=ck)
    >>> latest(ck.directory)  # the last one: rounds done when it was taken
    4
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = ["Checkpoints", "checkpointing", "claim", "latest", "restore", "save"]


@dataclass(frozen=True)
class Checkpoints:
    """Where :func:`jaxstale.loop.run` saves its progress, and how often.

    Attributes:
        directory: the run's checkpoint folder (created on the first save).
        every: updates between two checkpoints (the first interval end after ``every`` more
            updates than the last checkpoint's); ``≥ 1``.
    """

    directory: str | os.PathLike[str]
    every: int

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ValueError(f"checkpoint every must be a positive int, got {self.every!r}")


_ACTIVE: contextvars.ContextVar[tuple[Path, int, list[int]] | None] = contextvars.ContextVar(
    "jaxstale_checkpointing", default=None
)


@contextlib.contextmanager
def checkpointing(directory: str | os.PathLike[str], every: int) -> Iterator[None]:
    """Checkpoints for every :func:`jaxstale.loop.run` call inside: the ``n``-th call (from 0)
    saves into ``directory/run-<n>`` every ``every`` updates (its own ``checkpoint=`` wins)."""
    Checkpoints(directory, every)  # checks every
    token = _ACTIVE.set((Path(directory), every, [0]))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def claim() -> Checkpoints | None:
    """The next run's :class:`Checkpoints` under :func:`checkpointing` (None outside one)."""
    got = _ACTIVE.get()
    if got is None:
        return None
    directory, every, count = got
    count[0] += 1
    return Checkpoints(directory / f"run-{count[0] - 1}", every)


def latest(directory: str | os.PathLike[str]) -> int | None:
    """The rounds of the newest complete checkpoint in ``directory`` (None if none)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    done = [int(p.stem) for p in d.glob("*.json") if p.stem.isdigit() and (d / p.stem).is_dir()]
    return max(done, default=None)


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _plain(leaf: Any) -> Any:
    """A leaf as orbax writes it: device arrays stay where they are (sharded arrays are
    written shard by shard, no host copy of the state), random keys as their key data."""
    if _is_key(leaf):
        return jax.random.key_data(leaf)
    return leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)


def _spec(leaves: list[Any]) -> list[list[Any]]:
    return [[str(a.dtype), list(a.shape)] for a in leaves]


def save(
    directory: str | os.PathLike[str],
    rounds: int,
    arrays: Any,
    records: Mapping[str, Any],
) -> Path:
    """Writes checkpoint ``rounds``: the pytree ``arrays`` (device arrays as they are sharded,
    host arrays, random keys as their key data) and the JSON-able ``records``, then removes the
    older checkpoints.

    Returns:
        The checkpoint's JSON path.
    """
    import orbax.checkpoint as ocp

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    leaves = [_plain(a) for a in jax.tree.leaves(arrays)]
    where = d / str(rounds)
    if where.exists():  # an incomplete one of the same round (killed before its JSON)
        shutil.rmtree(where)
    ocp.PyTreeCheckpointer().save(where.absolute(), {str(i): a for i, a in enumerate(leaves)})
    text = json.dumps({**records, "rounds": rounds, "leaves": _spec(leaves)}, allow_nan=True)
    tmp = d / f".{rounds}.json.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, d / f"{rounds}.json")
    for p in d.iterdir():  # older checkpoints, and anything a kill left half-written
        stem = p.name.removesuffix(".json")
        if stem != str(rounds) and (stem.isdigit() or p.name.startswith(".")):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return d / f"{rounds}.json"


def restore(
    directory: str | os.PathLike[str], template: Any, identity: Mapping[str, Any]
) -> tuple[Any, dict[str, Any]] | None:
    """The newest complete checkpoint of ``directory`` as ``(arrays, records)``: ``arrays`` in
    ``template``'s structure, each leaf restored onto ``template``'s sharding (random keys
    wrapped again, host arrays as NumPy), or None when there is none.

    Raises:
        ValueError: the checkpoint's ``identity`` fields or array shapes differ from this
            run's (written by another run: one line naming the folder and the difference).
    """
    import orbax.checkpoint as ocp

    rounds = latest(directory)
    if rounds is None:
        return None
    d = Path(directory)
    records = json.loads((d / f"{rounds}.json").read_text(encoding="utf-8"))
    leaves, tree = jax.tree.flatten(template)
    plain = [_plain(a) for a in leaves]
    for field, want in {**identity, "leaves": _spec(plain)}.items():
        if records.get(field) != json.loads(json.dumps(want)):
            raise ValueError(
                f"checkpoint {d} was written by another run ({field} differs: "
                f"{_short(records.get(field))} there, {_short(want)} here); remove it to start "
                "afresh"
            )
    target = {str(i): a for i, a in enumerate(plain)}
    args = ocp.checkpoint_utils.construct_restore_args(target)  # each leaf's sharding
    got = ocp.PyTreeCheckpointer().restore(
        (d / str(rounds)).absolute(), item=target, restore_args=args
    )
    out = []
    for i, t in enumerate(leaves):
        a = got[str(i)]
        if _is_key(t):
            out.append(jax.random.wrap_key_data(a, impl=jax.random.key_impl(t)))
        else:
            out.append(a if isinstance(t, jax.Array) else np.asarray(a))
    return jax.tree.unflatten(tree, out), records


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
