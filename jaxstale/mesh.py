"""Device meshes for the mesh executors: build one, check a user's, move values on and off it.

The executors never enumerate devices: they take a ``jax.sharding.Mesh`` with a named axis
(``"stage"`` for pipelines, ``"data"`` for asynchronous workers) and run ``jax.shard_map`` over
it — on emulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set before
``import jax``), on GPUs, and across processes after ``jax.distributed.initialize()`` (every
process runs the same program; ``jax.devices()`` then lists all processes' devices).

**Several processes.** A mesh may span the devices of several processes (JAX's
multi-controller model: ``python -m jaxstale.launch`` on one machine, or a cluster's launcher).
Then every process must hold at least one device of the mesh (it runs its part of every step
and reads the results from its own devices: :func:`check_processes`; :func:`make_mesh` takes
devices from every process), every process places the *same* host values on the mesh
(:func:`to_mesh`: each fills its own devices' shards from its copy, no transfer between
processes), and reads results back with :func:`to_host` (a replicated array from its own
devices; a sharded one gathered from all processes, a collective every process must join).
In one process these are ``jax.device_put`` and ``np.asarray``.

References:
    JAX documentation, "Manual parallelism with shard_map" and "Multi-host and multi-process
    environments" (https://docs.jax.dev/en/latest/multi_process.html).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, Sharding

__all__ = [
    "async_rounds",
    "check_mesh",
    "check_processes",
    "default_data_mesh",
    "fetch_global",
    "make_mesh",
    "to_host",
    "to_mesh",
]


def make_mesh(
    size: int | None = None,
    axis: str = "stage",
    *,
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A one-axis mesh of ``size`` of ``devices`` (default all), axis ``axis`` (``"stage"`` or
    ``"data"``).

    ``devices`` default to ``jax.devices()`` (global after ``jax.distributed.initialize()``); of
    those, the mesh takes the first ``size`` in one process, and in several processes the first
    ``size // P`` of each process's devices (one more from the first ``size % P`` processes), so
    that every process holds a device of it (:func:`check_processes`); ``ValueError`` if
    ``size`` is smaller than the number of processes. Given ``devices`` are taken in their
    order, the first ``size``.

    The axis type is ``Auto`` on purpose: with JAX's default ``Explicit`` type a ``shard_map``
    whose ``in_specs`` shard an array not already sharded that way fails; ``Auto`` lets the
    executors place their own arrays. ``ValueError`` for ``size < 1`` or too few devices.

    Example:
        >>> from jaxstale.mesh import make_mesh
        >>> mesh = make_mesh(1, "stage")
        >>> dict(mesh.shape)
        {'stage': 1}
    """
    devs = list(jax.devices() if devices is None else devices)
    n = len(devs) if size is None else size
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"make_mesh: size must be a positive int, got {size!r}")
    if n > len(devs):
        raise ValueError(
            f"make_mesh: asked for a {axis!r} axis of {n} devices but only {len(devs)} are "
            "available; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before "
            "importing jax, on a cluster call jax.distributed.initialize() first"
        )
    if devices is None and n < len(devs):
        devs = _every_process(devs, n, axis)
    return jax.make_mesh((n,), (axis,), axis_types=(AxisType.Auto,), devices=devs[:n])


