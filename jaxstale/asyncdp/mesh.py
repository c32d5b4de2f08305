"""Asynchronous data parallelism on a device mesh: workers' gradients in parallel, server in order.

``M`` workers live on the ``"data"`` axis of a mesh of ``D`` devices (``C`` = ``M`` rounded up
to a multiple of ``D``): worker ``i``'s snapshot and the model state it pulled are row ``i`` of
``[C, ...]`` stacks sharded ``P('data')``; the server (weights, optimizer state, DANA's momenta)
is replicated. A round's gradients are computed in parallel (``jax.shard_map``, each device
vmapping its ``C / D`` workers), then every device applies
:func:`jaxstale.asyncdp.server.async_update` for each, in the delay model's order — the
emulator's very server, so every method behaves as in :mod:`jaxstale.asyncdp.emulator`.

A round (:func:`jaxstale.mesh.async_rounds`) is the longest run of consecutive updates in which
no worker appears twice: each of its gradients is taken at a snapshot no update of the round
changes. Round-robin and constant delay give rounds of ``M`` updates; gamma-timed workers end
a round where a fast worker finishes twice; evaluation points cut rounds too. SSGD: each device
computes its ``C / D`` gradients at the common weights (when ``D`` does not divide ``M``, the
last ``C − M`` on zero padding mini-batches, then dropped), the server averages the ``M``.

**Several processes** (:mod:`jaxstale.distributed`): the mesh may span the devices of several
processes, each running the same program on the same host data (delay schedule, mini-batches,
initial weights). Every process must hold a device of the mesh
(:func:`jaxstale.mesh.default_data_mesh` and :func:`jaxstale.mesh.make_mesh` take devices from
every process); host values go onto the mesh
with :func:`jaxstale.mesh.to_mesh` (each process fills its own devices' shards), the round's
losses and the server's weights are replicated, so every process reads them from its own
devices (``executor(...).params`` returns them as numpy there); results are written by process
0 (:class:`experiments.runs.RunFolder` does so). In one process this is the same code path as
before: ``jax.device_put`` and device arrays.

References:
    JAX documentation, "Manual parallelism with shard_map"
    (https://docs.jax.dev/en/latest/notebooks/shard_map.html).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxstale.asyncdp import server
from jaxstale.asyncdp.methods import Method, MethodSpec, check_hyperparameters
from jaxstale.asyncdp.server import AsyncServer, AsyncState, ServerHParams
from jaxstale.delays import DelaySchedule
from jaxstale.loop import Executor, Stats, jit
from jaxstale.mesh import (
    async_rounds,
    check_mesh,
    check_processes,
    default_data_mesh,
    fetch_global,
    to_mesh,
)

__all__ = ["AsyncMesh", "executor"]


class AsyncMesh:
    """The compiled round of one method on one model on a ``"data"`` mesh axis.

    Args:
        apply: ``apply(params, model_state, x, train) -> (logits, new_model_state)``.
        method: a registered name, a builder, an optax transformation or a ``MethodSpec``.
        num_workers: ``M``.
        mesh: a mesh with a ``"data"`` axis of ``D`` devices (default :func:`default_data_mesh`),
            holding a device of every process.
        momentum: ``μ`` in ``[0, 1)`` for builders.
        warmup_steps: learning-rate warm-up (updates), as in the emulator.
        loss_fn: ``loss_fn(logits, labels)``; default mean cross-entropy.

    Attributes:
        server: the :class:`~jaxstale.asyncdp.server.AsyncServer` it runs (the emulator's, with
            capacity ``C``, ``M`` rounded up to a multiple of ``D``), replicated on every device.
    """

    def __init__(
        self,
        apply: Callable[..., Any],
        method: Method,
        num_workers: int,
        *,
        mesh: jax.sharding.Mesh | None = None,
        momentum: float = 0.0,
        warmup_steps: int = 0,
        loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    ) -> None:
        m = num_workers
        if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
            raise ValueError(f"num_workers must be a positive int, got {m!r}")
        mesh = default_data_mesh(m) if mesh is None else mesh
        if "data" not in dict(getattr(mesh, "shape", {})):
            check_mesh(mesh, "data", m)  # raises with a clear message
        check_processes(mesh)
        d = int(dict(mesh.shape)["data"])
        self.capacity = -(-m // d) * d
        self.server = AsyncServer.create(
            method,
            self.capacity,
            momentum=momentum,
            warmup_steps=warmup_steps,
            num_workers=m,
            where="AsyncMesh",
        )
        self.mesh, self.apply, self.loss_fn, self.num_workers = mesh, apply, loss_fn, m
        self._rep = NamedSharding(mesh, PartitionSpec())
        self._data = NamedSharding(mesh, PartitionSpec("data"))
        self._init = jit(self.server.init)
        self._round: Callable[..., Any] | None = None

    @property
    def mode(self) -> str:
        """The method's mode: ``"async"``, ``"sync"`` or ``"dana"``."""
        return self.server.mode

    def spec(self, hparams: ServerHParams | dict[str, Any]) -> MethodSpec:
        """Build the method for one run's hyper-parameters (inside the trace)."""
        return self.server.spec(hparams)

    def init(self, params: Any, model_state: Any, *, learning_rate: Any = 0.0) -> AsyncState:
        """The initial cluster on the mesh, snapshots sharded ``P('data')``."""
        check_hyperparameters("AsyncMesh.init", learning_rate)
        hp = ServerHParams.concrete(learning_rate, self.num_workers)
        state = self._init(params, model_state, hp)
        shardings = jax.tree.map(lambda _: self._rep, state)._replace(
            workers=jax.tree.map(lambda _: self._data, state.workers),
            worker_model_state=jax.tree.map(lambda _: self._data, state.worker_model_state),
        )
        if self._round is None:  # pin the snapshots to their workers' devices across rounds
            self._round = jit(
                self._round_fn, donate_argnums=(0,), out_shardings=(shardings, self._rep)
            )
        return to_mesh(state, shardings)

    def _round_fn(
        self, state: AsyncState, xs: Any, ys: Any, order: Any, extra: dict[str, Any]
    ) -> tuple[AsyncState, jax.Array]:
        """Gradients of a round on the workers' devices, then the server's updates in order.

        ``xs``/``ys``: ``[C, B, ...]`` each worker's mini-batch (SSGD: the ``M`` mini-batches,
        then ``C − M`` of zero padding);
        ``order``: ``[C, 3]`` the updates as ``(worker, staleness, valid)``; ``extra``: name ->
        ``[C]`` aligned with ``order``.
        """
        sync = self.mode == "sync"

        def one(w, wms, xx, yy):
            return server.worker_gradient(self.apply, self.loss_fn, w, wms, xx, yy)

        def local_grad(workers, worker_ms, params, ms, x, y):
            if sync:  # this device's C / D mini-batches, all at the server's weights
                return jax.vmap(one, in_axes=(None, None, 0, 0))(params, ms, x, y)
            return jax.vmap(one)(workers, worker_ms, x, y)  # this device's C / D workers

        data, rep = PartitionSpec("data"), PartitionSpec()
        workers, worker_ms = ((), ()) if sync else (state.workers, state.worker_model_state)
        loss, new_ms, g = jax.shard_map(
            local_grad,
            mesh=self.mesh,
            in_specs=(data, data, rep, rep, data, data),
            out_specs=data,
            check_vma=False,
        )(workers, worker_ms, state.params, state.model_state, xs, ys)
        if sync:
            grads = (loss, new_ms, g)
            if self.capacity > self.num_workers:  # drop the padding mini-batches' gradients
                grads = jax.tree.map(lambda a: a[: self.num_workers], grads)
            return self.server.sync_update(state, grads)

        def body(s: AsyncState, ev: Any) -> tuple[AsyncState, jax.Array]:
            (worker, stale, valid), ex = ev
            pick = lambda t: jax.tree.map(lambda a: a[worker], t)

            def apply(s: AsyncState) -> tuple[AsyncState, jax.Array]:
                pulled = self.server.pulled(s, worker)
                out = (loss[worker], pick(new_ms), pick(g))
                return self.server.update(s, worker, stale, ex, out, pulled), out[0]

            return jax.lax.cond(valid > 0, apply, lambda s: (s, jnp.zeros((), loss.dtype)), s)

        return jax.lax.scan(body, state, ((order[:, 0], order[:, 1], order[:, 2]), extra))

    def run(
        self,
        state: AsyncState,
        schedule: DelaySchedule,
        x_batches: Any,
        y_batches: Any,
        start: int,
        stop: int,
        *,
        extra: dict[str, np.ndarray] | None = None,
    ) -> tuple[AsyncState, np.ndarray]:
        """Apply updates ``start … stop − 1`` of ``schedule`` (``state`` donated; SSGD: update
        ``r`` uses mini-batches ``r·M … r·M + M − 1``). Returns ``(state, losses)``: host
        values, the same on every process."""
        if self._round is None:
            raise ValueError("call init(...) before run")
        c, losses = self.capacity, []
        if self.mode == "sync":
            m = self.num_workers
            order = to_mesh(np.zeros((c, 3), np.int32), self._rep)
            for r in range(start, stop):
                idx = np.arange(r * m, (r + 1) * m)
                xs, ys = x_batches[idx], y_batches[idx]
                if c > m:  # zero mini-batches on the padding devices, dropped in the round
                    xs, ys = (np.concatenate([a, np.zeros_like(a[: c - m])]) for a in (xs, ys))
                xs, ys = to_mesh((xs, ys), self._data)
                state, loss = self._round(state, xs, ys, order, {})
                losses.append(np.asarray(loss).reshape(1))
        for a, z in [] if self.mode == "sync" else async_rounds(schedule, cuts=(start, stop)):
            if z <= start or a >= stop:
                continue
            ev = np.arange(a, z)
            workers = schedule.worker[ev]
            bidx = np.zeros(c, np.int64)
            bidx[workers] = schedule.batch[ev]
            present = np.zeros(c, bool)
            present[workers] = True
            xb = np.asarray(x_batches[bidx])
            xs = np.where(present.reshape(-1, *[1] * (xb.ndim - 1)), xb, 0).astype(xb.dtype)
            order = np.zeros((c, 3), np.int32)
            order[: len(ev)] = np.stack([workers, schedule.staleness[ev], np.ones_like(ev)], 1)
            ex = {}
            for k, v in (extra or {}).items():
                col = np.zeros((c, *v.shape[1:]), v.dtype)
                col[: len(ev)] = v[ev]
                ex[k] = to_mesh(col, self._rep)
            xs, ys = to_mesh((xs, np.asarray(y_batches[bidx])), self._data)
            state, loss = self._round(state, xs, ys, to_mesh(order, self._rep), ex)
            losses.append(np.asarray(loss)[: len(ev)])
        return state, np.concatenate(losses) if losses else np.zeros(0, np.float32)


