"""Local SGD / DiLoCo on one device: ``M`` workers' inner steps and the server's outer updates.

The server holds the global weights ``θ`` and the outer optimizer's state; each worker holds the
copy of ``θ`` it pulled (its dispatch point) and its **own inner optimizer state, which persists
across its jobs**. A job (a row of a :class:`~jaxstale.localsgd.schedule.LocalSchedule`) runs
``H_w`` inner steps of ``inner_tx`` from the worker's dispatch point on its mini-batches — a
``lax.scan`` — and yields the pseudo-gradient ``Δ = θ_dispatch − θ_local``. Then:

- **synchronous** (DiLoCo): the round's ``M`` jobs run vmapped from the same ``θ``, their
  ``Δ`` are averaged (never the parameters) and ``outer_tx`` applies the mean once
  (``staleness = 0``); every worker then starts from the new ``θ``.
- **asynchronous** (Liu et al.): each arrival is one outer update of its own ``Δ`` with
  ``staleness = t − pulled``; the worker pulls the new ``θ`` at once (with
  :func:`~jaxstale.transforms.lookahead.momentum_lookahead`, its look-ahead point).
- **overlapped** synchronous rounds (``outer_overlap``, :mod:`~jaxstale.localsgd.overlap`): the
  round's mean applied one round late (``"delayed"``), or Kale et al.'s eager updates.

``updates, state = outer_tx.update(Δ, state, θ, staleness=τ)``, ``θ ← θ + updates``: any Optax
transform is an outer optimizer (:mod:`jaxstale.transforms.outer`: DiLoCo's Nesterov, Delayed
Nesterov, staleness weights). Reductions (tested): one worker, ``H = 1`` and outer SGD at rate 1
without momentum is the inner optimizer itself; outer rate 1 without momentum is parameter
averaging (LocalSGD).

Driven by :func:`jaxstale.loop.run` like every executor (one round = one outer update; the
round's loss is the mean inner training loss of its jobs). Models without non-parameter state
(no batch norm).

References:
    Douillard et al., "DiLoCo", arXiv:2311.08105 (Algorithm 1). Liu et al., "Asynchronous
    Local-SGD Training for Language Modeling", arXiv:2401.09135.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale._batching import Indexed, check_streams, stream_shape
from jaxstale.localsgd import overlap as overlapped
from jaxstale.localsgd._trees import stack as _stack
from jaxstale.localsgd.core import (
    EXCHANGES,
    check_lookahead,
    check_model_state,
    check_streaming,
    inner_job,
)
from jaxstale.localsgd.quantize import exchange_mean, exchange_one
from jaxstale.localsgd.schedule import LocalSchedule
from jaxstale.localsgd.streaming import fragment_ids, init_outer, round_fn
from jaxstale.loop import Executor, Stats, jit
from jaxstale.losses import cross_entropy
from jaxstale.optimizers import set_hyperparams
from jaxstale.transforms.lookahead import lookahead_point

__all__ = ["executor"]


def _tables(schedules: Sequence[LocalSchedule]) -> dict[str, jax.Array]:
    """The schedules' jobs as int32 arrays ``[L, J]`` (``[L, rounds, M]`` when synchronous)."""
    tabs = {
        k: jnp.asarray(np.stack([getattr(s, k) for s in schedules]), jnp.int32)
        for k in ("worker", "pulled", "first_batch", "steps")
    }
    s0 = schedules[0]
    if s0.synchronous:
        tabs = {k: v.reshape(len(schedules), -1, s0.num_workers) for k, v in tabs.items()}
    return tabs


def _check(schedules: Sequence[LocalSchedule], xb: Any, yb: Any, lanes: int | None) -> None:
    s0 = schedules[0]
    for s in schedules[1:]:
        same = (s.num_workers, s.num_updates, s.synchronous, len(s.worker))
        if same != (s0.num_workers, s0.num_updates, s0.synchronous, len(s0.worker)):
            raise ValueError(
                "schedule: every lane's schedule needs the same workers, updates and kind"
            )
    check_streams(xb, yb)
    lead = () if lanes is None else (lanes,)
    for name, arr in (("xb", xb), ("yb", yb)):
        if stream_shape(arr)[: len(lead)] != lead:
            raise ValueError(
                f"{name} has shape {stream_shape(arr)}, expected a leading lane axis {lanes}"
            )
    nb, nby = (stream_shape(a)[len(lead)] for a in (xb, yb))
    need = max(s.num_batches for s in schedules)
    if nb < need or nby != nb:
        raise ValueError(f"xb has {nb} mini-batches (yb {nby}), the schedule consumes {need}")