def _every_process(devs: list[Any], n: int, axis: str) -> list[Any]:
    """``n`` of ``devs`` taken evenly from each process (in process order), or ``devs`` as they
    are when they belong to one process."""
    procs = sorted({d.process_index for d in devs})
    p = len(procs)
    if p == 1:
        return devs
    if n < p:
        raise ValueError(
            f"make_mesh: a {axis!r} axis of {n} devices cannot include a device of each of the "
            f"{p} processes, and every process must hold one (it runs its part of every step "
            "and reads the results there); use at least as many devices as processes"
        )
    own = [[d for d in devs if d.process_index == q] for q in procs]
    want = [n // p + (i < n % p) for i in range(p)]
    picked = [o[:w] for o, w in zip(own, want, strict=True)]
    spare = [d for o, w in zip(own, want, strict=True) for d in o[w:]]
    short = n - sum(len(x) for x in picked)  # processes with fewer devices than their share
    return [d for x in picked for d in x] + spare[:short]


def check_processes(mesh: Mesh) -> Mesh:
    """``mesh`` if every process holds one of its devices (always true in one process); else
    ``ValueError``: a process without a device of the mesh could neither run its part of a step
    nor read the results."""
    count = jax.process_count()
    if count == 1:
        return mesh
    have = {d.process_index for d in mesh.devices.flat}
    missing = sorted(set(range(count)) - have)
    if missing:
        raise ValueError(
            f"the mesh's devices belong to processes {sorted(have)} only; processes {missing} "
            "hold none. Every process runs the same program and must hold a device of the mesh: "
            "build it with jaxstale.mesh.make_mesh (devices from every process)"
        )
    return mesh


def check_mesh(mesh: Any, axis: str, size: int) -> Mesh:
    """``mesh`` if it is a ``jax.sharding.Mesh`` with an axis ``axis`` of length ``size`` (other
    axes are replicated over) that spans every process (:func:`check_processes`); else
    ``TypeError`` / ``ValueError`` saying how to build one."""
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh (e.g. jaxstale.mesh.make_mesh({size}, "
            f"{axis!r})), got {type(mesh).__name__}"
        )
    shape = dict(mesh.shape)
    if axis not in shape:
        raise ValueError(
            f"mesh has axes {tuple(shape)} but this executor needs an axis named {axis!r} "
            f"(build one with jaxstale.mesh.make_mesh({size}, {axis!r}))"
        )
    if shape[axis] != size:
        raise ValueError(
            f"mesh axis {axis!r} has {shape[axis]} devices but {size} are needed (one per "
            f"{'stage' if axis == 'stage' else 'worker'})"
        )
    return check_processes(mesh)


def to_mesh(tree: Any, sharding: Any) -> Any:
    """Host values, *the same on every process*, placed as arrays laid out by ``sharding``.

    ``sharding`` is one ``jax.sharding.Sharding`` for every leaf or a pytree of them shaped like
    ``tree``. If the shardings' devices all belong to this process this is exactly
    ``jax.device_put(tree, sharding)``. Otherwise (a mesh spanning several processes) each leaf
    becomes a global array with ``jax.make_array_from_process_local_data(s, value,
    value.shape)`` — JAX's form for "every process holds the whole value": each process fills
    the shards of its own devices from its copy, nothing crosses processes, nothing is checked.
    (``jax.device_put`` would either refuse a committed array, since the CPU backend has no
    cross-host transfers, or run ``multihost_utils.assert_equal`` — an all-gather of the value
    — before every placement.) Leaves that are arrays of another process layout are first
    brought to the host with :func:`to_host`.

    Example:
        >>> import numpy as np
        >>> from jax.sharding import NamedSharding, PartitionSpec
        >>> from jaxstale.mesh import make_mesh, to_mesh
        >>> x = to_mesh(np.arange(4.0), NamedSharding(make_mesh(2, "data"), PartitionSpec("data")))
        >>> x.sharding.spec, x.tolist()
        (P('data',), [0.0, 1.0, 2.0, 3.0])
    """
    if isinstance(sharding, Sharding):
        if sharding.is_fully_addressable:
            return jax.device_put(tree, sharding)
        return jax.tree.map(lambda x: _global(x, sharding), tree)
    if all(s.is_fully_addressable for s in jax.tree.leaves(sharding)):
        return jax.device_put(tree, sharding)
    return jax.tree.map(lambda s, x: _global(x, s), sharding, tree)


def _global(x: Any, sharding: Sharding) -> jax.Array:
    value = to_host(x) if isinstance(x, jax.Array) else np.asarray(x)
    value = value.astype(jax.dtypes.canonicalize_dtype(value.dtype), copy=False)
    return jax.make_array_from_process_local_data(sharding, value, value.shape)


def to_host(x: jax.Array) -> np.ndarray:
    """A (possibly multi-process) sharded array's global value as numpy on this process.

    A fully addressable or fully replicated array is read from this process's devices
    (``np.asarray``); one sharded over several processes' devices is gathered with
    ``multihost_utils.process_allgather`` (a collective: every process must call it).

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale.mesh import to_host
        >>> to_host(jnp.arange(3)).tolist()
        [0, 1, 2]
    """
    if x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def fetch_global(tree: Any) -> Any:
    """``tree`` with every array that spans several processes replaced by its global value as
    numpy (:func:`to_host`; every process must call it, in the same order); arrays of this
    process alone and non-arrays are returned as they are — so in one process ``tree`` itself.

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale.mesh import fetch_global
        >>> x = jnp.arange(3)
        >>> fetch_global({"x": x})["x"] is x
        True
    """
    return jax.tree.map(
        lambda a: to_host(a) if isinstance(a, jax.Array) and not a.is_fully_addressable else a,
        tree,
    )


# --- the data axis: rounds of asynchronous arrivals that run in parallel (asyncdp, localsgd) ---


class _Arrivals(Protocol):
    """What :func:`async_rounds` reads of a schedule: which worker each update is."""

    @property
    def worker(self) -> np.ndarray: ...

    @property
    def num_updates(self) -> int: ...


def async_rounds(schedule: _Arrivals, *, cuts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Cut a delay schedule into rounds ``[a, z)`` of updates whose gradients can run in parallel.

    Args:
        schedule: the delay schedule (or any schedule with ``worker`` and ``num_updates``, e.g.
            an asynchronous :class:`jaxstale.localsgd.LocalSchedule`).
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

    With several processes ``D`` is at least the number of processes ``P`` (each must hold a
    device): the largest divisor of ``M`` in ``[P, device_count]``, else ``max(P, min(M,
    device_count))`` (padding workers then fill ``C``)."""
    m, count, procs = num_workers, jax.device_count(), jax.process_count()
    fits = [k for k in range(procs, min(m, count) + 1) if m % k == 0]
    d = max(fits) if fits else max(procs, min(m, count))
    return make_mesh(d, "data")
