"""Device meshes for the mesh executors: build one from the visible devices, or check a user's.

The executors never enumerate devices: they take a ``jax.sharding.Mesh`` with a named axis
(``"stage"`` for pipelines, ``"data"`` for asynchronous workers) and run ``jax.shard_map`` over
it — on emulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set before
``import jax``), on GPUs, and across hosts after ``jax.distributed.initialize()`` (every host runs
the same program; ``jax.devices()`` then lists all hosts' devices).

References:
    JAX documentation, "Manual parallelism with shard_map" and "Multi-host and multi-process
    environments" (https://docs.jax.dev/en/latest/multi_process.html).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

__all__ = ["check_mesh", "make_mesh", "to_host"]


def make_mesh(
    size: int | None = None,
    axis: str = "stage",
    *,
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A one-axis mesh of the first ``size`` of ``devices`` (default ``jax.devices()``: global
    after ``jax.distributed.initialize()``), axis ``axis`` (``"stage"`` or ``"data"``).

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
    return jax.make_mesh((n,), (axis,), axis_types=(AxisType.Auto,), devices=devs[:n])


def check_mesh(mesh: Any, axis: str, size: int) -> Mesh:
    """``mesh`` if it is a ``jax.sharding.Mesh`` with an axis ``axis`` of length ``size`` (other
    axes are replicated over); else ``TypeError`` / ``ValueError`` saying how to build one."""
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
    return mesh


def to_host(x: jax.Array) -> np.ndarray:
    """A (possibly multi-host) sharded array's global value as numpy on this host (other hosts'
    shards gathered with ``multihost_utils.process_allgather``; every process must call it).

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