def _on_device(xb: Any, yb: Any) -> tuple[Any, Any]:
    """The stream on the device: arrays, or :class:`~jaxstale.data.Indexed` with one copy of
    each split and of indices ``xb`` and ``yb`` share."""
    if not isinstance(xb, Indexed):
        return jnp.asarray(xb), jnp.asarray(yb)
    idx = jnp.asarray(xb.idx)
    yidx = idx if yb.idx is xb.idx else jnp.asarray(yb.idx)
    return Indexed(jnp.asarray(xb.x), idx), Indexed(jnp.asarray(yb.x), yidx)


def _batch(a: Any, b: jax.Array) -> jax.Array:
    """Mini-batch ``b`` of a stream: ``a[b]``, or gathered from an :class:`Indexed` one."""
    return a.x[a.idx[b]] if isinstance(a, Indexed) else a[b]


def _lane_values(
    hyperparams: Mapping[str, Mapping[str, Sequence[float]]] | None, lanes: int | None
) -> dict[str, dict[str, jax.Array]]:
    """``{"outer": {name: [L] float32}, "inner": {...}}`` (empty without hyper-parameters)."""
    out: dict[str, dict[str, jax.Array]] = {"outer": {}, "inner": {}}
    for side, values in (hyperparams or {}).items():
        if side not in out:
            raise ValueError(f"hyperparams: keys are 'outer' and 'inner', got {side!r}")
        if lanes is None:
            raise ValueError("hyperparams are per lane: pass lanes=L with them")
        for name, v in values.items():
            if len(v) != lanes:
                raise ValueError(
                    f"hyperparams[{side!r}][{name!r}]: {len(v)} values for {lanes} lanes"
                )
            out[side][name] = jnp.asarray(v, jnp.float32)
    return out


