"""Delay models for asynchronous data parallelism: who finishes next, at which weight version.

A delay model is computed on the host with numpy, independently of the weights: for every
applied update ``t = 0, 1, …, T−1`` it says which worker's gradient the parameter server applies
(``worker[t]``), the version of the master weights that worker had pulled when it started
computing that gradient (``pulled[t]``), hence the gradient's **staleness**

    τ_t = t − pulled[t]      (version t = the master weights after t applied updates, w_t)

and which mini-batch of the global data stream the gradient was computed on (``batch[t]``; the
stream is consumed in the order workers *start* computing). The executors
(:mod:`jaxstale.asyncdp`) consume a :class:`DelaySchedule` as data, so the same
compiled step serves every delay model.

Models:

* :func:`constant` — a FIFO of versions: ``w_{t+1} = w_t − η g(w_{t−τ})`` (Jain et al.).
* :func:`round_robin` — ``M`` workers finish in turn; ``τ_t = M − 1`` for every ``t ≥ M − 1``.
* :func:`gamma_timed` — each worker's compute time is ``Gamma(shape=100, scale=B/100)``
  (mean ``B`` time units, B the batch size), a min-heap yields the next finisher, the finisher
  pulls the new weights right after its gradient is applied (the DANA / Gap-Aware authors'
  simulator). Optional heterogeneous stragglers: a fraction of the workers is ``k×`` slower.

**Warm-up convention.** All workers pull version 0 at time 0 and there are no versions before
0. So the first gradients are computed at ``w_0`` and their staleness is their version gap, not
the nominal delay: for :func:`constant` ``pulled[t] = max(t − τ, 0)`` (``τ_t = min(t, τ)``), for
:func:`round_robin` the first ``M − 1`` updates have ``τ_t = t`` (0, 1, …, M − 2) and every later
one exactly ``M − 1``. Constant delay τ and round-robin of ``τ + 1`` workers give identical
``pulled`` sequences; they differ only in what they call a worker.

References:
    Jain, Nagarajan, Pradeep. "Staleness effects in asynchronous SGD" style constant-delay study,
    ICLR 2018 workshop. Hakimi, Barkai, Gabel, Schuster. "Taming Momentum in a Distributed
    Asynchronous Environment", arXiv 1907.11612 (gamma-timed workers).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxstale._checks import check_int, check_real

__all__ = [
    "DELAY_MODELS",
    "DelaySchedule",
    "constant",
    "gamma_timed",
    "make_schedule",
    "round_robin",
]

DELAY_MODELS: tuple[str, ...] = ("constant", "round_robin", "gamma")


class DelaySchedule(NamedTuple):
    """The event sequence of an asynchronous run, independent of the weights.

    Attributes:
        worker: ``[T]`` int32, the worker whose gradient is applied at update ``t``.
        pulled: ``[T]`` int32, the version the gradient was computed at (``0 ≤ pulled[t] ≤ t``).
        batch: ``[T]`` int32, the index of the mini-batch (in the global stream) it used.
        num_workers: ``M``, the number of workers.
        name: the delay model that produced it.
        start_time: ``[T]`` float64 or None: when the worker pulled its weights and started this
            gradient (timed models only; LC-ASGD's ``t_comm``).
        finish_time: ``[T]`` float64 or None: when the gradient arrived at the server.
    """

    worker: np.ndarray
    pulled: np.ndarray
    batch: np.ndarray
    num_workers: int
    name: str
    start_time: np.ndarray | None = None
    finish_time: np.ndarray | None = None

    @property
    def staleness(self) -> np.ndarray:
        """``[T]`` int32: ``τ_t = t − pulled[t]`` (0 = fresh)."""
        return (np.arange(len(self.pulled), dtype=np.int32) - self.pulled).astype(np.int32)

    @property
    def num_updates(self) -> int:
        """``T``, the number of applied updates."""
        return len(self.pulled)

    def counts(self) -> np.ndarray:
        """Histogram of the staleness: ``counts[τ]`` = number of updates with staleness τ."""
        return np.bincount(self.staleness, minlength=1)

    def validate(self) -> DelaySchedule:
        """Check that the schedule is a possible event sequence; return it unchanged.

        Every constructor in :mod:`jaxstale.delays` ends with it; call it on a schedule you
        built by hand (the executors consume a schedule as data and cannot check it later).

        Checks (the first violation raises a one-line error naming the field): ``worker``,
        ``pulled``, ``batch`` (and ``start_time``, ``finish_time`` when present) are 1-D of the
        same length ``T`` (``ValueError``), the first three of an integer dtype (``TypeError``);
        ``num_workers`` is an int ``≥ 1``; ``0 ≤ pulled[t] ≤ t`` (no gradient is taken at
        weights that do not exist yet); ``0 ≤ worker[t] < num_workers``; ``batch[t] ≥ 0``;
        ``start_time[t] ≤ finish_time[t]`` when both are present (NaN fails).

        Returns:
            ``self``.

        Example:
            >>> import numpy as np
            >>> from jaxstale.delays import DelaySchedule
            >>> ok = DelaySchedule(np.array([0, 0]), np.array([0, 0]), np.array([0, 1]), 1, "mine")
            >>> ok.validate().staleness.tolist()
            [0, 1]
            >>> bad = ok._replace(pulled=np.array([0, 2]))
            >>> bad.validate()
            Traceback (most recent call last):
            ...
            ValueError: DelaySchedule.validate: pulled[1] = 2 is outside [0, 1] (...)
        """
        where = "DelaySchedule.validate"
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int | np.integer):
            raise TypeError(f"{where}: num_workers must be an int, got {self.num_workers!r}")
        if self.num_workers < 1:
            raise ValueError(f"{where}: num_workers must be >= 1, got {self.num_workers}")
        fields = {"worker": self.worker, "pulled": self.pulled, "batch": self.batch}
        if self.start_time is not None:
            fields["start_time"] = self.start_time
        if self.finish_time is not None:
            fields["finish_time"] = self.finish_time
        arrays = {name: np.asarray(value) for name, value in fields.items()}
        t_count = len(arrays["pulled"]) if arrays["pulled"].ndim == 1 else -1
        for name, arr in arrays.items():
            if arr.ndim != 1 or len(arr) != t_count:
                raise ValueError(
                    f"{where}: {name} must be 1-D with one entry per update, like pulled "
                    f"(shape ({max(t_count, 0)},)); got shape {arr.shape}"
                )
            if name in ("worker", "pulled", "batch") and arr.dtype.kind not in "iu":
                raise TypeError(f"{where}: {name} must hold integers, got dtype {arr.dtype}")
        t = np.arange(t_count)

        def first_bad(name: str, ok: np.ndarray, allowed: str, why: str = "") -> None:
            if not np.all(ok):
                i = int(np.argmin(ok))
                raise ValueError(
                    f"{where}: {name}[{i}] = {arrays[name][i]} is outside {allowed.format(t=i)}"
                    + (f" ({why})" if why else "")
                )

        pulled, worker = arrays["pulled"], arrays["worker"]
        first_bad(
            "pulled",
            (pulled >= 0) & (pulled <= t),
            "[0, {t}]",
            "update t applies a gradient taken at a version 0 … t",
        )
        first_bad("worker", (worker >= 0) & (worker < self.num_workers), f"[0, {self.num_workers})")
        first_bad("batch", arrays["batch"] >= 0, "[0, inf)")
        if "start_time" in arrays and "finish_time" in arrays:
            start, finish = arrays["start_time"], arrays["finish_time"]
            ok = start <= finish
            if not np.all(ok):
                i = int(np.argmin(ok))
                raise ValueError(
                    f"{where}: start_time[{i}] = {start[i]} must be <= finish_time[{i}] = "
                    f"{finish[i]} (a gradient arrives after its worker started it)"
                )
        return self


def _from_pulled(
    pulled: np.ndarray,
    worker: np.ndarray,
    batch: np.ndarray,
    m: int,
    name: str,
    start_time: np.ndarray | None = None,
    finish_time: np.ndarray | None = None,
) -> DelaySchedule:
    return DelaySchedule(
        worker=worker.astype(np.int32),
        pulled=pulled.astype(np.int32),
        batch=batch.astype(np.int32),
        num_workers=m,
        name=name,
        start_time=start_time,
        finish_time=finish_time,
    ).validate()


def constant(tau: int, num_updates: int) -> DelaySchedule:
    """Constant delay ``τ``: the gradient applied at update ``t`` was taken at ``w_{max(t−τ, 0)}``.

    This is a FIFO of versions (Jain et al.); ``τ = 0`` is sequential SGD. It equals
    :func:`round_robin` with ``τ + 1`` workers, whose ids are ``t mod (τ + 1)``.

    Args:
        tau: the delay, ``τ ≥ 0``.
        num_updates: ``T``, the number of applied updates (``≥ 1``).

    Returns:
        A :class:`DelaySchedule` with ``staleness[t] = min(t, τ)`` and ``batch[t] = t``.

    Example:
        >>> from jaxstale.delays import constant
        >>> constant(2, 6).staleness.tolist()
        [0, 1, 2, 2, 2, 2]

    References:
        Jain et al., ICLR 2018 workshop (constant-delay SGD with momentum).
    """
    tau = check_int(tau, "tau", "constant", 0)
    t_count = check_int(num_updates, "num_updates", "constant", 1)
    t = np.arange(t_count)
    return _from_pulled(np.maximum(t - tau, 0), t % (tau + 1), t, tau + 1, "constant")


def round_robin(num_workers: int, num_updates: int) -> DelaySchedule:
    """``M`` workers of equal speed finishing in turn: worker ``t mod M`` applies update ``t``.

    Worker ``i`` pulls version ``t + 1`` right after its update ``t``; its next update is
    ``t + M``, so every gradient after the warm-up has staleness exactly ``M − 1``. The first
    ``M − 1`` updates were computed at ``w_0`` (there is nothing older): ``τ_t = t``.

    Args:
        num_workers: ``M ≥ 1``.
        num_updates: ``T ≥ 1``.

    Returns:
        A :class:`DelaySchedule` (``pulled[t] = max(t − M + 1, 0)``, ``batch[t] = t``).

    Example:
        >>> from jaxstale.delays import round_robin
        >>> s = round_robin(3, 7)
        >>> s.worker.tolist(), s.staleness.tolist()
        ([0, 1, 2, 0, 1, 2, 0], [0, 1, 2, 2, 2, 2, 2])
    """
    m = check_int(num_workers, "num_workers", "round_robin", 1)
    t_count = check_int(num_updates, "num_updates", "round_robin", 1)
    t = np.arange(t_count)
    return _from_pulled(np.maximum(t - m + 1, 0), t % m, t, m, "round_robin")


class Arrivals(NamedTuple):
    """The order in which dispatched jobs finish (:func:`earliest_first`): per arrival ``t``,
    its ``worker``, the version it ``pulled``, its dispatch index ``job`` (the initial ``M``
    jobs are 0..M−1, then one per arrival in arrival order), and its start and finish times."""

    worker: np.ndarray
    pulled: np.ndarray
    job: np.ndarray
    start: np.ndarray
    finish: np.ndarray


def earliest_first(num_workers: int, count: int, draw: Callable[[int], float]) -> Arrivals:
    """``count`` arrivals of ``M`` workers that each run one job at a time: every worker starts
    at time 0; repeatedly the earliest finisher (ties: the lower worker id) arrives as update
    ``t``, pulls version ``t + 1`` at once and starts its next job. ``draw(i)`` is worker
    ``i``'s next job duration, called in dispatch order (the initial ``M`` jobs, then one per
    arrival), so a seeded generator gives a deterministic schedule.

    Example:
        >>> a = earliest_first(2, 4, lambda i: [1.0, 3.0][i])
        >>> a.worker.tolist(), a.pulled.tolist(), a.job.tolist()
        ([0, 0, 0, 1], [0, 1, 2, 0], [0, 2, 3, 1])
    """
    heap = [(float(draw(i)), i) for i in range(num_workers)]
    heapq.heapify(heap)
    version = np.zeros(num_workers, np.int64)  # the version each worker holds
    job = np.arange(num_workers, dtype=np.int64)  # each worker's current job
    started = np.zeros(num_workers)  # when each worker pulled
    ints = lambda: np.empty(count, np.int64)
    out = Arrivals(ints(), ints(), ints(), np.empty(count), np.empty(count))
    for t in range(count):
        now, i = heapq.heappop(heap)
        out.worker[t], out.pulled[t], out.job[t] = i, version[i], job[i]
        out.start[t], out.finish[t] = started[i], now
        version[i], job[i], started[i] = t + 1, num_workers + t, now
        heapq.heappush(heap, (now + float(draw(i)), i))
    return out


def gamma_timed(
    num_workers: int,
    num_updates: int,
    *,
    batch_size: int,
    seed: int,
    shape: float = 100.0,
    straggler_fraction: float = 0.0,
    straggler_slowdown: float = 1.0,
) -> DelaySchedule:
    """Workers with random compute times; the next to finish is applied (a min-heap of times).

    Worker ``i`` draws its compute time ``c ~ Gamma(shape, scale=s_i·B/shape)`` (mean ``s_i·B``;
    ``s_i = straggler_slowdown`` for the first ``round(straggler_fraction·M)`` workers, else 1).
    All workers pull ``w_0`` at time 0. Repeatedly the earliest finisher's gradient is applied as
    update ``t``; the worker pulls ``w_{t+1}`` at once and starts its next gradient on the next
    mini-batch of the stream. Staleness emerges from the order; its mean is close to ``M − 1``
    (each worker applies about every ``M``-th update). Times are drawn with
    ``np.random.default_rng(seed)``, so the schedule is a deterministic function of the seed.

    Args:
        num_workers: ``M ≥ 1``.
        num_updates: ``T ≥ 1``.
        batch_size: ``B`` (sets the time scale only; ``≥ 1``).
        seed: numpy seed, an int ``≥ 0``.
        shape: the gamma shape ``k`` (finite, ``> 0``; 100 = compute times with 10% relative
            spread).
        straggler_fraction: fraction of workers that are slow, in ``[0, 1]``.
        straggler_slowdown: how many times slower the stragglers are (``≥ 1``).

    Returns:
        A :class:`DelaySchedule`.

    Example:
        >>> from jaxstale.delays import gamma_timed
        >>> s = gamma_timed(4, 2000, batch_size=32, seed=0)
        >>> bool(abs(s.staleness[100:].mean() - 3) < 0.1), s.num_workers
        (True, 4)

    References:
        Hakimi et al., "Taming Momentum in a Distributed Asynchronous Environment",
        arXiv 1907.11612; Barkai et al., "Gap-Aware Mitigation of Gradient Staleness",
        ICLR 2020, arXiv 1909.10802 (their simulators use Gamma(100, B/100) worker times).
    """
    m = check_int(num_workers, "num_workers", "gamma_timed", 1)
    t_count = check_int(num_updates, "num_updates", "gamma_timed", 1)
    b = check_int(batch_size, "batch_size", "gamma_timed", 1)
    seed = check_int(seed, "seed", "gamma_timed", 0)
    shape = check_real(shape, "shape", "gamma_timed", 0, low_open=True)
    straggler_fraction = check_real(straggler_fraction, "straggler_fraction", "gamma_timed", 0, 1)
    straggler_slowdown = check_real(straggler_slowdown, "straggler_slowdown", "gamma_timed", 1)
    rng = np.random.default_rng(seed)
    slow = np.ones(m)
    slow[: round(straggler_fraction * m)] = straggler_slowdown
    scale = slow * b / shape
    a = earliest_first(m, t_count, lambda i: rng.gamma(shape, scale[i]))
    # one mini-batch per job, in dispatch order
    pulled, worker, batch, start, finish = a.pulled, a.worker, a.job, a.start, a.finish
    return _from_pulled(pulled, worker, batch, m, "gamma", start, finish)


def make_schedule(
    name: str,
    num_workers: int,
    num_updates: int,
    *,
    batch_size: int = 32,
    seed: int = 0,
    **kwargs: float,
) -> DelaySchedule:
    """Build a schedule by name: ``"constant"`` (τ = ``num_workers − 1``), ``"round_robin"``,
    ``"gamma"`` (extra keyword arguments go to :func:`gamma_timed`).

    Args:
        name: one of :data:`DELAY_MODELS`.
        num_workers: ``M`` (for ``"constant"``, the delay is ``M − 1``).
        num_updates: ``T``.
        batch_size: ``B`` for ``"gamma"``.
        seed: seed for ``"gamma"``.
        **kwargs: ``shape``, ``straggler_fraction``, ``straggler_slowdown`` for ``"gamma"``.

    Returns:
        A :class:`DelaySchedule`.

    Example:
        >>> from jaxstale.delays import make_schedule
        >>> make_schedule("constant", 3, 5).staleness.tolist()
        [0, 1, 2, 2, 2]
    """
    if name == "constant":
        check_int(num_workers, "num_workers", "make_schedule", 1)
        if kwargs:
            raise ValueError(
                f"make_schedule: constant takes no extra options, got {sorted(kwargs)}"
            )
        return constant(num_workers - 1, num_updates)
    if name == "round_robin":
        if kwargs:
            raise ValueError(
                f"make_schedule: round_robin takes no extra options, got {sorted(kwargs)}"
            )
        return round_robin(num_workers, num_updates)
    if name == "gamma":
        return gamma_timed(num_workers, num_updates, batch_size=batch_size, seed=seed, **kwargs)
    raise ValueError(
        f"make_schedule: unknown delay model name {name!r}; known: {', '.join(DELAY_MODELS)}"
    )
