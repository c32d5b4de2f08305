"""Local-SGD arrivals: which worker's ``H`` inner steps reach the server next, from which version.

In local SGD a worker pulls the global weights ``θ`` (version ``v``: after ``v`` outer updates),
runs ``H_w`` inner optimizer steps on its next mini-batches and sends back its pseudo-gradient;
the server applies it as outer update ``t``. A :class:`LocalSchedule` is that event sequence,
computed on the host independently of the weights (as :mod:`jaxstale.delays` does for gradients):

    staleness τ_t = t − pulled[t]      (outer updates applied since the worker's pull)

- :func:`synchronous`: DiLoCo's rounds — every worker pulls the same version, runs ``H`` steps,
  and the ``M`` pseudo-gradients are averaged into one outer update (``τ = 0``). Outer update
  ``r`` is round ``r``; its ``M`` jobs are the rows ``r·M … r·M + M − 1``.
- :func:`asynchronous`: asynchronous local SGD (Liu et al.) — each arrival is one outer update;
  worker ``i``'s inner step takes ``Gamma(k, s_i/k)`` time units (mean ``s_i``: ``s_i`` is the
  straggler slowdown), so ``H`` steps take ``Gamma(k·H, s_i/k)``; the earliest finisher arrives,
  pulls the new weights at once and starts its next ``H_w`` steps. ``dynamic=True`` is
  **dynamic local updates** (DyLU): ``H_w = max(1, ⌈H · speed_w / max speed⌉)``, speed ``1/s_w``,
  so every worker's job takes about as long as the fastest one's ``H`` steps.

Mini-batches are consumed in the order jobs *start* (a job's ``steps[t]`` consecutive batches
from ``first_batch[t]``), so the data stream is a function of the schedule alone. The times
(``start_time``, ``finish_time``, in inner-step units of a speed-1 worker) are the emulated
wall clock: "faster in wall clock" is read off them.

References:
    Douillard et al., "DiLoCo", arXiv:2311.08105. Liu et al., "Asynchronous Local-SGD Training
    for Language Modeling", arXiv:2401.09135 (asynchronous arrivals, dynamic local updates).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxstale._checks import check_int, check_real
from jaxstale.delays import earliest_first

__all__ = ["LocalSchedule", "asynchronous", "synchronous"]


class LocalSchedule(NamedTuple):
    """The jobs of a local-SGD run, in the order the server applies them.

    Attributes:
        worker: ``[J]`` int32, the worker of job ``j``.
        pulled: ``[J]`` int32, the version (outer updates applied) it started from.
        first_batch: ``[J]`` int32, its first mini-batch in the global stream.
        steps: ``[J]`` int32, its number of inner steps ``H_w``.
        start_time: ``[J]`` float64, when it pulled (emulated wall clock).
        finish_time: ``[J]`` float64, when its pseudo-gradient reached the server.
        num_workers: ``M``.
        inner_steps: ``H``, the most inner steps of any job.
        synchronous: whether ``M`` jobs make one averaged outer update (DiLoCo) rather than one
            update each.
        name: the schedule's kind.
    """

    worker: np.ndarray
    pulled: np.ndarray
    first_batch: np.ndarray
    steps: np.ndarray
    start_time: np.ndarray
    finish_time: np.ndarray
    num_workers: int
    inner_steps: int
    synchronous: bool
    name: str

    @property
    def num_updates(self) -> int:
        """Outer updates: rounds (synchronous) or arrivals."""
        n = len(self.worker)
        return n // self.num_workers if self.synchronous else n

    @property
    def staleness(self) -> np.ndarray:
        """``[num_updates]`` int32: τ of each outer update (0 for every synchronous round)."""
        if self.synchronous:
            return np.zeros(self.num_updates, np.int32)
        return (np.arange(len(self.pulled)) - self.pulled).astype(np.int32)

    @property
    def num_batches(self) -> int:
        """Mini-batches the run consumes."""
        return int((self.first_batch + self.steps).max()) if len(self.steps) else 0

    @property
    def wall_time(self) -> float:
        """Emulated time until the last update."""
        return float(self.finish_time.max()) if len(self.finish_time) else 0.0


def _slowdowns(m: int, fraction: float, slowdown: float, where: str) -> np.ndarray:
    """``[M]``: each worker's mean time per inner step (the first ``round(f·M)`` stragglers)."""
    frac = check_real(fraction, "straggler_fraction", where, 0, 1)
    slowdown = check_real(slowdown, "straggler_slowdown", where, 1)
    slow = np.ones(m)
    slow[: round(frac * m)] = slowdown
    return slow


