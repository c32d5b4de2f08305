"""Multi-process JAX: join a process group, write from one process, gather global arrays.

JAX runs a program on several hosts by starting the *same* program once per process (JAX's
multi-controller model): each calls ``jax.distributed.initialize`` first; ``jax.devices()`` then
lists every process's devices, a mesh built from them spans the group, and the collectives of a
``jax.shard_map`` cross process boundaries. :func:`initialize` joins a group started on one
machine by ``python -m jaxstale.launch`` (and does nothing otherwise, so programs call it
unconditionally); :func:`is_main_process` and :func:`process_allgather_to_host` are what a
program needs to write its results once. No runtime of our own: coordination, heartbeats and
collectives (gloo on the CPU) are JAX's.

**What multi-process use of the mesh executors requires** (:mod:`jaxstale.asyncdp.mesh`,
:mod:`jaxstale.pipeline.mesh`; the experiments' ``--executor mesh`` under the launcher):

* every process runs the same program with the same arguments and the same host data
  (datasets, seeds, delay schedules, initial weights): each places *its* copy of a value on
  its own devices of the mesh (:func:`jaxstale.mesh.to_mesh`), nothing checks that the copies
  agree, and every process must make the same JAX calls in the same order (a collective one
  process skips waits forever);
* the mesh is built after :func:`initialize` from ``jax.devices()`` (the global list) and holds
  a device of every process: :func:`jaxstale.mesh.make_mesh` takes devices from each, the
  executors refuse a mesh that leaves a process out;
* results come back to every process (replicated losses read from its own devices, weights
  gathered with :func:`jaxstale.mesh.to_host`), and are written once, by process 0:
  :class:`experiments.runs.RunFolder` and :func:`experiments.runs.atomic_write_text` write nothing
  on the other processes;
* resuming a run folder needs every process to see the same files: one machine, or a shared
  filesystem on a cluster (a ``RunFolder`` compares what each process finds and stops them all
  with an error if it differs); without one, do not resume (use a new ``--out``).

On a cluster, let the cluster's launcher start the processes (not ``jaxstale.launch -n``):
each must call ``jax.distributed.initialize()`` with no arguments before any JAX computation;
JAX reads the coordinator, the number of processes and the process id from Slurm
(``SLURM_*``) or Open MPI (``OMPI_*``) variables by itself (and ``mpi4py`` with
``cluster_detection_method="mpi4py"``). ``python -m jaxstale.launch --cluster -- TARGET
[args]`` does that, then runs the target (an experiment name, ``-m MODULE`` or a script)::

    # Slurm: 2 nodes, 4 GPUs each, one process per GPU
    srun --nodes=2 --ntasks-per-node=4 --gpus-per-task=1 \
        python -m jaxstale.launch --cluster -- async_workers --executor mesh
    # Open MPI: 8 processes over two hosts
    mpirun -np 8 -H host1:4,host2:4 \
        python -m jaxstale.launch --cluster -- async_workers --executor mesh

(your own program can instead call ``jax.distributed.initialize()`` first thing; on
GPUs under Slurm or Open MPI each process then sees one local GPU by default). On several
CPU-only hosts, also set ``jax.config.update("jax_cpu_collectives_implementation", "gloo")``
before ``jax.distributed.initialize()``.

References:
    JAX documentation, "Introduction to multi-controller JAX"
    (https://docs.jax.dev/en/latest/multi_process.html).
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import jax
import numpy as np

from jaxstale.mesh import to_host

__all__ = [
    "allgather_bytes",
    "cluster_environment",
    "initialize",
    "is_main_process",
    "process_allgather_to_host",
    "process_count",
]

ENV_COORDINATOR = "JAXSTALE_COORDINATOR"
ENV_NUM_PROCESSES = "JAXSTALE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXSTALE_PROCESS_ID"
ENV_TIMEOUT = "JAXSTALE_TIMEOUT"


def initialize() -> bool:
    """Join the process group started by ``python -m jaxstale.launch``; no-op otherwise.

    If the launcher's variables ``JAXSTALE_COORDINATOR``, ``JAXSTALE_NUM_PROCESSES`` and
    ``JAXSTALE_PROCESS_ID`` are set, this calls ``jax.distributed.initialize(coordinator_address,
    num_processes, process_id)`` with cluster auto-detection off (a local group is not the
    Slurm/MPI job it may run inside) and the coordinator bound to its loopback address only.
    Before that, on the CPU platform it makes sure cross-process collectives are on
    (``jax_cpu_collectives_implementation``: gloo if unset; gloo is jax 0.10's default, an
    explicit "mpi" is kept), and it turns off JAX's
    preemption service unless ``JAX_ENABLE_PREEMPTION_SERVICE`` is set: that service catches
    SIGTERM and keeps the process running (a "preemption notice"), whereas under the launcher
    SIGTERM means stop. ``JAXSTALE_TIMEOUT`` (``--timeout``), if set, becomes JAX's
    ``initialization_timeout``, ``heartbeat_timeout_seconds`` and ``shutdown_timeout_seconds``.

    Without those variables it does nothing (one process), so programs can call it
    unconditionally. It is idempotent: once JAX's distributed runtime is up (by an earlier call,
    by the launcher's bootstrap, or by the user's own ``jax.distributed.initialize()``) it
    returns at once.

    It must run before anything initializes a JAX backend (``jax.devices()``, creating an
    array, a computation); importing jax is fine. On a cluster, call
    ``jax.distributed.initialize()`` instead (see the module documentation).

    Returns:
        Whether JAX's distributed runtime is initialized on return (``False`` in a single
        process).

    Raises:
        ValueError: malformed ``JAXSTALE_*`` variables.
        RuntimeError: from JAX, if a backend was already initialized.

    Example:
        >>> from jaxstale.distributed import initialize
        >>> initialize()  # no JAXSTALE_* variables here: a single process, nothing to do
        False
    """
    if jax.distributed.is_initialized():
        return True
    coordinator = os.environ.get(ENV_COORDINATOR)
    if not coordinator:
        return False
    try:
        num_processes = int(os.environ[ENV_NUM_PROCESSES])
        process_id = int(os.environ[ENV_PROCESS_ID])
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"{ENV_COORDINATOR} is set but {ENV_NUM_PROCESSES} / {ENV_PROCESS_ID} are missing "
            f"or not integers ({e}); they are set by python -m jaxstale.launch"
        ) from None
    timeouts: dict[str, int] = {}
    if raw := os.environ.get(ENV_TIMEOUT):
        t = max(1, math.ceil(float(raw)))
        timeouts = {
            "initialization_timeout": t,
            "heartbeat_timeout_seconds": t,
            "shutdown_timeout_seconds": t,
        }
    platforms = _config("jax_platforms") or ""
    cpu = not platforms or "cpu" in platforms.split(",")
    if cpu and _config("jax_cpu_collectives_implementation") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # jax 0.10's default
    if "JAX_ENABLE_PREEMPTION_SERVICE" not in os.environ:
        jax.config.update("jax_enable_preemption_service", False)
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        cluster_detection_method="deactivate",
        coordinator_bind_address=coordinator,
        **timeouts,
    )
    return True


def cluster_environment() -> str | None:
    """The cluster environment ``jax.distributed.initialize()`` would detect here, or ``None``.

    Asks JAX's own detectors (``jax._src.clusters``), in JAX's order, leaving out the opt-in
    ones (``mpi4py``): e.g. ``"ompi"`` under Open MPI's ``mpirun`` (``OMPI_MCA_orte_hnp_uri``),
    ``"slurm"`` in a Slurm job step (``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``,
    ``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_LOCALID``), the Cloud TPU and Kubernetes
    environments. Without one, ``jax.distributed.initialize()`` with no arguments fails
    ("coordinator_address should be defined"). If this JAX keeps no list of detectors it
    returns ``"unknown"`` (let JAX decide).

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from jaxstale.distributed import cluster_environment
        >>> step = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node1", "SLURM_NTASKS": "2",
        ...         "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}   # what srun sets
        >>> with mock.patch.dict(os.environ, step):
        ...     cluster_environment()
        'slurm'
    """
    try:
        from jax._src import clusters

        kinds = [k for k in clusters.ClusterEnv._cluster_types if not k.opt_in_only_method]
    except (ImportError, AttributeError):
        return "unknown"
    for kind in kinds:
        with contextlib.suppress(Exception):  # a detector's own failure: not this cluster
            if kind.is_env_present():
                return kind.name or kind.__name__
    return None


def _config(name: str) -> Any:
    return getattr(jax.config, name)  # (jax's Config declares no attributes for mypy)


def is_main_process() -> bool:
    """Whether this is process 0 (``jax.process_index() == 0``): the one that writes results.

    Always ``True`` in a single process. In a launched group call it after :func:`initialize`
    (it initializes the JAX backend).

    Example:
        >>> from jaxstale.distributed import is_main_process
        >>> is_main_process()
        True
    """
    return jax.process_index() == 0


def process_count() -> int:
    """The number of processes in the group: ``jax.process_count()`` once JAX's distributed
    runtime is initialized, else 1 — without starting a JAX backend in that case (so a
    single-process program may call it before configuring JAX).

    Example:
        >>> from jaxstale.distributed import process_count
        >>> process_count()
        1
    """
    return jax.process_count() if jax.distributed.is_initialized() else 1


def allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's ``data``, in process order, on every process (a collective: every
    process must call it, with ``data`` of the same length). ``[data]`` in one process.

    Example:
        >>> from jaxstale.distributed import allgather_bytes
        >>> allgather_bytes(b"ok")
        [b'ok']
    """
    if process_count() == 1:
        return [bytes(data)]
    from jax.experimental import multihost_utils

    rows = multihost_utils.process_allgather(np.frombuffer(data, np.uint8), tiled=False)
    return [np.asarray(r, np.uint8).tobytes() for r in rows]


def process_allgather_to_host(tree: Any) -> Any:
    """Every array of a pytree as a numpy array holding its *global* value, on every process.

    A ``jax.Array`` sharded over devices of several processes (not fully addressable) is
    gathered with ``jax.experimental.multihost_utils.process_allgather`` (a collective: every
    process must call this, with arrays of the same global shapes, in the same order); any
    other array (one process's own, or fully replicated) is converted with ``np.asarray``.
    The result has the global shape, as if the program ran in one process.

    This is not for collecting *different* per-process values (e.g. each process's own loss):
    for that use ``multihost_utils.process_allgather(x, tiled=False)``, which stacks them.

    Args:
        tree: a pytree of ``jax.Array`` / numpy arrays / scalars.

    Returns:
        The same pytree with numpy arrays.

    Example:
        >>> import jax.numpy as jnp
        >>> from jaxstale.distributed import process_allgather_to_host
        >>> process_allgather_to_host({"w": jnp.arange(3.0)})
        {'w': array([0., 1., 2.], dtype=float32)}
    """

    return jax.tree.map(lambda x: to_host(x) if isinstance(x, jax.Array) else np.asarray(x), tree)
