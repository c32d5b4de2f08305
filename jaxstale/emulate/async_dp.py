"""Exact single-device emulation of asynchronous data-parallel SGD (a parameter server, M workers).

**What is emulated.** A parameter server holds the master weights ``w_t`` (version ``t`` = after
``t`` applied updates) and the optimizer state. Each of ``M`` workers holds the weights it last
pulled. A :class:`~jaxstale.delays.DelaySchedule` (computed on the host, independent of the
weights) says, for every applied update ``t``, which worker finishes next (``worker[t]``), the
version it pulled (``pulled[t]``) and its mini-batch (``batch[t]``). One emulated update is

    g      = ∇ℓ(w_worker; batch)                         (the worker's gradient, at its weights)
    u, s   = tx.update(g, s, w_t, stale_params=w_worker, staleness=τ_t)
    w_t+1  = w_t + u                                      (the server applies it)
    w_worker ← w_t+1                                      (the worker pulls)

with ``τ_t = t − pulled[t]``. Any optax chain works; staleness-aware transforms
(``jaxstale.dc_asgd``, ``gap_aware``, ``staleness_aware``, or your own) read the ``stale_params``
/ ``staleness`` extra arguments, plain optax transforms ignore them. The emulator also passes
``worker`` (the finishing worker's id), ``worker_loss`` (the gradient's mini-batch loss), for
timed delay models ``t_comm`` / ``t_comp`` (the worker's pull time and compute time), and any
per-update ``extra_args`` you give :func:`emulate_async` — what LC-ASGD's predictors need.

**Worker weights are per-worker snapshots**, a stacked ``[M, ...]`` copy of the parameters (row
``i`` = what worker ``i`` holds), rather than a :class:`~jaxstale.VersionBuffer` plus pulled
indices. Memory is ``M × params`` in both cases for constant delay / round-robin (a buffer of
capacity ``τ + 1 = M``), snapshots are smaller for gamma-timed workers (whose largest staleness is
about ``1.6 M``, so a buffer would need that many versions), and they also hold weights that are
not a server version — DANA's look-ahead. The update is an index read and an index write on
donated buffers, so it costs no copy.

**Model state (batch-norm running statistics) is per worker too**, as on a real parameter
server: a worker pulls the server's statistics with its weights, its forward pass (training
mode: normalised with the batch's own statistics) advances its copy,
``E ← m·E_pulled + (1 − m)·μ_batch``, and pushes it with the gradient. By default the server
keeps what arrives (*ordinary BN*, last writer wins: the updates other workers made since this
worker pulled are overwritten: with round-robin workers ``E`` is an EMA along the chain of pulls,
``E_t+1 = m·E_t−M+1 + (1 − m)·μ_t``, whose ``1/(1 − m)`` batches span ``M/(1 − m)`` updates of
the weights instead of ``1/(1 − m)``); a method's ``merge_model_state`` replaces that policy
(LC-ASGD's Async-BN merges each worker's batch statistics into the server's own EMA). Gradients
and losses never depend on the running statistics in training mode; evaluation uses the
server's. Memory: ``M`` copies of the statistics (tiny next to the weights).

**Modes** (:class:`MethodSpec`): ``"async"`` (above), ``"sync"`` (SSGD: every step the M workers'
gradients at the same ``w_t`` on M mini-batches are averaged and applied once, staleness 0;
at an equal number of processed samples it makes ``1/M`` as many updates), ``"dana"`` (DANA:
per-worker momentum ``v^i`` and their sum ``Σ`` on the server; ``tx`` then only pre-processes
the gradient, e.g. DC compensation for DANA-DC)::

    g ← tx(g; stale_params = ŵ_i)     v^i ← μ v^i + g     Σ ← Σ + (v^i_new − v^i_old)
    w ← w − η v^i                      ŵ_i ← w − η μ Σ     (the look-ahead sent to worker i)

**Built-in methods** (:data:`METHODS`, name → builder of ``HParams``; ``opt = optax.sgd(η, μ)``):

=============  =======  ======================================================================
name           mode     server chain
=============  =======  ======================================================================
sgd, asgd      async    ``opt`` (``sgd`` is meant for M = 1, ``asgd`` for M > 1)
ssgd           sync     ``opt`` on the average of M fresh gradients
sa-asgd        async    ``chain(staleness_aware(), opt)``: ``g / max(τ, 1)`` (Zhang et al.)
dc-asgd-c      async    ``chain(dc_asgd(0.04), opt)`` (Zheng et al., constant λ)
dc-asgd-a      async    ``chain(dc_asgd(2.0, adaptive=True), opt)`` (adaptive λ, m = 0.95)
gap-aware      async    ``chain(gap_aware(η, momentum=μ), opt)`` (Barkai et al.)
dana           dana     ``identity``, then DANA's per-worker momentum step (Hakimi et al.)
dana-dc        dana     ``dc_asgd(2.0, adaptive=True)`` against the look-ahead the worker used,
                        then DANA. ALGORITHMS.md §5 says "DC with λ = 2"; we read it as the
                        adaptive variant whose recommended λ0 is 2 **[ours]**.
=============  =======  ======================================================================

Add your own with :func:`register_method` (any transformation reading ``stale_params`` /
``staleness``); ``experiments/async_workers.py --methods`` then runs it by name.

**Loops** (DESIGN.md "compiled steps, measured loops"): one jitted step, state donated. MLPs run
it inside a ``lax.scan`` over a chunk of updates (one compiled call per evaluation interval);
models with convolutions (any parameter with ≥ 3 dimensions) call the jitted step from a host
loop, because a conv weight gradient inside a rolled scan is 12–50x slower on XLA:CPU. Seeds
are batched with ``vmap`` (break-even or better for MLPs on the CPU, a win on GPUs); pass
``vmap=False`` to run them one after another with the same compiled step.

**One compiled step per method.** The method is rebuilt inside the step from traced
hyper-parameters (learning rate, number of workers; :class:`HParams`), and the snapshot stack
has a fixed capacity (runs with fewer workers use its first rows), so the runs of a sweep that
differ in seed, learning rate or ``M`` (and delay model) share one executable: compile time,
not step time, dominates a CPU sweep (about 1 s per compile here).

**M = 1 reproduces synchronous SGD bit for bit**: the worker's snapshot is always equal to
``w_t``, the staleness is 0, every τ = 0 transform is the identity, and the gradient, update and
apply are the same operations as a plain ``optax`` step (the loss is ``jaxstale.losses``'s mean
cross-entropy). Measured on XLA:CPU: the final weights equal ``jaxstale.train.fit``'s bit for bit
with either loop (``tests/emulate/test_async_dp.py``), and also across loop types (trainer host
loop vs emulator scan, and vice versa). Where the order legitimately differs — a backend fusing
the scanned program differently, or DANA, whose ``Σ`` is kept incrementally — agreement is to
float32 rounding.

References:
    Zheng et al. "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017,
    arXiv 1609.08326. Zhang et al. "Staleness-aware Async-SGD for Distributed Deep Learning",
    IJCAI 2016, arXiv 1511.05950. Hakimi et al. "Taming Momentum in a Distributed Asynchronous
    Environment", arXiv 1907.11612. Barkai et al. "Gap-Aware Mitigation of Gradient Staleness",
    ICLR 2020, arXiv 1909.10802.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeAlias, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxstale.delays import DelaySchedule

__all__ = [
    "METHODS",
    "MODES",
    "AsyncEmulator",
    "AsyncState",
    "EmulationResult",
    "HParams",
    "MethodSpec",
    "as_spec",
    "build_method",
    "emulate_async",
    "evaluate_accuracy",
    "lr_warmup",
    "method_names",
    "register_method",
]

MODES: tuple[str, ...] = ("async", "sync", "dana")

Schedule = Callable[[jax.Array], jax.Array]
LearningRate = float | jax.Array | Schedule


# ----------------------------------------------------------------------------- methods


class HParams(NamedTuple):
    """What a method builder receives.

    The emulator builds the method *inside* its compiled step, so one compiled program serves
    every learning rate and worker count of a sweep (they are vmapped lanes or sequential calls
    of the same executable). Hence ``learning_rate`` and ``num_workers`` may be traced jax
    scalars: use them in arithmetic (``hp.learning_rate / hp.num_workers``), never in Python
    control flow. ``momentum`` is a static Python float (it may change state structure).

    Attributes:
        learning_rate: ``η``: a float, a traced scalar, or an optax schedule of the update count
            (the emulator's warm-up, :func:`lr_warmup`, arrives here as a schedule).
        momentum: ``μ`` (0.0 = plain SGD), a Python float.
        num_workers: ``M`` of this run (an int or a traced int32 scalar).
    """

    learning_rate: LearningRate | jax.Array
    momentum: float
    num_workers: int | jax.Array


class MethodSpec(NamedTuple):
    """How the emulator runs one method.

    Attributes:
        tx: the server's optax chain. Its ``update`` is called as
            ``tx.update(g, state, params, stale_params=…, staleness=…)``. In ``"dana"`` mode it
            only pre-processes the gradient (``optax.identity()`` for DANA, DC compensation for
            DANA-DC); the emulator then applies DANA's per-worker momentum step itself.
        mode: ``"async"`` (the worker's gradient is applied through ``tx``), ``"sync"`` (SSGD:
            the M workers' gradients at the same weights are averaged, one update) or ``"dana"``.
        learning_rate: ``η`` for ``"dana"`` mode (float or schedule); unused otherwise.
        momentum: ``μ`` for ``"dana"`` mode; unused otherwise.
        merge_model_state: optional server policy for non-trainable state (batch-norm
            statistics): ``merge(server, pulled, returned) -> new server state``, called with
            the server's state, the state the worker pulled with its weights (its forward pass
            started from it), and the state it returned (e.g. LC-ASGD's Async-BN).
            ``None``: ordinary batch-norm, the server keeps ``returned`` (last writer wins).
    """

    tx: optax.GradientTransformation
    mode: str = "async"
    learning_rate: LearningRate = 0.0
    momentum: float = 0.0
    merge_model_state: Callable[[Any, Any, Any], Any] | None = None


MethodBuilder = Callable[[HParams], "optax.GradientTransformation | MethodSpec"]


def _sgd(hp: HParams) -> optax.GradientTransformation:
    return optax.sgd(hp.learning_rate, momentum=hp.momentum or None)


def _build_sgd(hp: HParams) -> optax.GradientTransformation:
    return _sgd(hp)


def _build_ssgd(hp: HParams) -> MethodSpec:
    return MethodSpec(_sgd(hp), mode="sync")


def _build_sa(hp: HParams) -> optax.GradientTransformation:
    import jaxstale

    return optax.chain(jaxstale.staleness_aware(), _sgd(hp))


def _build_dc_c(hp: HParams) -> optax.GradientTransformation:
    import jaxstale

    return optax.chain(jaxstale.dc_asgd(0.04), _sgd(hp))


def _build_dc_a(hp: HParams) -> optax.GradientTransformation:
    import jaxstale

    return optax.chain(jaxstale.dc_asgd(2.0, adaptive=True), _sgd(hp))


def _build_gap_aware(hp: HParams) -> optax.GradientTransformation:
    import jaxstale

    ga = jaxstale.gap_aware(hp.learning_rate, momentum=hp.momentum)
    return optax.chain(ga, _sgd(hp))


def _build_dana(hp: HParams) -> MethodSpec:
    return MethodSpec(optax.identity(), "dana", hp.learning_rate, hp.momentum)


def _build_dana_dc(hp: HParams) -> MethodSpec:
    import jaxstale

    dc = jaxstale.dc_asgd(2.0, adaptive=True)
    return MethodSpec(dc, "dana", hp.learning_rate, hp.momentum)


#: name -> builder. The built-in methods; ``register_method`` adds yours.
METHODS: dict[str, MethodBuilder] = {
    "sgd": _build_sgd,
    "ssgd": _build_ssgd,
    "asgd": _build_sgd,
    "sa-asgd": _build_sa,
    "dc-asgd-c": _build_dc_c,
    "dc-asgd-a": _build_dc_a,
    "gap-aware": _build_gap_aware,
    "dana": _build_dana,
    "dana-dc": _build_dana_dc,
}
_BUILTIN = frozenset(METHODS)


def register_method(name: str, build: MethodBuilder, *, overwrite: bool = False) -> None:
    """Register a method for :func:`build_method` and the ``async_workers`` experiment.

    Args:
        name: the method's name (the ``"method"`` field of result rows), e.g. ``"my-asgd"``.
        build: ``build(hp: HParams)`` returning an optax transformation (run in ``"async"``
            mode) or a :class:`MethodSpec`. Learning rate and momentum come from ``hp``.
        overwrite: allow replacing an existing user method (built-ins cannot be replaced).

    Example:
        >>> import optax
        >>> from jaxstale.emulate import register_method, build_method, HParams
        >>> register_method("plain-doc", lambda hp: optax.sgd(hp.learning_rate), overwrite=True)
        >>> build_method("plain-doc", HParams(0.1, 0.0, 4)).mode
        'async'
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"method name must be a non-empty str, got {name!r}")
    if not callable(build):
        raise TypeError(f"build must be callable(HParams) -> transformation, got {build!r}")
    if name in _BUILTIN or (name in METHODS and not overwrite):
        raise ValueError(f"method {name!r} is already registered (pass overwrite=True for yours)")
    METHODS[name] = build


def method_names() -> tuple[str, ...]:
    """The registered method names, built-ins first."""
    return tuple(METHODS)


def build_method(name: str, hp: HParams) -> MethodSpec:
    """Build a registered method into a :class:`MethodSpec`.

    Args:
        name: a registered name (:func:`method_names`).
        hp: learning rate, momentum, number of workers.

    Returns:
        The :class:`MethodSpec` (a bare transformation is wrapped in ``"async"`` mode).

    Example:
        >>> from jaxstale.emulate import build_method, HParams
        >>> build_method("ssgd", HParams(0.1, 0.9, 4)).mode
        'sync'
    """
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
    return as_spec(METHODS[name](hp))


def as_spec(method: optax.GradientTransformation | MethodSpec) -> MethodSpec:
    """Wrap a bare optax transformation as an ``"async"`` :class:`MethodSpec`; check modes."""
    if isinstance(method, MethodSpec):
        if method.mode not in MODES:
            raise ValueError(f"unknown mode {method.mode!r}; allowed: {', '.join(MODES)}")
        return method._replace(tx=optax.with_extra_args_support(method.tx))
    if isinstance(method, optax.GradientTransformation):
        return MethodSpec(optax.with_extra_args_support(method))
    raise TypeError(f"expected an optax transformation or MethodSpec, got {type(method).__name__}")


def lr_warmup(
    learning_rate: float | jax.Array, num_workers: int | jax.Array, warmup_steps: int
) -> LearningRate:
    """Linear learning-rate warm-up from ``η/M`` to ``η`` over ``warmup_steps`` updates.

    ``η_t = η · (1/M + (1 − 1/M) · min(t / warmup_steps, 1))``. The DANA and Gap-Aware authors
    warm up over the first 5 epochs. ``warmup_steps = 0`` returns ``η`` unchanged; for ``M = 1``
    the schedule is constantly ``η`` (bit for bit). ``η`` and ``M`` may be traced.

    Args:
        learning_rate: ``η``.
        num_workers: ``M ≥ 1``.
        warmup_steps: number of updates of the ramp (``≥ 0``, a Python int).

    Returns:
        ``η`` or an optax schedule of the update count.

    Example:
        >>> from jaxstale.emulate import lr_warmup
        >>> s = lr_warmup(0.4, 4, 10)
        >>> [round(float(s(t)), 3) for t in (0, 5, 10, 20)]
        [0.1, 0.25, 0.4, 0.4]
    """
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int | np.integer):
        raise TypeError(f"warmup_steps must be an int, got {type(warmup_steps).__name__}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if isinstance(num_workers, int | np.integer) and num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if warmup_steps == 0:
        return learning_rate

    def schedule(count: jax.Array) -> jax.Array:
        inv = 1.0 / jnp.asarray(num_workers, jnp.float32)
        frac = jnp.minimum(jnp.asarray(count, jnp.float32) / warmup_steps, 1.0)
        return learning_rate * (inv + (1.0 - inv) * frac)

    return schedule


# ----------------------------------------------------------------------------- emulator


class AsyncState(NamedTuple):
    """The emulated cluster (a pytree; every field is donated by the compiled step).

    Attributes:
        params: the server's master weights ``w_t``.
        model_state: the server's non-trainable model variables (batch-norm running
            statistics): by default the ones the applied gradient's worker pushed (last writer
            wins), or what the method's ``merge_model_state`` made of them. An empty
            ``nnx.State`` for MLPs.
        opt_state: the optax chain's state.
        workers: ``[C, ...]`` the weights each worker holds (its pulled snapshot, or DANA's
            look-ahead), ``C`` = the emulator's worker capacity; ``()`` in ``"sync"`` mode.
        worker_model_state: ``[C, ...]`` the model state each worker pulled with its weights
            (its forward pass starts from it); ``()`` in ``"sync"`` mode.
        velocity: DANA's per-worker momentum ``[C, ...]``; ``()`` in other modes.
        velocity_sum: DANA's ``Σ_i v^i``; ``()`` in other modes.
        step: int32, the number of applied updates ``t`` (the current version).
        hparams: ``{"learning_rate": float32, "num_workers": int32}``, this run's traced
            hyper-parameters (what the method builder receives).
    """

    params: Any
    model_state: Any
    opt_state: Any
    workers: Any
    worker_model_state: Any
    velocity: Any
    velocity_sum: Any
    step: jax.Array
    hparams: dict[str, jax.Array]


Method: TypeAlias = str | MethodBuilder | optax.GradientTransformation | MethodSpec


def _default_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    from jaxstale.losses import cross_entropy

    return cross_entropy(logits, labels)


def _index(tree: Any, i: jax.Array) -> Any:
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, keepdims=False), tree)