def synchronous(
    num_workers: int,
    num_rounds: int,
    inner_steps: int,
    *,
    seed: int | None = None,
    shape: float = 100.0,
    straggler_fraction: float = 0.0,
    straggler_slowdown: float = 1.0,
) -> LocalSchedule:
    """DiLoCo's synchronous rounds: ``M`` workers × ``H`` steps per outer update.

    Round ``r``'s worker ``m`` runs on batches ``(r·M + m)·H … + H − 1`` (every worker sees its
    own data), all from version ``r``. Times: without ``seed`` a round takes ``H`` time units
    (every worker at speed 1); with it, worker ``i``'s ``H`` steps take ``Gamma(k·H, s_i/k)``
    as in :func:`asynchronous` and a round lasts until its slowest worker is done (the
    barrier), so the wall clock of synchronous and asynchronous runs compares. The times never
    change which batches or versions a job uses.

    Example:
        >>> s = synchronous(2, 3, 4)
        >>> s.num_updates, s.num_batches, s.first_batch.tolist()[:4]
        (3, 24, [0, 4, 8, 12])
    """
    m = check_int(num_workers, "num_workers", "synchronous", 1)
    rounds = check_int(num_rounds, "num_rounds", "synchronous", 1)
    h = check_int(inner_steps, "inner_steps", "synchronous", 1)
    jobs = np.arange(rounds * m)
    r = jobs // m
    if seed is None:
        ends = np.arange(1, rounds + 1, dtype=np.float64) * h
    else:
        seed = check_int(seed, "seed", "synchronous", 0)
        shape = check_real(shape, "shape", "synchronous", 0, low_open=True)
        slow = _slowdowns(m, straggler_fraction, straggler_slowdown, "synchronous")
        draws = np.random.default_rng(seed).gamma(shape * h, slow / shape, size=(rounds, m))
        ends = np.cumsum(draws.max(axis=1))
    starts = np.concatenate([[0.0], ends[:-1]])
    return LocalSchedule(
        worker=(jobs % m).astype(np.int32),
        pulled=r.astype(np.int32),
        first_batch=(jobs * h).astype(np.int32),
        steps=np.full(rounds * m, h, np.int32),
        start_time=starts[r],
        finish_time=ends[r],
        num_workers=m,
        inner_steps=h,
        synchronous=True,
        name="synchronous",
    )


def asynchronous(
    num_workers: int,
    num_updates: int,
    inner_steps: int,
    *,
    seed: int,
    shape: float = 100.0,
    straggler_fraction: float = 0.0,
    straggler_slowdown: float = 1.0,
    dynamic: bool = False,
) -> LocalSchedule:
    """Asynchronous local SGD: each arrival is an outer update; the earliest finisher next.

    Args:
        num_workers: ``M ≥ 1``.
        num_updates: outer updates (arrivals) ``≥ 1``.
        inner_steps: ``H ≥ 1`` (the fastest workers' steps per job with ``dynamic``).
        seed: numpy seed of the compute times (``≥ 0``).
        shape: gamma shape ``k`` of one inner step's time (100: 10 % spread).
        straggler_fraction: fraction of workers ``straggler_slowdown`` times slower.
        straggler_slowdown: ``≥ 1``.
        dynamic: dynamic local updates (DyLU): ``H_w = max(1, ⌈H · speed_w / max speed⌉)``.

    Example:
        >>> s = asynchronous(4, 8, 10, seed=0, straggler_fraction=0.25, straggler_slowdown=4.0)
        >>> s.steps.tolist() == [10] * 8, int(s.staleness.max()) >= 3
        (True, True)
        >>> d = asynchronous(4, 8, 10, seed=0, straggler_fraction=0.25, straggler_slowdown=4.0,
        ...                  dynamic=True)
        >>> sorted(set(d.steps.tolist()))  # the straggler runs a quarter of the steps
        [3, 10]
    """
    where = "asynchronous"
    m = check_int(num_workers, "num_workers", where, 1)
    count = check_int(num_updates, "num_updates", where, 1)
    h = check_int(inner_steps, "inner_steps", where, 1)
    seed = check_int(seed, "seed", where, 0)
    shape = check_real(shape, "shape", where, 0, low_open=True)
    slow = _slowdowns(m, straggler_fraction, straggler_slowdown, where)
    rng = np.random.default_rng(seed)
    speed = 1.0 / slow
    hw = (
        np.maximum(1, np.ceil(h * speed / speed.max() - 1e-9)).astype(np.int64)
        if dynamic
        else np.full(m, h, np.int64)
    )
    a = earliest_first(m, count, lambda i: rng.gamma(shape * hw[i], slow[i] / shape))
    # the jobs' steps in dispatch order (worker i's initial job is job i), their first batches
    job_steps = np.concatenate([hw, hw[a.worker]])
    job_first = np.concatenate([[0], np.cumsum(job_steps)[:-1]])
    cols = {"worker": a.worker, "pulled": a.pulled, "first": job_first[a.job],
            "steps": job_steps[a.job]}  # fmt: skip
    start, finish = a.start, a.finish
    return LocalSchedule(
        worker=cols["worker"].astype(np.int32),
        pulled=cols["pulled"].astype(np.int32),
        first_batch=cols["first"].astype(np.int32),
        steps=cols["steps"].astype(np.int32),
        start_time=start,
        finish_time=finish,
        num_workers=m,
        inner_steps=int(hw.max()),
        synchronous=False,
        name="dylu" if dynamic else "asynchronous",
    )
