"""The parameter server's update: one pure function, used by both asynchronous executors.

The server holds the master weights ``w_t`` (version ``t`` = after ``t`` updates), the optimizer
state and, per worker ``i``, the weights it last pulled and the model state it pulled with them
(rows of ``[C, ...]`` stacks). :func:`worker_gradient` is a worker's gradient at its snapshot;
:func:`async_update` applies it, in order::

    u, s  = tx.update(g, s, w_t, stale_params=w_i, staleness=τ, worker=i, worker_loss=ℓ, …)
    w_t+1 = w_t + u;   w_i ← w_t+1                       ("async" mode)
    v^i ← μ v^i + u;   Σ ← Σ + Δv^i;   w ← w − η v^i;   w_i ← w − η μ Σ     ("dana" mode)

In ``"dana"`` mode ``tx.update`` also gets ``lookahead`` = ``w_t − η μ Σ_t``, the look-ahead a
worker pulling now would get (what the last update sent; ``w_i`` is the one worker ``i`` used),
so that a transform can measure a gap between look-ahead points
(:func:`jaxstale.asyncdp.methods.at_lookahead`).

and :func:`sync_update` is SSGD (the M gradients at ``w_t`` averaged, applied once). A worker's
forward pass advances the batch-norm statistics it pulled; the server keeps what arrives (last
writer wins) unless the method's ``merge_model_state`` says otherwise (Async-BN,
:mod:`jaxstale.asyncdp.bn`). The emulator calls these functions update by update; the mesh
executor computes a round's gradients in parallel and then calls the same :func:`async_update`
for each, in the delay model's order — so both run one server (see ``docs/design.md``).
:func:`update_rows` is the same update on the finishing worker's own rows, the stacks left alone
(the emulator's host loop, which keeps a worker's weights as their own buffer).

Both executors hold an :class:`AsyncServer`: the method builder, the momentum, the warm-up, the
worker capacity and the mode, with the server's operations as methods (the state's
initialisation, the method of a run's :class:`ServerHParams`, and the three updates above).

References:
    Zheng et al. "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017.
    Hakimi et al. "Taming Momentum in a Distributed Asynchronous Environment", arXiv:1907.11612.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale.asyncdp.methods import (
    HParams,
    Method,
    MethodBuilder,
    MethodSpec,
    as_spec,
    check_hyperparameters,
    lr_warmup,
    resolve,
)
from jaxstale.losses import batch_mean, cross_entropy

__all__ = [
    "AsyncServer",
    "AsyncState",
    "ServerHParams",
    "async_update",
    "build_spec",
    "index",
    "init_state",
    "set_row",
    "sync_update",
    "update_rows",
    "worker_gradient",
]


class ServerHParams(NamedTuple):
    """One run's hyper-parameters as the server carries them (:attr:`AsyncState.hparams`).

    Traced inside the executors' compiled steps, so that one executable serves every learning
    rate and worker count of a sweep; the method is rebuilt from them at every update
    (:meth:`AsyncServer.spec` hands the builder a :class:`~jaxstale.asyncdp.methods.HParams`).

    Attributes:
        learning_rate: float32 ``η`` (before the warm-up; ``[L]`` for ``L`` vmapped lanes).
        num_workers: int32 ``M`` of the run, at most the executor's capacity (``[L]`` likewise).
    """

    learning_rate: Any
    num_workers: Any

    @classmethod
    def of(cls, hparams: ServerHParams | Mapping[str, Any]) -> ServerHParams:
        """``hparams`` as a :class:`ServerHParams` (also from a mapping with its two keys).

        Example:
            >>> from jaxstale.asyncdp.server import ServerHParams
            >>> ServerHParams.of({"learning_rate": 0.1, "num_workers": 4})
            ServerHParams(learning_rate=0.1, num_workers=4)
        """
        if isinstance(hparams, ServerHParams):
            return hparams
        return cls(hparams["learning_rate"], hparams["num_workers"])

    @classmethod
    def concrete(
        cls, learning_rate: Any, num_workers: Any, lanes: tuple[int, ...] = ()
    ) -> ServerHParams:
        """Host values for a compiled step: float32 ``η`` and int32 ``M``, broadcast to the
        ``lanes`` shape (``()``: one run)."""
        return cls(
            np.broadcast_to(np.asarray(learning_rate, np.float32), lanes),
            np.broadcast_to(np.asarray(num_workers, np.int32), lanes),
        )


class AsyncState(NamedTuple):
    """The emulated cluster (a pytree; donated by the compiled steps).

    Attributes:
        params: the master weights ``w_t``.
        model_state: the server's batch-norm statistics (an empty ``nnx.State`` for MLPs).
        opt_state: the method's optax state.
        workers: ``[C, ...]`` each worker's weights (its snapshot, or DANA's look-ahead); ``()``
            in ``"sync"`` mode.
        worker_model_state: ``[C, ...]`` the model state each worker pulled; ``()`` in ``"sync"``.
        velocity: DANA's per-worker momentum ``[C, ...]``; ``()`` in other modes.
        velocity_sum: DANA's ``Σ_i v^i``; ``()`` in other modes.
        step: int32, the number of applied updates ``t``.
        hparams: this run's traced hyper-parameters (:class:`ServerHParams`).
    """

    params: Any
    model_state: Any
    opt_state: Any
    workers: Any
    worker_model_state: Any
    velocity: Any
    velocity_sum: Any
    step: jax.Array
    hparams: ServerHParams


@dataclasses.dataclass(frozen=True)
class AsyncServer:
    """The parameter server of one method, as both executors run it.

    Holds what is static about the server — the method's builder, ``μ``, the warm-up, the
    executor's worker capacity and the method's mode — and applies the server's operations to
    an :class:`AsyncState` (whose :class:`ServerHParams` carry what is traced: ``η``, ``M``).
    The method is rebuilt from the state's hyper-parameters inside every traced operation
    (:meth:`spec`). Build one with :meth:`create`.

    Attributes:
        build: the method's builder (``HParams -> transformation | MethodSpec``).
        mode: ``"async"``, ``"sync"`` or ``"dana"`` (:data:`~jaxstale.asyncdp.methods.MODES`).
        momentum: ``μ`` passed to the builder (static).
        warmup_steps: linear learning-rate warm-up from ``η/M`` over this many updates.
        capacity: the executor's static worker capacity ``C`` (the ``[C, ...]`` stacks and
            per-worker method state); ``None`` outside an executor.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jaxstale.asyncdp.server import AsyncServer, ServerHParams
        >>> srv = AsyncServer.create("dana", 4, momentum=0.9)
        >>> srv.mode
        'dana'
        >>> st = srv.init(jnp.zeros(3), {}, ServerHParams.concrete(0.1, 4))
        >>> jax.tree.leaves(st.velocity)[0].shape, int(st.step)
        ((4, 3), 0)
    """

    build: MethodBuilder
    mode: str
    momentum: float = 0.0
    warmup_steps: int = 0
    capacity: int | None = None

    @classmethod
    def create(
        cls,
        method: Method,
        capacity: int | None = None,
        *,
        momentum: float = 0.0,
        warmup_steps: int = 0,
        num_workers: int | None = None,
        where: str = "AsyncServer",
    ) -> AsyncServer:
        """The server of ``method`` (a registered name, a builder, an optax transformation or a
        ``MethodSpec``), its mode learnt by building it for ``η = 0.1`` and ``num_workers``
        workers (default: ``capacity``, else 1).

        Raises:
            ValueError: ``warmup_steps`` negative, ``momentum`` outside ``[0, 1)`` (the message
                starts with ``where``), an unknown method name.
            TypeError: a ``momentum`` that is not a number, a method of no known kind.
        """
        lr_warmup(0.1, 1, warmup_steps)  # validates warmup_steps
        check_hyperparameters(where, momentum=momentum)
        build, momentum, warmup_steps = resolve(method), float(momentum), int(warmup_steps)
        m = num_workers if num_workers is not None else capacity or 1
        probe = ServerHParams(0.1, m)
        mode = build_spec(build, probe, momentum, warmup_steps, capacity).mode
        return cls(build, mode, momentum, warmup_steps, capacity)

    def spec(self, hparams: ServerHParams | Mapping[str, Any]) -> MethodSpec:
        """The method for one run's (possibly traced) hyper-parameters (:func:`build_spec`)."""
        return build_spec(self.build, hparams, self.momentum, self.warmup_steps, self.capacity)

    def init(
        self, params: Any, model_state: Any, hparams: ServerHParams | Mapping[str, Any]
    ) -> AsyncState:
        """The initial cluster of ``capacity`` workers (:func:`init_state`)."""
        if self.capacity is None:
            raise ValueError("AsyncServer.init needs a capacity (the number of worker rows)")
        return init_state(self.spec(hparams), params, model_state, self.capacity, hparams)

    def pulled(self, s: AsyncState, worker: jax.Array) -> tuple[Any, Any]:
        """``(w_i, model_state_i)``: what worker ``worker`` pulled (its rows of the stacks)."""
        return index(s.workers, worker), index(s.worker_model_state, worker)

    def update(
        self,
        s: AsyncState,
        worker: jax.Array,
        staleness: jax.Array,
        extra: dict[str, Any],
        grad: tuple[jax.Array, Any, Any],
        pulled: tuple[Any, Any],
    ) -> AsyncState:
        """One worker's gradient applied, ``"async"`` or ``"dana"`` mode (:func:`async_update`
        with the method of ``s.hparams``)."""
        return async_update(self.spec(s.hparams), s, worker, staleness, extra, grad, pulled)

    def update_rows(
        self,
        s: AsyncState,
        worker: jax.Array,
        staleness: jax.Array,
        extra: dict[str, Any],
        grad: tuple[jax.Array, Any, Any],
        pulled: tuple[Any, Any],
        velocity_i: Any = (),
    ) -> tuple[AsyncState, tuple[Any, Any, Any]]:
        """:meth:`update` on the finishing worker's own rows, the stacks left alone
        (:func:`update_rows`)."""
        spec = self.spec(s.hparams)
        return update_rows(spec, s, worker, staleness, extra, grad, pulled, velocity_i)

    def sync_update(
        self, s: AsyncState, grads: tuple[jax.Array, Any, Any]
    ) -> tuple[AsyncState, jax.Array]:
        """SSGD's update from the ``M`` workers' stacked gradients (:func:`sync_update`)."""
        return sync_update(self.spec(s.hparams), s, grads)


