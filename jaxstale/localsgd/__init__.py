"""Local SGD and the DiLoCo family: workers run ``H`` inner steps and exchange pseudo-gradients.

The family has the shape of the other two: a core (:mod:`~jaxstale.localsgd.core`: a worker's
job, the exchange precisions, the checks) that two executors import — neither imports the
other — and :func:`make`, which builds either from the same arguments.

:mod:`~jaxstale.localsgd.schedule` says which worker's job reaches the server when (synchronous
rounds, asynchronous arrivals, dynamic local updates, stragglers: configurations of one
schedule); :mod:`~jaxstale.localsgd.emulator` runs them on one device with any Optax inner
optimizer and any outer optimizer over pseudo-gradients (:mod:`jaxstale.transforms.outer`).
:mod:`~jaxstale.localsgd.streaming` is Streaming DiLoCo (fragments, overlap, α merge);
:mod:`~jaxstale.localsgd.overlap` overlaps a synchronous round's outer exchange (delayed and
eager updates);
:mod:`~jaxstale.localsgd.quantize` the fp8 exchange; :mod:`~jaxstale.localsgd.mesh` runs
synchronous and asynchronous local SGD with each worker on a device of a ``"data"`` axis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax

from jaxstale._checks import check_transform
from jaxstale.localsgd import emulator as _emulator
from jaxstale.localsgd import mesh as _mesh
from jaxstale.localsgd.core import EXCHANGES as EXCHANGES
from jaxstale.localsgd.emulator import executor as executor
from jaxstale.localsgd.schedule import LocalSchedule as LocalSchedule
from jaxstale.localsgd.schedule import asynchronous as asynchronous
from jaxstale.localsgd.schedule import synchronous as synchronous
from jaxstale.loop import Executor as _Executor

#: the executors :func:`make` builds
EXECUTORS: tuple[str, ...] = ("emulate", "mesh")


def make(
    executor: str,
    apply: Callable[..., tuple[jax.Array, Any]],
    inner_tx: optax.GradientTransformation,
    outer_tx: optax.GradientTransformation,
    schedule: LocalSchedule | Sequence[LocalSchedule],
    xb: Any,
    yb: Any,
    *,
    mesh: jax.sharding.Mesh | None = None,
    lanes: int | None = None,
    hyperparams: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    **options: Any,
) -> _Executor:
    """The executor of local SGD on ``(xb, yb)`` following ``schedule``: ``"emulate"`` (one
    device, :func:`jaxstale.localsgd.emulator.executor`: ``lanes`` runs at once, their
    ``hyperparams`` per lane) or ``"mesh"`` (a worker per device of a ``"data"`` axis of
    ``mesh``, :func:`jaxstale.localsgd.mesh.executor`: one run). ``options`` are both
    executors' (``loss_fn``, ``exchange``, ``fragments``, ``overlap``, ``alpha``,
    ``outer_overlap``); drive the result with :func:`jaxstale.loop.run`, as every family's.

    Example:
        >>> import numpy as np, optax
        >>> from jaxstale import localsgd, loop, outer_nesterov
        >>> apply = lambda p, s, x, train: (x @ p, s)
        >>> xb = np.ones((8, 2, 3), np.float32); yb = np.zeros((8, 2), np.int32)
        >>> sched = localsgd.synchronous(2, 2, 2)  # 2 workers, 2 rounds of 2 inner steps
        >>> runs = [localsgd.make(e, apply, optax.sgd(0.1), outer_nesterov(0.7), sched, xb, yb)
        ...         for e in localsgd.EXECUTORS]
        >>> [loop.run(ex, np.zeros((3, 2), np.float32), {})[0].diverged for ex in runs]
        [False, False]

    Raises:
        ValueError: an unknown ``executor``, ``mesh`` given to the emulator, or several lanes
            or per-lane ``hyperparams`` given to the mesh (which runs one run); and what the
            executor refuses.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    check_transform(inner_tx, "inner_tx", "localsgd.make", "optax.adamw(1e-3)")
    check_transform(outer_tx, "outer_tx", "localsgd.make", "jaxstale.outer_nesterov(0.7)")
    if executor == "emulate":
        if mesh is not None:
            raise ValueError("make: mesh is the mesh executor's; the emulator runs on one device")
        return _emulator.executor(
            apply, inner_tx, outer_tx, schedule, xb, yb, lanes=lanes, hyperparams=hyperparams,
            **options,
        )  # fmt: skip
    if lanes not in (None, 1) or hyperparams is not None:
        raise ValueError(
            "make: the mesh executor runs one run: no lanes or per-lane hyperparams "
            "(build one executor per run, or use the emulator's lanes)"
        )
    if not isinstance(schedule, LocalSchedule):
        raise ValueError("make: the mesh executor takes one schedule")
    return _mesh.executor(apply, inner_tx, outer_tx, schedule, xb, yb, mesh=mesh, **options)
