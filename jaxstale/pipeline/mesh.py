"""A pipeline program on a device mesh: one stage per device of a ``"stage"`` axis.

Runs the emulator's :class:`~jaxstale.pipeline.program.Program` tick by tick
(:meth:`~jaxstale.pipeline.program.Program.tick_table`): every device runs its stage's op —
idle, forward or backward — with the weights the policy names, and an update lands at the end
of the tick of the backward that completes it. Heterogeneous stages share one axis: each
stage's parameters are flattened (``ravel_pytree``), zero-padded to ``P_max`` and stacked
``[N, P_max]``, sharded ``P('stage')``; inside ``jax.shard_map`` each device runs its own stage
through ``lax.switch`` (idle, ``F_k``, ``B_k``). Activations and cotangents travel as flat
buffers padded to ``A_max`` with ``lax.ppermute`` every tick and are filed into the slots the
program names; a ``"saved"`` backward (and ``stash``) rebuilds the forward's linearisation from
its residuals, kept flattened and padded to ``R_max``. Memory per device: weights, optimizer
state and gradient accumulator of ``P_max``, a stash of ``C × P_max`` (``C`` the most versions
any stage keeps), slots ``S × A_max`` and ``S × R_max``. One compiled tick serves every program
of the same sizes. Batch-norm state is not carried on the mesh (use ``mlp`` or ``cnn``). On CPU
devices each tick completes before the next is dispatched (``MeshPipeline.block_ticks``: XLA:CPU's
in-process collectives can otherwise deadlock between consecutive ticks).

**Several processes** (:mod:`jaxstale.distributed`): the ``"stage"`` axis may span the devices
of several processes, each running the same program on the same host data (mini-batches,
initial weights, program). Every process must hold a stage (:func:`jaxstale.mesh.make_mesh`
takes devices from every process; :func:`jaxstale.mesh.check_mesh` checks a given mesh); the
program's rows, the data and the initial state go onto the mesh with
:func:`jaxstale.mesh.to_mesh` (each process fills its own devices' shards), activations and
cotangents cross processes in ``lax.ppermute``, each tick's loss is replicated (read from this
process's devices), and the weights (:meth:`MeshPipeline.stage_params`, the executor's
``params``) and :meth:`MeshPipeline.busy` are gathered to every process with
:func:`jaxstale.mesh.to_host` (a collective: every process calls them at the same points, as
:func:`jaxstale.loop.run` does). Results are written by process 0. In one process this is the
same code path as before: ``jax.device_put`` and device arrays.

References:
    Huang et al., "GPipe", NeurIPS 2019, arXiv:1811.06965. Narayanan et al., "PipeDream", SOSP
    2019. JAX documentation, "Manual parallelism with shard_map"
    (https://docs.jax.dev/en/latest/notebooks/shard_map.html).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec

from jaxstale._batching import materialised
from jaxstale._compile import memo
from jaxstale.loop import Executor, Stats, jit
from jaxstale.losses import cross_entropy
from jaxstale.mesh import check_mesh, make_mesh, to_host, to_mesh
from jaxstale.pipeline.kernel import (
    compose,
    lookback_weights,
    pass_weights,
    rebuild,
    split_residuals,
    stage_optimizer,
)
from jaxstale.pipeline.program import Program
from jaxstale.pipeline.stage_trees import StageTrees
from jaxstale.schedules import BACKWARD, FORWARD
from jaxstale.versions import VersionBuffer

__all__ = ["MeshPipeline", "MeshState", "executor"]

# the program's per-tick fields, one int32 row per tick and stage (lr_scale: its float32 bits)
FIELDS: tuple[str, ...] = (
    "op", "data", "micro", "in_slot", "ct_slot", "res_slot", "recv_act", "recv_ct",
    "tau", "horizon", "rule", "update", "first", "lr_scale",
)  # fmt: skip
_F = {name: i for i, name in enumerate(FIELDS)}


class MeshState(NamedTuple):
    """Executor state, every leaf ``[N, ...]`` sharded ``P('stage')``: flat padded weights
    ``params``, their ``opt_state``, a ``stash`` (:class:`jaxstale.VersionBuffer` per stage),
    slots of in-flight stage inputs ``acts``, cotangents ``cots`` and residuals ``res``, what
    arrived over ``ppermute`` at the last tick (``inbox_f``, ``inbox_b``), the accumulated
    gradient ``gacc`` and ``busy`` (ticks each device spent on F or B). Sharded over the mesh:
    read a leaf with :func:`jaxstale.mesh.to_host` (several processes: a collective)."""

    params: jax.Array
    opt_state: Any
    stash: VersionBuffer
    acts: jax.Array
    cots: jax.Array
    res: jax.Array
    inbox_f: jax.Array
    inbox_b: jax.Array
    gacc: jax.Array
    busy: jax.Array


def _as_stage(stage: Any) -> tuple[Callable[[Any, jax.Array], jax.Array], Any]:
    if hasattr(stage, "apply") and hasattr(stage, "params"):
        if jax.tree.leaves(getattr(stage, "state", None)):
            raise ValueError(
                "the mesh pipeline supports stages without non-parameter state (no batch-norm "
                "statistics); use the mlp or cnn model"
            )
        st = stage.state
        return (lambda p, x: stage.apply(p, st, x, True)[0]), stage.params
    if isinstance(stage, tuple | list) and len(stage) == 2 and callable(stage[0]):
        return stage[0], stage[1]
    raise TypeError(
        "each stage must be a jaxstale.models.Functional or a (fn(params, x) -> y, params) pair, "
        f"got {type(stage).__name__}"
    )


def _state_reads_shapes(tx: optax.GradientTransformation, params: Any) -> bool:
    """Whether ``tx``'s state on a stage's pytree is not, in size, its state on the flat vector
    (basis rotation keeps a basis per matrix): such an optimizer must update pytrees."""
    size = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
    flat = jax.ShapeDtypeStruct((size(params),), jnp.result_type(*jax.tree.leaves(params)))
    return size(jax.eval_shape(tx.init, params)) != size(jax.eval_shape(tx.init, flat))


def _pad(v: jax.Array, size: int) -> jax.Array:
    return jnp.pad(v, (0, size - v.shape[0]))


_SLOTS = ("acts", "cots", "res")


def _local(st: MeshState, fn: Callable[[jax.Array], jax.Array]) -> MeshState:
    """``fn`` (drop / restore the leading device axis) on every leaf but the slot buffers, which
    keep their axis of 1 inside ``shard_map``: filed into in place one slot at a time, where
    squeezed buffers would be copied whole by XLA, several times per tick."""
    return MeshState(
        **{f: v if f in _SLOTS else jax.tree.map(fn, v) for f, v in st._asdict().items()}
    )


def _file(buf: jax.Array, item: jax.Array, slot: jax.Array) -> jax.Array:
    """``buf [1, S, X]`` with ``item [X]`` written into slot ``slot`` (in place)."""
    return jax.lax.dynamic_update_slice(buf, item[None, None].astype(buf.dtype), (0, slot, 0))


class MeshPipeline:
    """The compiled tick of a pipeline on a ``"stage"`` mesh (shared by its executors).

    Args:
        stages: ``N`` stages: :class:`jaxstale.models.Functional` (no batch-norm state) or
            ``(fn(params, x) -> y, params)`` pairs.
        program: the program (its sizes and policy structure).
        tx: the per-stage optimizer, applied on each stage's device to its flat weight vector
            (element-wise optimizers: SGD, Adam, NAdam), or with ``stage_trees`` to the
            stage's parameter pytree.
        micro_x: an example micro-batch input ``[mb, ...]``.
        mesh: a mesh with a ``"stage"`` axis of ``N`` devices (default: the first ``N``).
        momentum: ``μ`` of the Nesterov prediction rule.
        loss_fn: ``loss_fn(logits, labels) -> scalar``.
        stage_trees: apply ``tx`` to each stage's parameter pytree
            (:class:`~jaxstale.pipeline.stage_trees.StageTrees`): needed by an optimizer that
            reads the parameters' shapes (``jaxstale.optimizers``' AdamW decays matrices only,
            Muon orthogonalises them) and by per-stage ``hyperparams``. Default: on when
            ``hyperparams`` are given.
        hyperparams: ``{name: value or [value per stage]}`` of an ``inject_hyperparams``
            optimizer, set in each stage's initial state (AsyncPP's β1 per stage).
    """

    def __init__(
        self,
        stages: Sequence[Any],
        program: Program,
        tx: optax.GradientTransformation,
        micro_x: Any,
        *,
        mesh: jax.sharding.Mesh | None = None,
        momentum: float = 0.0,
        loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
        stage_trees: bool | None = None,
        hyperparams: Mapping[str, Any] | None = None,
    ) -> None:
        self.num_stages = n = program.schedule.num_stages
        if len(stages) != n:
            raise ValueError(f"{len(stages)} stages given for a schedule of {n} stages")
        self.mesh = make_mesh(n, "stage") if mesh is None else check_mesh(mesh, "stage", n)
        self.program, self.loss_fn, self.momentum = program, loss_fn, float(momentum)
        self.predict = program.policy.predict is not None
        self.tx = stage_optimizer(tx, program)
        self.saved = program.saves_residuals
        self.num_micro = program.schedule.num_micro
        fns, params = zip(*[_as_stage(s) for s in stages], strict=True)
        self.fns = list(fns)
        flats, self.unravels = [], []
        for p in params:
            f, unravel = ravel_pytree(p)
            flats.append(f)
            self.unravels.append(unravel)
        self.sizes = [int(f.shape[0]) for f in flats]
        self.p_max = max(self.sizes)
        self.dtype = jnp.result_type(*flats)
        self.flat0 = jnp.stack([_pad(f.astype(self.dtype), self.p_max) for f in flats])
        if stage_trees is None:  # a state that is not the flat vector's reads the shapes
            stage_trees = bool(hyperparams) or any(_state_reads_shapes(self.tx, p) for p in params)
        if hyperparams and not stage_trees:
            raise ValueError("hyperparams per stage need stage_trees=True")
        self.trees = (
            StageTrees(self.tx, params, self.dtype, self.p_max, hyperparams)
            if stage_trees
            else None
        )
        x = jax.ShapeDtypeStruct(np.shape(micro_x), jnp.result_type(micro_x))
        self.micro_shape = tuple(x.shape)
        self.in_shapes: list[Any] = [x]  # stage k's input
        for fn, p in zip(self.fns[:-1], params[:-1], strict=True):
            y = jax.eval_shape(fn, p, self.in_shapes[-1])
            self.in_shapes.append(jax.ShapeDtypeStruct(y.shape, y.dtype))
        self.a_max = max([math.prod(s.shape) for s in self.in_shapes[1:]], default=1)
        # residuals a forward keeps for its backward: (treedef, kinds, shapes) per stage
        self.res_specs: list[Any] = []
        for k in range(n - 1 if self.saved else 0):
            spec = jax.eval_shape(lambda p, x, k=k: self._linearise(k, p, x)[2], params[k],
                                  self.in_shapes[k])  # fmt: skip
            self.res_specs.append([(r.shape, r.dtype) for r in spec])
        self.r_max = max([sum(math.prod(s) for s, _ in sp) for sp in self.res_specs] or [1]) or 1
        self.slots = max(*program.in_cap, *program.ct_cap, *program.res_cap, 1)
        self.capacity = max(program.stash_capacity)
        self._tick = jit(self._sharded(), donate_argnums=(0,))
        # XLA:CPU runs the devices' collectives on a bounded thread pool: a tick dispatched
        # while the previous one is still waiting in a collective can take the threads that
        # one needs, and both hang. Emulated CPU devices therefore finish each tick first.
        self.block_ticks = all(d.platform == "cpu" for d in self.mesh.devices.flat)

    def _linearise(self, k: int, p: Any, x: jax.Array) -> tuple[Any, Any, list]:
        y, vjp_fn = jax.vjp(self.fns[k], p, x)
        return y, vjp_fn, split_residuals(vjp_fn, p, x)[2]

    def _stage_in(self, k: int, x_in: jax.Array, xb: jax.Array) -> jax.Array:
        if k == 0:
            return xb
        shape = self.in_shapes[k].shape
        return x_in[: math.prod(shape)].reshape(shape).astype(self.in_shapes[k].dtype)

    def _branches(self) -> list[Callable[..., Any]]:
        n, a_max, p_max, dt, r_max = self.num_stages, self.a_max, self.p_max, self.dtype, self.r_max

        def zeros():
            return (
                jnp.zeros((a_max,), dt),
                jnp.zeros((p_max,), dt),
                jnp.zeros((), jnp.float32),
                jnp.zeros((r_max,), jnp.float32),
            )

        def idle(w, x_in, cot_in, res, xb, yb):
            za, zp, zl, zr = zeros()
            return za, za, zp, zl, zr

        def fwd(k):
            def f(w, x_in, cot_in, res, xb, yb):
                za, zp, zl, zr = zeros()
                if k == n - 1:  # fused into the loss stage's backward
                    return za, za, zp, zl, zr
                p = self.unravels[k](w[: self.sizes[k]])
                inp = self._stage_in(k, x_in, xb)
                if self.saved:
                    y, _, rest = self._linearise(k, p, inp)
                    flat = [r.reshape(-1).astype(jnp.float32) for r in rest]
                    zr = _pad(jnp.concatenate(flat), r_max) if flat else zr
                else:
                    y = self.fns[k](p, inp)
                return _pad(y.reshape(-1).astype(dt), a_max), za, zp, zl, zr

            return f

        def bwd(k):
            def f(w, x_in, cot_in, res, xb, yb):
                za, _, zl, zr = zeros()
                p = self.unravels[k](w[: self.sizes[k]])
                inp = self._stage_in(k, x_in, xb)
                if k == n - 1:  # one stage (k = 0): no input gradient (a GPT's are token ids)
                    loss, grads = jax.value_and_grad(
                        lambda p, x: self.loss_fn(self.fns[k](p, x), yb), argnums=(0, 1)[: 1 + k]
                    )(p, inp)
                    gp, gx = grads if k else (grads[0], None)
                else:
                    y_shape = self.in_shapes[k + 1]
                    ct = cot_in[: math.prod(y_shape.shape)].reshape(y_shape.shape)
                    if self.saved:  # the forward's linearisation, the backward's weights
                        saved, at = [], 0
                        for shape, dtype in self.res_specs[k]:
                            size = math.prod(shape)
                            saved.append(res[at : at + size].reshape(shape).astype(dtype))
                            at += size
                        vjp = rebuild(jax.vjp(self.fns[k], p, inp)[1], p, inp, iter(saved))
                    else:
                        _, vjp = jax.vjp(self.fns[k], p, inp)
                    gp, gx = vjp(ct.astype(y_shape.dtype))
                    loss = zl
                g = _pad(ravel_pytree(gp)[0].astype(dt), p_max)
                cot = za if gx is None or k == 0 else _pad(gx.reshape(-1).astype(dt), a_max)
                return za, cot, g, loss.astype(jnp.float32), zr

            return f

        return [idle] + [fwd(k) for k in range(n)] + [bwd(k) for k in range(n)]

    def init(self, params: Sequence[Any] | None = None) -> MeshState:
        """The initial :class:`MeshState` on the mesh from per-stage weights (default: the
        stages')."""
        n, dt = self.num_stages, self.dtype
        flat0 = self.flat0
        if params is not None:
            if len(params) != n:
                raise ValueError(f"params: {len(params)} stages given, the executor has {n}")
            flats = [ravel_pytree(p)[0].astype(dt) for p in params]
            if [int(f.shape[0]) for f in flats] != self.sizes:
                raise ValueError("params: stage parameter sizes differ from the executor's")
            flat0 = jnp.stack([_pad(f, self.p_max) for f in flats])
        state = MeshState(
            params=flat0,
            opt_state=(
                jax.vmap(self.tx.init)(flat0)
                if self.trees is None
                else self.trees.init(self.stage_params_of(flat0))
            ),
            stash=jax.vmap(lambda f: VersionBuffer.create(f, self.capacity))(flat0),
            acts=jnp.zeros((n, self.slots, self.a_max), dt),
            cots=jnp.zeros((n, self.slots, self.a_max), dt),
            res=jnp.zeros((n, self.slots, self.r_max), jnp.float32),
            inbox_f=jnp.zeros((n, self.a_max), dt),
            inbox_b=jnp.zeros((n, self.a_max), dt),
            gacc=jnp.zeros((n, self.p_max), dt),
            busy=jnp.zeros((n,), jnp.int32),
        )
        return to_mesh(state, NamedSharding(self.mesh, PartitionSpec("stage")))

    def _tick_local(
        self, st: MeshState, row: jax.Array, xs: jax.Array, ys: jax.Array
    ) -> tuple[MeshState, jax.Array]:
        """One tick on one device (inside ``shard_map``): file arrivals, run the op, update."""
        n, nm, tx = self.num_stages, self.num_micro, self.tx
        st = _local(st, lambda a: a[0])  # this device's stage
        row = row.reshape(-1)
        k = jax.lax.axis_index("stage")
        op, i = row[_F["op"]], row[_F["data"]]
        ra, rc = row[_F["recv_act"]], row[_F["recv_ct"]]
        ia, ic = jnp.maximum(ra, 0), jnp.maximum(rc, 0)
        acts = _file(st.acts, jnp.where(ra >= 0, st.inbox_f, st.acts[0, ia]), ia)
        cots = _file(st.cots, jnp.where(rc >= 0, st.inbox_b, st.cots[0, ic]), ic)
        # the weights this pass uses: stashed (tau > 0) and/or predicted (horizon > 0)
        tau = row[_F["tau"]]
        w = st.stash.get(tau)
        if self.predict:
            horizon, rule, mu = row[_F["horizon"]], row[_F["rule"]], self.momentum
            cur = w
            if self.trees is None:
                w = pass_weights(w, st.opt_state, horizon, rule, mu)
            else:
                predict = lambda p, s: pass_weights(p, s, horizon, rule, mu)
                w = self.trees.map_state(k, predict, w, st.opt_state)
            if self.program.predicts_back:  # a looked-back version: its own last update
                prev = st.stash.get(tau + 1)
                w = lookback_weights(cur, prev, w, tau, horizon, rule, mu)
        branch = jnp.where(op == 0, 0, jnp.where(op == FORWARD, 1 + k, 1 + n + k))
        rs = row[_F["res_slot"]]
        out, cot, g, loss, res = jax.lax.switch(
            branch,
            self._branches(),
            w,
            acts[0, row[_F["in_slot"]]],
            cots[0, row[_F["ct_slot"]]],
            st.res[0, rs],
            xs[i],
            ys[i],
        )
        res_buf = _file(st.res, jnp.where(op == FORWARD, res, st.res[0, rs]), rs)
        first = row[_F["first"]] > 0
        gacc = jnp.where(op == BACKWARD, jnp.where(first, g, st.gacc + g), st.gacc)

        def update(args):
            params, opt_state, stash, acc = args
            grad = acc / nm if nm > 1 else acc
            scale = jax.lax.bitcast_convert_type(row[_F["lr_scale"]], jnp.float32)
            if self.trees is None:
                upd, opt_state = tx.update(grad, opt_state, params, lr_scale=scale)
                params = optax.apply_updates(params, upd)
            else:
                params, opt_state = self.trees.update(k, grad, opt_state, params, lr_scale=scale)
            return params, opt_state, stash.push(params), acc

        params, opt_state, stash, gacc = jax.lax.cond(
            row[_F["update"]] > 0, update, lambda a: a, (st.params, st.opt_state, st.stash, gacc)
        )
        if n > 1:
            inbox_f = jax.lax.ppermute(out, "stage", [(j, j + 1) for j in range(n - 1)])
            inbox_b = jax.lax.ppermute(cot, "stage", [(j + 1, j) for j in range(n - 1)])
        else:
            inbox_f, inbox_b = out, cot
        new = MeshState(
            params=params,
            opt_state=opt_state,
            stash=stash,
            acts=acts,
            cots=cots,
            res=res_buf,
            inbox_f=inbox_f,
            inbox_b=inbox_b,
            gacc=gacc,
            busy=st.busy + (op != 0).astype(jnp.int32),
        )
        # the loss stage's loss, replicated on every device (one scalar all-reduce per tick)
        is_loss = (k == n - 1) & (op == BACKWARD)
        loss = jax.lax.psum(jnp.where(is_loss, loss, 0.0), "stage")
        return _local(new, lambda a: a[None]), loss

    def _sharded(self) -> Callable[..., Any]:
        stage, rep = PartitionSpec("stage"), PartitionSpec()
        return jax.shard_map(
            self._tick_local,
            mesh=self.mesh,
            in_specs=(stage, stage, rep, rep),
            out_specs=(stage, rep),
            check_vma=False,
        )

    def memory_analysis(self, state: MeshState, xs: Any, ys: Any) -> Any:
        """XLA's compiled memory analysis of one tick, per device (``.argument_size_in_bytes``,
        ``.temp_size_in_bytes`` etc.). ``state`` may be abstract (``jax.eval_shape(self.init)``:
        nothing is allocated); ``xs`` / ``ys`` are the micro-batch stacks ``[nb·M, mb, ...]``
        (arrays or ``jax.ShapeDtypeStruct``), replicated on every device."""
        stage = NamedSharding(self.mesh, PartitionSpec("stage"))
        rep = NamedSharding(self.mesh, PartitionSpec())
        spec = lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
        state = jax.tree.map(lambda a: spec(a, stage), state)
        row = jax.ShapeDtypeStruct((self.num_stages, len(FIELDS)), jnp.int32, sharding=stage)
        lowered = self._tick.lower(state, row, spec(xs, rep), spec(ys, rep))
        return lowered.compile().memory_analysis()

    def stage_params_of(self, flat: jax.Array) -> list[Any]:
        """One parameter pytree per stage from stacked flat weights ``[N, P_max]`` (local)."""
        return [self.unravels[k](flat[k, : self.sizes[k]]) for k in range(self.num_stages)]

    def stage_params(self, state: MeshState) -> list[Any]:
        """The weights held in ``state``, gathered to the host (of every process), one pytree
        per stage."""
        flat = to_host(state.params)
        return [
            self.unravels[k](jnp.asarray(flat[k, : self.sizes[k]])) for k in range(self.num_stages)
        ]

    def busy(self, state: MeshState) -> np.ndarray:
        """``[N]`` ticks each stage's device spent on a forward or backward, on the host (of
        every process)."""
        return to_host(state.busy)


def _core(
    stages: Sequence[Any],
    program: Program,
    tx: optax.GradientTransformation,
    micro: np.ndarray,
    mesh: jax.sharding.Mesh | None,
    momentum: float,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array],
    stage_trees: bool | None = None,
    hyperparams: Mapping[str, Any] | None = None,
) -> MeshPipeline:
    key = (
        tuple(id(getattr(st, "apply", st)) for st in stages),
        id(tx),
        id(mesh),
        float(momentum),
        id(loss_fn),
        micro.shape,
        str(micro.dtype),
        program.structure,
        stage_trees,
        repr(sorted((hyperparams or {}).items())),
    )
    build = lambda: MeshPipeline(
        stages,
        program,
        tx,
        micro,
        mesh=mesh,
        momentum=momentum,
        loss_fn=loss_fn,
        stage_trees=stage_trees,
        hyperparams=hyperparams,
    )
    return memo("pipeline.mesh", key, build, keep=(stages, tx, mesh, loss_fn))