def build_spec(
    build: MethodBuilder,
    hparams: ServerHParams | Mapping[str, Any],
    momentum: float,
    warmup_steps: int,
    capacity: int | None = None,
) -> MethodSpec:
    """The method for one run's (possibly traced) ``η`` and ``M``, warm-up from ``η/M`` included;
    ``capacity`` is the executor's static worker capacity (per-worker state sizes)."""
    hp = ServerHParams.of(hparams)
    m = hp.num_workers
    lr = lr_warmup(hp.learning_rate, m, warmup_steps)
    spec = as_spec(build(HParams(lr, momentum, m, capacity)))
    return spec._replace(tx=_as_arrived(spec.tx))


def _as_arrived(tx: optax.GradientTransformationExtraArgs) -> optax.GradientTransformationExtraArgs:
    """``tx`` applied to the gradient as it arrived: an optimization barrier in front of it.

    Without it XLA compiles the server's arithmetic fused with whatever produced the gradient —
    the backward pass in the emulator, a row of the workers' stacked gradients on the mesh — and
    rounded LC-ASGD's ``g·s`` and the momentum after it otherwise in the two: their weights
    parted in the last bit at LC-ASGD's second update. Behind the barrier both compile the
    update from a plain array (the mesh executor is then LC-ASGD's emulator bit for bit)."""

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return tx.update(jax.lax.optimization_barrier(updates), state, params, **extra)

    return optax.GradientTransformationExtraArgs(tx.init, update)


