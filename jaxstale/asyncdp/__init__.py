"""Asynchronous data parallelism: the method catalogue, one server, two executors of it.

:mod:`~jaxstale.asyncdp.methods` (the registry), :mod:`~jaxstale.asyncdp.server` (the update,
one pure function), :mod:`~jaxstale.asyncdp.emulator` (one device),
:mod:`~jaxstale.asyncdp.mesh` (workers on a ``"data"`` mesh axis) and
:mod:`~jaxstale.asyncdp.bn` (batch-norm merge policies). :func:`make` builds the executor of a
run (or of several batched runs on the emulator) — ``executor`` (:data:`EXECUTORS`) picks the
kind, nothing else changes — and :func:`run` drives one or several with
:func:`jaxstale.loop.run`.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> from jaxstale.delays import round_robin
    >>> from jaxstale.asyncdp import run
    >>> apply = lambda p, s, x, train: (x.reshape(len(x), -1) @ p, s)
    >>> rng = np.random.default_rng(0)
    >>> xb = rng.normal(size=(40, 8, 4)).astype(np.float32)
    >>> yb = (xb[..., 0] > 0).astype(np.int32)
    >>> r = run(apply, "asgd", jnp.zeros((4, 2)), {}, round_robin(4, 40), xb, yb,
    ...         learning_rate=0.5, x_test=xb[0], y_test=yb[0], executor="mesh")
    >>> r.diverged, r.final_test_accuracy, int(r.staleness.max())
    (False, 1.0, 3)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import jax
import numpy as np
import optax

from jaxstale import loop as _loop
from jaxstale._batching import check_pairs, stream_shape
from jaxstale.asyncdp import emulator as _emulator
from jaxstale.asyncdp import mesh as _mesh
from jaxstale.asyncdp import server as _server
from jaxstale.asyncdp.bn import async_bn_update as async_bn_update
from jaxstale.asyncdp.bn import batch_stats_from_update as batch_stats_from_update
from jaxstale.asyncdp.bn import merge_batch_stats as merge_batch_stats
from jaxstale.asyncdp.bn import ordinary_bn_update as ordinary_bn_update
from jaxstale.asyncdp.bn import recompute_batch_stats as recompute_batch_stats
from jaxstale.asyncdp.emulator import AsyncEmulator as AsyncEmulator
from jaxstale.asyncdp.mesh import AsyncMesh as AsyncMesh
from jaxstale.asyncdp.methods import METHOD_MODES as METHOD_MODES
from jaxstale.asyncdp.methods import METHODS as METHODS
from jaxstale.asyncdp.methods import MODES as MODES
from jaxstale.asyncdp.methods import HParams as HParams
from jaxstale.asyncdp.methods import Method as Method
from jaxstale.asyncdp.methods import MethodSpec as MethodSpec
from jaxstale.asyncdp.methods import as_spec as as_spec
from jaxstale.asyncdp.methods import build_method as build_method
from jaxstale.asyncdp.methods import check_hyperparameters
from jaxstale.asyncdp.methods import lr_warmup as lr_warmup
from jaxstale.asyncdp.methods import method_mode as method_mode
from jaxstale.asyncdp.methods import method_names as method_names
from jaxstale.asyncdp.methods import register_method as register_method
from jaxstale.asyncdp.methods import resolve as resolve
from jaxstale.asyncdp.server import AsyncServer as AsyncServer
from jaxstale.asyncdp.server import AsyncState as AsyncState
from jaxstale.asyncdp.server import ServerHParams as ServerHParams
from jaxstale.delays import DelaySchedule
from jaxstale.mesh import async_rounds as async_rounds
from jaxstale.mesh import default_data_mesh as default_data_mesh

EXECUTORS: tuple[str, ...] = ("emulate", "mesh")


class EmulationResult(NamedTuple):
    """One run of :func:`run`: the fields of :class:`jaxstale.loop.Result` and ``staleness``,
    ``[steps]``, the staleness of every applied gradient (zeros in ``"sync"`` mode)."""

    params: Any
    model_state: Any
    losses: np.ndarray
    curve: list[dict]
    diverged: bool
    diverged_step: int | None
    final_test_accuracy: float | None
    final_accuracy: dict[str, float | None]
    metric: str
    final_loss: dict[str, float | None]
    staleness: np.ndarray


def _lanes(value: Any, many: bool, n: int, what: str) -> list[Any]:
    out = list(value) if many else [value]
    if len(out) != n:
        raise ValueError(f"{what}: {len(out)} values for {n} runs (one per schedule)")
    return out


def make(
    executor: str,
    apply: Callable[..., Any],
    method: Method,
    schedule: DelaySchedule | Sequence[DelaySchedule],
    x_batches: Any,
    y_batches: Any,
    *,
    learning_rate: Any = None,
    momentum: float = 0.0,
    warmup_steps: int = 0,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    loop: str = "auto",
    vmap: bool = True,
    extra_args: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    _cores: dict[tuple[Any, ...], Any] | None = None,
) -> _loop.Executor:
    """The executor of one run of a method, or of several at once on the emulator (its lanes,
    batched with ``jax.vmap``), as :func:`jaxstale.pipeline.make` and
    :func:`jaxstale.localsgd.make` return theirs: the mesh, and the emulator with ``vmap``
    False, run one run (several are refused: :func:`run` takes lists for them and makes one
    executor a run).

    Update ``t`` of a run uses mini-batch ``schedule.batch[t]`` of its stream ``x_batches`` (an
    int-indexable ``[num_batches, B, ...]`` array covering ``max(schedule.batch) + 1`` batches;
    for M = 1 batch ``t``: the synchronous trainer's run); SSGD consumes the ``T`` updates'
    worth of batches M per step. Several runs are lists of equal length (schedules of equal
    ``T``, streams, learning rates, ``extra_args`` dicts). ``executor`` (:data:`EXECUTORS`):
    ``"emulate"`` (one device; several runs share one compiled step, batched; ``loop`` is
    ``"auto"``, ``"scan"`` or ``"host"``) or ``"mesh"`` (workers on a ``"data"`` axis of
    ``mesh``, default a device per worker). ``learning_rate`` is required for names and
    builders; ``warmup_steps`` ramps it from ``η/M``; ``extra_args`` are per-update arguments
    for the transforms (name -> ``[T]``; timed delay models add ``t_comm`` / ``t_comp``).
    ``_cores`` is :func:`run`'s: the compiled cores its executors share, by ``M``.

    Raises:
        ValueError: among others, a learning rate that is negative, NaN or infinite, a
            ``momentum`` outside ``[0, 1)``, an unknown ``executor``, several runs on the mesh
            or with ``vmap`` False.
        TypeError: a schedule that is not a :class:`~jaxstale.delays.DelaySchedule`, a
            learning rate or momentum that is not a number.
    """
    check_hyperparameters("make", learning_rate, momentum)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    many = not isinstance(schedule, DelaySchedule)
    scheds: list[DelaySchedule] = list(schedule) if many else [schedule]  # type: ignore[arg-type,list-item]
    n = len(scheds)
    if n == 0 or not all(isinstance(s, DelaySchedule) for s in scheds):
        raise TypeError("schedule must be a DelaySchedule or a non-empty list of them")
    if n > 1 and (executor == "mesh" or not vmap):
        how = "on the mesh" if executor == "mesh" else "with vmap=False"
        raise ValueError(
            f"make: {n} runs {how}: it runs one run; make one executor a run "
            "(or asyncdp.run, which takes the lists)"
        )
    scheds = [s.validate() for s in scheds]  # a hand-built schedule gets the constructors' checks
    xs, ys = _lanes(x_batches, many, n, "x_batches"), _lanes(y_batches, many, n, "y_batches")
    if learning_rate is None:
        if not isinstance(method, optax.GradientTransformation | MethodSpec):
            raise ValueError("learning_rate is required when method is a name or a builder")
        learning_rate = 0.0
    broadcast = not isinstance(learning_rate, list | tuple)
    lrs = _lanes([learning_rate] * n if broadcast else learning_rate, True, n, "learning_rate")
    hp = _server.ServerHParams(0.1, 1)
    sync = _server.build_spec(resolve(method), hp, momentum, warmup_steps).mode == "sync"
    ms, t_count = [s.num_workers for s in scheds], scheds[0].num_updates
    if any(s.num_updates != t_count for s in scheds):
        raise ValueError("all schedules must have the same num_updates")
    if sync and len(set(ms)) > 1:
        raise ValueError(f"sync mode: all runs need the same number of workers, got {ms}")
    per = ms[0] if sync else 1  # mini-batches per update
    steps = t_count // per
    if steps < 1:
        raise ValueError(f"sync mode needs num_updates >= num_workers ({t_count} < {per})")
    if isinstance(extra_args, list | tuple):
        user = [dict(e) for e in _lanes(extra_args, True, n, "extra_args")]
    else:
        user = [dict(cast(dict[str, Any], extra_args or {}))] * n
    extras: list[dict[str, np.ndarray]] = []
    for u, s in zip(user, scheds, strict=True):
        ex = {} if sync else {k: np.asarray(v) for k, v in u.items()}
        for k, v in ex.items():
            if v.shape[:1] != (steps,):
                raise ValueError(f"extra_args[{k!r}] must have {steps} entries per run")
        if not sync and s.start_time is not None and s.finish_time is not None:
            ex.setdefault("t_comm", s.start_time.astype(np.float32))
            ex.setdefault("t_comp", (s.finish_time - s.start_time).astype(np.float32))
        extras.append(ex)
    if len({tuple(sorted(ex)) for ex in extras}) > 1:
        raise ValueError("every run needs the same extra arguments (timed or untimed delays)")
    for xb, yb in zip(xs, ys, strict=True):
        check_pairs(stream_shape(xb), stream_shape(yb), "x_batches", "y_batches")
    for xb, s in zip(xs, scheds, strict=True):
        need = steps * per if sync else int(np.max(s.batch)) + 1
        if len(xb) < need:
            raise ValueError(f"x_batches has {len(xb)} batches; the schedule needs {need}")
    kw: dict[str, Any] = {"momentum": momentum, "warmup_steps": warmup_steps, "loss_fn": loss_fn}
    cores = {} if _cores is None else _cores
    if executor == "mesh":
        if ("mesh", ms[0]) not in cores:
            cores["mesh", ms[0]] = _mesh.AsyncMesh(apply, method, ms[0], mesh=mesh, **kw)
        core = cores["mesh", ms[0]]
        return _mesh.executor(
            core, scheds[0], xs[0], ys[0], learning_rate=lrs[0], extra=extras[0]
        )  # fmt: skip
    batched = vmap and n > 1
    key = ("emulate", max(ms), batched)
    if key not in cores:
        cores[key] = _emulator.AsyncEmulator(
            apply, method, max(ms), loop=loop, vmap=batched, **kw
        )  # fmt: skip
    if sync:  # round r uses batches r·M … r·M + M − 1, all at w_r
        bidx = [np.arange(steps * per).reshape(steps, per)] * n
        worker = stale = np.zeros((n, steps), np.int32)
    else:
        bidx = [s.batch for s in scheds]
        worker = np.stack([s.worker for s in scheds])
        stale = np.stack([s.staleness for s in scheds])
    return _emulator.executor(
        cores[key],
        bidx,
        worker,
        stale,
        {k: np.stack([e[k] for e in extras]) for k in extras[0]},
        xs,
        ys,
        learning_rate=lrs,
        num_workers=ms,
        batches_per_update=per,
    )


def run(
    apply: Callable[..., Any],
    method: Method,
    params: Any,
    model_state: Any,
    schedule: DelaySchedule | Sequence[DelaySchedule],
    x_batches: Any,
    y_batches: Any,
    *,
    executor: str = "emulate",
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    eval_data: Mapping[str, tuple[Any, Any]] | None = None,
    eval_every: int | None = None,
    metric: str = "accuracy",
    **kwargs: Any,
) -> EmulationResult | list[EmulationResult]:
    """Train one run, or several at once (lists, as for :func:`make`), with asynchronous workers
    (or SSGD / DANA): :func:`make` with ``**kwargs``, then :func:`jaxstale.loop.run` from
    ``(params, model_state)`` (lists for several runs), evaluating every ``eval_every``
    mini-batches (default: once, at the end) on ``eval_data`` (``{split: (x, y)}``, e.g.
    ``{"val": ..., "test": ...}``) or on ``(x_test, y_test)`` (the ``"test"`` split), measuring
    ``metric`` (:func:`jaxstale.loop.run`'s: ``"accuracy"``, or a language model's ``"loss"``).
    Returns one :class:`EmulationResult` per run (a single one for a single run).

    Raises:
        ValueError, TypeError: bad arguments, before anything runs (see :func:`make`).
    """
    _check_kwargs("run", kwargs)
    many = not isinstance(schedule, DelaySchedule)
    n = len(schedule) if many else 1
    ps, mss = _lanes(params, many, n, "params"), _lanes(model_state, many, n, "model_state")
    scheds: list[DelaySchedule] = list(schedule) if many else [schedule]  # type: ignore[arg-type,list-item]
    stack = lambda trees: jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *trees)
    results: list[Any] = [None] * n
    splits = dict(eval_data or {})
    if x_test is not None and y_test is not None:
        splits.setdefault("test", (x_test, y_test))
    xs, ys = _lanes(x_batches, many, n, "x_batches"), _lanes(y_batches, many, n, "y_batches")
    batched = many and n > 1 and executor == "emulate" and kwargs.get("vmap", True)
    groups = [list(range(n))] if batched else [[i] for i in range(n)]
    per_run = {k: _lanes(kwargs[k], True, n, k) for k in ("learning_rate", "extra_args")
               if isinstance(kwargs.get(k), list | tuple)}  # fmt: skip
    cores: dict[tuple[Any, ...], Any] = {}
    one = lambda v, g: v[g[0]] if len(g) == 1 and not batched else [v[i] for i in g]
    made = [  # every executor made (every run's arguments checked) before anything runs
        (
            make(executor, apply, method, one(scheds, g), one(xs, g), one(ys, g),
                 **{**kwargs, **{k: one(v, g) for k, v in per_run.items()}}, _cores=cores),
            g,
        )
        for g in groups
    ]  # fmt: skip
    for ex, group in made:
        per = ex.batches_per_update or 1
        every = max(1, (eval_every or scheds[0].num_updates) // per)
        p0 = stack([ps[i] for i in group]) if ex.vmapped else ps[group[0]]
        s0 = stack([mss[i] for i in group]) if ex.vmapped else mss[group[0]]
        out = _loop.run(ex, p0, s0, eval_every=every, eval_data=splits or None, metric=metric)
        for i, r in zip(group, out, strict=True):
            stale = np.zeros(ex.num_updates, np.int32) if per > 1 else scheds[i].staleness
            results[i] = EmulationResult(*r, staleness=stale)
    return results if many else results[0]


def _check_kwargs(where: str, kwargs: dict[str, Any]) -> None:
    """The learning rate(s) and momentum of a call, refused with ``where`` first (the caller)."""
    check_hyperparameters(where, kwargs.get("learning_rate"), kwargs.get("momentum"))


def emulate_async(*args: Any, **kwargs: Any) -> EmulationResult | list[EmulationResult]:
    """:func:`run` on the single-device emulator (``executor="emulate"``).

    Raises:
        ValueError: among others, a ``learning_rate`` that is negative, NaN or infinite, or a
            ``momentum`` outside ``[0, 1)``, before anything runs (see :func:`make`).
        TypeError: a learning rate or momentum that is not a number.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from jaxstale import emulate_async, delays
        >>> apply = lambda p, s, x, train: (x @ p, s)
        >>> xb, yb = np.ones((8, 2, 4), np.float32), np.zeros((8, 2), np.int32)
        >>> r = emulate_async(apply, "asgd", jnp.zeros((4, 2)), {}, delays.round_robin(2, 8),
        ...                   xb, yb, learning_rate=0.1)
        >>> r.staleness.tolist()
        [0, 1, 1, 1, 1, 1, 1, 1]
    """
    _check_kwargs("emulate_async", kwargs)
    return run(*args, executor="emulate", **kwargs)


def run_async(*args: Any, **kwargs: Any) -> EmulationResult | list[EmulationResult]:
    """:func:`run` on the ``"data"``-axis mesh executor (``executor="mesh"``).

    Raises:
        ValueError, TypeError: bad arguments, before anything runs (as :func:`emulate_async`).

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from jaxstale import run_async, delays
        >>> apply = lambda p, s, x, train: (x @ p, s)
        >>> xb, yb = np.ones((8, 2, 4), np.float32), np.zeros((8, 2), np.int32)
        >>> run_async(apply, "ssgd", jnp.zeros((4, 2)), {}, delays.round_robin(2, 8), xb, yb,
        ...           learning_rate=0.1).losses.shape   # SSGD: 8 batches, 4 updates
        (4,)
    """
    _check_kwargs("run_async", kwargs)
    return run(*args, executor="mesh", **kwargs)
