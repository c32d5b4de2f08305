"""Exact single-device emulation of asynchronous data-parallel SGD (a parameter server, M workers).

A :class:`~jaxstale.delays.DelaySchedule` says, for every update ``t``, which worker finishes
(``worker[t]``), the version it pulled (``pulled[t]``, so ``τ_t = t − pulled[t]``) and its
mini-batch (``batch[t]``). One emulated update is the worker's gradient at its snapshot followed
by the server's :func:`~jaxstale.asyncdp.server.async_update` (SSGD:
:func:`~jaxstale.asyncdp.server.sync_update`). The transforms receive ``stale_params``,
``staleness``, ``worker``, ``worker_loss``, for timed delay models ``t_comm`` / ``t_comp``, and
any per-update ``extra_args``.

**Loops** (measured; DESIGN "compiled steps, measured loops"): one jitted step. MLPs run it in
a ``lax.scan`` over each evaluation interval (the snapshots an ``[C, ...]`` stack: read with a
dynamic slice, written in place); models with convolutions call it from a host loop (a conv
weight gradient in a rolled scan is 12–50x slower on XLA:CPU), where a worker's weights are its
own buffer: the step (:meth:`AsyncEmulator.row_step`, :func:`~jaxstale.asyncdp.server.update_rows`)
reads them in place, and the worker's pull is the new weights themselves, so an emulated update
reads and writes what the method's step does and no snapshot is copied (its bytes accessed stay
within the synchronous step's + 2 × the parameters; ``benchmarks/async_emulation.py``); the
stacks are read at a worker's first update of each call and written back at its end. Runs
(lanes: seeds, learning rates, worker counts) are ``vmap``-ed (through the stack step) or run
one after another on the same executable: the method is rebuilt inside the step from traced
hyper-parameters and the snapshot stack has a fixed capacity, so a sweep compiles once per
method.

**M = 1 reproduces synchronous SGD bit for bit**: the snapshot is always ``w_t``, every τ = 0
transform is the identity, and the final weights equal ``jaxstale.train.fit``'s
(``tests/asyncdp/test_emulator.py``).

References:
    Zheng et al. "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017,
    arXiv 1609.08326.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxstale.asyncdp import server
from jaxstale.asyncdp.methods import Method, MethodSpec, check_hyperparameters
from jaxstale.asyncdp.server import AsyncServer, AsyncState, ServerHParams
from jaxstale.loop import Executor, Stats, jit

__all__ = ["AsyncEmulator", "executor"]


class AsyncEmulator:
    """The compiled emulation step of one method on one model, for up to ``num_workers`` workers.

    Shared by the executors of a sweep: runs with other learning rates, seeds or fewer workers
    (their snapshots use the first rows) are vmapped lanes of one call or further calls of the
    same executable.

    Args:
        apply: ``apply(params, model_state, x, train) -> (logits, new_model_state)``, pure.
        method: a registered name, a builder ``HParams -> transformation | MethodSpec``, an
            optax transformation or a ``MethodSpec``.
        num_workers: the worker capacity ``C ≥ 1`` (``"sync"`` mode: exactly the runs' ``M``).
        momentum: ``μ`` in ``[0, 1)`` passed to builders (static).
        warmup_steps: linear learning-rate warm-up from ``η/M`` over this many updates.
        loss_fn: ``loss_fn(logits, labels)``; default mean cross-entropy.
        loop: ``"scan"``, ``"host"`` or ``"auto"`` (``"host"`` for models with convolutions).
        vmap: states and inputs carry a leading lane axis.

    Attributes:
        server: the :class:`~jaxstale.asyncdp.server.AsyncServer` it runs (capacity
            ``num_workers``): the state's initialisation and every update.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from jaxstale.asyncdp import AsyncEmulator
        >>> apply = lambda p, s, x, train: (x @ p["w"], s)
        >>> mse = lambda out, y: jnp.mean((out[:, 0] - y) ** 2)
        >>> emu = AsyncEmulator(apply, optax.sgd(0.1), 2, loss_fn=mse)
        >>> st = emu.init({"w": jnp.zeros((1, 1))}, {})
        >>> x, y = jnp.ones((3, 1, 1)), jnp.ones((3, 1))
        >>> st, losses = emu.run(st, x, y, jnp.array([0, 1, 0]), jnp.array([0, 1, 1]))
        >>> [round(float(v), 3) for v in losses]   # 2nd gradient is stale: taken at w_0
        [1.0, 1.0, 0.64]
    """

    def __init__(
        self,
        apply: Callable[..., tuple[jax.Array, Any]],
        method: Method,
        num_workers: int,
        *,
        momentum: float = 0.0,
        warmup_steps: int = 0,
        loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
        loop: str = "auto",
        vmap: bool = False,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int | np.integer):
            raise TypeError(f"num_workers must be an int, got {type(num_workers).__name__}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if loop not in ("auto", "scan", "host"):
            raise ValueError(f"loop must be 'auto', 'scan' or 'host', got {loop!r}")
        self.server = AsyncServer.create(
            method,
            int(num_workers),
            momentum=momentum,
            warmup_steps=warmup_steps,
            where="AsyncEmulator",
        )
        self.apply, self.loss_fn, self.num_workers = apply, loss_fn, int(num_workers)
        self.loop, self.vmap = loop, vmap
        self._jit: dict[str, Callable] = {}

    @property
    def mode(self) -> str:
        """The method's mode: ``"async"``, ``"sync"`` or ``"dana"``."""
        return self.server.mode

    def spec(self, hparams: ServerHParams | dict[str, Any]) -> MethodSpec:
        """Build the method for one run's hyper-parameters (inside the trace)."""
        return self.server.spec(hparams)

    def _compiled(self, name: str, fn: Callable, **kw: Any) -> Callable:
        if name not in self._jit:
            self._jit[name] = jit(jax.vmap(fn) if self.vmap else fn, **kw)
        return self._jit[name]

    def init(
        self, params: Any, model_state: Any, *, learning_rate: Any = 0.0, num_workers: Any = None
    ) -> AsyncState:
        """The initial cluster (lanes stacked when ``vmap``): ``η`` and ``M ≤`` the capacity
        per lane (default: the capacity)."""
        check_hyperparameters("AsyncEmulator.init", learning_rate)
        if self.loop == "auto":
            one = [a[0] if self.vmap else a for a in jax.tree.leaves(params)]
            self.loop = "host" if any(np.ndim(a) >= 3 for a in one) else "scan"
        m = self.num_workers if num_workers is None else num_workers
        if np.min(m) < 1 or np.max(m) > self.num_workers:
            raise ValueError(f"num_workers must be in [1, {self.num_workers}], got {m}")
        if self.mode == "sync" and np.min(m) != self.num_workers:
            raise ValueError(f"sync mode: every run needs exactly {self.num_workers} workers")
        lead = (np.shape(jax.tree.leaves(params)[0])[0],) if self.vmap else ()
        hp = ServerHParams.concrete(learning_rate, m, lead)
        return self._compiled("init", self.server.init)(params, model_state, hp)

    def step(self, s: AsyncState, inputs: tuple) -> tuple[AsyncState, jax.Array]:
        """One update (pure): ``inputs = (x, y, worker, staleness, extra)`` (``"sync"``: ``x``
        and ``y`` hold the M workers' batches). Returns ``(state, loss)``."""
        x, y, worker, staleness, extra = inputs

        def grad(w, ms, xx, yy):
            return server.worker_gradient(self.apply, self.loss_fn, w, ms, xx, yy)

        if self.mode == "sync":
            grads = jax.vmap(grad, in_axes=(None, None, 0, 0))(s.params, s.model_state, x, y)
            return self.server.sync_update(s, grads)
        pulled = self.server.pulled(s, worker)  # w_i and the model state it pulled with w_i
        out = grad(*pulled, x, y)
        return self.server.update(s, worker, staleness, extra, out, pulled), out[0]

    @property
    def compiled_step(self) -> Callable[[AsyncState, tuple], tuple[AsyncState, jax.Array]]:
        """The jitted, donated :meth:`step` (vmapped with ``vmap``): the host loop of lanes."""
        return self._compiled("step", self.step, donate_argnums=0)

    def row_step(
        self, s: AsyncState, model_states: Any, rows: tuple, inputs: tuple
    ) -> tuple[AsyncState, Any, Any, jax.Array]:
        """One update on the finishing worker's own rows (pure; the host loop's, without lanes):
        ``s`` the cluster without its ``[C, ...]`` stacks, ``model_states`` its
        ``worker_model_state``, ``rows = (w_i, velocity_i)`` what worker ``inputs[2]`` holds.
        Returns ``(s, model_states, new, loss)``: ``new`` is the worker's new weights and
        velocity in ``"dana"`` mode, ``((), ())`` in ``"async"`` mode, where it holds ``s.params``
        itself (a program returning it twice would copy it). The model states stay a stack (a
        few statistics; their update is then the same program as :meth:`step`'s)."""
        x, y, worker, staleness, extra = inputs
        w_i, v_i = rows
        ms_i = server.index(model_states, worker)
        out = server.worker_gradient(self.apply, self.loss_fn, w_i, ms_i, x, y)
        s, (w, ms, v) = self.server.update_rows(s, worker, staleness, extra, out, (w_i, ms_i), v_i)
        new = (w, v) if self.mode == "dana" else ((), ())
        return s, server.set_row(model_states, ms, worker), new, out[0]

    @property
    def compiled_row_step(self) -> Callable[..., tuple]:
        """The jitted :meth:`row_step`, only ``model_states`` donated: its new weights are the
        server's and the worker's (one buffer), and the previous ones may be another worker's."""
        if self.vmap:
            raise ValueError("lanes (vmap) run compiled_step: each lane has its own worker")
        return self._compiled("row_step", self.row_step, donate_argnums=1)

    def row_update(self, s: AsyncState, model_states: Any, rows: tuple, inputs: tuple) -> tuple:
        """:attr:`compiled_row_step`, returning the worker's new ``(weights, velocity)`` (in
        ``"async"`` mode the server's own weights: a pull copies nothing)."""
        s, model_states, (w, v), loss = self.compiled_row_step(s, model_states, rows, inputs)
        return s, model_states, (w if self.mode == "dana" else s.params, v), loss

    def pull(self, state: AsyncState, worker: Any) -> tuple:
        """Worker ``worker``'s rows ``(weights, velocity)`` out of the stacks."""
        take = lambda st, i: tuple(server.index(t, i) for t in st)
        return self._compiled("pull", take)((state.workers, state.velocity), np.int32(worker))

    def _run_rows(
        self,
        state: AsyncState,
        x: np.ndarray,
        y: np.ndarray,
        worker: np.ndarray,
        staleness: np.ndarray,
        extra: dict[str, np.ndarray],
    ) -> tuple[AsyncState, list[jax.Array]]:
        """The host loop without lanes: a worker's rows leave the stacks when it first finishes
        in this call, pass from update to update by reference and go back at the end (meanwhile
        the stacks and the rows of the workers that finished are both held)."""
        rows: dict[int, tuple] = {}
        s = state._replace(workers=(), worker_model_state=(), velocity=())
        model_states, losses = state.worker_model_state, []
        for i in range(worker.shape[-1]):
            w = int(worker[i])
            if w not in rows:
                rows[w] = self.pull(state, w)
            inputs = (x[i], y[i], worker[i], staleness[i], {k: v[i] for k, v in extra.items()})
            s, model_states, rows[w], loss = self.row_update(s, model_states, rows[w], inputs)
            losses.append(loss)
        stacks = (state.workers, state.velocity)
        put = lambda st, r, i: tuple(server.set_row(t, v, i) for t, v in zip(st, r, strict=True))
        for w, r in rows.items():
            stacks = self._compiled("put", put, donate_argnums=0)(stacks, r, np.int32(w))
        state = s._replace(workers=stacks[0], worker_model_state=model_states, velocity=stacks[1])
        return state, losses

    def run(
        self,
        state: AsyncState,
        x: Any,
        y: Any,
        worker: Any,
        staleness: Any,
        extra: dict[str, Any] | None = None,
    ) -> tuple[AsyncState, jax.Array]:
        """Apply ``L`` updates (``state`` is donated): ``x``, ``y`` ``[L, B, ...]``, ``worker``
        and ``staleness`` ``[L]``, ``extra`` name -> ``[L]`` (a leading lane axis with ``vmap``).
        Returns ``(state, losses [L])``."""
        worker = np.asarray(worker, np.int32)
        staleness = np.asarray(staleness, np.int32)
        extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
        if self.loop != "host":
            chunk = lambda s, inp: jax.lax.scan(self.step, s, inp)
            run = self._compiled("scan", chunk, donate_argnums=0)
            return run(state, (x, y, worker, staleness, extra))
        x, y = np.asarray(x), np.asarray(y)  # host slicing: no device op per update
        if self.vmap or self.mode == "sync":
            step, losses = self.compiled_step, []
            take = (lambda a, i: a[:, i]) if self.vmap else (lambda a, i: a[i])
            for i in range(worker.shape[-1]):
                ex = {k: take(v, i) for k, v in extra.items()}
                state, loss = step(
                    state, (take(x, i), take(y, i), take(worker, i), take(staleness, i), ex)
                )
                losses.append(loss)
        else:
            state, losses = self._run_rows(state, x, y, worker, staleness, extra)
        return state, jnp.asarray(np.stack(jax.device_get(losses), axis=-1))


def executor(
    emu: AsyncEmulator,
    batches: Sequence[np.ndarray],
    worker: np.ndarray,
    staleness: np.ndarray,
    extras: dict[str, np.ndarray],
    x_batches: Sequence[Any],
    y_batches: Sequence[Any],
    *,
    learning_rate: Sequence[Any],
    num_workers: Sequence[int],
    batches_per_update: int,
) -> Executor:
    """An :class:`~jaxstale.loop.Executor` of ``emu`` over ``L`` runs; a round is one update.

    Per lane: ``batches`` (the mini-batch indices of every update, ``[steps]``; SSGD
    ``[steps, M]``), the ``x_batches`` / ``y_batches`` streams, ``learning_rate`` and
    ``num_workers``; ``worker``, ``staleness`` and ``extras`` (name -> ...) are ``[L, steps]``.
    ``batches_per_update`` is 1, or ``M`` for SSGD.
    """
    n, steps = worker.shape

    def init(params: Any, model_state: Any) -> AsyncState:
        lr = np.asarray(learning_rate, np.float32) if emu.vmap else learning_rate[0]
        m = np.asarray(num_workers, np.int32) if emu.vmap else num_workers[0]
        return emu.init(params, model_state, learning_rate=lr, num_workers=m)

    def advance(state: AsyncState, a: int, z: int) -> tuple[AsyncState, Stats]:
        xs = [np.asarray(x[b[a:z]]) for x, b in zip(x_batches, batches, strict=True)]
        ys = [np.asarray(y[b[a:z]]) for y, b in zip(y_batches, batches, strict=True)]
        ex = {k: v[:, a:z] for k, v in extras.items()}
        if emu.vmap:
            inputs = (np.stack(xs), np.stack(ys), worker[:, a:z], staleness[:, a:z], ex)
        else:
            ex = {k: v[0] for k, v in ex.items()}
            inputs = (xs[0], ys[0], worker[0, a:z], staleness[0, a:z], ex)
        state, lv = emu.run(state, *inputs)
        loss = np.asarray(lv).reshape(n, z - a)
        return state, Stats(loss, np.ones_like(loss, np.int32))

    return Executor(
        init=init,
        step=lambda state, r: advance(state, r, r + 1),
        params=lambda state: (state.params, state.model_state),
        apply=emu.apply,
        num_rounds=steps,
        num_updates=steps,
        lanes=n,
        vmapped=emu.vmap,
        advance=advance,
        batches_per_update=batches_per_update,
    )