def init_state(
    spec: MethodSpec,
    params: Any,
    model_state: Any,
    capacity: int,
    hparams: ServerHParams | Mapping[str, Any],
) -> AsyncState:
    """The initial cluster: ``capacity`` workers holding ``params`` (version 0), zero momenta."""
    stack = lambda t: jax.tree.map(lambda p: jnp.broadcast_to(p, (capacity, *p.shape)), t)
    # fresh buffers: the steps donate the state, the caller's arrays must survive
    params = jax.tree.map(lambda p: jnp.array(p, copy=True), params)
    model_state = jax.tree.map(lambda p: jnp.array(p, copy=True), model_state)
    zeros = jax.tree.map(jnp.zeros_like, params)
    return AsyncState(
        params=params,
        model_state=model_state,
        opt_state=spec.tx.init(params),
        workers=() if spec.mode == "sync" else stack(params),
        worker_model_state=() if spec.mode == "sync" else stack(model_state),
        velocity=stack(zeros) if spec.mode == "dana" else (),
        velocity_sum=zeros if spec.mode == "dana" else (),
        step=jnp.zeros((), jnp.int32),
        hparams=ServerHParams.of(hparams),
    )


def index(tree: Any, i: jax.Array) -> Any:
    """Row ``i`` of every leaf of a stacked pytree (a worker's snapshot)."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False), tree)


def set_row(tree: Any, value: Any, i: jax.Array) -> Any:
    """``tree`` (stacked) with row ``i`` of every leaf set to ``value``'s."""
    return jax.tree.map(lambda a, v: jax.lax.dynamic_update_index_in_dim(a, v, i, 0), tree, value)