def _set(tree: Any, value: Any, i: jax.Array) -> Any:
    return jax.tree.map(lambda a, v: jax.lax.dynamic_update_index_in_dim(a, v, i, 0), tree, value)


def _has_conv(params: Any) -> bool:
    return any(np.ndim(leaf) >= 3 for leaf in jax.tree.leaves(params))


def _as_builder(method: Method) -> MethodBuilder:
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; registered: {', '.join(METHODS)}")
        return METHODS[method]
    if isinstance(method, optax.GradientTransformation | MethodSpec):
        return lambda hp: method
    if callable(method):
        return method
    raise TypeError(
        "method must be a registered name, a builder(HParams), an optax transformation or a "
        f"MethodSpec; got {type(method).__name__}"
    )


class AsyncEmulator:
    """The compiled emulation step of one method on one model, for up to ``num_workers`` workers.

    The method is rebuilt from its hyper-parameters inside the compiled step, so every run that
    shares the method, the momentum and the shapes shares one compiled program: runs with other
    learning rates or fewer workers (``≤ num_workers``; their snapshots use the first rows) are
    vmapped lanes of one call (``vmap=True``) or further calls of the same executable.

    Args:
        apply: ``apply(params, model_state, x, train) -> (logits, new_model_state)``, pure
            (``jaxstale.models.functional(model).apply``).
        method: a registered name (``"dc-asgd-a"``), a builder ``HParams -> transformation or
            MethodSpec``, an optax transformation (``"async"`` mode) or a :class:`MethodSpec`.
        num_workers: the worker capacity ``C ≥ 1`` (rows of the snapshot stack). In ``"sync"``
            mode every run must have exactly this many workers.
        momentum: ``μ`` passed to builders (static).
        warmup_steps: linear learning-rate warm-up from ``η/M`` over this many updates
            (:func:`lr_warmup`; 0 = none). Applies to what builders receive as ``learning_rate``.
        loss_fn: ``loss_fn(logits, labels) -> scalar``; default mean cross-entropy.
        loop: ``"scan"`` (a chunk of updates per compiled call), ``"host"`` (one compiled call
            per update) or ``"auto"`` (``"host"`` for models with convolutions, decided at
            :meth:`init`).
        vmap: ``True`` when states and inputs carry a leading lane axis (seeds, lrs, M's).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from jaxstale.emulate import AsyncEmulator
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
        lr_warmup(0.1, 1, warmup_steps)  # validates warmup_steps
        self.build = _as_builder(method)
        self.apply = apply
        self.num_workers = int(num_workers)
        self.momentum = float(momentum)
        self.warmup_steps = int(warmup_steps)
        self.loss_fn = loss_fn or _default_loss
        self.loop = loop
        self.vmap = vmap
        self.mode = self.spec({"learning_rate": 0.1, "num_workers": self.num_workers}).mode
        self._init: Callable | None = None
        self._run_scan: Callable | None = None
        self._run_host: Callable | None = None

    def spec(self, hparams: dict[str, Any]) -> MethodSpec:
        """Build the method for one run's hyper-parameters (inside the trace)."""
        m = hparams["num_workers"]
        lr = lr_warmup(hparams["learning_rate"], m, self.warmup_steps)
        return as_spec(self.build(HParams(lr, self.momentum, m)))

    # -- state
    def _init_one(self, params: Any, model_state: Any, hparams: dict[str, Any]) -> AsyncState:
        c = self.num_workers
        spec = self.spec(hparams)
        stack = lambda t: jax.tree.map(lambda p: jnp.broadcast_to(p, (c, *p.shape)), t)
        # fresh buffers: run() donates the state, the caller's arrays must survive
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
            hparams=hparams,
        )

    def init(
        self,
        params: Any,
        model_state: Any,
        *,
        learning_rate: Any = 0.0,
        num_workers: Any = None,
    ) -> AsyncState:
        """The initial cluster: every worker holds ``params`` (version 0), zero momenta.

        Args:
            params: initial weights (stacked over lanes when ``vmap=True``).
            model_state: initial model state (same leading axis when ``vmap=True``).
            learning_rate: ``η`` given to the builder (``[S]`` per lane with vmap).
            num_workers: this run's ``M ≤`` capacity (default: the capacity; ``[S]`` with vmap).

        Returns:
            An :class:`AsyncState` (device arrays; donated by :meth:`run`).
        """
        if self.loop == "auto":
            leaves = jax.tree.leaves(params)
            one = [leaf[0] for leaf in leaves] if self.vmap else leaves
            self.loop = "host" if _has_conv(one) else "scan"
        m = self.num_workers if num_workers is None else num_workers
        m_arr = np.asarray(m)
        if m_arr.min() < 1 or m_arr.max() > self.num_workers:
            raise ValueError(f"num_workers must be in [1, {self.num_workers}], got {m}")
        if self.mode == "sync" and m_arr.min() != self.num_workers:
            raise ValueError(f"sync mode: every run needs exactly {self.num_workers} workers")
        lead = (np.shape(jax.tree.leaves(params)[0])[0],) if self.vmap else ()
        hp = {
            "learning_rate": np.broadcast_to(np.asarray(learning_rate, np.float32), lead),
            "num_workers": np.broadcast_to(np.asarray(m, np.int32), lead),
        }
        if self._init is None:  # one compiled program (eager ops would compile one by one)
            self._init = jax.jit(jax.vmap(self._init_one) if self.vmap else self._init_one)
        return self._init(params, model_state, hp)

    # -- one update
    def _grad(
        self, w: Any, model_state: Any, x: jax.Array, y: jax.Array
    ) -> tuple[jax.Array, Any, Any]:
        def loss(p):
            logits, new_state = self.apply(p, model_state, x, True)
            return self.loss_fn(logits, y), new_state

        (value, new_state), g = jax.value_and_grad(loss, has_aux=True)(w)
        return value, new_state, g

    def step(self, s: AsyncState, inputs: tuple) -> tuple[AsyncState, jax.Array]:
        """One applied update (pure; :meth:`run` compiles it).

        Args:
            s: the cluster state.
            inputs: ``(x, y, worker, staleness, extra)``; in ``"sync"`` mode ``x``/``y`` hold
                the M workers' batches ``[M, B, ...]`` and the rest is ignored. ``extra`` is a
                dict of per-update scalars passed on to ``tx.update`` as extra arguments.

        Returns:
            ``(new_state, loss)``, the loss of the gradient's batch at the weights it used.
        """
        x, y, worker, staleness, extra = inputs
        spec = self.spec(s.hparams)
        if spec.mode == "sync":
            loss, new_ms, g = jax.vmap(self._grad, in_axes=(None, None, 0, 0))(
                s.params, s.model_state, x, y
            )
            g = jax.tree.map(lambda a: jnp.mean(a, axis=0), g)
            new_ms = jax.tree.map(lambda a: jnp.mean(a, axis=0).astype(a.dtype), new_ms)
            u, opt_state = spec.tx.update(
                g,
                s.opt_state,
                s.params,
                stale_params=s.params,
                staleness=jnp.int32(0),
                worker=jnp.int32(0),
                worker_loss=jnp.mean(loss),
            )
            params = optax.apply_updates(s.params, u)
            new = s._replace(params=params, model_state=new_ms, opt_state=opt_state)
            return new._replace(step=s.step + 1), jnp.mean(loss)

        w_i = _index(s.workers, worker)
        ms_i = _index(s.worker_model_state, worker)  # the state it pulled with w_i
        loss, new_ms, g = self._grad(w_i, ms_i, x, y)
        if spec.merge_model_state is not None:
            new_ms = spec.merge_model_state(s.model_state, ms_i, new_ms)
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
        if spec.mode == "async":
            params = optax.apply_updates(s.params, u)
            new = s._replace(workers=_set(s.workers, params, worker))
        else:  # dana
            lr: Any = spec.learning_rate
            lr = lr(s.step) if callable(lr) else lr
            mu = spec.momentum
            v_old = _index(s.velocity, worker)
            v_new = jax.tree.map(lambda v, gi: mu * v + gi, v_old, u)
            vsum = jax.tree.map(lambda t, a, b: t + (a - b), s.velocity_sum, v_new, v_old)
            params = jax.tree.map(lambda w, v: (w - lr * v).astype(w.dtype), s.params, v_new)
            look = jax.tree.map(lambda w, t: (w - lr * mu * t).astype(w.dtype), params, vsum)
            new = s._replace(
                workers=_set(s.workers, look, worker),
                velocity=_set(s.velocity, v_new, worker),
                velocity_sum=vsum,
            )
        new = new._replace(
            params=params,
            model_state=new_ms,
            worker_model_state=_set(s.worker_model_state, new_ms, worker),  # pulled with w
            opt_state=opt_state,
        )
        return new._replace(step=s.step + 1), loss

    # -- loops
    def _chunk(self, s: AsyncState, inputs: tuple) -> tuple[AsyncState, jax.Array]:
        return jax.lax.scan(self.step, s, inputs)

    def run(
        self,
        state: AsyncState,
        x: Any,
        y: Any,
        worker: Any,
        staleness: Any,
        extra: dict[str, Any] | None = None,
    ) -> tuple[AsyncState, jax.Array]:
        """Apply ``L`` updates; ``state`` is donated (do not reuse it).

        Args:
            state: from :meth:`init` or a previous :meth:`run`.
            x: ``[L, B, ...]`` the batches (``[L, M, B, ...]`` in ``"sync"`` mode); with
                ``vmap=True`` a leading lane axis ``[S, L, ...]`` on all inputs.
            y: ``[L, B]`` labels (same layout as ``x``).
            worker: ``[L]`` int32, the finishing worker of each update (``< num_workers``).
            staleness: ``[L]`` int32, each update's staleness τ (reaches the transforms).
            extra: optional per-update side information, name -> ``[L]`` array, passed to
                ``tx.update`` as extra keyword arguments (e.g. LC-ASGD's ``t_comm``).

        Returns:
            ``(state, losses)`` with ``losses`` ``[L]`` (``[S, L]`` with vmap).
        """
        worker = np.asarray(worker, np.int32)
        staleness = np.asarray(staleness, np.int32)
        extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
        if self.loop != "host":
            if self._run_scan is None:
                f = jax.vmap(self._chunk) if self.vmap else self._chunk
                self._run_scan = jax.jit(f, donate_argnums=0)
            return self._run_scan(state, (x, y, worker, staleness, extra))
        step = self.compiled_step
        x, y = np.asarray(x), np.asarray(y)  # host slicing: no device op per update
        ax = 1 if self.vmap else 0
        take = lambda a, i: a[:, i] if ax else a[i]
        losses = []
        for i in range(worker.shape[ax]):
            ex = {k: take(v, i) for k, v in extra.items()}
            inp = (take(x, i), take(y, i), take(worker, i), take(staleness, i), ex)
            state, loss = step(state, inp)
            losses.append(loss)
        return state, jnp.asarray(np.stack(jax.device_get(losses), axis=ax))

    @property
    def compiled_step(self) -> Callable[[AsyncState, tuple], tuple[AsyncState, jax.Array]]:
        """The jitted, donated single update ``(state, (x, y, worker, staleness, extra)) ->
        (state, loss)`` (vmapped if ``vmap``): the lowest-overhead entry point for a host
        loop (``extra``: a dict of scalars, ``{}`` if none)."""
        if self._run_host is None:
            f = jax.vmap(self.step) if self.vmap else self.step
            self._run_host = jax.jit(f, donate_argnums=0)
        return self._run_host