def executor(
    core: AsyncMesh,
    schedule: DelaySchedule,
    x_batches: Any,
    y_batches: Any,
    *,
    learning_rate: float,
    extra: dict[str, np.ndarray],
) -> Executor:
    """An :class:`~jaxstale.loop.Executor` of one run on the mesh (a round = one update).

    ``params(state)`` gives the server's weights and model state: its device arrays in one
    process, their (replicated) values as numpy on each process of a mesh spanning several
    (so that evaluation runs on each process's own devices)."""
    per = core.num_workers if core.mode == "sync" else 1
    steps = schedule.num_updates // per

    def advance(state: AsyncState, a: int, z: int) -> tuple[AsyncState, Stats]:
        state, lv = core.run(state, schedule, x_batches, y_batches, a, z, extra=extra)
        loss = np.asarray(lv, np.float32).reshape(1, z - a)
        return state, Stats(loss, np.ones_like(loss, np.int32))

    return Executor(
        init=lambda p, ms: core.init(p, ms, learning_rate=learning_rate),
        step=lambda state, r: advance(state, r, r + 1),
        params=lambda state: fetch_global((state.params, state.model_state)),
        apply=core.apply,
        num_rounds=steps,
        num_updates=steps,
        advance=advance,
        batches_per_update=per,
    )