def worker_gradient(
    apply: Callable[..., tuple[jax.Array, Any]],
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None,
    w: Any,
    model_state: Any,
    x: jax.Array,
    y: jax.Array,
) -> tuple[jax.Array, Any, Any]:
    """``(loss, new_model_state, grads)`` of a worker's batch at its weights ``w`` (train mode;
    ``loss_fn`` None: mean cross-entropy)."""
    loss_fn = loss_fn or cross_entropy

    def loss(p):
        logits, new_state = apply(p, model_state, x, True)
        return loss_fn(logits, y), new_state

    (value, new_state), g = jax.value_and_grad(loss, has_aux=True)(w)
    return value, new_state, g


def _lr(spec: MethodSpec, step: jax.Array) -> Any:
    lr: Any = spec.learning_rate
    return lr(jnp.maximum(step, 0)) if callable(lr) else lr


def _lookahead(spec: MethodSpec, params: Any, vsum: Any, step: jax.Array) -> Any:
    """DANA's look-ahead ``θ − η_step·μ·Σ`` (``η`` of update ``step``, the last one applied)."""
    lr, mu = _lr(spec, step), spec.momentum
    return jax.tree.map(lambda w, t: (w - lr * mu * t).astype(w.dtype), params, vsum)


def async_update(
    spec: MethodSpec,
    s: AsyncState,
    worker: jax.Array,
    staleness: jax.Array,
    extra: dict[str, Any],
    grad: tuple[jax.Array, Any, Any],
    pulled: tuple[Any, Any],
) -> AsyncState:
    """Apply one worker's gradient (``"async"`` or ``"dana"`` mode): update ``t`` → ``t + 1``.

    Args:
        spec: the method.
        s: the cluster.
        worker: int32, the finishing worker ``i``.
        staleness: int32, the gradient's staleness ``τ``.
        extra: further per-update arguments for ``tx.update`` (e.g. LC-ASGD's ``t_comm``).
        grad: ``(loss, new_model_state, g)`` from :func:`worker_gradient` at the snapshot.
        pulled: ``(w_i, model_state_i)``, the worker's snapshot (``index(s.workers, worker)``…).

    Returns:
        The cluster after the update: :func:`update_rows`, its rows written into the stacks.
    """
    v_i = index(s.velocity, worker) if spec.mode == "dana" else ()
    new, (w_row, ms_row, v_row) = update_rows(spec, s, worker, staleness, extra, grad, pulled, v_i)
    new = new._replace(
        workers=set_row(s.workers, w_row, worker),
        worker_model_state=set_row(s.worker_model_state, ms_row, worker),  # pulled with w
    )
    return new._replace(velocity=set_row(s.velocity, v_row, worker)) if spec.mode == "dana" else new


