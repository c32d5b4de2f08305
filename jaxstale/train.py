r"""Synchronous SGD trainer: the reference every staleness experiment compares against.

One training step is one jitted function with donated buffers,

.. math::

    (\ell_t, g_t) = \big(L(w_t; B_t), \nabla_w L(w_t; B_t)\big), \qquad
    (u_t, s_{t+1}) = \mathrm{tx.update}(g_t, s_t, w_t), \qquad w_{t+1} = w_t + u_t,

with the gradient taken at the *current* weights (staleness :math:`\tau = 0`). ``tx`` is any optax
``GradientTransformation`` or ``GradientTransformationExtraArgs``; batch-norm statistics (ResNet-20)
are carried alongside the parameters.

:func:`fit` runs the :func:`executor` of this step with :func:`jaxstale.loop.run`. How the
steps are looped is chosen by measurement (``benchmarks/loop_strategies.py``), per model and
backend: a host loop of the jitted step, a rolled ``lax.scan`` over each evaluation interval,
or ``scan(unroll=True)`` chunks; seeds ``vmap``-ed or one after the other. All compute the same
thing (to float rounding; the same seed gives bitwise the same numbers on the CPU). A run whose
loss becomes NaN or ±inf is diverged at that step: its parameters are frozen (masked, so NaNs
do not spread), it is not evaluated any more, and the other seeds carry on.

Example:
    >>> import numpy as np, optax
    >>> from jaxstale.data import Dataset
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(256, 4, 4, 1)).astype(np.float32)
    >>> y = (x.reshape(256, -1).sum(1) > 0).astype(np.int32)
    >>> ds = Dataset("toy", x[:192], y[:192], x[192:], y[192:], 2)
    >>> res = fit("mlp", optax.sgd(0.1, momentum=0.9), ds, steps=60, batch_size=32, seeds=2,
    ...           eval_every=30)
    >>> [(r["seed"], r["diverged"], r["final_test_accuracy"] > 0.8) for r in res]
    [(0, False, True), (1, False, True)]
    >>> [c["step"] for c in res[0]["curve"]]
    [30, 60]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxstale import models
from jaxstale._strategy import AUTO_STRATEGY, LOOPS, SEED_MODES, default_strategy
from jaxstale.data import check_dataset, load
from jaxstale.loop import Executor, Stats, accuracy
from jaxstale.loop import jit as loop_jit
from jaxstale.loop import run as run_loop
from jaxstale.losses import cross_entropy

__all__ = [
    "AUTO_STRATEGY",
    "LOOPS",
    "SEED_MODES",
    "default_strategy",
    "evaluate",
    "executor",
    "fit",
    "make_train_step",
    "update_executor",
]

Params = Any
Carry = tuple[Any, Any, Any, jax.Array]  # (params, opt_state, state, alive)


# ----------------------------------------------------------------------------------------------
# The step
# ----------------------------------------------------------------------------------------------

ExtraArgs = Mapping[str, Any] | Callable[[Params], Mapping[str, Any]] | None


def _make_update(
    apply: Callable[..., Any],
    tx: optax.GradientTransformation,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array],
    extra_args: ExtraArgs,
) -> Callable[..., tuple[Any, Any, Any, jax.Array]]:
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"tx must be an optax GradientTransformation, got {type(tx).__name__}")
    if extra_args is not None and not isinstance(tx, optax.GradientTransformationExtraArgs):
        raise TypeError(
            "extra_args were given but tx is a plain optax.GradientTransformation; pass an "
            "optax.GradientTransformationExtraArgs (e.g. from optax.chain or "
            "optax.with_extra_args_support)"
        )

    def update(params, opt_state, state, x, y):
        def objective(p):
            logits, new_state = apply(p, state, x, True)
            return loss_fn(logits, y), new_state

        (loss, new_state), grads = jax.value_and_grad(objective, has_aux=True)(params)
        extra = extra_args(params) if callable(extra_args) else (extra_args or {})
        updates, opt_state = tx.update(grads, opt_state, params, **extra)
        return optax.apply_updates(params, updates), opt_state, new_state, loss

    return update


def make_train_step(
    apply: Callable[..., Any],
    tx: optax.GradientTransformation,
    *,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    extra_args: ExtraArgs = None,
    jit: bool = True,
) -> Callable[..., tuple[Any, Any, Any, jax.Array]]:
    r"""The synchronous training step ``(params, opt_state, state, x, y) -> (..., loss)``.

    .. math::

        (\ell, g) = \mathrm{value\_and\_grad}(L)(w), \quad
        (u, s') = \mathrm{tx.update}(g, s, w, **extra), \quad w' = w + u,

    where ``L(w) = loss_fn(apply(w, state, x, train=True), y)`` and the new batch-norm state is
    returned next to the parameters. The jitted step donates ``params``, ``opt_state`` and
    ``state`` (``donate_argnums=(0, 1, 2)``): the caller must not use the passed-in values again.

    Args:
      apply: ``apply(params, state, x, train) -> (logits, new_state)``
        (``jaxstale.models.functional(module).apply``).
      tx: any optax ``GradientTransformation`` / ``GradientTransformationExtraArgs``.
      loss_fn: ``loss_fn(logits, labels) -> scalar``.
      extra_args: keyword arguments for ``tx.update``: a dict (passed every step), or a function
        ``params -> dict`` evaluated inside the step (e.g. ``lambda p: {"stale_params": p}``
        for a staleness-aware transform at :math:`\tau = 0`). Requires an ExtraArgs transform.
      jit: return the jitted, donating step (True) or the pure function (False, for composing
        into scans or vmaps).

    Returns:
      ``step(params, opt_state, state, x, y) -> (params, opt_state, state, loss)``.

    Raises:
      TypeError: if ``tx`` is not an optax transformation, or ``extra_args`` are given for a
        plain ``GradientTransformation``.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from jaxstale import models
      >>> f = models.functional(models.create("mlp", input_shape=(2, 2, 1), num_classes=2))
      >>> tx = optax.sgd(0.1)
      >>> step = make_train_step(f.apply, tx)
      >>> x, y = jnp.ones((4, 2, 2, 1)), jnp.zeros(4, jnp.int32)
      >>> params, opt_state, state = f.params, tx.init(f.params), f.state
      >>> params, opt_state, state, loss0 = step(params, opt_state, state, x, y)
      >>> params, opt_state, state, loss1 = step(params, opt_state, state, x, y)
      >>> bool(loss1 < loss0)
      True
    """
    update = _make_update(apply, tx, loss_fn, extra_args)
    return loop_jit(update, donate_argnums=(0, 1, 2)) if jit else update


def _masked(update: Callable[..., Any]) -> Callable[[Carry, Any, Any], tuple[Carry, jax.Array]]:
    """Step on a carry ``(params, opt_state, state, alive)`` that freezes a run at its first
    non-finite loss (``alive`` becomes False and stays False; later losses are NaN)."""

    def step(carry: Carry, x: Any, y: Any) -> tuple[Carry, jax.Array]:
        params, opt_state, state, alive = carry
        new_params, new_opt, new_state, loss = update(params, opt_state, state, x, y)
        ok = jnp.logical_and(alive, jnp.isfinite(loss))
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        return (
            keep(new_params, params),
            keep(new_opt, opt_state),
            keep(new_state, state),
            ok,
        ), jnp.where(alive, loss, jnp.nan)

    return step


def _compiled_loops(
    update: Callable[..., Any], loop: str, vmap: bool
) -> Callable[[int], Callable[[Carry, Any, Any], tuple[Carry, jax.Array]]]:
    """Returns ``get(n)``: a jitted, carry-donating function running ``n`` steps.

    host: ``n`` must be 1 and ``x`` is one batch; scan/unrolled: ``x`` holds ``n`` batches.
    With ``vmap`` every argument has a leading seed axis and the losses are ``[S]`` / ``[S, n]``.
    """
    step = _masked(update)

    if loop == "host":
        fn = jax.vmap(step) if vmap else step
        jitted = loop_jit(fn, donate_argnums=0)
        return lambda n: jitted

    cache: dict[int, Callable[..., Any]] = {}

    def get(n: int) -> Callable[..., Any]:
        if n not in cache:

            def chunk(carry, xs, ys):
                return jax.lax.scan(
                    lambda c, xy: step(c, *xy), carry, (xs, ys), unroll=(loop == "unrolled")
                )

            cache[n] = loop_jit(jax.vmap(chunk) if vmap else chunk, donate_argnums=0)
        return cache[n]

    return get


def _chunks(a: int, b: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(i + size, b)) for i in range(a, b, size)]


def _copy_tree(tree: Any) -> Any:
    # Fresh buffers, so that donation never hits a buffer shared between leaves (or the module).
    return jax.tree.map(lambda a: jnp.array(a, copy=True), tree)


def _stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def executor(
    apply: Callable[..., Any],
    tx: optax.GradientTransformation,
    x_train: Any,
    y_train: Any,
    indices: Any,
    *,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    extra_args: ExtraArgs = None,
    loop: str = "host",
    vmap: bool = False,
    unroll_chunk: int = 8,
    max_chunk: int = 100,
) -> Executor:
    """The synchronous trainer as an :class:`~jaxstale.loop.Executor` (a round is one step).

    Step ``t`` trains on ``x_train[indices[t]]`` with :func:`make_train_step`'s update; a run
    whose loss becomes non-finite is frozen there (its later losses are NaN).

    Args:
      apply: ``apply(params, state, x, train) -> (logits, new_state)``.
      tx: any optax transformation.
      x_train: training inputs ``[N, ...]``.
      y_train: labels ``[N]``.
      indices: ``[steps, B]`` example indices of every step (``[S, steps, B]`` with ``vmap``).
      loss_fn: the loss.
      extra_args: extra keyword arguments for ``tx.update`` (see :func:`make_train_step`).
      loop: ``"host"`` (a Python loop of jitted steps), ``"scan"`` (a rolled ``lax.scan`` over
        each evaluation interval, in chunks of at most ``max_chunk`` steps) or ``"unrolled"``
        (``scan(unroll=True)`` over chunks of ``unroll_chunk`` steps).
      vmap: the runs (seeds) are lanes of one ``jax.vmap``-ed step.
      unroll_chunk: steps per unrolled chunk.
      max_chunk: most steps per rolled scan.

    Returns:
      The executor; ``init(params, state)`` takes weights stacked over seeds with ``vmap``.
    """
    update = _make_update(apply, tx, loss_fn, extra_args)
    return update_executor(
        update,
        tx.init,
        apply,
        x_train,
        y_train,
        indices,
        loop=loop,
        vmap=vmap,
        unroll_chunk=unroll_chunk,
        max_chunk=max_chunk,
    )


def update_executor(
    update: Callable[..., tuple[Any, Any, Any, jax.Array]],
    opt_init: Callable[[Any], Any],
    apply: Callable[..., Any],
    x_train: Any,
    y_train: Any,
    indices: Any,
    *,
    loop: str = "host",
    vmap: bool = False,
    unroll_chunk: int = 8,
    max_chunk: int = 100,
) -> Executor:
    """:func:`executor` around any one-step ``update(params, opt_state, state, x, y) ->
    (params, opt_state, state, loss)`` whose optimizer state starts as ``opt_init(params)``
    (e.g. :func:`jaxstale.delayed.delayed_update`'s, which keeps weight versions there)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
    get = _compiled_loops(update, loop, vmap)
    idx = np.asarray(indices)
    lanes = idx.shape[0] if vmap else 1
    steps = int(idx.shape[-2])
    x_train, y_train = np.asarray(x_train), np.asarray(y_train)

    def init(params: Any, state: Any) -> Carry:
        opt = jax.vmap(opt_init)(params) if vmap else opt_init(params)
        alive = jnp.ones((lanes,), bool) if vmap else jnp.asarray(True)
        return _copy_tree((params, opt, state, alive))

    def advance(carry: Carry, a: int, b: int) -> tuple[Carry, Stats]:
        losses = []
        if loop == "host":
            fn = get(1)
            for t in range(a, b):
                it = idx[..., t, :]
                carry, loss = fn(carry, x_train[it], y_train[it])
                losses.append(loss)
            seg = np.stack(jax.device_get(losses), axis=-1)
        else:
            size = min(b - a, max_chunk) if loop == "scan" else unroll_chunk
            for c0, c1 in _chunks(a, b, size):
                it = idx[..., c0:c1, :]
                carry, loss = get(c1 - c0)(carry, x_train[it], y_train[it])
                losses.append(loss)
            seg = np.concatenate(jax.device_get(losses), axis=-1)
        seg = np.asarray(seg).reshape(lanes, b - a)
        return carry, Stats(seg, np.ones_like(seg, np.int32))

    return Executor(
        init=init,
        step=lambda carry, r: advance(carry, r, r + 1),
        params=lambda carry: (carry[0], carry[2]),
        apply=apply,
        num_rounds=steps,
        num_updates=steps,
        lanes=lanes,
        vmapped=vmap,
        advance=advance,
    )


def evaluate(
    apply: Callable[..., Any],
    params: Params,
    state: Any,
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int = 512,
) -> float:
    r"""Test accuracy :math:`\frac{1}{N}\sum_i \mathbb{1}[\arg\max_c f(x_i)_c = y_i]`, eval mode.

    :func:`jaxstale.loop.accuracy` of one run: ``train=False`` (batch-norm uses its running
    averages), batches of ``batch_size``, the last one padded and masked.

    Args:
      apply: ``apply(params, state, x, train) -> (logits, new_state)``.
      params: the parameters.
      state: the non-parameter state (batch statistics); may be an empty ``nnx.State``.
      x: inputs ``[N, ...]``.
      y: integer labels ``[N]``.
      batch_size: evaluation batch size.

    Returns:
      The accuracy as a Python float in ``[0, 1]``.

    Raises:
      ValueError: on empty or mismatched inputs, or ``batch_size < 1``.

    Example:
      >>> import numpy as np
      >>> from jaxstale import models
      >>> f = models.functional(models.create("mlp", input_shape=(2, 2, 1), num_classes=3))
      >>> acc = evaluate(f.apply, f.params, f.state, np.zeros((5, 2, 2, 1), np.float32),
      ...                np.zeros(5, np.int32), batch_size=2)
      >>> acc in (0.0, 1.0)
      True
    """
    return float(accuracy(apply, params, state, x, y, batch_size=batch_size)[0])


# ----------------------------------------------------------------------------------------------
# fit
# ----------------------------------------------------------------------------------------------


def _resolve_dataset(dataset: Any) -> Any:
    if isinstance(dataset, str):
        return load(dataset)
    for field in ("x_train", "y_train", "x_test", "y_test", "num_classes"):
        if not hasattr(dataset, field):
            raise TypeError(
                f"dataset must be a name or a jaxstale.data.Dataset, got {type(dataset).__name__}"
            )
    return dataset


def fit(
    model: str | Callable[[int], nnx.Module],
    tx: optax.GradientTransformation | Callable[[], optax.GradientTransformation],
    dataset: Any,
    *,
    steps: int,
    batch_size: int,
    seeds: int | Sequence[int] = 1,
    eval_every: int | None = None,
    loop: str = "auto",
    seed_mode: str = "auto",
    unroll_chunk: int = 8,
    max_chunk: int = 100,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    extra_args: ExtraArgs = None,
    eval_batch_size: int = 512,
    model_kwargs: Mapping[str, Any] | None = None,
    return_params: bool = False,
    metric: str | None = None,
) -> list[dict[str, Any]]:
    r"""Trains ``model`` with synchronous SGD-style updates from ``tx``, one run per seed.

    Seed ``s`` fixes both the initialisation (``models.create(..., seed=s)``) and the data
    order (``data.batches(..., seed=s)``), so a seed is reproducible bit for bit on the CPU, and
    the same seed gives the same run under any ``loop`` / ``seed_mode`` up to float rounding.
    Every ``eval_every`` steps (and at the end) the mean training loss of the interval and the
    validation and test accuracies are recorded (a language model's dataset: their mean
    next-token losses in nats, ``metric="loss"``).

    Args:
      model: a name in ``jaxstale.models.MODELS`` or a function ``seed -> nnx.Module``.
      tx: an optax transformation, or a zero-argument factory returning one.
      dataset: a ``jaxstale.data.Dataset`` or a dataset name for ``jaxstale.data.load``.
      steps: training steps per seed.
      batch_size: examples per step.
      seeds: number of seeds (``0 .. n-1``) or an explicit list of seeds.
      eval_every: steps between evaluations (default ``max(1, steps // 10)``).
      loop: ``"host"``, ``"scan"``, ``"unrolled"`` or ``"auto"`` (:func:`default_strategy`).
      seed_mode: ``"vmap"``, ``"sequential"`` or ``"auto"``.
      unroll_chunk: steps per unrolled scan chunk (``loop="unrolled"``).
      max_chunk: most steps per rolled scan (``loop="scan"``; one scan covers an evaluation
        interval up to this length), which bounds the batches held on the device at once.
      loss_fn: ``loss_fn(logits, labels) -> scalar``.
      extra_args: extra keyword arguments for ``tx.update`` (see :func:`make_train_step`).
      eval_batch_size: batch size of :func:`evaluate`.
      model_kwargs: extra keyword arguments for ``models.create``.
      return_params: also return each seed's final ``params`` and ``state``.
      metric: ``"accuracy"`` or ``"loss"`` (:func:`jaxstale.loop.run`'s); default: the
        dataset task's (``"loss"`` for a language model).

    Returns:
      One dict per seed, in the order of ``seeds``: ``seed``, ``curve`` (list of ``{"step",
      "train_loss", "val_accuracy", "test_accuracy"}``; ``val_accuracy`` on the dataset's
      validation split, only when it has one), ``final_val_accuracy`` and
      ``final_test_accuracy`` (floats, None if diverged; with ``metric="loss"``:
      ``val_loss``/``test_loss`` and ``final_val_loss``/``final_test_loss``),
      ``final_train_loss``, ``diverged``
      (bool), ``diverged_step`` (1-based step whose loss was first non-finite, or None),
      ``steps``, ``batch_size``, ``loop``, ``seed_mode``, ``wall_s`` (the whole call), and
      ``params``/``state`` if requested.

    Raises:
      ValueError: on an unknown ``loop``/``seed_mode``, non-positive ``steps``, ``batch_size``,
        ``eval_every`` or ``unroll_chunk``, or an empty ``seeds``.
    """
    start = time.perf_counter()
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must be a positive count or a non-empty list of seeds")
    for name, value in (
        ("steps", steps),
        ("batch_size", batch_size),
        ("unroll_chunk", unroll_chunk),
        ("max_chunk", max_chunk),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    if not isinstance(eval_every, int) or eval_every < 1:
        raise ValueError(f"eval_every must be a positive int, got {eval_every!r}")
    auto_loop, auto_mode = default_strategy(model if isinstance(model, str) else "")
    loop = auto_loop if loop == "auto" else loop
    seed_mode = auto_mode if seed_mode == "auto" else seed_mode
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS} or 'auto', got {loop!r}")
    if seed_mode not in SEED_MODES:
        raise ValueError(f"seed_mode must be one of {SEED_MODES} or 'auto', got {seed_mode!r}")

    ds = check_dataset(_resolve_dataset(dataset), "fit")
    task = getattr(ds, "task", "classification")
    metric = ("loss" if task == "language_model" else "accuracy") if metric is None else metric
    if metric not in ("accuracy", "loss"):
        raise ValueError(f"metric must be 'accuracy' or 'loss', got {metric!r}")
    tx = tx if isinstance(tx, optax.GradientTransformation) else tx()
    x_train, y_train = np.asarray(ds.x_train), np.asarray(ds.y_train)
    if len(x_train) < batch_size:
        raise ValueError(f"batch_size {batch_size} exceeds the {len(x_train)} training examples")

    def build(seed: int) -> models.Functional:
        module: nnx.Module
        if isinstance(model, str):
            module = models.create(
                model,
                input_shape=tuple(x_train.shape[1:]),
                num_classes=int(ds.num_classes),
                seed=seed,
                task=task,
                **(model_kwargs or {}),
            )
        else:
            module = models.check_logits(
                model(seed),
                tuple(x_train.shape[1:]),
                int(ds.num_classes),
                "fit: model(seed)",
                task=task,
            )
        return models.functional(module)

    from jaxstale import data

    funcs = [build(s) for s in seeds]
    apply = funcs[0].apply  # one apply (one graphdef) for all seeds: compile once
    indices = [
        data.batch_indices(len(x_train), batch_size=batch_size, num_steps=steps, seed=s)
        for s in seeds
    ]
    vmap = seed_mode == "vmap"
    splits = {"test": (ds.x_test, ds.y_test)}
    if getattr(ds, "x_val", None) is not None and len(ds.x_val):
        splits = {"val": (ds.x_val, ds.y_val), **splits}
    n = len(seeds)
    results: list[Any] = [None] * n
    for group in [list(range(n))] if vmap else [[i] for i in range(n)]:
        ex = executor(
            apply,
            tx,
            x_train,
            y_train,
            np.stack([indices[i] for i in group]) if vmap else indices[group[0]],
            loss_fn=loss_fn,
            extra_args=extra_args,
            loop=loop,
            vmap=vmap,
            unroll_chunk=unroll_chunk,
            max_chunk=max_chunk,
        )
        start_state = [_copy_tree((funcs[i].params, funcs[i].state)) for i in group]
        params = _stack([p for p, _ in start_state]) if vmap else start_state[0][0]
        state = _stack([s for _, s in start_state]) if vmap else start_state[0][1]
        out = run_loop(
            ex,
            params,
            state,
            eval_every=eval_every,
            eval_data=splits,
            eval_batch_size=eval_batch_size,
            metric=metric,
        )
        for i, r in zip(group, out, strict=True):
            results[i] = r
    wall = time.perf_counter() - start
    rows = []
    for seed, r in zip(seeds, results, strict=True):
        fin = r.final_loss if metric == "loss" else r.final_accuracy
        row: dict[str, Any] = {
            "seed": seed,
            "curve": r.curve,
            f"final_val_{metric}": fin.get("val"),
            f"final_test_{metric}": fin.get("test"),
            "final_train_loss": None if r.diverged or not r.curve else r.curve[-1]["train_loss"],
            "diverged": r.diverged,
            "diverged_step": r.diverged_step,
            "steps": steps,
            "batch_size": batch_size,
            "loop": loop,
            "seed_mode": seed_mode,
            "wall_s": wall,
        }
        if return_params:
            row["params"], row["state"] = r.params, r.model_state
        rows.append(row)
    return rows
