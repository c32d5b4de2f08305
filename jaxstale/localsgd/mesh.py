"""Local SGD / DiLoCo on a device mesh: each worker's inner steps on its own device.

``M`` workers live on the ``"data"`` axis of a mesh of ``D`` devices (``D`` divides ``M``):
worker ``i``'s inner optimizer state (and, asynchronously, its dispatch point) is row ``i`` of
``[M, ...]`` stacks sharded ``P('data')``; the server (global weights, outer state) is
replicated. A round's jobs run in parallel (``jax.shard_map``, each device vmapping its
``M / D`` workers over their own ``[H, B, ...]`` mini-batches), then:

- **synchronous** (DiLoCo): the ``M`` pseudo-gradients are gathered to every device and
  averaged there as the emulator averages them (``mean`` over the stacked ``[M, ...]``, or the
  low-precision exchange), then one outer update;
- **asynchronous**: a round is the longest run of consecutive arrivals in which no worker
  appears twice (each job starts from a dispatch point no arrival of the round changes); the
  arrivals' outer updates then apply in order, each worker's dispatch point set to the weights
  after its own arrival.

- **Streaming DiLoCo** (``fragments``, ``overlap``, ``alpha``): the replicas ``[M, ...]`` are
  sharded like the inner states; each sync's inner steps run on the workers' devices, the
  replicas are gathered for the fragment's mean and outer step
  (:func:`~jaxstale.localsgd.streaming.sync_step`, the emulator's own), the merge is local.

Every number equals :mod:`jaxstale.localsgd.emulator`'s to float32 rounding (tested): the same
:func:`~jaxstale.localsgd.core.inner_job`, the same outer update. One run (no lanes).

References:
    Douillard et al., "DiLoCo", arXiv:2311.08105. Liu et al., "Asynchronous Local-SGD Training
    for Language Modeling", arXiv:2401.09135.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxstale._batching import materialised
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
from jaxstale.localsgd.streaming import fragment_ids, init_outer, sync_step
from jaxstale.loop import Executor, Stats, jit
from jaxstale.losses import cross_entropy
from jaxstale.mesh import (
    async_rounds,
    check_mesh,
    check_processes,
    default_data_mesh,
    fetch_global,
    to_mesh,
)
from jaxstale.transforms.lookahead import lookahead_point

__all__ = ["executor", "local_rounds"]


def local_rounds(schedule: LocalSchedule) -> list[tuple[int, int]]:
    """The outer updates ``[a, z)`` whose jobs run in parallel: a synchronous round each, or
    runs of consecutive arrivals with no worker twice.

    Example:
        >>> from jaxstale.localsgd import asynchronous
        >>> s = asynchronous(3, 7, 4, seed=0)
        >>> rounds = local_rounds(s)
        >>> rounds[0][0], rounds[-1][1]
        (0, 7)
    """
    if schedule.synchronous:
        return [(r, r + 1) for r in range(schedule.num_updates)]
    return async_rounds(schedule)


def executor(
    apply: Callable[..., tuple[jax.Array, Any]],
    inner_tx: optax.GradientTransformation,
    outer_tx: optax.GradientTransformation,
    schedule: LocalSchedule,
    xb: Any,
    yb: Any,
    *,
    mesh: jax.sharding.Mesh | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    exchange: str = "fp32",
    fragments: int | Sequence[int] | None = None,
    overlap: int = 0,
    alpha: float = 0.0,
    outer_overlap: str = "none",
) -> Executor:
    """An :class:`~jaxstale.loop.Executor` of local SGD on a ``"data"`` mesh (arguments as
    :func:`jaxstale.localsgd.executor`'s, Streaming DiLoCo's ``fragments``, ``overlap`` and
    ``alpha`` and the delayed or eager ``outer_overlap`` included, the stream as arrays or
    :class:`~jaxstale.data.Indexed`, materialised here; ``mesh``: default
    :func:`jaxstale.mesh.default_data_mesh`, the
    largest ``D ≤`` the devices that divides ``M``).

    Raises:
        ValueError: ``D`` does not divide ``M``, an unknown ``exchange``, fewer mini-batches
            than the schedule consumes, a model with non-parameter state, streaming settings
            out of range or given to an asynchronous schedule, a bad ``outer_overlap``.
    """
    if exchange not in EXCHANGES:
        raise ValueError(f"unknown exchange {exchange!r}; choose from {', '.join(EXCHANGES)}")
    m, sync = schedule.num_workers, schedule.synchronous
    if mesh is None:
        mesh = default_data_mesh(m)
    if "data" not in dict(getattr(mesh, "shape", {})):
        check_mesh(mesh, "data", m)  # raises, saying how to build one
    check_processes(mesh)
    d = int(dict(mesh.shape)["data"])
    if m % d:
        raise ValueError(f"the mesh's {d} 'data' devices must divide the {m} workers")
    # Indexed streams are materialised: each device takes its workers' mini-batches
    xb, yb = materialised(xb, yb)
    if np.shape(xb)[0] < schedule.num_batches:
        raise ValueError(
            f"xb has {np.shape(xb)[0]} mini-batches, the schedule consumes {schedule.num_batches}"
        )
    outer = optax.with_extra_args_support(outer_tx)
    h = schedule.inner_steps
    streaming = check_streaming(schedule, fragments, overlap, alpha)
    mode = overlapped.check_overlap(outer_overlap, sync, streaming)
    frags = fragments or 1
    masked = not bool(np.all(schedule.steps == h))
    rep, data = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
    rounds = local_rounds(schedule)

    def jobs(
        st: dict[str, Any],
        starts: Any,
        xr: Any,
        yr: Any,
        steps: jax.Array,
        inner: Any = None,
        offset: int = 0,
        length: int = h,
    ) -> tuple:
        """Every worker's job of the round on its device: ``(p_end, inner, loss sums)``;
        ``starts``: the workers' ``[M, ...]`` dispatch points, or ``None``: every job from
        ``θ`` (vmapped unbatched, as the emulator's synchronous round); ``length`` steps from
        the ``offset``-th of the round's mini-batches (``inner``: default the state's)."""
        common = starts is None

        def local(starts: Any, inner: Any, ms: Any, xr: Any, yr: Any, steps: jax.Array) -> tuple:
            def one(p0: Any, s0: Any, x: Any, y: Any, n: jax.Array) -> tuple:
                at = lambda i: (x[offset + i], y[offset + i])
                return inner_job(apply, inner_tx, loss_fn, p0, s0, n, ms, at, length, masked)

            axes = (None if common else 0, 0, 0, 0, 0)
            return jax.vmap(one, in_axes=axes)(starts, inner, xr, yr, steps)

        spec_d, spec_r = PartitionSpec("data"), PartitionSpec()
        return jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(spec_r if common else spec_d, spec_d, spec_r, spec_d, spec_d, spec_d),
            out_specs=spec_d,
            check_vma=False,
        )(
            st["theta"] if common else starts,
            st["inner"] if inner is None else inner,
            st["model_state"],
            xr,
            yr,
            steps,
        )

    def gather(tree: Any) -> Any:
        """``[M, ...]`` rows sharded on ``"data"`` -> every device's full copy."""
        return jax.shard_map(
            lambda x: jax.lax.all_gather(x, "data", tiled=True),
            mesh=mesh,
            in_specs=PartitionSpec("data"),
            out_specs=PartitionSpec(),
            check_vma=False,
        )(tree)

    def round_sync(st: dict[str, Any], xr: Any, yr: Any, steps: jax.Array, _order: Any) -> tuple:
        p_end, inner, totals = jobs(st, None, xr, yr, steps)
        deltas = jax.tree.map(lambda t, p: t[None] - p, st["theta"], p_end)
        deltas = gather(deltas)  # to every device, then the emulator's very mean
        delta = exchange_mean(deltas, exchange)
        u, o = outer.update(delta, st["outer"], st["theta"], staleness=jnp.int32(0))
        theta = optax.apply_updates(st["theta"], u)
        new = {**st, "theta": theta, "outer": o, "inner": inner, "version": st["version"] + 1}
        return new, jnp.mean(totals / steps.astype(jnp.float32))[None]

    def round_overlapped(
        st: dict[str, Any], xr: Any, yr: Any, steps: jax.Array, _order: Any
    ) -> tuple:
        def run(starts: Any, per_worker: bool) -> tuple:
            p_end, inner, totals = jobs(st, starts if per_worker else None, xr, yr, steps)
            return p_end, inner, jnp.mean(totals / steps.astype(jnp.float32))

        new, loss = overlapped.sync_step(st, run, outer, mode, exchange=exchange, gather=gather)
        return new, loss[None]

    def round_async(st: dict[str, Any], xr: Any, yr: Any, steps: jax.Array, order: Any) -> tuple:
        """``order``: ``[M, 3]`` the round's arrivals as ``(worker, pulled, valid)``."""
        p_end, inner, totals = jobs(st, st["dispatch"], xr, yr, jnp.maximum(steps, 1))
        present = steps > 0
        keep = lambda new, old: jax.tree.map(
            lambda a, b: jnp.where(present.reshape(-1, *[1] * (a.ndim - 1)), a, b), new, old
        )
        st = {**st, "inner": keep(inner, st["inner"])}

        def body(s: dict[str, Any], ev: jax.Array) -> tuple:
            w, pulled, valid = ev[0], ev[1], ev[2]

            def go(s: dict[str, Any]) -> tuple:
                p0 = jax.tree.map(lambda a: a[w], s["dispatch"])
                delta = jax.tree.map(lambda a, b: a - b[w], p0, p_end)
                delta = exchange_one(delta, exchange)
                tau = s["version"] - pulled
                u, o = outer.update(delta, s["outer"], s["theta"], staleness=tau)
                theta = optax.apply_updates(s["theta"], u)
                pull = lookahead_point(theta, o)
                disp = jax.tree.map(lambda a, b: a.at[w].set(b), s["dispatch"], pull)
                new = {**s, "theta": theta, "outer": o, "dispatch": disp}
                return {**new, "version": s["version"] + 1}, totals[w] / steps[w].astype(
                    jnp.float32
                )

            return jax.lax.cond(valid > 0, go, lambda s: (s, jnp.float32(0.0)), s)

        return jax.lax.scan(body, st, order)

    def round_streaming(st: dict[str, Any], xr: Any, yr: Any, steps: jax.Array, j: Any) -> tuple:
        """Sync ``k`` of fragment ``j``: ``xr`` holds each worker's ``H/P`` mini-batches."""

        def run(x: Any, s: Any, offset: int, n: int) -> tuple:
            return jobs(st, x, xr, yr, jnp.full_like(steps, n), s, offset, n)

        new, loss = sync_step(
            st, j, run, outer, frags, inner_steps=h, overlap=overlap, alpha=alpha,
            exchange=exchange,
            gather=gather,
        )  # fmt: skip
        return new, loss[None]

    compiled: list[Callable[..., Any]] = []  # built by init: the state's shardings pinned
    xs, ys = np.asarray(xb), np.asarray(yb)

    def init(params: Any, model_state: Any) -> dict[str, Any]:
        check_model_state(model_state)
        params = jax.tree.map(jnp.asarray, params)
        state = {
            "theta": params,
            "outer": (
                init_outer(outer, params, fragment_ids(params, frags))
                if streaming
                else outer.init(params)
            ),
            "inner": _stack(inner_tx.init(params), m),
            "version": jnp.int32(0),
            "model_state": model_state,
        }
        check_lookahead(state["outer"], sync)
        shard = {k: jax.tree.map(lambda _: rep, v) for k, v in state.items()}
        shard["inner"] = jax.tree.map(lambda _: data, state["inner"])
        for rows in ("dispatch",) if not sync else ("replicas",) if streaming else ():
            state[rows] = _stack(params, m)
            shard[rows] = jax.tree.map(lambda _: data, state[rows])
        state = overlapped.init_state(state, mode, m)
        for key in overlapped.ROW_KEYS if mode == "eager" else ():
            shard[key] = jax.tree.map(lambda _: data, state[key])
        shard.update(
            {k: jax.tree.map(lambda _: rep, v) for k, v in state.items() if k not in shard}
        )
        state = jax.tree.map(lambda a: np.array(a, copy=True), state)
        if not compiled:  # keep each worker's rows on its device across rounds
            fn = round_streaming if streaming else round_sync if sync else round_async
            fn = round_overlapped if mode != "none" else fn
            compiled.append(jit(fn, donate_argnums=(0,), out_shardings=(shard, rep)))
        return to_mesh(state, shard)

    def host_round(a: int, z: int) -> tuple[Any, ...]:
        """The round's ``[M, H, B, ...]`` batches, steps and arrivals (host arrays)."""
        ev = np.arange(a * m, z * m) if sync else np.arange(a, z)
        rows = schedule.worker[ev]
        first = np.zeros(m, np.int64)
        steps = np.zeros(m, np.int32)
        first[rows], steps[rows] = schedule.first_batch[ev], schedule.steps[ev]
        idx = np.minimum(first[:, None] + np.arange(h)[None], len(xs) - 1)
        order = np.zeros((m, 3), np.int32)
        if not sync:
            order[: len(ev)] = np.stack([rows, schedule.pulled[ev], np.ones_like(rows)], 1)
        return xs[idx], ys[idx], steps, order

    def host_sync(k: int) -> tuple[Any, ...]:
        """Sync ``k``'s ``[M, H/P, B, ...]`` batches (fragment ``k mod P``)."""
        length = h // streaming
        ev = np.arange((k // streaming) * m, (k // streaming + 1) * m)
        first = np.zeros(m, np.int64)
        first[schedule.worker[ev]] = schedule.first_batch[ev] + (k % streaming) * length
        idx = first[:, None] + np.arange(length)[None]
        return xs[idx], ys[idx], np.full(m, length, np.int32), np.int32(k % streaming)

    def advance(state: dict[str, Any], a: int, z: int) -> tuple[dict[str, Any], Stats]:
        if streaming:
            losses = []
            for k in range(a, z):
                xr, yr, steps, j = host_sync(k)
                xr, yr, steps = to_mesh((xr, yr, steps), data)
                state, loss = compiled[0](state, xr, yr, steps, to_mesh(j, rep))
                losses.append(np.asarray(loss, np.float32))
            loss_v = np.concatenate(losses).reshape(1, z - a)
            return state, Stats(loss_v, np.ones_like(loss_v, np.int32))
        losses = []
        for ra, rz in rounds:
            if rz <= a or ra >= z:
                continue
            lo, hi = max(ra, a), min(rz, z)
            xr, yr, steps, order = host_round(lo, hi)
            xr, yr, steps = to_mesh((xr, yr, steps), data)
            state, loss = compiled[0](state, xr, yr, steps, to_mesh(order, rep))
            losses.append(np.asarray(loss, np.float32)[: hi - lo])
        loss_v = np.concatenate(losses).reshape(1, z - a)
        return state, Stats(loss_v, np.ones_like(loss_v, np.int32))

    return Executor(
        init=init,
        step=lambda state, r: advance(state, r, r + 1),
        params=lambda state: fetch_global((state["theta"], state["model_state"])),
        apply=apply,
        num_rounds=schedule.num_updates * (streaming or 1),
        num_updates=schedule.num_updates * (streaming or 1),
        advance=advance,
    )
