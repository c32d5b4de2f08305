"""One driver for every executor: rounds, evaluation cadence, divergence, learning curves.

Every way of training in jaxstale — the synchronous reference (:mod:`jaxstale.train`), the
asynchronous data-parallel emulator and mesh executor (:mod:`jaxstale.asyncdp`), the pipeline
emulator and mesh executor (:mod:`jaxstale.pipeline`) — is an :class:`Executor`: pure functions
in the optax spirit over an explicit state,

.. code-block:: text

    state            = ex.init(params, model_state)
    state, stats     = ex.step(state, r)            r = 0 … ex.num_rounds − 1 (jitted, donated)
    params, mstate   = ex.params(state)

and :func:`run` is the only loop. A *round* is the executor's unit of work (one update of the
asynchronous server or of the synchronous trainer; one period of a pipeline schedule). Each round
reports :class:`Stats`: the summed training loss of the updates it completed and their number,
per lane (vmapped runs — seeds, learning rates, worker counts — are lanes of one executor).

:func:`run` advances the rounds in evaluation intervals of ``eval_every`` rounds (through
``ex.advance`` where the executor has a faster path than a host loop of ``step``: a
``lax.scan`` over the interval), and at the end of each interval records, per lane,

.. code-block:: text

    {"step": updates done, ["batches": mini-batches consumed,] "train_loss": mean over the
     interval's updates, "<split>_accuracy": accuracy on each evaluation split (None after
     divergence; "<split>_loss", the mean cross-entropy, with metric="loss")}

and the last record of a lane that did not diverge also has ``"test_correct"``: which test
examples its final weights classify correctly (:func:`decode_correct` reads it) — with
``metric="loss"``, ``"test_losses"``: each test example's (window's) mean loss
(:func:`decode_losses`), whose mean is the record's ``test_loss`` —, so a report can resample
the test set as well as the seeds.

``eval_data`` is ``(x, y)`` (recorded as ``"test_accuracy"``) or a mapping of split names to
``(x, y)``, e.g. ``{"val": (x_val, y_val), "test": (x_test, y_test)}`` (recorded as
``"val_accuracy"`` and ``"test_accuracy"``): experiments choose on the validation curve and
report the test one.

An *evaluation hook* measures the weights another way, in place of ``eval_data`` or beside it:
``evaluate(params, model_state) -> {name: per-lane values}``, called at the end of each interval
with the executor's current weights; each name is recorded as ``"<name>_accuracy"`` (None after
divergence) and its last value is the Result's ``final_accuracy[name]``, exactly like a split
of ``eval_data``. E.g. accuracy with other batch-norm statistics, or on a transformed test set.

Divergence: a lane whose training loss becomes NaN or ±inf is *diverged at the first update whose
loss is non-finite* (1-based, over the lane's updates); it is not evaluated any more and its
final accuracy is None; the other lanes go on, and the loop stops early once every lane has
diverged. Records of a diverged lane continue (with null loss and accuracy) while other lanes of
the same executor run on — they share one clock. Final weights that are not finite also count as
divergence (at the last update). Nothing is raised.

**Compiled steps** (:func:`jit`): every executor compiles its steps with :func:`jit`, so that a
run's numbers do not depend on the runs it is batched with. On XLA:CPU it leaves out YNNPACK's
*reduce* fusion (its dot and convolution fusions stay): YNNPACK sums a vmapped reduction — a
bias gradient, ``reduce`` of ``f32[L, 32, 64]`` over the batch axis — in another order than
XLA's own loop sums the same ``f32[32, 64]`` of one run, so a run alone and the same run as one
of ``L ≥ 2`` vmapped lanes parted in the last bit from their first update (the pipeline's bias
gradients; LC-ASGD's loss predictor, fed the worker's loss). With it and fixed-order sums where
a loss or LC-ASGD's predictors reduce (:func:`jaxstale.losses.fixed_sum`,
:func:`~jaxstale.losses.batch_mean`), measured on XLA:CPU for the experiments' MLPs (every loss,
curve point and final weight): the asynchronous emulator's lanes are its runs alone for every
built-in method but Gap-Aware (300 updates, 12 lanes: M = 4, 16 and 32, two rates, two seeds;
ASGD and LC-ASGD also in a group of 100 lanes); the pipeline's lanes are its runs alone and the
mesh executor's runs (the six policies of ``pipeline_staleness`` with SGD, its ``--quick``
cells: N = 2 and 4, 300 steps; with Adam vanilla, SpecTrain v1 and Nesterov at N = 4; NAdam:
lanes only). Where XLA still rewrites a lane by its company no option helps: in Gap-Aware's
update the algebraic simplifier turns the bias correction ``v / (1 − β^t)`` into ``v · (1 / (1 −
β^t))`` when ``t`` is a per-lane vector (vmapped) and keeps the division for one run, so the two
round apart from Gap-Aware's first stale update. The same rewrite, made in one executor's
program and not the other's, parts the mesh executors from the emulators for SA-ASGD (``g /
max(τ, 1)``), Gap-Aware and the pipeline's NAdam (its bias corrections, on a stage's flat
vector). On other backends (GPU: cuBLAS and reduction tilings chosen per shape) nothing is
promised beyond float32 rounding. A run folder keeps a sweep reproducible all the same: groups
are a function of the configuration and a resume recomputes a missing cell in its group
(:meth:`experiments.runs.RunFolder.run_grouped`), so a resumed or re-run sweep writes its table
byte for byte. Runs of one structure share a compiled core through one memo (the pipelines'
rounds, composed models, remat wrappers: keyed by the identities of the stages' functions, the
optimizer and the loss), which :func:`clear_memo` empties for a long session's memory.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np, optax
    >>> from jaxstale import loop, train
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(64, 3)).astype(np.float32)
    >>> y = (x[:, 0] > 0).astype(np.int32)
    >>> apply = lambda p, s, xb, train: (xb @ p, s)
    >>> idx = np.arange(60).reshape(6, 10) % 64
    >>> ex = train.executor(apply, optax.sgd(0.5), x, y, idx)
    >>> (res,) = loop.run(ex, jnp.zeros((3, 2)), {}, eval_every=3, eval_data=(x, y))
    >>> [c["step"] for c in res.curve], res.diverged, res.final_test_accuracy > 0.9
    ([3, 6], False, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxstale import checkpoint as _checkpoint
from jaxstale._compile import clear_memo, compiler_options, jit
from jaxstale.checkpoint import Checkpoints
from jaxstale.evaluation import (
    accuracy,
    decode_correct,
    decode_losses,
    encode_correct,
    encode_losses,
    mean_loss,
    measure,
)

__all__ = [
    "Evaluate",
    "Executor",
    "Result",
    "Stats",
    "accuracy",
    "advance",
    "clear_memo",
    "compiler_options",
    "decode_correct",
    "decode_losses",
    "encode_correct",
    "encode_losses",
    "eval_splits",
    "jit",
    "lane",
    "mean_loss",
    "run",
]

State = Any
Params = Any


class Stats(NamedTuple):
    """What rounds report, per lane and round.

    Attributes:
        loss: ``[lanes, rounds]`` float32: the sum of the training losses of the updates the
            round completed (NaN or inf once a lane diverged).
        updates: ``[lanes, rounds]`` int: how many updates the round completed (0 in a
            pipeline's warm-up rounds; 1 per round for the asynchronous server and the
            synchronous trainer).
    """

    loss: np.ndarray
    updates: np.ndarray


class Executor(NamedTuple):
    """A training run as pure functions; :func:`run` drives any of them.

    Attributes:
        init: ``init(params, model_state) -> state``: the initial state from initial weights
            (stacked over lanes when ``vmapped``); device arrays, donated by ``step``.
        step: ``step(state, r) -> (state, stats)``: round ``r`` (the state is donated: do not
            reuse it); ``stats`` is a :class:`Stats` of one round.
        params: ``params(state) -> (params, model_state)``: the current weights (stacked over
            lanes when ``vmapped``), in the form ``apply`` takes.
        apply: ``apply(params, model_state, x, train) -> (logits, model_state)`` of one lane,
            for evaluation.
        num_rounds: rounds of a full run.
        num_updates: updates of a full run (per lane).
        lanes: number of runs in the state.
        vmapped: whether the state (and ``params(state)``) carries a leading lane axis, the
            runs batched with ``jax.vmap`` (possibly a single lane); False: one unbatched run.
        advance: optional ``advance(state, start, stop) -> (state, stats)``: rounds
            ``start … stop − 1`` at once (e.g. one ``lax.scan``); default: ``step`` in a loop.
        batches_per_update: mini-batches consumed by one update (SSGD: ``M``), reported as the
            records' ``"batches"``; None to leave it out.
    """

    init: Callable[[Params, Any], State]
    step: Callable[[State, int], tuple[State, Stats]]
    params: Callable[[State], tuple[Params, Any]]
    apply: Callable[..., tuple[jax.Array, Any]]
    num_rounds: int
    num_updates: int
    lanes: int = 1
    vmapped: bool = False
    advance: Callable[[State, int, int], tuple[State, Stats]] | None = None
    batches_per_update: int | None = None


class Result(NamedTuple):
    """One lane of :func:`run`.

    Attributes:
        params: final weights (host arrays).
        model_state: final model state (batch-norm statistics).
        losses: ``[num_updates]`` float32 training loss of every update, in order (NaN where the
            run stopped early).
        curve: evaluation records (see the module docstring).
        diverged: whether the loss (or the final weights) became non-finite.
        diverged_step: the 1-based update whose loss was first non-finite (None if none).
        final_test_accuracy: the last recorded ``"test"`` accuracy (None if diverged or not
            evaluated on a ``"test"`` split).
        final_accuracy: the last recorded accuracy of every evaluation split, by name (values
            None if diverged); empty when the metric is a loss.
        metric: what was measured (``"accuracy"`` or ``"loss"``, :func:`run`'s ``metric``).
        final_loss: with ``metric="loss"``, the last recorded mean loss of every split, by
            name (None if diverged); else empty.
    """

    params: Any
    model_state: Any
    losses: np.ndarray
    curve: list[dict[str, Any]]
    diverged: bool
    diverged_step: int | None
    final_test_accuracy: float | None
    final_accuracy: dict[str, float | None] = {}  # noqa: RUF012 (never mutated; built per run)
    metric: str = "accuracy"
    final_loss: dict[str, float | None] = {}  # noqa: RUF012 (never mutated; built per run)


EvalData = tuple[Any, Any] | Mapping[str, tuple[Any, Any]]


def eval_splits(eval_data: EvalData | None) -> dict[str, tuple[Any, Any]]:
    """``eval_data`` as ``{split name: (x, y)}``: ``(x, y)`` is the ``"test"`` split.

    Raises:
        ValueError: a split that is not an ``(x, y)`` pair, or an empty name.
    """
    if eval_data is None:
        return {}
    splits = dict(eval_data) if isinstance(eval_data, Mapping) else {"test": eval_data}
    for name, pair in splits.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"eval_data: split names must be non-empty strings, got {name!r}")
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ValueError(f"eval_data[{name!r}] must be an (x, y) pair")
    return splits


def advance(ex: Executor, state: State, start: int, stop: int) -> tuple[State, Stats]:
    """Rounds ``start … stop − 1`` of ``ex``: ``ex.advance`` if it has one, else ``ex.step``.

    Args:
        ex: the executor.
        state: its state (donated).
        start: first round.
        stop: one past the last round.

    Returns:
        ``(state, stats)`` with ``stats`` of shape ``[lanes, stop − start]``.
    """
    if ex.advance is not None:
        return ex.advance(state, start, stop)
    losses, counts = [], []
    for r in range(start, stop):
        state, st = ex.step(state, r)
        losses.append(st.loss)
        counts.append(st.updates)
    loss = np.concatenate([np.asarray(a).reshape(ex.lanes, -1) for a in losses], axis=1)
    count = np.concatenate([np.asarray(c).reshape(ex.lanes, -1) for c in counts], axis=1)
    return state, Stats(loss, count)


def _finite(tree: Any) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(a)))) for a in jax.tree.leaves(tree))


def lane(tree: Any, j: int, vmapped: bool) -> Any:
    """Lane ``j`` of a tree stacked over lanes (``vmapped``), or the tree itself (one run).

    Example:
        >>> import numpy as np
        >>> from jaxstale.loop import lane
        >>> tree = {"w": np.arange(6).reshape(3, 2)}
        >>> lane(tree, 1, True)["w"].tolist(), lane(tree, 1, False) is tree
        ([2, 3], True)
    """
    return jax.tree.map(lambda a: a[j], tree) if vmapped else tree


#: ``evaluate(params, model_state) -> {name: per-lane values}``: an evaluation hook of :func:`run`
Evaluate = Callable[[Params, Any], Mapping[str, Any]]


def _measured(got: Mapping[str, Any], taken: Mapping[str, Any], lanes: int) -> dict[str, Any]:
    """An evaluation hook's answer as ``{name: [lanes] values}``, checked."""
    if not isinstance(got, Mapping):
        raise TypeError(f"evaluate must return a mapping of names to values, got {type(got)}")
    out = {}
    for name, value in got.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"evaluate: names must be non-empty strings, got {name!r}")
        if name in taken:
            raise ValueError(f"evaluate: {name!r} is also a split of eval_data")
        out[name] = np.broadcast_to(np.asarray(value), (lanes,))
    return out