def executor(
    stages: Sequence[Any],
    program: Program,
    tx: optax.GradientTransformation,
    xb: Any,
    yb: Any,
    *,
    mesh: jax.sharding.Mesh | None = None,
    momentum: float | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    stage_trees: bool | None = None,
    hyperparams: Mapping[str, Any] | None = None,
) -> Executor:
    """An :class:`~jaxstale.loop.Executor` of ``program`` on ``(xb, yb)`` on a ``"stage"`` mesh
    (default: the first ``N`` devices): the emulator executor's arguments, rounds, stats,
    ``init`` and ``params`` (as :func:`jaxstale.pipeline.emulator.executor`); ``stage_trees``
    and ``hyperparams`` as :class:`MeshPipeline` takes them. :class:`~jaxstale.data.Indexed`
    data are materialised (each stage's device holds the run's mini-batches)."""
    s = program.schedule
    if program.policy.predict == "nesterov" and momentum is None:
        raise ValueError(f"policy {program.policy.name!r} needs momentum=μ (the optimizer's μ)")
    xb, yb = materialised(xb, yb)
    nb, nm = s.num_batches, s.num_micro
    if xb.shape[0] != nb or yb.shape[0] != nb:
        raise ValueError(f"xb has {xb.shape[0]} mini-batches, the schedule {nb}")
    if xb.shape[1] % nm:
        raise ValueError(f"batch size {xb.shape[1]} is not divisible by {nm} micro-batches")
    xs = xb.reshape(nb * nm, xb.shape[1] // nm, *xb.shape[2:])
    ys = yb.reshape(nb * nm, yb.shape[1] // nm, *yb.shape[2:])
    core = _core(
        stages, program, tx, xs[0], mesh, momentum or 0.0, loss_fn, stage_trees, hyperparams
    )
    rep = NamedSharding(core.mesh, PartitionSpec())
    xs_d, ys_d = to_mesh(xs, rep), to_mesh(ys, rep)
    table = program.tick_table()
    rows_np = np.stack([table[f].view(np.int32) for f in FIELDS], axis=-1)  # [T, N, F] int32
    last = s.num_stages - 1
    loss_ticks = (table["op"][:, last] == BACKWARD).reshape(program.num_rounds, program.period)
    sharding = NamedSharding(core.mesh, PartitionSpec("stage"))
    rows: list[Any] = []

    def step(state: MeshState, r: int) -> tuple[MeshState, Stats]:
        if not rows:
            rows.extend(to_mesh(row, sharding) for row in rows_np)
        loss_sum = jnp.zeros((), jnp.float32)
        for t in range(r * program.period, (r + 1) * program.period):
            state, loss = core._tick(state, rows[t], xs_d, ys_d)
            if core.block_ticks:
                jax.block_until_ready(state)
            if not loss.is_fully_addressable:  # replicated: this process's copy, no collective
                loss = loss.addressable_data(0)
            loss_sum = loss_sum + loss
        count = int(loss_ticks[r].sum()) // nm
        loss_v = np.asarray(loss_sum, np.float32)
        loss_v = loss_v / np.float32(nm) if nm > 1 else loss_v
        return state, Stats(loss_v.reshape(1, 1), np.asarray([[count]], np.int32))

    return Executor(
        init=lambda params, states: core.init(params),
        step=step,
        params=lambda state: (
            core.stage_params(state),
            [getattr(st, "state", {}) for st in stages],
        ),
        apply=compose(stages),
        num_rounds=program.num_rounds,
        num_updates=nb,
    )
