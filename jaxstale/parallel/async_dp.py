"""Asynchronous data parallelism on a device mesh: workers' gradients in parallel, server in order.

``M`` workers live on the ``"data"`` axis of a mesh of ``D`` devices (``D`` divides ``C``, ``C``
= ``M`` rounded up to a multiple of ``D``). Each worker's weight snapshot (what it last pulled,
or DANA's look-ahead) is row ``i`` of a ``[C, ...]`` stack sharded ``P('data')``, so worker ``i``
lives on device ``i // (C / D)`` with its snapshot. The parameter server (master weights,
optimizer state, DANA's momenta) is replicated: every device applies the same updates, which is
cheap element-wise work.

Semantics are those of the single-device emulator :mod:`jaxstale.emulate.async_dp`, by
construction: a :class:`jaxstale.delays.DelaySchedule` gives, for each applied update ``t``, the
finishing worker ``worker[t]``, its staleness ``τ_t`` and its mini-batch ``batch[t]``; update
``t`` is

    g      = ∇ℓ(w_worker; batch)                               (on the worker's device)
    u, s   = tx.update(g, s, w_t, stale_params=w_worker, staleness=τ_t, worker=…, …)
    w_t+1  = w_t + u,   w_worker ← w_t+1 (or DANA's look-ahead)  (the server, in order)

and the server part *is* the emulator's own step (:meth:`AsyncEmulator.step`, fed the gradient
computed on the mesh, with the same worker ids and per-update extra arguments), so every
method — ASGD, SA-ASGD, DC-ASGD-c/-a, Gap-Aware, DANA, DANA-DC, SSGD, LC-ASGD and registered
ones — behaves exactly as in the emulator.

Rounds. The gradients of one round are computed in parallel, so they must depend only on
updates already applied. A gradient for update ``t`` is taken at worker ``worker[t]``'s
snapshot, which is final once that worker's previous update has been applied. A round is
therefore the longest run of consecutive updates ``t = v, v+1, …`` (``v`` = updates applied so
far) in which no worker appears twice: every device computes the gradients of its workers
(``C / D`` each, vmapped) from snapshots that no update of the round changes, and then the
server applies the round's gradients in the schedule's order (update ``t`` still sees ``w_t``,
with every earlier update of the round applied). Round-robin and constant delay give rounds of
exactly ``M`` updates (every worker once); gamma-timed workers give rounds that end where a
fast worker finishes twice. Rounds are also cut at evaluation points.

SSGD (``"sync"`` mode, ``D`` dividing ``M``): each device computes the gradients of its
``M / D`` mini-batches at the common weights; the server averages the ``M`` gradients (the
emulator's step).

Batch-norm running statistics (models with ``model_state``): each worker's pulled copy is row
``i`` of a second ``[C, ...]`` stack on the worker's device, like its weights, and is final at
the start of the round for the same reason; the server's policy (last writer wins, or the
method's ``merge_model_state``, e.g. Async-BN) runs in order inside the emulator's step. So the
running statistics are exact too (``resnet20`` included).

References:
    Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017.
    Hakimi et al., "Taming Momentum in a Distributed Asynchronous Environment",
    arXiv:1907.11612. JAX documentation, "Manual parallelism with shard_map"
    (https://docs.jax.dev/en/latest/notebooks/shard_map.html).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxstale.delays import DelaySchedule
from jaxstale.emulate.async_dp import (
    AsyncEmulator,
    AsyncState,
    EmulationResult,
    Method,
    evaluate_accuracy,
)
from jaxstale.parallel.mesh import check_mesh, make_mesh

__all__ = ["AsyncMeshExecutor", "async_rounds", "default_data_mesh", "run_async"]


def async_rounds(schedule: DelaySchedule, *, cuts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Cut a delay schedule into rounds of updates whose gradients can run in parallel.

    A round ``[a, z)`` is the longest run of consecutive updates from ``a`` in which no worker
    appears twice (so every gradient of the round is taken at a snapshot that no update of the
    round changes), and that does not cross a cut.

    Args:
        schedule: the delay schedule.
        cuts: update indices where a round must end (evaluation points).

    Returns:
        The rounds as ``(start, stop)`` pairs covering ``0 … T``.

    Example:
        >>> from jaxstale.delays import round_robin
        >>> async_rounds(round_robin(4, 10))
        [(0, 4), (4, 8), (8, 10)]
    """
    cut = {int(x) for x in cuts}
    rounds = []
    t, total = 0, schedule.num_updates
    while t < total:
        a, workers = t, set()
        while t < total and (t == a or t not in cut):
            w = int(schedule.worker[t])
            if w in workers:
                break
            workers.add(w)
            t += 1
        rounds.append((a, t))
    return rounds