def run(
    ex: Executor,
    params: Params,
    model_state: Any,
    *,
    eval_every: int | None = None,
    eval_data: EvalData | None = None,
    eval_batch_size: int = 512,
    callback: Callable[[int, list[dict[str, Any]]], None] | None = None,
    evaluate: Evaluate | None = None,
    metric: str = "accuracy",
    checkpoint: Checkpoints | None = None,
) -> list[Result]:
    """Run ``ex`` from ``(params, model_state)`` to the end (or until every lane diverged).

    Args:
        ex: the executor.
        params: initial weights (stacked over lanes when ``ex.vmapped``).
        model_state: initial model state (same layout).
        eval_every: rounds per evaluation interval (default: one interval, the whole run).
        eval_data: ``(x, y)`` (the ``"test"`` split) or ``{name: (x, y)}`` to measure accuracy
            on at the end of each interval; None records ``test_accuracy: None``.
        eval_batch_size: batch size of the evaluation (see :func:`accuracy`).
        callback: optional ``callback(rounds_done, records)`` after each interval (one record
            per lane), e.g. for progress.
        evaluate: optional evaluation hook ``evaluate(params, model_state) -> {name: values}``,
            called at the end of each interval (after ``eval_data`` is measured; not once every
            lane has diverged) with ``ex.params(state)``: device arrays, stacked over lanes when
            ``ex.vmapped``; read them, do not keep them (the next round donates the state).
            ``values`` is ``[lanes]`` (or a scalar, for every lane), one number per lane.
            Each name is recorded as ``"<name>_accuracy"`` after the splits' (None for a
            diverged lane) and its last value is ``final_accuracy[name]`` (``"test"``:
            ``final_test_accuracy``), as for a split of ``eval_data``, whose names it must not
            repeat. A name is recorded from the first interval that returns it. With a hook
            and no ``eval_data``, nothing else is measured (no ``test_accuracy: None``).
        metric: what the splits measure (:func:`jaxstale.evaluation.measure`): ``"accuracy"``,
            or ``"loss"`` (the mean cross-entropy of every target: a language model's
            ``[N, T]`` next-token targets), recorded as ``"<split>_loss"`` (a hook's names too)
            and returned in ``final_loss``; a loss run records ``test_losses`` (its final
            ``test_loss`` is their mean) in place of ``test_correct``.
        checkpoint: save the run's progress every ``checkpoint.every`` updates and resume
            from the newest checkpoint in ``checkpoint.directory`` (:mod:`jaxstale.checkpoint`:
            the resumed run ends bit for bit where an uninterrupted one does); default: the
            next slot of an active :func:`jaxstale.checkpoint.checkpointing`, else none.

    Returns:
        One :class:`Result` per lane.

    Raises:
        ValueError: ``eval_every < 1``, or malformed ``eval_data``, or a hook's name that is
            empty or a split of ``eval_data``, or values that are not one per lane.
        TypeError: a hook that does not return a mapping.

    Example:
        An evaluation hook beside ``eval_data``: here, the accuracy with the weights negated.

        >>> import jax.numpy as jnp, numpy as np, optax
        >>> from jaxstale import loop, train
        >>> x = np.eye(2, dtype=np.float32)[[0, 1] * 8]
        >>> y = np.array([0, 1] * 8, np.int32)
        >>> apply = lambda p, s, xb, train: (xb @ p, s)
        >>> ex = train.executor(apply, optax.sgd(1.0), x, y, np.arange(16).reshape(4, 4))
        >>> flipped = lambda p, s: loop.accuracy(apply, -p, s, x, y)
        >>> (res,) = loop.run(ex, jnp.zeros((2, 2)), {}, eval_every=2, eval_data=(x, y),
        ...                   evaluate=lambda p, s: {"flipped": flipped(p, s)})
        >>> [k for k in res.curve[-1] if k.endswith("_accuracy")]
        ['test_accuracy', 'flipped_accuracy']
        >>> res.final_accuracy
        {'test': 1.0, 'flipped': 0.0}
    """
    if metric not in ("accuracy", "loss"):
        raise ValueError(f"metric must be 'accuracy' or 'loss', got {metric!r}")
    splits = eval_splits(eval_data)
    names = list(splits) or ([] if evaluate is not None else ["test"])
    if eval_every is not None and (not isinstance(eval_every, int) or eval_every < 1):
        raise ValueError(f"eval_every must be a positive int, got {eval_every!r}")
    lanes = ex.lanes
    every = eval_every or max(ex.num_rounds, 1)
    ck = checkpoint if checkpoint is not None else _checkpoint.claim()
    if ck is not None and jax.process_count() > 1:
        raise ValueError("checkpoints need one process: the state is not all on this host")
    state = ex.init(params, model_state)
    losses = np.full((lanes, ex.num_updates), np.nan, np.float32)
    done = np.zeros(lanes, np.int64)  # updates completed per lane
    curves: list[list[dict[str, Any]]] = [[] for _ in range(lanes)]
    dead = np.zeros(lanes, bool)
    diverged_step: list[int | None] = [None] * lanes
    start, saved = 0, 0
    identity = {"num_rounds": ex.num_rounds, "num_updates": ex.num_updates, "lanes": lanes,
                "eval_every": every, "metric": metric, "splits": list(splits)}  # fmt: skip
    if ck is not None:
        carried = {"state": state, "losses": losses, "done": done, "dead": dead}
        restored = _checkpoint.restore(ck.directory, carried, identity)
        if restored is not None:
            arrays, kept = restored
            state, losses, done, dead = (arrays[k] for k in ("state", "losses", "done", "dead"))
            losses, done, dead = np.array(losses), np.array(done), np.array(dead)
            curves, diverged_step, names = kept["curves"], kept["diverged_step"], kept["names"]
            start, saved = kept["rounds"], int(done.max())
    for a in range(start, ex.num_rounds, every):
        z = min(a + every, ex.num_rounds)
        state, st = advance(ex, state, a, z)
        loss = np.asarray(st.loss, np.float32).reshape(lanes, z - a)
        count = np.asarray(st.updates).reshape(lanes, z - a)
        if not count.any():
            continue
        seg = []
        for j in range(lanes):
            if (count[j] != 1).any():  # rounds with 0 or several updates: one loss per update
                ok = count[j] > 0
                mean = loss[j][ok] / count[j][ok].astype(np.float32)
                per = np.repeat(mean, count[j][ok])
            else:
                per = loss[j]
            first = int(done[j])
            losses[j, first : first + len(per)] = per
            done[j] += len(per)
            bad = np.flatnonzero(~np.isfinite(per))
            if not dead[j] and len(bad):
                dead[j] = True
                diverged_step[j] = first + int(bad[0]) + 1
            seg.append(per)
        accs: dict[str, Any] = {}
        correct = None
        if (splits or evaluate is not None) and not dead.all():
            p, ms = ex.params(state)
            for name, (xe, ye) in splits.items():
                vm, bs = ex.vmapped, eval_batch_size
                # the final weights: which test examples a classifier gets right, or a
                # language model's loss on each test window
                if name == "test" and z == ex.num_rounds:
                    each = accuracy if metric == "accuracy" else mean_loss
                    correct = each(ex.apply, p, ms, xe, ye, vmap=vm, batch_size=bs,
                                   per_example=True)  # fmt: skip
                    got = correct.mean(axis=1)
                else:
                    got = measure(metric, ex.apply, p, ms, xe, ye, vmap=vm, batch_size=bs)
                accs[name] = np.broadcast_to(got, (lanes,))
            if evaluate is not None:
                accs.update(_measured(evaluate(p, ms), splits, lanes))
                names += [n for n in accs if n not in names]
        records = []
        for j in range(lanes):
            rec: dict[str, Any] = {"step": int(done[j])}
            if ex.batches_per_update is not None:
                rec["batches"] = int(done[j]) * ex.batches_per_update
            rec["train_loss"] = float(np.mean(seg[j]))
            for name in names:
                have = accs.get(name)
                rec[f"{name}_{metric}"] = None if dead[j] or have is None else float(have[j])
            if correct is not None and not dead[j]:
                if metric == "accuracy":
                    rec["test_correct"] = encode_correct(correct[j])
                else:
                    rec["test_losses"] = encode_losses(correct[j])
            curves[j].append(rec)
            records.append(rec)
        if ck is not None and z < ex.num_rounds and not dead.all():
            if int(done.max()) - saved >= ck.every:  # before the callback: a kill there keeps it
                carried = {"state": state, "losses": losses, "done": done, "dead": dead}
                now = {"curves": curves, "diverged_step": diverged_step, "names": names}
                _checkpoint.save(ck.directory, z, carried, {**identity, **now})
                saved = int(done.max())
        if callback is not None:
            callback(z, records)
        if dead.all():
            break
    final = jax.device_get(ex.params(state))
    results = []
    for j in range(lanes):
        p, ms = lane(final[0], j, ex.vmapped), lane(final[1], j, ex.vmapped)
        if not dead[j] and not _finite(p):
            dead[j] = True
            diverged_step[j] = int(done[j])
        div = bool(dead[j])
        last = curves[j][-1] if curves[j] else {}
        fin = {n: None if div else last.get(f"{n}_{metric}") for n in names}
        acc = fin if metric == "accuracy" else {}
        results.append(
            Result(
                params=p,
                model_state=ms,
                losses=losses[j],
                curve=curves[j],
                diverged=div,
                diverged_step=diverged_step[j],
                final_test_accuracy=acc.get("test"),
                final_accuracy=acc,
                metric=metric,
                final_loss={} if metric == "accuracy" else fin,
            )
        )
    return results