# ----------------------------------------------------------------------------- driver


class EmulationResult(NamedTuple):
    """One run (lane) of :func:`emulate_async`.

    Attributes:
        params: final master weights.
        model_state: final model state.
        losses: ``[steps]`` training loss of every applied gradient (at the weights it used).
        curve: evaluation points: dicts with ``step`` (updates applied), ``batches`` (mini-batches
            processed), ``train_loss`` (mean over the interval), ``test_accuracy``.
        diverged: whether a loss became non-finite.
        diverged_step: the 1-based update whose loss was first non-finite (``None`` if none;
            the trainer's convention).
        final_test_accuracy: the last test accuracy (``None`` if diverged or no test set).
        staleness: ``[steps]`` staleness of every applied gradient (zeros in ``"sync"`` mode).
    """

    params: Any
    model_state: Any
    losses: np.ndarray
    curve: list[dict]
    diverged: bool
    diverged_step: int | None
    final_test_accuracy: float | None
    staleness: np.ndarray


_EVAL_CACHE: dict[Any, Callable] = {}


def evaluate_accuracy(
    apply: Callable[..., tuple[jax.Array, Any]],
    params: Any,
    model_state: Any,
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int = 1000,
    vmap: bool = False,
) -> np.ndarray:
    """Test accuracy (``train=False``) over ``x`` in batches of ``batch_size``.

    Args:
        apply: the model's pure apply (compiled once per ``apply`` object and shapes).
        params: weights (stacked over lanes if ``vmap``).
        model_state: model state (same).
        x: ``[N, ...]`` inputs.
        y: ``[N]`` labels.
        batch_size: evaluation batch.
        vmap: leading lane axis on ``params``/``model_state``.

    Returns:
        A float array: ``[]`` or ``[S]`` with vmap.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from jaxstale.emulate import evaluate_accuracy
        >>> apply = lambda p, s, x, train: (x @ p, s)
        >>> float(evaluate_accuracy(apply, jnp.eye(2), {}, np.eye(2), np.array([0, 0])))
        0.5
    """
    key = (apply, vmap)
    if key not in _EVAL_CACHE:

        def correct(p, s, xb, yb):
            logits, _ = apply(p, s, xb, False)
            return jnp.sum(jnp.argmax(logits, -1) == yb)

        f = jax.vmap(correct, in_axes=(0, 0, None, None)) if vmap else correct
        _EVAL_CACHE[key] = jax.jit(f)
    f = _EVAL_CACHE[key]
    total: Any = 0
    for a in range(0, len(x), batch_size):
        xb, yb = x[a : a + batch_size], y[a : a + batch_size]
        total = total + np.asarray(f(params, model_state, xb, yb))
    return np.asarray(total / len(x))