def default_data_mesh(num_workers: int) -> jax.sharding.Mesh:
    """A ``"data"`` mesh of the largest ``D ≤ jax.device_count()`` that divides ``M``.

    Args:
        num_workers: ``M``.

    Returns:
        The mesh (one device per worker when there are enough devices).
    """
    d = max(k for k in range(1, min(num_workers, jax.device_count()) + 1) if num_workers % k == 0)
    return make_mesh(d, "data")


class _Server(AsyncEmulator):
    """The emulator's step with the gradient supplied: ``x`` carries ``(loss, model_state, g)``."""

    def _grad(self, w: Any, model_state: Any, x: Any, y: Any) -> Any:
        return x


@dataclasses.dataclass
class AsyncMeshExecutor:
    """Asynchronous data-parallel training of one model on a ``"data"`` mesh axis.

    See the module docstring for the placement, the rounds and the exactness argument.

    Args:
        apply: ``apply(params, model_state, x, train) -> (logits, new_model_state)``
            (``jaxstale.models.functional(model).apply``).
        method: as for :class:`jaxstale.emulate.async_dp.AsyncEmulator` (a registered name such
            as ``"dc-asgd-a"``, a builder, an optax transformation or a ``MethodSpec``).
        num_workers: ``M``.
        mesh: a mesh with a ``"data"`` axis of ``D`` devices (default:
            :func:`default_data_mesh`; ``"sync"`` mode needs ``D`` to divide ``M``).
        momentum: ``μ`` for builders.
        warmup_steps: learning-rate warm-up (updates), as in the emulator.
        loss_fn: ``loss_fn(logits, labels)``; default mean cross-entropy.
    """

    apply: Callable[..., Any]
    method: Method
    num_workers: int
    mesh: jax.sharding.Mesh | None = None
    momentum: float = 0.0
    warmup_steps: int = 0
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None

    def __post_init__(self) -> None:
        m = self.num_workers
        if self.mesh is None:
            self.mesh = default_data_mesh(m)
        if "data" not in dict(self.mesh.shape):
            check_mesh(self.mesh, "data", m)  # raises with a clear message
        self._mesh: jax.sharding.Mesh = self.mesh
        self.num_devices = d = int(dict(self.mesh.shape)["data"])
        self.capacity = -(-m // d) * d
        self.server = _Server(
            self.apply,
            self.method,
            self.capacity,
            momentum=self.momentum,
            warmup_steps=self.warmup_steps,
            loss_fn=self.loss_fn,
            loop="host",
        )
        self.mode = self.server.mode
        if self.mode == "sync" and m % d:
            raise ValueError(
                f"sync mode (SSGD) needs a 'data' axis whose size divides M={m}, got {d}"
            )
        self._round: Callable[..., Any] | None = None

    # -- state
    def init(self, params: Any, model_state: Any, *, learning_rate: Any = 0.0) -> AsyncState:
        """The initial cluster (the emulator's), snapshots sharded ``P('data')``.

        Args:
            params: initial weights.
            model_state: initial model state.
            learning_rate: ``η`` for the method builder.

        Returns:
            An :class:`AsyncState` on the mesh.
        """
        state = self.server.init(
            params, model_state, learning_rate=learning_rate, num_workers=self.num_workers
        )
        shardings = self._shardings(state)
        if self._round is None:  # pin the snapshots to their workers' devices across rounds
            rep = NamedSharding(self._mesh, PartitionSpec())
            self._round = jax.jit(
                self._round_fn, donate_argnums=(0,), out_shardings=(shardings, rep)
            )
        return jax.device_put(state, shardings)

    def _shardings(self, state: AsyncState) -> Any:
        rep = NamedSharding(self._mesh, PartitionSpec())
        data = NamedSharding(self._mesh, PartitionSpec("data"))
        out = jax.tree.map(lambda _: rep, state)
        return out._replace(
            workers=jax.tree.map(lambda _: data, state.workers),
            worker_model_state=jax.tree.map(lambda _: data, state.worker_model_state),
        )

    # -- one round
    def _round_fn(
        self, state: AsyncState, xs: Any, ys: Any, order: Any, extra: dict[str, Any]
    ) -> tuple[AsyncState, jax.Array]:
        """Gradients of the round on their devices, then the server's updates in order.

        ``xs``/``ys``: ``[C, B, ...]`` the mini-batch of each worker (row) of the round, zeros
        for absent workers (``[M, B, ...]`` in ``"sync"`` mode); ``order``: ``[C, 3]`` the
        round's updates in order as ``(worker, staleness, valid)``; ``extra``: name -> ``[C]``
        per-update extra arguments, aligned with ``order``.
        """
        sync = self.mode == "sync"
        grad = AsyncEmulator._grad

        def local_grad(workers, worker_ms, params, ms, x, y):
            def one(w, wms, xx, yy):
                return grad(self.server, w, wms, xx, yy)

            if sync:  # this device's M / D mini-batches, all at the server's weights
                return jax.vmap(one, in_axes=(None, None, 0, 0))(params, ms, x, y)
            return jax.vmap(one)(workers, worker_ms, x, y)  # this device's C / D workers

        data, rep = PartitionSpec("data"), PartitionSpec()
        workers = () if sync else state.workers
        worker_ms = () if sync else state.worker_model_state
        loss, new_ms, g = jax.shard_map(
            local_grad,
            mesh=self._mesh,
            in_specs=(data, data, rep, rep, data, data),
            out_specs=data,
            check_vma=False,
        )(workers, worker_ms, state.params, state.model_state, xs, ys)
        if sync:  # the emulator averages the M gradients taken at the same weights
            zeros = jnp.zeros((self.num_workers,), jnp.int32)
            return self.server.step(state, ((loss, new_ms, g), zeros, zeros[0], zeros[0], {}))

        def body(s: AsyncState, ev: Any) -> tuple[AsyncState, jax.Array]:
            (worker, stale, valid), ex = ev
            pick = lambda t: jax.tree.map(lambda a: a[worker], t)
            inp = ((loss[worker], pick(new_ms), pick(g)), ys[0], worker, stale, ex)
            return jax.lax.cond(
                valid > 0,
                lambda s: self.server.step(s, inp),
                lambda s: (s, jnp.zeros((), loss.dtype)),
                s,
            )

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
        extra: dict[str, Any] | None = None,
        cuts: Sequence[int] = (),
    ) -> tuple[AsyncState, np.ndarray]:
        """Apply updates ``start … stop − 1`` of ``schedule`` (the emulator's ``run``).

        Args:
            state: from :meth:`init` or an earlier :meth:`run` (donated).
            schedule: the delay schedule (``"sync"`` mode: its updates are consumed ``M`` per
                step, update ``r`` using mini-batches ``r·M … r·M + M − 1``).
            x_batches: ``[num_batches, B, ...]`` the mini-batch stream.
            y_batches: ``[num_batches, B]`` labels.
            start, stop: the update range (``"sync"`` mode: SSGD steps).
            extra: per-update extra arguments for the transforms, name -> ``[T]`` array
                (indexed by update ``t``, as the emulator's ``extra_args``).
            cuts: extra round boundaries.

        Returns:
            ``(state, losses)`` with ``losses[stop − start]``: each update's loss at the weights
            its gradient used.
        """
        if self._round is None:
            raise ValueError("call init(...) before run")
        c = self.capacity
        x_batches, y_batches = np.asarray(x_batches), np.asarray(y_batches)
        data = NamedSharding(self._mesh, PartitionSpec("data"))
        rep = NamedSharding(self._mesh, PartitionSpec())
        extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
        losses = []
        if self.mode == "sync":
            m = self.num_workers
            for r in range(start, stop):
                idx = np.arange(r * m, (r + 1) * m)
                xs, ys = jax.device_put((x_batches[idx], y_batches[idx]), data)
                order = jax.device_put(np.zeros((c, 3), np.int32), rep)
                state, loss = self._round(state, xs, ys, order, {})
                losses.append(np.asarray(loss).reshape(1))
            return state, np.concatenate(losses) if losses else np.zeros(0, np.float32)
        stale = schedule.staleness
        for a, z in async_rounds(schedule, cuts=(start, stop, *cuts)):
            if z <= start or a >= stop:
                continue
            ev = np.arange(a, z)
            workers = schedule.worker[ev]
            bidx = np.zeros(c, np.int64)
            bidx[workers] = schedule.batch[ev]
            present = np.zeros(c, bool)
            present[workers] = True
            xs = np.where(present.reshape(-1, *[1] * (x_batches.ndim - 1)), x_batches[bidx], 0)
            ys = y_batches[bidx]
            order = np.zeros((c, 3), np.int32)
            order[: len(ev)] = np.stack([workers, stale[ev], np.ones_like(ev)], axis=1)
            ex = {}
            for k, v in extra.items():
                col = np.zeros((c, *v.shape[1:]), v.dtype)
                col[: len(ev)] = v[ev]
                ex[k] = jax.device_put(col, rep)
            xs, ys = jax.device_put((xs.astype(x_batches.dtype), ys), data)
            state, loss = self._round(state, xs, ys, jax.device_put(order, rep), ex)
            losses.append(np.asarray(loss)[: len(ev)])
        return state, np.concatenate(losses) if losses else np.zeros(0, np.float32)


