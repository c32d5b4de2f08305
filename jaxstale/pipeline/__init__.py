"""Pipelined model parallelism: policies as data, one program, two executors of it.

:mod:`~jaxstale.pipeline.policies` (:class:`Policy` rows), :mod:`~jaxstale.pipeline.program`
(:func:`compile` a schedule and a policy into named arrays), :mod:`~jaxstale.pipeline.emulator`
(runs the program on one device) and :mod:`~jaxstale.pipeline.mesh` (on a ``"stage"`` mesh
axis). :func:`make` picks the executor by name (:data:`EXECUTORS`), the same arguments for both.

Example:
    >>> import numpy as np, optax
    >>> from jaxstale import loop, models, schedules, pipeline
    >>> model = models.create("mlp", input_shape=(4, 4, 1), num_classes=3, hidden=(8,))
    >>> stages = models.functional_stages(model, 2)
    >>> xb = np.ones((6, 4, 4, 4, 1), np.float32); yb = np.zeros((6, 4), np.int32)
    >>> ex = pipeline.make("emulate", stages, schedules.one_f_one_b(2, 6), "nesterov",
    ...                    optax.sgd(0.1, 0.9), xb, yb, momentum=0.9)
    >>> (res,) = loop.run(ex, [s.params for s in stages], [s.state for s in stages])
    >>> len(res.losses), res.diverged
    (6, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax

from jaxstale._checks import check_transform
from jaxstale.loop import Executor
from jaxstale.losses import cross_entropy
from jaxstale.models.remat import remat_stages
from jaxstale.pipeline import emulator as _emulator
from jaxstale.pipeline import mesh as _mesh
from jaxstale.pipeline.kernel import compose as compose
from jaxstale.pipeline.policies import POLICIES as POLICIES
from jaxstale.pipeline.policies import Policy as Policy
from jaxstale.pipeline.policies import get_policy as get_policy
from jaxstale.pipeline.policies import pipemare_lr_scale as pipemare_lr_scale
from jaxstale.pipeline.policies import register_policy as register_policy
from jaxstale.pipeline.program import BACKWARD_MODES as BACKWARD_MODES
from jaxstale.pipeline.program import Program as Program
from jaxstale.pipeline.program import compile as compile
from jaxstale.schedules import Schedule
from jaxstale.sizes import tree_bytes

EXECUTORS: tuple[str, ...] = ("emulate", "mesh")


def _program(
    schedule: Schedule | Program, policy: str | Policy | None, backward: str, target: str | None
) -> Program:
    """``schedule`` compiled with ``policy`` (``backward``, ``target``), or a ready
    :class:`Program` with ``policy=None``."""
    if isinstance(schedule, Program):
        if policy is not None:
            raise ValueError("pass policy=None with a compiled Program")
        return schedule
    if policy is None:
        raise ValueError("a policy is needed to compile a schedule")
    return compile(schedule, policy, backward=backward, target=target)


def make(
    executor: str,
    stages: Sequence[Any],
    schedule: Schedule | Program,
    policy: str | Policy | None,
    tx: optax.GradientTransformation,
    xb: Any,
    yb: Any,
    *,
    backward: str = "saved",
    target: str | None = None,
    momentum: float | None = None,
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array] = cross_entropy,
    mesh: jax.sharding.Mesh | None = None,
    lanes: int | None = None,
    hyperparams: Mapping[str, Any] | None = None,
    stage_trees: bool | None = None,
    remat: str = "none",
) -> Executor:
    """The executor (``"emulate"``: one device; ``"mesh"``: a stage per device of a ``"stage"``
    axis) of ``schedule`` — compiled with ``policy`` (``backward``, ``target``), or a ready
    :class:`~jaxstale.pipeline.program.Program` with ``policy=None`` — on ``(xb [nb, B, ...],
    yb [nb, B])`` — arrays, or :class:`jaxstale.data.Indexed` indices into one copy of the data
    (what a long run needs) — with the per-stage optimizer ``tx``; drive it with
    :func:`jaxstale.loop.run`.

    ``stages`` (``jaxstale.models.functional_stages``) give the structure; weights are the
    executor's ``init`` arguments. Pass the same stage objects, ``tx`` and ``loss_fn`` for every
    seed of a sweep: runs of one structure then share a compiled round. ``momentum`` is ``μ`` of
    the Nesterov prediction rule; ``mesh`` a mesh with a ``"stage"`` axis of ``N`` devices.
    ``lanes`` / ``hyperparams`` (emulator): ``L`` runs at once, e.g. seeds and a learning-rate
    grid, ``{name: [value (or [value per stage]) per lane]}`` (see
    :func:`jaxstale.pipeline.emulator.executor`); the mesh runs one run, ``hyperparams``
    ``{name: value or [value per stage]}``. ``stage_trees`` (mesh): the optimizer on each
    stage's parameter pytree instead of its flat weight vector, for optimizers that read shapes
    (AdamW's decay on matrices, Muon) and per-stage hyper-parameters (on when those are given,
    or when ``tx``'s state on a stage's pytree differs in size from its state on the flat vector,
    as basis rotation's does; :class:`~jaxstale.pipeline.stage_trees.StageTrees`). The emulator
    always updates pytrees. ``remat`` (:data:`jaxstale.models.remat.REMAT`): which activations
    a forward keeps for its backward (``"names"``: the model's tagged ones, under a quarter of
    a GPT's residual memory; the rules per policy in :mod:`jaxstale.models.remat`).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    check_transform(tx, "tx", "pipeline.make", "optax.adamw(3e-3)")
    program = _program(schedule, policy, backward, target)
    stages = remat_stages(stages, remat)
    kw: dict[str, Any] = {"momentum": momentum, "loss_fn": loss_fn}
    if executor == "mesh":
        if lanes is not None:
            raise ValueError("the mesh executor runs one run at a time: lanes are emulator-only")
        return _mesh.executor(
            stages,
            program,
            tx,
            xb,
            yb,
            mesh=mesh,
            momentum=momentum,
            loss_fn=loss_fn,
            stage_trees=stage_trees,
            hyperparams=hyperparams,
        )
    if stage_trees is not None:
        raise ValueError("stage_trees applies to the mesh executor (the emulator updates pytrees)")
    return _emulator.executor(
        stages, program, tx, xb, yb, lanes=lanes, hyperparams=hyperparams, **kw
    )


def carried_bytes(
    stages: Sequence[Any],
    schedule: Schedule | Program,
    policy: str | Policy | None,
    tx: optax.GradientTransformation,
    x_example: Any,
    *,
    backward: str = "saved",
    target: str | None = None,
    remat: str = "none",
) -> int:
    """Bytes of one run's carried state in the emulator — every stage's weights (or stashed
    versions), optimizer state, statistics and the slots of in-flight inputs, cotangents and
    residuals — from abstract shapes (``jax.eval_shape``: nothing is allocated or compiled).
    The residuals of the mini-batches in flight dominate for a deep model: stage ``k`` keeps
    ``N − k`` forwards' activations until their backward passes (``backward="recompute"``
    keeps only their inputs; ``remat``, :func:`make`'s, what a slot keeps). ``x_example``: one
    mini-batch, or its ``jax.ShapeDtypeStruct``; the other arguments as :func:`make`'s.

    Example:
        >>> from jaxstale import models, schedules
        >>> model = models.create("mlp", input_shape=(8, 1), num_classes=3, hidden=(16, 16))
        >>> stages = models.functional_stages(model, 2)
        >>> x = jax.ShapeDtypeStruct((4, 8, 1), "float32")
        >>> sched = schedules.one_f_one_b(2, 6)
        >>> a = carried_bytes(stages, sched, "vanilla", optax.sgd(0.1), x)
        >>> b = carried_bytes(stages, sched, "stash", optax.sgd(0.1), x)
        >>> 0 < a < b   # stashing keeps N − k weight versions
        True
    """
    program = _program(schedule, policy, backward, target)
    em = _emulator.PipelineEmulator(remat_stages(stages, remat), program, tx)
    carry = jax.eval_shape(em.init, x_example)
    return tree_bytes(carry)