def update_rows(
    spec: MethodSpec,
    s: AsyncState,
    worker: jax.Array,
    staleness: jax.Array,
    extra: dict[str, Any],
    grad: tuple[jax.Array, Any, Any],
    pulled: tuple[Any, Any],
    velocity_i: Any = (),
) -> tuple[AsyncState, tuple[Any, Any, Any]]:
    """:func:`async_update` on the finishing worker's own rows, its ``[C, ...]`` stacks left
    alone (``s.workers``, ``s.worker_model_state`` and ``s.velocity`` are not read: they may be
    ``()``); ``velocity_i`` is DANA's ``v^i`` (``()`` in ``"async"`` mode).

    Returns:
        ``(s', (weights, model_state, velocity))``: the cluster with ``params``,
        ``model_state``, ``opt_state``, ``velocity_sum`` and ``step`` advanced, and what worker
        ``i`` now holds — ``"async"``: the new weights and model state themselves (``s'.params``,
        ``s'.model_state``, velocity ``()``); ``"dana"``: the look-ahead, the model state and
        ``v^i``.
    """
    loss, new_ms, g = grad
    w_i, ms_i = pulled
    if spec.merge_model_state is not None:
        new_ms = spec.merge_model_state(s.model_state, ms_i, new_ms)
    if spec.mode == "dana":  # the look-ahead a worker pulling now would get (sent last update)
        extra = {**extra, "lookahead": _lookahead(spec, s.params, s.velocity_sum, s.step - 1)}
    u, opt_state = spec.tx.update(
        g,
        s.opt_state,
        s.params,
        stale_params=w_i,
        staleness=staleness.astype(jnp.int32),
        worker=worker,
        worker_loss=loss,
        **extra,
    )
    new = s._replace(model_state=new_ms, opt_state=opt_state, step=s.step + 1)
    if spec.mode == "async":
        params = optax.apply_updates(s.params, u)
        return new._replace(params=params), (params, new_ms, ())
    mu = spec.momentum  # dana
    v_new = jax.tree.map(lambda v, gi: mu * v + gi, velocity_i, u)
    vsum = jax.tree.map(lambda t, a, b: t + (a - b), s.velocity_sum, v_new, velocity_i)
    lr = _lr(spec, s.step)
    params = jax.tree.map(lambda w, v: (w - lr * v).astype(w.dtype), s.params, v_new)
    look = _lookahead(spec, params, vsum, s.step)
    return new._replace(params=params, velocity_sum=vsum), (look, new_ms, v_new)


def sync_update(
    spec: MethodSpec, s: AsyncState, grads: tuple[jax.Array, Any, Any]
) -> tuple[AsyncState, jax.Array]:
    """SSGD: ``grads = (losses, model_states, gradients)`` of the M workers, stacked, taken at
    ``w_t``; average and apply once. Returns ``(state, mean loss)``.

    The averages over the workers are :func:`jaxstale.losses.batch_mean` (a fixed order of
    element-wise additions): the emulator sums a vmapped stack, the mesh executor rows that
    live on different devices, and ``jnp.mean`` would reduce them in different orders."""
    loss, new_ms, g = grads
    g = jax.tree.map(batch_mean, g)
    new_ms = jax.tree.map(_worker_mean, new_ms)
    mean_loss = batch_mean(loss)
    u, opt_state = spec.tx.update(
        g,
        s.opt_state,
        s.params,
        stale_params=s.params,
        staleness=jnp.int32(0),
        worker=jnp.int32(0),
        worker_loss=mean_loss,
    )
    params = optax.apply_updates(s.params, u)
    new = s._replace(params=params, model_state=new_ms, opt_state=opt_state)
    return new._replace(step=s.step + 1), mean_loss


def _worker_mean(a: jax.Array) -> jax.Array:
    """The workers' mean of a stacked model-state leaf (floats in a fixed order)."""
    if jnp.issubdtype(a.dtype, jnp.floating):
        return batch_mean(a)
    return jnp.mean(a, axis=0).astype(a.dtype)
