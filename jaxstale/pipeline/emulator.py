"""Single-device execution of a pipeline program, one jitted round at a time.

A model split into ``N`` stages (:func:`jaxstale.models.functional_stages`) is trained on one
device exactly as a pipeline would train it: the :class:`~jaxstale.pipeline.program.Program`'s
rounds run in order, each a jitted function with donated buffers called from a host loop. A
round's ticks are unrolled (no ``lax.scan`` over conv layers — ``benchmarks/loop_strategies.py``)
unless its (stage, kind) pattern repeats within the round: a 2BW round (``2N`` ticks, ``N``
micro-batches per stage) is a ``lax.fori_loop`` over ``N`` chunks of 2 unrolled ticks, so its
compile time grows like ``N``, not ``N²`` (``benchmarks/results/pipeline_emulation_gpt.md``). A
pass's weights are the stage's current ones, a stashed version or a prediction
(:func:`~jaxstale.pipeline.kernel.pass_weights`); gradients are vector-Jacobian products per stage,
``(W̄_k, x̄_k) = vjp((W, x) ↦ s_k(W, x))|_(W^B_k, x_k)(ȳ_k)``, with ``x_k`` the stage input kept
since the forward (made with the forward weights) and ``W^B_k`` the backward weights. The stage
optimizer (:func:`~jaxstale.pipeline.kernel.stage_optimizer`) scales each update by the program's
``lr_scale``. Where they differ (vanilla, prediction) the program's ``backward`` mode decides:
``"saved"`` keeps the forward's residuals and puts ``W^B_k`` only where the weights themselves are
residuals (``x̄ = ȳ W_Bᵀ``; within 1.3x of a plain step); ``"recompute"`` recomputes the stage
forward at ``W^B_k`` (about 4/3 of a step). The loss stage fuses its F and B (they see one version
in every schedule here); ops of absent mini-batches are masked; each stage's batch-norm statistics
are updated once per forward pass.

Example:
    >>> import numpy as np, optax
    >>> from jaxstale import loop, models, schedules
    >>> from jaxstale.pipeline import compile, emulator
    >>> model = models.create("mlp", input_shape=(4, 4, 1), num_classes=3, hidden=(8,))
    >>> stages = models.functional_stages(model, 2)
    >>> xb = np.zeros((3, 4, 4, 4, 1), np.float32); yb = np.zeros((3, 4), np.int32)
    >>> prog = compile(schedules.one_f_one_b(2, 3), "stash")
    >>> ex = emulator.executor(stages, prog, optax.sgd(0.1, 0.9), xb, yb)
    >>> (res,) = loop.run(ex, [s.params for s in stages], [s.state for s in stages])
    >>> ex.num_rounds, prog.stash_capacity, len(res.losses)
    (4, (2, 1), 3)

References:
    Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019.
    Chen, Yang, Cheng, "Efficient and Robust Parallel DNN Training through Model Parallelism on
    Multi-GPU Platform" (SpecTrain), arXiv:1809.02839, 2018.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale import schedules as S
from jaxstale._batching import Indexed, check_streams, stream_shape
from jaxstale._compile import memo
from jaxstale.loop import Executor, Stats, jit
from jaxstale.losses import cross_entropy
from jaxstale.optimizers import set_hyperparams
from jaxstale.pipeline.kernel import (
    _tree_where,
    compose,
    lookback_weights,
    pass_weights,
    rebuild,
    split_residuals,
    stage_optimizer,
)
from jaxstale.pipeline.program import Program
from jaxstale.versions import VersionBuffer

__all__ = ["PipelineEmulator", "executor", "for_program", "set_hyperparams"]


def _slot(b: jax.Array, m: Any, nm: int, cap: int) -> jax.Array:
    return (b * nm + m) % cap


def _tick_ops(program: Program) -> dict[str, np.ndarray]:
    """The round template per tick and stage, ``[period, N]`` int32 arrays: the column ``col``
    of the op in the program's tables, its ``micro``-batch, ``update`` and ``first`` flags."""
    n = program.schedule.num_stages
    out = {f: np.zeros((program.period, n), np.int32) for f in ("col", "micro", "update", "first")}
    j = 0
    for ti, row in enumerate(program.ticks):
        for o in row:
            out["col"][ti, o.stage] = j
            out["micro"][ti, o.stage] = o.micro
            out["update"][ti, o.stage] = int(o.update)
            out["first"][ti, o.stage] = int(o.first_micro)
            j += 1
    return out