def executor(
    apply: Callable[..., tuple[jax.Array, Any]],
    inner_tx: optax.GradientTransformation,
    outer_tx: optax.GradientTransformation,
    schedule: LocalSchedule | Sequence[LocalSchedule],
    xb: Any,
    yb: Any,
    *,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    exchange: str = "fp32",
    lanes: int | None = None,
    hyperparams: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    fragments: int | Sequence[int] | None = None,
    overlap: int = 0,
    alpha: float = 0.0,
    outer_overlap: str = "none",
) -> Executor:
    """An :class:`~jaxstale.loop.Executor` of local SGD on the mini-batch stream ``(xb [NB, B,
    ...], yb [NB, B, ...])`` following ``schedule``: arrays, or :class:`~jaxstale.data.Indexed`
    indices into one copy of the data (gathered inside the jitted step, bit-identical; with
    ``lanes`` only the indices carry the lane axis, so a long run costs ``NB·B`` integers per
    lane instead of as many examples).

    Args:
        apply: ``apply(params, model_state, x, train) -> (logits, model_state)`` (a
            :class:`jaxstale.models.Functional`'s).
        inner_tx: every worker's optimizer (its state persists across the worker's jobs).
        outer_tx: the server's optimizer over pseudo-gradients; ``update`` gets
            ``staleness=τ`` as an extra argument (``optax.with_extra_args_support`` is applied
            to a plain transform).
        schedule: the jobs (:func:`~jaxstale.localsgd.schedule.synchronous` or
            :func:`~jaxstale.localsgd.schedule.asynchronous`); with ``lanes``, one per lane (or
            one for every lane).
        loss_fn: ``loss_fn(logits, labels) -> scalar``.
        exchange: how pseudo-gradients travel: ``"fp32"`` (as computed), ``"fp8"`` (rowwise
            absmax float8 e4m3, the replicas' mean re-quantized:
            :func:`~jaxstale.localsgd.quantize.fp8_mean`) or ``"fp4"`` (the same in e2m1).
        lanes: ``L`` runs at once, vmapped (e.g. seeds): ``xb``, ``yb`` and the initial
            weights carry a leading lane axis; the lanes' schedules need the same workers,
            updates and kind (a seed's own timing). Each lane equals its run alone.
        hyperparams: per-lane values of injected hyper-parameters (needs ``lanes``):
            ``{"outer": {"learning_rate": [one per lane]}, "inner": {...}}``, for an
            ``optax.inject_hyperparams`` outer or inner optimizer (every worker of a lane gets
            the lane's inner values), so that one compiled step serves a rate grid.
        fragments: Streaming DiLoCo (synchronous schedules only,
            :mod:`~jaxstale.localsgd.streaming`): ``P`` fragments of whole layers (an int) or a
            fragment id per weight tensor; one executor step is then one fragment's sync, every
            ``H/P`` inner steps (``H`` divisible by ``P``), and the run has ``rounds·P`` of them.
        overlap: Streaming DiLoCo's ``τ``: inner steps between a fragment's snapshot (and outer
            step) and its merge into the replicas, ``0 ≤ τ < H/P``.
        alpha: Streaming DiLoCo's merge ``x ← α·x + (1 − α)·g``, ``0 ≤ α ≤ 1`` (0: the
            replicas take the global weights, DiLoCo).
        outer_overlap: synchronous rounds whose outer exchange overlaps the next round
            (:mod:`~jaxstale.localsgd.overlap`): ``"none"`` (DiLoCo, the default),
            ``"delayed"`` (the mean applied one round late) or ``"eager"`` (Kale et al.'s
            eager updates: each worker's own fresh share with the others' delayed mean).

    Raises:
        ValueError: fewer mini-batches than the schedule consumes, an unknown ``exchange``,
            lanes that do not match, streaming settings out of range or given to an
            asynchronous schedule, an ``outer_overlap`` that is unknown or given to an
            asynchronous or streaming run; at ``init``, a model with non-parameter state (batch
            norm: each worker's running statistics would be dropped).
    """
    if exchange not in EXCHANGES:
        raise ValueError(f"unknown exchange {exchange!r}; choose from {', '.join(EXCHANGES)}")
    if lanes is not None and (isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1):
        raise ValueError(f"lanes must be a positive int, got {lanes!r}")
    if isinstance(schedule, LocalSchedule):
        schedules = [schedule] * (lanes or 1)
    else:
        schedules = list(schedule)
        if len(schedules) != (lanes or 1):
            raise ValueError(f"{len(schedules)} schedules for {lanes or 1} lanes")
    _check(schedules, xb, yb, lanes)
    hp = _lane_values(hyperparams, lanes)
    outer = optax.with_extra_args_support(outer_tx)
    s0 = schedules[0]
    m, sync = s0.num_workers, s0.synchronous
    h = max(s.inner_steps for s in schedules)
    streaming = check_streaming(s0, fragments, overlap, alpha)
    mode = overlapped.check_overlap(outer_overlap, sync, streaming)
    uniform = all(bool(np.all(s.steps == h)) for s in schedules)  # nothing to mask
    tables = _tables(schedules)
    xs, ys = _on_device(xb, yb)
    if lanes is None:
        tables = {k: v[0] for k, v in tables.items()}

    def job(
        p0: Any, s0: Any, first: jax.Array, steps: jax.Array, ms: Any, data: tuple, length: int
    ) -> tuple:
        """``length`` inner steps (the first ``steps`` of them applied): ``(p, s, loss sum)``."""
        xs, ys = data
        at = lambda i: (_batch(xs, first + i), _batch(ys, first + i))
        return inner_job(apply, inner_tx, loss_fn, p0, s0, steps, ms, at, length, not uniform)

    def outer_step(st: dict[str, Any], delta: Any, tau: jax.Array) -> tuple[Any, Any]:
        u, o = outer.update(delta, st["outer"], st["theta"], staleness=tau)
        return optax.apply_updates(st["theta"], u), o

    def round_sync(st: dict[str, Any], r: jax.Array, tabs: dict, data: tuple) -> tuple:
        first, steps = tabs["first_batch"][r], tabs["steps"][r]
        run = jax.vmap(job, in_axes=(None, 0, 0, 0, None, None, None))
        p_end, inner, totals = run(
            st["theta"], st["inner"], first, steps, st["model_state"], data, h
        )
        losses = totals / steps.astype(jnp.float32)
        deltas = jax.tree.map(lambda t, p: t[None] - p, st["theta"], p_end)
        delta = exchange_mean(deltas, exchange)
        theta, o = outer_step(st, delta, jnp.int32(0))
        new = {**st, "theta": theta, "outer": o, "inner": inner, "version": st["version"] + 1}
        return new, jnp.mean(losses)

    def arrival(st: dict[str, Any], t: jax.Array, tabs: dict, data: tuple) -> tuple:
        w = tabs["worker"][t]
        p0 = jax.tree.map(lambda a: a[w], st["dispatch"])
        s0 = jax.tree.map(lambda a: a[w], st["inner"])
        first, steps = tabs["first_batch"][t], tabs["steps"][t]
        p_end, s_new, total = job(p0, s0, first, steps, st["model_state"], data, h)
        loss = total / steps.astype(jnp.float32)
        delta = jax.tree.map(jnp.subtract, p0, p_end)
        delta = exchange_one(delta, exchange)  # one replica: Q(Q(Δ)) = Q(Δ)
        theta, o = outer_step(st, delta, st["version"] - tabs["pulled"][t])
        put = lambda stack, v: jax.tree.map(lambda a, b: a.at[w].set(b), stack, v)
        new = {
            **st,
            "theta": theta,
            "outer": o,
            "dispatch": put(st["dispatch"], lookahead_point(theta, o)),
            "inner": put(st["inner"], s_new),
            "version": st["version"] + 1,
        }
        return new, loss

    def round_overlapped(st: dict[str, Any], r: jax.Array, tabs: dict, data: tuple) -> tuple:
        first, steps = tabs["first_batch"][r], tabs["steps"][r]

        def run(starts: Any, per_worker: bool) -> tuple:
            axes = (0 if per_worker else None, 0, 0, 0, None, None, None)
            p_end, inner, totals = jax.vmap(job, in_axes=axes)(
                starts, st["inner"], first, steps, st["model_state"], data, h
            )
            return p_end, inner, jnp.mean(totals / steps.astype(jnp.float32))

        return overlapped.sync_step(st, run, outer, mode, exchange=exchange)

    fn = round_sync if sync else arrival
    if mode != "none":
        fn = round_overlapped
    if streaming:
        fn = round_fn(
            job,
            outer,
            fragments or 1,
            inner_steps=h,
            overlap=overlap,
            alpha=alpha,
            exchange=exchange,
        )
    if lanes is not None:
        # Indexed streams: the lane axis is on the indices, every lane shares the split
        axes = tuple(Indexed(None, 0) if isinstance(a, Indexed) else 0 for a in (xb, yb))
        fn = jax.vmap(fn, in_axes=(0, None, 0, axes))
    compiled = jit(fn, donate_argnums=(0,))

    def init_one(params: Any, model_state: Any, values: dict) -> dict[str, Any]:
        i = inner_tx.init(params)
        if streaming:
            o = init_outer(outer, params, fragment_ids(params, fragments or 1))
        else:
            o = outer.init(params)
        check_lookahead(o, sync)
        o = set_hyperparams(o, values["outer"]) if values["outer"] else o
        i = set_hyperparams(i, values["inner"]) if values["inner"] else i
        state = {
            "theta": params,
            "outer": o,
            "inner": _stack(i, m),
            "version": jnp.int32(0),
            "model_state": model_state,
        }
        if not sync:
            state["dispatch"] = _stack(params, m)
        if streaming:
            state["replicas"] = _stack(params, m)
        return overlapped.init_state(state, mode, m)

    def init(params: Any, model_state: Any) -> dict[str, Any]:
        check_model_state(model_state)
        params = jax.tree.map(jnp.asarray, params)
        state = (init_one if lanes is None else jax.vmap(init_one))(params, model_state, hp)
        # every leaf its own buffer: the step donates the state (optimizer states may share
        # zeros, and the caller keeps its weights)
        return jax.tree.map(lambda a: jnp.array(a, copy=True), state)

    n = lanes or 1

    def step(state: dict[str, Any], r: int) -> tuple[dict[str, Any], Stats]:
        state, loss = compiled(state, jnp.int32(r), tables, (xs, ys))
        loss_v = np.asarray(loss, np.float32).reshape(n, 1)
        return state, Stats(loss_v, np.ones((n, 1), np.int32))

    return Executor(
        init=init,
        step=step,
        params=lambda state: (state["theta"], state["model_state"]),
        apply=apply,
        num_rounds=s0.num_updates * (streaming or 1),
        num_updates=s0.num_updates * (streaming or 1),
        lanes=n,
        vmapped=lanes is not None,
    )