def _take(a: Any, j: int) -> Any:
    return a[j]


def _identity(a: Any) -> Any:
    return a


def _stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *trees)


def emulate_async(
    apply: Callable[..., tuple[jax.Array, Any]],
    method: Method,
    params: Any | Sequence[Any],
    model_state: Any | Sequence[Any],
    schedule: DelaySchedule | Sequence[DelaySchedule],
    x_batches: Any | Sequence[Any],
    y_batches: Any | Sequence[Any],
    *,
    learning_rate: float | Sequence[float] | None = None,
    momentum: float = 0.0,
    warmup_steps: int = 0,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    eval_every: int | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    loop: str = "auto",
    vmap: bool = True,
    extra_args: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
) -> EmulationResult | list[EmulationResult]:
    """Run emulated asynchronous (or SSGD / DANA) training: one run, or several runs at once.

    Update ``t`` uses mini-batch ``schedule.batch[t]`` of the stream ``x_batches`` (for M = 1 that
    is batch ``t``: the synchronous trainer's run). In ``"sync"`` mode the schedule's ``T``
    updates' worth of batches are consumed M per step: ``T // M`` updates on the same number of
    samples. Several runs (lanes: seeds, learning rates, worker counts — lists of equal length)
    share one compiled step; with ``vmap`` they also run in one call.

    Args:
        apply: the model's pure apply (``jaxstale.models.functional(m).apply``).
        method: a registered name, a builder, an optax transformation or a :class:`MethodSpec`.
        params: initial weights; a list of them (one per lane) for several runs.
        model_state: initial model state (a list for several runs).
        schedule: a :class:`DelaySchedule` (a list: equal ``T``; ``M`` may differ except in
            ``"sync"`` mode).
        x_batches: ``[num_batches, B, ...]`` pre-batched inputs (numpy, indexable with an int
            array; a list for several runs). Must cover ``max(schedule.batch) + 1`` batches.
        y_batches: ``[num_batches, B]`` labels.
        learning_rate: ``η`` for builders (a float, or one per lane). Required for names and
            builders; ignored by a ready-made transformation.
        momentum: ``μ`` for builders.
        warmup_steps: warm-up from ``η/M`` over this many updates (see :func:`lr_warmup`).
        x_test: test inputs for the learning curve (optional).
        y_test: test labels.
        eval_every: evaluation interval in mini-batches processed (default: once, at the end).
        loss_fn: ``loss_fn(logits, labels)``, default mean cross-entropy.
        loop: ``"auto"``, ``"scan"`` or ``"host"`` (see :class:`AsyncEmulator`).
        vmap: batch the lanes with ``vmap`` (else run them one by one on the same executable).
        extra_args: per-update side information for the transforms, name -> ``[T]`` array (one
            dict per lane for several runs), passed as extra keyword arguments of
            ``tx.update`` at each update (e.g. precomputed ``predicted_steps``). Timed delay
            models add ``t_comm`` (pull time) and ``t_comp`` (compute time) by themselves.
            Not used in ``"sync"`` mode.

    Returns:
        One :class:`EmulationResult`, or a list of them (one per lane) when lists were given.

    Example:
        >>> import jax.numpy as jnp, numpy as np, optax
        >>> from jaxstale.delays import round_robin
        >>> from jaxstale.emulate import emulate_async
        >>> apply = lambda p, s, x, train: (x.reshape(len(x), -1) @ p, s)
        >>> rng = np.random.default_rng(0)
        >>> xb = rng.normal(size=(40, 8, 4)).astype(np.float32)
        >>> yb = (xb[..., 0] > 0).astype(np.int32)
        >>> r = emulate_async(apply, "asgd", jnp.zeros((4, 2)), {}, round_robin(4, 40), xb, yb,
        ...                   learning_rate=0.5, x_test=xb[0], y_test=yb[0])
        >>> r.diverged, r.final_test_accuracy, int(r.staleness.max())
        (False, 1.0, 3)
    """
    many = not isinstance(schedule, DelaySchedule)
    scheds: list[DelaySchedule] = list(schedule) if many else [schedule]  # type: ignore[arg-type,list-item]
    n = len(scheds)
    ps = list(params) if many else [params]
    mss = list(model_state) if many else [model_state]
    xbs: list[Any] = list(x_batches) if many else [x_batches]
    ybs: list[Any] = list(y_batches) if many else [y_batches]
    if n == 0 or not (len(ps) == len(mss) == len(xbs) == len(ybs) == n):
        raise ValueError("params, model_state, schedule, x_batches, y_batches: same length > 0")
    if learning_rate is None:
        if not isinstance(method, optax.GradientTransformation | MethodSpec):
            raise ValueError("learning_rate is required when method is a name or a builder")
        learning_rate = 0.0
    lrs = list(learning_rate) if isinstance(learning_rate, list | tuple) else [learning_rate] * n
    if len(lrs) != n:
        raise ValueError(f"learning_rate: {len(lrs)} values for {n} runs")
    ms = [s.num_workers for s in scheds]
    t_count = scheds[0].num_updates
    if any(s.num_updates != t_count for s in scheds):
        raise ValueError("all schedules must have the same num_updates")
    batched = vmap and n > 1
    emu = AsyncEmulator(
        apply,
        method,
        max(ms),
        momentum=momentum,
        warmup_steps=warmup_steps,
        loss_fn=loss_fn,
        loop=loop,
        vmap=batched,
    )
    sync = emu.mode == "sync"
    if sync and len(set(ms)) > 1:
        raise ValueError(f"sync mode: all runs need the same number of workers, got {ms}")
    per = ms[0] if sync else 1  # mini-batches per update
    steps = t_count // per
    if steps < 1:
        raise ValueError(f"sync mode needs num_updates >= num_workers ({t_count} < {per})")
    chunk = max(1, (eval_every or t_count) // per)
    evaluate = x_test is not None and y_test is not None

    if sync:  # round r uses batches r·M … r·M + M − 1, all at w_r
        bidx = [np.arange(steps * per).reshape(steps, per) for _ in scheds]
        worker = np.zeros((n, steps), np.int32)
        stale = np.zeros((n, steps), np.int32)
    else:
        bidx = [s.batch for s in scheds]
        worker = np.stack([s.worker for s in scheds])
        stale = np.stack([s.staleness for s in scheds])
    extras: dict[str, np.ndarray] = {}
    if not sync:
        user: list[dict[str, Any]]
        if isinstance(extra_args, list | tuple):
            user = [dict(e) for e in extra_args]
        else:
            user = [dict(cast(dict[str, Any], extra_args or {}))] * n
        if len(user) != n or len({tuple(sorted(u)) for u in user}) > 1:
            raise ValueError("extra_args: one dict per run, all with the same names")
        for name in user[0]:
            extras[name] = np.stack([np.asarray(u[name]) for u in user])
            if extras[name].shape[:2] != (n, steps):
                raise ValueError(f"extra_args[{name!r}] must have {steps} entries per run")
        starts = [s.start_time for s in scheds]
        ends = [s.finish_time for s in scheds]
        if all(a is not None for a in starts) and all(b is not None for b in ends):
            t0 = np.stack(cast(list[np.ndarray], starts))
            t1 = np.stack(cast(list[np.ndarray], ends))
            extras.setdefault("t_comm", t0.astype(np.float32))
            extras.setdefault("t_comp", (t1 - t0).astype(np.float32))
    for xb, b in zip(xbs, bidx, strict=True):
        if len(xb) <= int(np.max(b)):
            raise ValueError(f"x_batches has {len(xb)} batches; the schedule needs {np.max(b) + 1}")

    groups = [list(range(n))] if batched else [[i] for i in range(n)]
    results: list[EmulationResult | None] = [None] * n
    for lane in groups:
        k = len(lane)
        if batched:
            state = emu.init(
                _stack([ps[i] for i in lane]),
                _stack([mss[i] for i in lane]),
                learning_rate=np.asarray([lrs[i] for i in lane], np.float32),
                num_workers=np.asarray([ms[i] for i in lane], np.int32),
            )
        else:
            i = lane[0]
            state = emu.init(ps[i], mss[i], learning_rate=lrs[i], num_workers=ms[i])
        losses = np.full((k, steps), np.nan, np.float32)
        curves: list[list[dict]] = [[] for _ in lane]
        dead = np.zeros(k, bool)
        for a in range(0, steps, chunk):
            z = min(a + chunk, steps)
            xs = [np.asarray(xbs[i][bidx[i][a:z]]) for i in lane]
            ys = [np.asarray(ybs[i][bidx[i][a:z]]) for i in lane]
            w, st = worker[lane, a:z], stale[lane, a:z]
            ex = {k: v[lane, a:z] for k, v in extras.items()}
            if batched:
                state, lv = emu.run(state, np.stack(xs), np.stack(ys), w, st, ex)
            else:
                ex = {k: v[0] for k, v in ex.items()}
                state, lv = emu.run(state, xs[0], ys[0], w[0], st[0], ex)
            losses[:, a:z] = np.asarray(lv).reshape(k, z - a)
            dead |= ~np.isfinite(losses[:, a:z]).all(axis=1)
            if x_test is not None and y_test is not None and not dead.all():
                acc = evaluate_accuracy(
                    apply, state.params, state.model_state, x_test, y_test, vmap=batched
                )
                acc = np.broadcast_to(acc, (k,))
            else:
                acc = np.full(k, np.nan)
            for j in range(k):
                curves[j].append(
                    {
                        "step": int(z),
                        "batches": int(z * per),
                        "train_loss": float(np.mean(losses[j, a:z])),
                        "test_accuracy": None if dead[j] or not evaluate else float(acc[j]),
                    }
                )
            if dead.all():
                break
        final = jax.device_get((state.params, state.model_state))  # host copies, sliced freely
        for j, i in enumerate(lane):
            bad = np.flatnonzero(~np.isfinite(losses[j]))
            div = bool(dead[j])
            pick = functools.partial(_take, j=j) if batched else _identity
            results[i] = EmulationResult(
                params=jax.tree.map(pick, final[0]),
                model_state=jax.tree.map(pick, final[1]),
                losses=losses[j],
                curve=curves[j],
                diverged=div,
                diverged_step=int(bad[0]) + 1 if div else None,
                final_test_accuracy=None if div or not evaluate else curves[j][-1]["test_accuracy"],
                staleness=stale[i],
            )
    done = cast(list[EmulationResult], results)
    return done if many else done[0]