def run_async(
    apply: Callable[..., Any],
    method: Method,
    params: Any,
    model_state: Any,
    schedule: DelaySchedule,
    x_batches: Any,
    y_batches: Any,
    *,
    learning_rate: float | None = None,
    momentum: float = 0.0,
    warmup_steps: int = 0,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    eval_every: int | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    extra_args: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    mesh: jax.sharding.Mesh | None = None,
    **_: Any,
) -> EmulationResult | list[EmulationResult]:
    """:func:`jaxstale.emulate.async_dp.emulate_async` on a mesh: same arguments, same result.

    Runs of several lanes (lists of params / schedules / data / learning rates) run one after
    another. ``loop`` and ``vmap`` are accepted and ignored. See :class:`AsyncMeshExecutor`.

    Args:
        apply: the model's pure apply.
        method: a registered name, a builder, an optax transformation or a ``MethodSpec``.
        params: initial weights (a list for several runs).
        model_state: initial model state (a list for several runs).
        schedule: a :class:`jaxstale.delays.DelaySchedule` (a list for several runs).
        x_batches: ``[num_batches, B, ...]`` inputs (a list for several runs).
        y_batches: ``[num_batches, B]`` labels.
        learning_rate: ``η`` (a float or one per run).
        momentum: ``μ``.
        warmup_steps: learning-rate warm-up (updates).
        x_test: test inputs for the learning curve.
        y_test: test labels.
        eval_every: evaluation interval in mini-batches processed (default: once, at the end).
        loss_fn: the training loss.
        extra_args: per-update extra arguments for the transforms, name -> ``[T]`` array (one
            dict per run for several runs); timed delay models add ``t_comm`` / ``t_comp``.
        mesh: a mesh with a ``"data"`` axis (default: :func:`default_data_mesh`).

    Returns:
        One :class:`EmulationResult`, or a list of them.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from jaxstale.delays import round_robin
        >>> from jaxstale.parallel import run_async
        >>> apply = lambda p, s, x, train: (x.reshape(len(x), -1) @ p, s)
        >>> rng = np.random.default_rng(0)
        >>> xb = rng.normal(size=(40, 8, 4)).astype(np.float32)
        >>> yb = (xb[..., 0] > 0).astype(np.int32)
        >>> r = run_async(apply, "asgd", jnp.zeros((4, 2)), {}, round_robin(4, 40), xb, yb,
        ...               learning_rate=0.5, x_test=xb[0], y_test=yb[0])
        >>> r.diverged, r.final_test_accuracy, int(r.staleness.max())
        (False, 1.0, 3)
    """
    if not isinstance(schedule, DelaySchedule):
        n = len(schedule)
        eas = list(extra_args) if isinstance(extra_args, list | tuple) else [extra_args] * n
        lrs = learning_rate if isinstance(learning_rate, list | tuple) else [learning_rate] * n
        return [
            run_async(
                apply,
                method,
                p,
                ms,
                s,
                xb,
                yb,
                learning_rate=lr,
                momentum=momentum,
                warmup_steps=warmup_steps,
                x_test=x_test,
                y_test=y_test,
                eval_every=eval_every,
                loss_fn=loss_fn,
                mesh=mesh,
                extra_args=ea,
            )
            for p, ms, s, xb, yb, lr, ea in zip(
                params, model_state, schedule, x_batches, y_batches, lrs, eas, strict=True
            )
        ]
    m = schedule.num_workers
    ex = AsyncMeshExecutor(
        apply, method, m, mesh=mesh, momentum=momentum, warmup_steps=warmup_steps, loss_fn=loss_fn
    )
    if learning_rate is None:
        learning_rate = 0.0
    sync = ex.mode == "sync"
    per = m if sync else 1
    t_count = schedule.num_updates
    steps = t_count // per
    if steps < 1:
        raise ValueError(f"sync mode needs num_updates >= num_workers ({t_count} < {per})")
    need = steps * per if sync else int(np.max(schedule.batch)) + 1
    if len(x_batches) < need:
        raise ValueError(f"x_batches has {len(x_batches)} batches; the schedule needs {need}")
    chunk = max(1, (eval_every or t_count) // per)
    evaluate = x_test is not None and y_test is not None
    extra: dict[str, np.ndarray] = {}
    if not sync:  # as the emulator: the user's per-update arguments, and timed models' times
        user = cast(dict[str, Any], extra_args or {})
        extra = {k: np.asarray(v) for k, v in user.items()}
        for k, v in extra.items():
            if v.shape[:1] != (steps,):
                raise ValueError(f"extra_args[{k!r}] must have {steps} entries")
        if schedule.start_time is not None and schedule.finish_time is not None:
            extra.setdefault("t_comm", schedule.start_time.astype(np.float32))
            extra.setdefault(
                "t_comp", (schedule.finish_time - schedule.start_time).astype(np.float32)
            )
    state = ex.init(params, model_state, learning_rate=learning_rate)
    losses = np.full(steps, np.nan, np.float32)
    curve: list[dict] = []
    dead = False
    for a in range(0, steps, chunk):
        z = min(a + chunk, steps)
        state, lv = ex.run(state, schedule, x_batches, y_batches, a, z, extra=extra)
        losses[a:z] = lv
        dead = dead or not np.isfinite(losses[a:z]).all()
        acc = None
        if x_test is not None and y_test is not None and not dead:
            acc = float(evaluate_accuracy(apply, state.params, state.model_state, x_test, y_test))
        curve.append(
            {
                "step": int(z),
                "batches": int(z * per),
                "train_loss": float(np.mean(losses[a:z])),
                "test_accuracy": acc,
            }
        )
        if dead:
            break
    bad = np.flatnonzero(~np.isfinite(losses))
    stale = np.zeros(steps, np.int32) if sync else schedule.staleness
    return EmulationResult(
        params=state.params,
        model_state=state.model_state,
        losses=losses,
        curve=curve,
        diverged=dead,
        diverged_step=int(bad[0]) + 1 if dead else None,
        final_test_accuracy=None if dead or not evaluate else curve[-1]["test_accuracy"],
        staleness=stale,
    )