def _sub_period(program: Program) -> int:
    """The shortest ``p`` dividing the round's period such that tick ``t`` and tick ``t + p``
    run the same (stage, kind) ops: 2 for 1F1B-like rounds, the period for a flush's."""
    sig = [tuple((o.stage, o.kind) for o in row) for row in program.ticks]
    period = len(sig)
    for p in range(1, period + 1):
        if period % p == 0 and all(sig[t] == sig[t % p] for t in range(period)):
            return p
    return period  # pragma: no cover - p = period always matches


class PipelineEmulator:
    """The compiled round of a program's structure on one device (shared by its executors).

    Programs that differ only in data — the prediction policies among themselves, every seed
    and data stream — share one compiled round: get it with :func:`for_program`.

    Args:
        stages: the stages in functional form (their ``apply``; weights come at :meth:`init`).
        program: the program (its structure: template, capacities, stash, prediction).
        tx: the per-stage optimizer (wrapped by :func:`stage_optimizer`: for predicting
            policies that does not change its updates).
        momentum: ``μ`` of the Nesterov prediction rule.
        loss_fn: ``loss_fn(logits, labels) -> scalar``.
        loop_ticks: run the round as a loop over the chunks its (stage, kind) pattern repeats
            in (``True``; ``ValueError`` where it repeats in none) or unrolled (``False``);
            ``None`` (default): loop where it repeats. The two agree to float rounding.
    """

    def __init__(
        self,
        stages: Sequence[Any],
        program: Program,
        tx: optax.GradientTransformation,
        *,
        momentum: float = 0.0,
        loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
        loop_ticks: bool | None = None,
    ) -> None:
        if len(stages) != program.schedule.num_stages:
            raise ValueError(
                f"{len(stages)} stages given for a schedule of {program.schedule.num_stages} stages"
            )
        self.stages, self.prog, self.num_stages = list(stages), program, len(stages)
        self.stash, self.predict = program.stashes, program.policy.predict is not None
        self.tx = stage_optimizer(tx, program)
        self.momentum, self.loss_fn = float(momentum), loss_fn
        self._tick_ops = _tick_ops(program)
        self.sub_period = _sub_period(program)
        fits = self.sub_period < program.period
        self.looped = fits if loop_ticks is None else bool(loop_ticks)
        if self.looped and not fits:
            raise ValueError(
                f"loop_ticks: the {program.schedule.name!r} round's ticks repeat no shorter pattern"
            )
        self.step = jit(self._round, donate_argnums=(0,))
        self.lane_fns: dict[tuple, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # lanes

    def init(
        self,
        x_example: Any,
        params: Sequence[Any] | None = None,
        states: Sequence[Any] | None = None,
    ) -> dict[str, Any]:
        """The initial carry (weights or stashes, optimizer states, statistics, slot buffers)
        of one run; ``x_example`` is one mini-batch (for the shapes)."""
        n, nm, prog = self.num_stages, self.prog.schedule.num_micro, self.prog
        x = jnp.asarray(x_example)
        if x.shape[0] % nm:
            raise ValueError(f"batch size {x.shape[0]} is not divisible by {nm} micro-batches")
        shapes = [jax.ShapeDtypeStruct((x.shape[0] // nm, *x.shape[1:]), x.dtype)]
        for st in self.stages[:-1]:
            out, _ = jax.eval_shape(
                lambda p, q, v, st=st: st.apply(p, q, v, True), st.params, st.state, shapes[-1]
            )
            shapes.append(out)
        clone = lambda t: jax.tree.map(lambda a: jnp.array(a, copy=True), t)
        carry: dict[str, Any] = {k: [] for k in ("weights", "opt", "bn", "inp", "ct", "acc", "res")}
        params = [st.params for st in self.stages] if params is None else list(params)
        states = [st.state for st in self.stages] if states is None else list(states)
        for k in range(n):
            p = clone(params[k])
            w = VersionBuffer.create(p, prog.stash_capacity[k]) if self.stash else p
            carry["weights"].append(w)
            carry["opt"].append(self.tx.init(p))
            carry["bn"].append(clone(states[k]))
            res = []
            if prog.saves_residuals and k < n - 1:
                rest = lambda p, q, v, k=k: split_residuals(self._vjp(k, p, q, v)[1], p, v)[2]
                for r in jax.eval_shape(rest, p, states[k], shapes[k]):
                    res.append(jnp.zeros((prog.res_cap[k], *r.shape), r.dtype))
            carry["res"].append(res)
            carry["acc"].append(jax.tree.map(jnp.zeros_like, p) if nm > 1 else None)
            shp = shapes[k]
            carry["inp"].append(jnp.zeros((prog.in_cap[k], *shp.shape), shp.dtype) if k else None)
            o = shapes[k + 1] if k < n - 1 else None
            carry["ct"].append(jnp.zeros((prog.ct_cap[k], *o.shape), o.dtype) if o else None)
        return carry

    def _vjp(self, k: int, w: Any, bn: Any, x: jax.Array) -> tuple[Any, Any, Any]:
        """``(y, vjp_fn, new_bn)`` of stage ``k`` at weights ``w`` (train mode)."""
        st = self.stages[k]
        return jax.vjp(lambda p, xx: st.apply(p, bn, xx, True), w, x, has_aux=True)

    def current(self, carry: dict[str, Any], k: int) -> Any:
        """Stage ``k``'s current weights."""
        w = carry["weights"][k]
        return w.get(0) if self.stash else w

    def _weights_for(self, carry: dict[str, Any], k: int, tau: Any, h: Any, rule: Any) -> Any:
        """The weights a pass of stage ``k`` reads: the version ``tau`` pushes back (stashing)
        or the current one, then its prediction ``h`` updates ahead by ``rule``."""
        buf = carry["weights"][k]
        w = buf.get(tau) if self.stash else self.current(carry, k)
        if self.predict:
            fresh = pass_weights(w, carry["opt"][k], h, rule, self.momentum)
            if self.prog.predicts_back:  # a looked-back version: its own last update
                fresh = lookback_weights(w, buf.get(tau + 1), fresh, tau, h, rule, self.momentum)
            w = fresh
        return w

    def _micro(self, a: Any, b: Any, m: Any) -> jax.Array:
        """Micro-batch ``m`` of mini-batch ``b`` of ``a`` (``[nb, B, ...]``, or
        :class:`~jaxstale.data.Indexed`: its indices' micro-batch, gathered from ``a.x``)."""
        if isinstance(a, Indexed):
            return jnp.take(a.x, self._micro(a.idx, b, m), axis=0)
        nm = self.prog.schedule.num_micro
        xa = jax.lax.dynamic_index_in_dim(a, jnp.clip(b, 0, a.shape[0] - 1), 0, keepdims=False)
        if nm == 1:
            return xa
        parts = xa.reshape(nm, xa.shape[0] // nm, *xa.shape[1:])
        return parts[m] if isinstance(m, int) else jax.lax.dynamic_index_in_dim(parts, m, 0, False)

    def _stage_input(self, carry: dict[str, Any], k: int, b: Any, m: Any, xb: Any) -> Any:
        if k == 0:
            return self._micro(xb, b, m)
        nm, cap = self.prog.schedule.num_micro, self.prog.in_cap[k]
        return jax.lax.dynamic_index_in_dim(carry["inp"][k], _slot(b, m, nm, cap), 0, False)

    def _forward(
        self, carry: dict[str, Any], k: int, w: Any, x_in: Any, b: Any, m: Any, valid: Any
    ) -> Any:
        """Stage ``k``'s forward (not the loss stage's): its residuals, statistics and output
        filed; returns its VJP (for a same-round backward at the same weights)."""
        nm, prog = self.prog.schedule.num_micro, self.prog
        y, vjp_fn, new_bn = self._vjp(k, w, carry["bn"][k], x_in)
        if prog.saves_residuals:
            rslot = _slot(b, m, nm, prog.res_cap[k])
            carry["res"][k] = [
                jax.lax.dynamic_update_index_in_dim(buf, r, rslot, 0)
                for buf, r in zip(carry["res"][k], split_residuals(vjp_fn, w, x_in)[2], strict=True)
            ]
        carry["bn"][k] = _tree_where(valid, new_bn, carry["bn"][k])
        nxt = carry["inp"][k + 1]
        slot = _slot(b, m, nm, prog.in_cap[k + 1])
        carry["inp"][k + 1] = jax.lax.dynamic_update_index_in_dim(nxt, y.astype(nxt.dtype), slot, 0)
        return vjp_fn

    def _backward(self, carry, k, w, x_in, b, m, valid, yb, cached=None):
        """Stage ``k``'s backward (the loss stage's fused with its forward): the weight gradient
        (in the current weights' structure) and ``(loss, count)``; the input cotangent filed.
        ``cached``: the same round's forward VJP at these very weights, if any."""
        n, nm, prog, st = self.num_stages, self.prog.schedule.num_micro, self.prog, self.stages[k]
        bn = carry["bn"][k]
        loss, cnt = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)
        if k == n - 1:
            labels = self._micro(yb, b, m)

            def lossf(p, xx):
                out, nbn = st.apply(p, bn, xx, True)
                return self.loss_fn(out, labels), nbn

            # one stage (k = 0): no input gradient (a GPT's inputs are token ids)
            (lv, new_bn), grads = jax.value_and_grad(lossf, argnums=(0, 1)[: 1 + k], has_aux=True)(
                w, x_in
            )
            gw, gx = grads if k else (grads[0], None)
            carry["bn"][k] = _tree_where(valid, new_bn, carry["bn"][k])
            loss, cnt = jnp.where(valid, lv, 0.0), valid.astype(jnp.float32)
        else:
            cslot = _slot(b, m, nm, prog.ct_cap[k])
            ct = jax.lax.dynamic_index_in_dim(carry["ct"][k], cslot, 0, False)
            if cached is not None:
                vjp = cached  # same weights, same input: no recompute needed
            elif prog.saves_residuals:
                rslot = _slot(b, m, nm, prog.res_cap[k])
                saved = [jax.lax.dynamic_index_in_dim(a, rslot, 0, False) for a in carry["res"][k]]
                vjp = rebuild(self._vjp(k, w, bn, x_in)[1], w, x_in, iter(saved))
            else:
                _, vjp = jax.vjp(lambda p, xx: st.apply(p, bn, xx, True)[0], w, x_in)
            gw, gx = vjp(ct)
        if k > 0 and gx is not None:  # no input gradient at the first stage
            prev = carry["ct"][k - 1]
            slot = _slot(b, m, nm, prog.ct_cap[k - 1])
            carry["ct"][k - 1] = jax.lax.dynamic_update_index_in_dim(
                prev, gx.astype(prev.dtype), slot, 0
            )
        cur = self.current(carry, k)
        return jax.tree.unflatten(jax.tree.structure(cur), jax.tree.leaves(gw)), (loss, cnt)

    def _updated(self, k: int, weights: Any, opt: Any, gw: Any, valid: Any, scale: Any) -> Any:
        """Stage ``k``'s ``(weights, optimizer state)`` after its update with gradient ``gw``
        (masked where ``valid`` is false: then the unchanged weights are pushed, as the
        program's look-backs count)."""
        cur = weights.get(0) if self.stash else weights
        upd, new_opt = self.tx.update(gw, opt, cur, lr_scale=scale)
        new_w = _tree_where(valid, optax.apply_updates(cur, upd), cur)
        return (weights.push(new_w) if self.stash else new_w), _tree_where(valid, new_opt, opt)

    def _apply(self, carry: dict[str, Any], k: int, gw: Any, valid: Any, scale: Any) -> None:
        """Stage ``k``'s update in ``carry`` (see :meth:`_updated`)."""
        carry["weights"][k], carry["opt"][k] = self._updated(
            k, carry["weights"][k], carry["opt"][k], gw, valid, scale
        )

    def _round(self, carry, r_idx, tables, xb, yb):
        """One round: the template's ticks in order, unrolled; ops of absent mini-batches
        masked; the updates land at the end of their tick."""
        if self.looped:
            return self._looped_round(carry, r_idx, tables, xb, yb)
        nm, prog = self.prog.schedule.num_micro, self.prog
        carry = {key: list(v) for key, v in carry.items()}
        loss_sum = jnp.zeros((), jnp.float32)
        loss_cnt = jnp.zeros((), jnp.float32)
        j = 0
        fwd_cache: dict[tuple[int, int, int], Any] = {}
        for row in prog.ticks:
            pending = []
            for o in row:
                k, m = o.stage, o.micro
                valid, b = tables["valid"][r_idx, j], tables["batch"][r_idx, j]
                h, tau, rule = (tables[f][r_idx, j] for f in ("horizon", "tau", "rule"))
                scale = tables["lr_scale"][r_idx, j]
                j += 1
                if o.kind == S.FORWARD and k == self.num_stages - 1:
                    continue  # fused into the loss stage's backward
                w = self._weights_for(carry, k, tau, h, rule)
                x_in = self._stage_input(carry, k, b, m, xb)
                if o.kind == S.FORWARD:
                    # the same round's backward reuses this linearisation when it runs at the
                    # very same weights (flush schedules); otherwise XLA drops the residuals
                    fwd_cache[(k, o.d, m)] = (w, self._forward(carry, k, w, x_in, b, m, valid))
                    continue
                cached = fwd_cache.get((k, o.d, m))
                vjp = cached[1] if cached is not None and cached[0] is w else None
                gw, (ls, lc) = self._backward(carry, k, w, x_in, b, m, valid, yb, vjp)
                loss_sum, loss_cnt = loss_sum + ls, loss_cnt + lc
                if nm > 1:
                    acc = gw if o.first_micro else jax.tree.map(jnp.add, carry["acc"][k], gw)
                    if not o.update:
                        carry["acc"][k] = _tree_where(valid, acc, carry["acc"][k])
                        continue
                    gw = jax.tree.map(lambda a: a / nm, acc)
                if o.update:
                    pending.append((k, valid, gw, scale))
            for k, valid, gw, scale in pending:  # updates land at the end of the tick
                self._apply(carry, k, gw, valid, scale)
        return carry, (loss_sum, loss_cnt)

    def _looped_round(self, carry, r_idx, tables, xb, yb):
        """One round as a loop (``lax.fori_loop``) over its ``period / p`` chunks of ``p`` ticks,
        ``p`` the sub-period of the template's (stage, kind) pattern (2 for 2BW's round of
        ``2N`` ticks): a chunk's ticks are unrolled with the ops' kinds fixed and their
        mini-batch, micro-batch, slots and flags read per chunk; an update where only some
        chunks update is a ``lax.cond`` over the stage's weights and optimizer state. Each
        stage's passes compile ``p / 2`` times instead of ``period / 2``."""
        n, nm, ops, p = (
            self.num_stages,
            self.prog.schedule.num_micro,
            self._tick_ops,
            self.sub_period,
        )
        const = {f: jnp.asarray(v) for f, v in ops.items()}

        def flag(name: str, ti: int, k: int, t: jax.Array) -> Any:
            col = ops[name][ti::p, k]  # this op's flag in every chunk
            return bool(col[0]) if (col == col[0]).all() else const[name][t, k].astype(bool)

        def chunk(c_i: jax.Array, state: tuple) -> tuple:
            carry, loss_sum, loss_cnt = state
            carry = {key: list(v) for key, v in carry.items()}
            for ti, row in enumerate(self.prog.ticks[:p]):
                t = c_i * p + ti
                pending = []
                for o in row:
                    k = o.stage
                    if o.kind == S.FORWARD and k == n - 1:
                        continue  # fused into the loss stage's backward
                    j = const["col"][t, k]
                    valid, b, h, tau, rule, scale = (
                        tables[f][r_idx, j]
                        for f in ("valid", "batch", "horizon", "tau", "rule", "lr_scale")
                    )
                    m = const["micro"][t, k]
                    w = self._weights_for(carry, k, tau, h, rule)
                    x_in = self._stage_input(carry, k, b, m, xb)
                    if o.kind == S.FORWARD:
                        self._forward(carry, k, w, x_in, b, m, valid)
                        continue
                    gw, (ls, lc) = self._backward(carry, k, w, x_in, b, m, valid, yb)
                    loss_sum, loss_cnt = loss_sum + ls, loss_cnt + lc
                    if nm > 1:
                        first = flag("first", ti, k, t)
                        summed = jax.tree.map(jnp.add, carry["acc"][k], gw)
                        acc = _tree_where(first, gw, summed) if not isinstance(first, bool) else (
                            gw if first else summed
                        )  # fmt: skip
                        carry["acc"][k] = _tree_where(valid, acc, carry["acc"][k])
                        gw = jax.tree.map(lambda a: a / nm, acc)
                    pending.append((k, valid, gw, scale, flag("update", ti, k, t)))
                for k, valid, gw, scale, upd in pending:  # updates land at the end of the tick
                    if isinstance(upd, bool):
                        if upd:
                            self._apply(carry, k, gw, valid, scale)
                        continue
                    done = lambda wo, k=k, gw=gw, valid=valid, scale=scale: self._updated(
                        k, wo[0], wo[1], gw, valid, scale
                    )
                    pair = (carry["weights"][k], carry["opt"][k])
                    carry["weights"][k], carry["opt"][k] = jax.lax.cond(
                        upd, done, lambda wo: wo, pair
                    )
            return carry, loss_sum, loss_cnt

        zero = jnp.zeros((), jnp.float32)
        carry, loss_sum, loss_cnt = jax.lax.fori_loop(
            0, self.prog.period // p, chunk, (carry, zero, zero)
        )
        return carry, (loss_sum, loss_cnt)

    def memory_analysis(self, carry: dict[str, Any], xb: Any, yb: Any) -> Any:
        """XLA's compiled memory analysis of one round (``.argument_size_in_bytes`` etc.);
        ``carry``, ``xb`` and ``yb`` may be arrays or ``jax.ShapeDtypeStruct`` (e.g.
        ``jax.eval_shape(self.init, x0)``: nothing is allocated)."""
        tables = {k: jnp.asarray(v) for k, v in self.prog.tables.items()}
        put = lambda a: a if isinstance(a, jax.ShapeDtypeStruct) else jnp.asarray(a)
        xb, yb = (jax.tree.map(put, a) for a in (xb, yb))
        lowered = self.step.lower(carry, jnp.int32(0), tables, xb, yb)
        return lowered.compile().memory_analysis()


def for_program(
    stages: Sequence[Any],
    program: Program,
    tx: optax.GradientTransformation,
    *,
    momentum: float = 0.0,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    loop_ticks: bool | None = None,
) -> PipelineEmulator:
    """The :class:`PipelineEmulator` of ``program``'s structure, cached by that structure and
    the identities of the stages' applies, ``tx`` and ``loss_fn``: pass the same objects for
    every seed and policy of a sweep and they share one compiled round."""
    key = (
        tuple(id(st.apply) for st in stages),
        id(tx),
        float(momentum),
        id(loss_fn),
        program.structure,
        loop_ticks,
    )
    build = lambda: PipelineEmulator(
        stages, program, tx, momentum=momentum, loss_fn=loss_fn, loop_ticks=loop_ticks
    )
    return memo("pipeline.emulator", key, build, keep=(stages, tx, loss_fn))


def _lane_fns(
    core: PipelineEmulator, xb: Any, yb: Any
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The vmapped round (lanes share the program, each has its carry and data; the examples of
    :class:`~jaxstale.data.Indexed` data are shared, their indices per lane) and weights
    read-out of ``core``, compiled once per core and data kind."""
    axes = tuple(Indexed(None, 0) if isinstance(a, Indexed) else 0 for a in (xb, yb))
    if axes not in core.lane_fns:
        vround = jax.vmap(core._round, in_axes=(0, None, None, *axes))
        read = lambda c: ([core.current(c, k) for k in range(core.num_stages)], list(c["bn"]))
        core.lane_fns[axes] = (jit(vround, donate_argnums=(0,)), jit(jax.vmap(read)))
    return core.lane_fns[axes]


def _of_stage(value: Any, stage: int) -> Any:
    """A lane's hyper-parameter value at ``stage``: one value for every stage, or one each."""
    return value[stage] if isinstance(value, Sequence | np.ndarray) else value


def executor(
    stages: Sequence[Any],
    program: Program,
    tx: optax.GradientTransformation,
    xb: Any,
    yb: Any,
    *,
    momentum: float | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    lanes: int | None = None,
    hyperparams: Mapping[str, Sequence[float]] | None = None,
    loop_ticks: bool | None = None,
) -> Executor:
    """An :class:`~jaxstale.loop.Executor` of ``program`` on ``(xb [nb, B, ...], yb [nb, B])``,
    arrays or :class:`~jaxstale.data.Indexed` (one copy of the data and per-step indices,
    gathered inside the round: bit-identical, and a long run no longer holds ``nb * B``
    examples; ``idx`` then carries the lane axis, ``x`` is shared by the lanes).

    A round is one period of the schedule; ``init`` takes per-stage weights and batch-norm
    statistics, ``params`` returns them. ``tx`` is the per-stage optimizer (e.g.
    ``optax.sgd(η, μ)``); ``momentum`` is required by Nesterov-rule policies.

    ``lanes = L`` runs ``L`` runs of the program at once (``jax.vmap``; seeds, learning rates):
    ``xb``/``yb`` then carry a leading lane axis (``[L, nb, B, ...]``), ``init`` takes weights
    stacked over lanes, and ``hyperparams`` (``{name: [L] values}``) sets hyper-parameters of
    a ``tx`` built with ``optax.inject_hyperparams`` per lane (e.g. ``{"learning_rate": ...}``),
    so one compiled round serves a learning-rate grid; a lane's value may also be a sequence
    of one value per stage (e.g. AsyncPP's per-stage β1). ``loop_ticks``: see
    :class:`PipelineEmulator`.
    """
    s = program.schedule
    if program.policy.predict == "nesterov" and momentum is None:
        raise ValueError(f"policy {program.policy.name!r} needs momentum=μ (the optimizer's μ)")
    if lanes is not None and (not isinstance(lanes, int) or lanes < 1):
        raise ValueError(f"lanes must be a positive int, got {lanes!r}")
    if hyperparams and lanes is None:
        raise ValueError("hyperparams are per lane: pass lanes=L with them")
    hp = {k: list(v) for k, v in (hyperparams or {}).items()}
    for k, v in hp.items():
        if len(v) != lanes:
            raise ValueError(f"hyperparams[{k!r}] has {len(v)} values for {lanes} lanes")
        n = len(stages)
        if any(isinstance(x, Sequence | np.ndarray) and len(x) != n for x in v):
            raise ValueError(f"hyperparams[{k!r}]: a lane's per-stage values must be {n}")
    lead = (lanes,) if lanes is not None else ()
    check_streams(xb, yb)
    for name, a in (("xb", xb), ("yb", yb)):
        shp = stream_shape(a)
        if shp[: len(lead)] != lead or len(shp) <= len(lead):
            raise ValueError(f"{name} has shape {shp}, expected a leading lane axis of {lanes}")
    if stream_shape(xb)[len(lead)] != s.num_batches:
        raise ValueError(
            f"xb has {stream_shape(xb)[len(lead)]} mini-batches, the schedule {s.num_batches}"
        )
    core = for_program(
        stages, program, tx, momentum=momentum or 0.0, loss_fn=loss_fn, loop_ticks=loop_ticks
    )
    tables = {k: jnp.asarray(v) for k, v in program.tables.items()}
    first = (0,) * (len(lead) + 1)
    if isinstance(xb, Indexed):
        x0 = xb._replace(idx=np.asarray(xb.idx)[first]).gathered()
    else:
        x0 = np.asarray(xb[first])
    nm = s.num_micro
    xb, yb = (jax.tree.map(jnp.asarray, a) for a in (xb, yb))
    apply = compose(stages)
    n_lanes = 1 if lanes is None else lanes
    round_fn: Callable[..., Any]
    if lanes is None:
        round_fn = core.step
        read = lambda c: ([core.current(c, k) for k in range(core.num_stages)], list(c["bn"]))
        init = lambda params, states: core.init(x0, params, states)
    else:
        round_fn, read = _lane_fns(core, xb, yb)

        def init(params: Sequence[Any], states: Sequence[Any]) -> dict[str, Any]:
            carries = []
            for j in range(n_lanes):
                pick = lambda t, j=j: jax.tree.map(lambda a: a[j], t)
                c = core.init(x0, [pick(p) for p in params], [pick(q) for q in states])
                vals = [
                    {k: _of_stage(v[j], i) for k, v in hp.items()} for i in range(len(c["opt"]))
                ]
                c["opt"] = [set_hyperparams(o, v) for o, v in zip(c["opt"], vals, strict=True)]
                carries.append(c)
            return jax.tree.map(lambda *a: jnp.stack(a), *carries)

    def step(carry: dict[str, Any], r: int) -> tuple[dict[str, Any], Stats]:
        carry, (ls, lc) = round_fn(carry, jnp.int32(r), tables, xb, yb)
        loss = np.asarray(ls, np.float32) / np.float32(nm) if nm > 1 else np.asarray(ls)
        count = np.asarray(lc).astype(np.int32) // nm  # micro-batch losses -> mini-batches
        return carry, Stats(loss.reshape(n_lanes, 1), count.reshape(n_lanes, 1))

    return Executor(
        init=init,
        step=step,
        params=read,
        apply=apply,
        num_rounds=program.num_rounds,
        num_updates=s.num_batches,
        lanes=n_lanes,
        vmapped=lanes is not None,
    )
