"""The :class:`Schedule` and its constructors: tick tables, versions, targets (see
:mod:`jaxstale.schedules` for the semantics)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxstale._checks import check_int

IDLE = 0
FORWARD = 1
BACKWARD = 2

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "1f1b-flush", "2bw")
TARGETS: tuple[str, ...] = ("sequential", "roundtrip")


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """The timeline of a pipelined run of ``num_batches`` mini-batches over ``num_stages`` stages.

    Per-(mini-batch, stage) arrays have shape ``[num_batches, num_stages]``; per-micro-batch arrays
    ``[num_batches, num_micro, num_stages]``; tick tables ``[num_ticks, num_stages]``.

    Attributes:
        name: schedule name (one of :data:`SCHEDULES`).
        num_stages: ``N``.
        num_batches: number of mini-batches ``B`` (= updates per stage).
        num_micro: micro-batches per mini-batch ``M`` (1 for asynchronous 1F1B).
        table: op code per tick and stage (0 idle, 1 forward, 2 backward).
        table_batch: mini-batch index of that op (-1 when idle).
        table_micro: micro-batch index of that op (-1 when idle).
        micro_fwd_tick, micro_bwd_tick: tick of each micro-batch's F / B.
        fwd_tick: tick of mini-batch ``b``'s first forward at stage ``k``.
        bwd_tick: tick of its last backward at stage ``k`` (= ``update_tick``).
        update_tick: the tick at whose end stage ``k`` applies ``b``'s update.
        fwd_version, bwd_version: the version the pass uses: the updates stage ``k`` applied
            before it, or on ``2bw`` the double-buffered ``max(b - 1, 0)`` (the same for every
            micro-batch of ``b`` in every schedule here; checked at construction).
        target_version: sequential target, ``b``.
        roundtrip_target: the SpecTrain lab's target (module docstring).
        fwd_lag, bwd_lag: ``[num_batches, num_micro, num_stages]``, updates applied before the
            pass beyond its version (a stash look-back; nonzero only on ``2bw``).
        options: the constructor's arguments other than ``num_batches`` (to rebuild the kind).
    """

    name: str
    num_stages: int
    num_batches: int
    num_micro: int
    table: np.ndarray
    table_batch: np.ndarray
    table_micro: np.ndarray
    micro_fwd_tick: np.ndarray
    micro_bwd_tick: np.ndarray
    fwd_tick: np.ndarray
    bwd_tick: np.ndarray
    update_tick: np.ndarray
    fwd_version: np.ndarray
    bwd_version: np.ndarray
    target_version: np.ndarray
    roundtrip_target: np.ndarray
    fwd_lag: np.ndarray
    bwd_lag: np.ndarray
    options: dict[str, Any]

    @property
    def num_ticks(self) -> int:
        """Length of the timeline in ticks."""
        return int(self.table.shape[0])

    def target(self, target: str = "sequential") -> np.ndarray:
        """The target version array ``[num_batches, num_stages]`` ("sequential" or "roundtrip")."""
        if target == "sequential":
            return self.target_version
        if target == "roundtrip":
            return self.roundtrip_target
        raise ValueError(f"unknown target {target!r}; choose one of {TARGETS}")

    def horizons(self, target: str = "sequential") -> tuple[np.ndarray, np.ndarray]:
        """Per-pass staleness ``s = target - version`` as ``(forward, backward)`` arrays.

        These are the prediction horizons of SpecTrain / NAG for that target.
        """
        t = self.target(target)
        return t - self.fwd_version, t - self.bwd_version

    @property
    def fwd_staleness(self) -> np.ndarray:
        """Forward staleness against the sequential target, ``b - fwd_version``."""
        return self.target_version - self.fwd_version

    @property
    def bwd_staleness(self) -> np.ndarray:
        """Backward staleness against the sequential target, ``b - bwd_version``."""
        return self.target_version - self.bwd_version

    @property
    def max_versions(self) -> np.ndarray:
        """Per stage, how many weight versions a stash must hold (PipeDream: ``N - k`` for 1F1B).

        The largest number of versions alive at once: the version a forward used must be kept
        until its backward, and the current version always exists.
        """
        return np.asarray(
            [
                _most_live_versions(
                    self.update_tick[:, k],
                    self.micro_fwd_tick[..., k].ravel(),
                    self.micro_bwd_tick[..., k].ravel(),
                    np.repeat(self.fwd_version[:, k], self.num_micro),
                    self.num_ticks,
                )
                for k in range(self.num_stages)
            ],
            dtype=np.int64,
        )

    def ops(self, tick: int) -> list[tuple[int, int, int, int]]:
        """The ops of one tick as ``(stage, op, batch, micro)`` tuples (idle stages left out)."""
        return [
            (
                k,
                int(self.table[tick, k]),
                int(self.table_batch[tick, k]),
                int(self.table_micro[tick, k]),
            )
            for k in range(self.num_stages)
            if self.table[tick, k] != IDLE
        ]


def _most_live_versions(
    update_tick: np.ndarray, start: np.ndarray, end: np.ndarray, version: np.ndarray, ticks: int
) -> int:
    """The most versions of one stage alive at one tick: the current one (the updates applied
    before the tick) and every version a pass in flight used (its forward at or before the
    tick, its backward not before it). In array operations over ticks: the in-flight passes of
    one version are merged into disjoint tick ranges, counted with a difference array, and the
    current version is added at the ticks where no in-flight range of it covers it."""
    order = np.lexsort((start, version))
    v, a, z = version[order], start[order], end[order]
    # merge the ranges of each version: a range starts a new group unless it overlaps (or
    # touches) the running end of its version's previous ranges
    run_end = np.zeros_like(z)
    new = np.ones(len(v), dtype=bool)
    for i in range(len(v)):  # one pass; ranges of one version are few and sorted
        if i and v[i] == v[i - 1] and a[i] <= run_end[i - 1] + 1:
            new[i] = False
            run_end[i] = max(run_end[i - 1], z[i])
        else:
            run_end[i] = z[i]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(v) - 1] if len(v) else np.zeros(0, np.int64)
    mv, ma, mz = v[new], a[new], run_end[last]
    live = np.zeros(ticks + 1, dtype=np.int64)
    np.add.at(live, ma, 1)
    np.add.at(live, mz + 1, -1)
    # the current version at tick t is c(t) = #updates before t, non-decreasing: the ticks
    # where it equals v form one range [lo, hi]; where that meets a merged range of v, the
    # current version is already counted
    updates = np.sort(update_tick)
    lo = np.where(mv == 0, 0, updates[np.maximum(mv - 1, 0)] + 1)
    hi = np.where(mv < len(updates), updates[np.minimum(mv, len(updates) - 1)], ticks - 1)
    a2, z2 = np.maximum(ma, lo), np.minimum(mz, hi)
    hit = a2 <= z2
    covered = np.zeros(ticks + 1, dtype=np.int64)
    np.add.at(covered, a2[hit], 1)
    np.add.at(covered, z2[hit] + 1, -1)
    count = np.cumsum(live)[:ticks] + 1 - np.cumsum(covered)[:ticks]
    return int(max(1, count.max(initial=1)))


def _one_f_one_b_order(
    num_stages: int, stage: int, items: list[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """1F1B order of one stage over ``items`` (``(batch, micro)`` in stream order)."""
    order: list[tuple[int, int, int]] = []
    warm = min(num_stages - stage, len(items))
    f = b = 0
    for _ in range(warm):
        order.append((FORWARD, *items[f]))
        f += 1
    while b < len(items):
        order.append((BACKWARD, *items[b]))
        b += 1
        if f < len(items):
            order.append((FORWARD, *items[f]))
            f += 1
    return order


def _updates_before(update_tick: np.ndarray, ticks: np.ndarray) -> np.ndarray:
    """``out[b, m, k] = #{b' : update_tick[b', k] < ticks[b, m, k]}``: the updates stage ``k``
    had applied before the tick (``O(nb log nb)`` per stage: a sorted search, not the
    ``[nb, nb]`` comparison, which at 27,000 mini-batches needs gigabytes)."""
    out = np.empty(ticks.shape, dtype=np.int64)
    for k in range(update_tick.shape[1]):
        out[..., k] = np.searchsorted(np.sort(update_tick[:, k]), ticks[..., k], side="left")
    return out


def _later_landed(update_tick: np.ndarray, end: np.ndarray) -> np.ndarray:
    """``out[b, k] = #{b' > b : update_tick[b', k] <= end[b]}``: updates of later mini-batches
    that stage ``k`` applied by tick ``end[b]``. Every schedule here updates a stage in
    mini-batch order, so those ``b'`` are ``b < b' < c`` with ``c`` the updates applied by
    ``end[b]``; an order that is not increasing is counted pair by pair, in row blocks."""
    nb, n = update_tick.shape
    b = np.arange(nb)
    out = np.empty((nb, n), dtype=np.int64)
    for k in range(n):
        u = update_tick[:, k]
        if np.all(np.diff(u) > 0):
            c = np.searchsorted(u, end, side="right")
            out[:, k] = np.maximum(c - b - 1, 0)
            continue
        for lo in range(0, nb, 1024):  # no schedule here reorders updates (tested directly)
            rows = b[lo : lo + 1024]
            pairs = (b[None, :] > rows[:, None]) & (u[None, :] <= end[rows, None])
            out[rows, k] = pairs.sum(axis=1)
    return out


def _simulate(
    name: str,
    num_stages: int,
    num_batches: int,
    num_micro: int,
    orders: list[list[tuple[int, int, int]]],
    options: dict[str, Any],
    delay: int | None = None,
) -> Schedule:
    """Greedy list schedule of per-stage op orders under the module's tick semantics; with a
    ``delay`` every pass of mini-batch ``b`` uses version ``max(b - delay, 0)``."""
    n, nb, nm = num_stages, num_batches, num_micro
    fwd = np.full((nb, nm, n), -1, dtype=np.int64)
    bwd = np.full((nb, nm, n), -1, dtype=np.int64)
    pos = [0] * n
    rows: list[list[tuple[int, int, int]]] = []
    total = sum(len(o) for o in orders)
    done = 0
    tick = 0
    while done < total:
        row = []
        started = []
        for k in range(n):
            if pos[k] >= len(orders[k]):
                row.append((IDLE, -1, -1))
                continue
            op, b, m = orders[k][pos[k]]
            if op == FORWARD:
                ready = k == 0 or 0 <= fwd[b, m, k - 1] < tick
            elif k == n - 1:
                ready = 0 <= fwd[b, m, k] < tick
            else:
                ready = 0 <= bwd[b, m, k + 1] < tick
            if ready:
                row.append((op, b, m))
                started.append((k, op, b, m))
            else:
                row.append((IDLE, -1, -1))
        if not started:  # pragma: no cover - the orders here never deadlock
            raise RuntimeError(f"schedule {name!r} deadlocked at tick {tick}")
        for k, op, b, m in started:
            (fwd if op == FORWARD else bwd)[b, m, k] = tick
            pos[k] += 1
            done += 1
        rows.append(row)
        tick += 1

    arr = np.asarray(rows, dtype=np.int64)  # [T, N, 3]
    table, table_batch, table_micro = arr[..., 0], arr[..., 1], arr[..., 2]
    # the backward that completes the update: the last one of the mini-batch at that stage
    update_tick = bwd.max(axis=1)
    fwd_c, bwd_c = _updates_before(update_tick, fwd), _updates_before(update_tick, bwd)
    if delay is None:  # every pass uses the current version
        for arr_v, what in ((fwd_c, "forward"), (bwd_c, "backward")):
            if not np.all(arr_v == arr_v[:, :1, :]):  # pragma: no cover - invariant of the orders
                raise RuntimeError(
                    f"{name}: micro-batches of one mini-batch see different {what} versions"
                )
        fwd_v, bwd_v = fwd_c[:, 0, :], bwd_c[:, 0, :]
    else:  # every pass of mini-batch b uses version max(b - delay, 0)
        fwd_v = np.broadcast_to(np.maximum(np.arange(nb) - delay, 0)[:, None], (nb, n)).copy()
        bwd_v = fwd_v.copy()
    fwd_lag, bwd_lag = fwd_c - fwd_v[:, None, :], bwd_c - bwd_v[:, None, :]
    if (fwd_lag < 0).any() or (bwd_lag < 0).any():
        raise ValueError(
            f"{name}: a pass would use a version its stage has not computed yet "
            f"(num_micro={nm} is too small for {n} stages)"
        )
    target = np.broadcast_to(np.arange(nb)[:, None], (nb, n)).copy()
    end = bwd[:, :, 0].max(axis=1)  # round-trip end: stage 0's last backward of b
    roundtrip = target + _later_landed(update_tick, end)
    return Schedule(
        name=name,
        num_stages=n,
        num_batches=nb,
        num_micro=nm,
        table=table,
        table_batch=table_batch,
        table_micro=table_micro,
        micro_fwd_tick=fwd,
        micro_bwd_tick=bwd,
        fwd_tick=fwd.min(axis=1),
        bwd_tick=update_tick.copy(),
        update_tick=update_tick,
        fwd_version=fwd_v,
        bwd_version=bwd_v,
        target_version=target,
        roundtrip_target=roundtrip,
        fwd_lag=fwd_lag,
        bwd_lag=bwd_lag,
        options=dict(options),
    )


def gpipe(num_stages: int, num_batches: int, num_micro: int | None = None) -> Schedule:
    """GPipe: all forwards of a mini-batch's micro-batches, then all backwards, then the update.

    Every pass of mini-batch ``b`` sees version ``b`` at every stage: no staleness (the
    synchronous, data-parallel-equivalent reference).

    Args:
        num_stages: ``N >= 1``.
        num_batches: mini-batches (updates per stage), ``>= 1``.
        num_micro: micro-batches per mini-batch ``M >= 1`` (default ``N``).

    Returns:
        The :class:`Schedule`.

    Example:
        >>> s = gpipe(2, 2, 2)
        >>> from jaxstale.schedules import render_text
        >>> print(render_text(s))
        stage 0 | F0.0 F0.1 .    .    B0.1 B0.0 F1.0 F1.1 .    .    B1.1 B1.0
        stage 1 | .    F0.0 F0.1 B0.1 B0.0 .    .    F1.0 F1.1 B1.1 B1.0 .
        >>> s.fwd_staleness.max(), s.bwd_staleness.max()
        (np.int64(0), np.int64(0))

    References:
        Huang et al., "GPipe", NeurIPS 2019, arXiv:1811.06965.
    """
    n = check_int(num_stages, "num_stages", "gpipe", 1)
    nb = check_int(num_batches, "num_batches", "gpipe", 1)
    nm = check_int(n if num_micro is None else num_micro, "num_micro", "gpipe", 1)
    orders = []
    for _k in range(n):
        o: list[tuple[int, int, int]] = []
        for b in range(nb):
            o += [(FORWARD, b, m) for m in range(nm)]
            o += [(BACKWARD, b, m) for m in reversed(range(nm))]
        orders.append(o)
    return _simulate("gpipe", n, nb, nm, orders, {"num_stages": n, "num_micro": nm})


def one_f_one_b(num_stages: int, num_batches: int) -> Schedule:
    """Asynchronous PipeDream 1F1B: no flush, one update per mini-batch per stage.

    Stage ``k`` runs ``N - k`` forwards, then alternates one backward and one forward. Each
    backward applies its stage's update at once. In the steady state the forward of ``b`` at
    stage ``k`` sees version ``b - (N - 1 - k)`` and its backward version ``b``.

    Args:
        num_stages: ``N >= 1``.
        num_batches: mini-batches, ``>= 1``.

    Returns:
        The :class:`Schedule` (``num_micro = 1``).

    Example:
        >>> s = one_f_one_b(2, 3)
        >>> from jaxstale.schedules import render_text
        >>> print(render_text(s))
        stage 0 | F0 F1 .  B0 F2 B1 .  B2
        stage 1 | .  F0 B0 F1 B1 F2 B2 .
        >>> s.fwd_version.tolist(), s.bwd_version.tolist()
        ([[0, 0], [0, 1], [1, 2]], [[0, 0], [1, 1], [2, 2]])

    References:
        Narayanan et al., "PipeDream", SOSP 2019.
    """
    n = check_int(num_stages, "num_stages", "one_f_one_b", 1)
    nb = check_int(num_batches, "num_batches", "one_f_one_b", 1)
    items = [(b, 0) for b in range(nb)]
    orders = [_one_f_one_b_order(n, k, items) for k in range(n)]
    return _simulate("1f1b", n, nb, 1, orders, {"num_stages": n})


def one_f_one_b_flush(num_stages: int, num_batches: int, num_micro: int | None = None) -> Schedule:
    """1F1B with a flush per mini-batch (PipeDream-Flush, DeepSpeed, Megatron-LM).

    Within a mini-batch of ``M`` micro-batches stage ``k`` runs ``min(N - k, M)`` warm-up
    forwards, then 1F1B, then the cool-down backwards; the averaged gradient is applied at the
    last backward. Like GPipe it has no staleness, with at most ``N - k`` micro-batches in flight.

    Args:
        num_stages: ``N >= 1``.
        num_batches: mini-batches, ``>= 1``.
        num_micro: micro-batches per mini-batch ``M >= 1`` (default ``N``).

    Returns:
        The :class:`Schedule`.

    Example:
        >>> s = one_f_one_b_flush(2, 1, 3)
        >>> from jaxstale.schedules import render_text
        >>> print(render_text(s))
        stage 0 | F0.0 F0.1 .    B0.0 F0.2 B0.1 .    B0.2
        stage 1 | .    F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 .

    References:
        Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021,
        arXiv:2006.09503.
    """
    n = check_int(num_stages, "num_stages", "one_f_one_b_flush", 1)
    nb = check_int(num_batches, "num_batches", "one_f_one_b_flush", 1)
    nm = check_int(n if num_micro is None else num_micro, "num_micro", "one_f_one_b_flush", 1)
    opts = {"num_stages": n, "num_micro": nm}
    return _simulate("1f1b-flush", n, nb, nm, _flush_orders(n, nb, nm), opts)


def _flush_orders(n: int, nb: int, nm: int) -> list[list[tuple[int, int, int]]]:
    orders: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    for b in range(nb):
        items = [(b, m) for m in range(nm)]
        for k in range(n):
            orders[k] += _one_f_one_b_order(n, k, items)
    return orders


def pipedream_2bw(
    num_stages: int, num_batches: int, num_micro: int | None = None, *, delay: int = 1
) -> Schedule:
    """PipeDream-2BW: 1F1B without a flush, one update per mini-batch, double-buffered weights.

    Stage ``k`` runs the 1F1B order over the whole stream of micro-batches — ``N - k`` warm-up
    forwards in the first mini-batch only, then one backward and one forward — so the pipeline
    never drains between mini-batches. The ``M`` micro-batch gradients of mini-batch ``b`` are
    averaged and applied once, at its last backward. Every forward **and** backward of ``b``, at
    every stage, uses version ``max(b - 1, 0)``; each stage keeps at most two versions (the
    newest, which the optimizer updates, and the older one the passes read), and

    .. math:: W_{t+1} = W_t - \\nu\\,\\nabla f(W_{t-1})

    at every stage whatever the depth: the unchanged optimizer applied to the gradient of the
    previous version (momentum and Adam alike take ``∇f(W_{t−1})`` in place of ``g_t``).
    ``fwd_lag`` / ``bwd_lag`` say how far back in the stage's stash a pass reads (0 or 1).

    Staleness semantics: one update, every stage, even at ``N = 1`` (the delay belongs to the
    schedule, not to the depth). The delay-free counterpart is PipeDream-Flush:
    ``delay=0`` builds exactly the :func:`one_f_one_b_flush` timeline (a flush per mini-batch,
    every pass at the current version).

    Confirmed from the official code (msr-fiddle/pipedream, branch ``pipedream_2bw``,
    ``megatron/schedules.py::forward_backward_pipelining_no_flushes`` and
    ``megatron/optimizer/optimizer.py``'s two buffers): the schedule, one optimizer step per
    mini-batch, the version rule and the update above. The tick timing (unit-time passes) is
    this module's.

    Args:
        num_stages: ``N >= 1``.
        num_batches: mini-batches (updates per stage), ``>= 1``.
        num_micro: micro-batches per mini-batch ``M`` (default ``N``); with ``delay=1`` at
            least ``N - 1`` (the paper asks ``M >= N``), or the older version would not exist
            yet when a forward of the next mini-batch needs it.
        delay: 1 (2BW) or 0 (the flush: PipeDream-Flush).

    Returns:
        The :class:`Schedule` (``name="2bw"``).

    Example:
        >>> s = pipedream_2bw(2, 3, 2)
        >>> from jaxstale.schedules import render_text
        >>> print(render_text(s))
        stage 0 | F0.0 F0.1 .    B0.0 F1.0 B0.1 F1.1 B1.0 F2.0 B1.1 F2.1 B2.0 .    B2.1
        stage 1 | .    F0.0 B0.0 F0.1 B0.1 F1.0 B1.0 F1.1 B1.1 F2.0 B2.0 F2.1 B2.1 .
        >>> s.fwd_version[:, 0].tolist(), s.bwd_version[:, 0].tolist(), s.max_versions.tolist()
        ([0, 0, 1], [0, 0, 1], [2, 2])
        >>> s.fwd_lag[2, :, 0].tolist()  # F2.1 runs after update 2 landed: v1 is one back
        [0, 1]

    References:
        Narayanan, Phanishayee, Shi, Chen, Zaharia, "Memory-Efficient Pipeline-Parallel DNN
        Training", ICML 2021, arXiv:2006.09503; code: https://github.com/msr-fiddle/pipedream
        (branch ``pipedream_2bw``).
    """
    n = check_int(num_stages, "num_stages", "pipedream_2bw", 1)
    nb = check_int(num_batches, "num_batches", "pipedream_2bw", 1)
    nm = check_int(n if num_micro is None else num_micro, "num_micro", "pipedream_2bw", 1)
    if isinstance(delay, bool) or not isinstance(delay, int | np.integer) or delay not in (0, 1):
        raise ValueError(
            f"pipedream_2bw: delay must be 0 (PipeDream-Flush) or 1 (2BW), got {delay!r}"
        )
    opts = {"num_stages": n, "num_micro": nm, "delay": delay}
    if delay == 0:
        return _simulate("2bw", n, nb, nm, _flush_orders(n, nb, nm), opts)
    if nm < n - 1:
        raise ValueError(
            f"pipedream_2bw: 2bw needs num_micro >= num_stages - 1 = {n - 1}, got {nm}"
        )
    items = [(b, m) for b in range(nb) for m in range(nm)]
    orders = [_one_f_one_b_order(n, k, items) for k in range(n)]
    return _simulate("2bw", n, nb, nm, orders, opts, delay=1)


_CONSTRUCTORS = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "1f1b-flush": one_f_one_b_flush,
    "2bw": pipedream_2bw,
}


def get(name: str, **kwargs: Any) -> Schedule:
    """Build a schedule by name: ``get("1f1b", num_stages=4, num_batches=8)``.

    Args:
        name: one of :data:`SCHEDULES` (``"gpipe"``, ``"1f1b"``, ``"1f1b-flush"``, ``"2bw"``).
        **kwargs: the constructor's arguments.

    Returns:
        The :class:`Schedule`.

    Raises:
        ValueError: unknown name, or arguments the constructor does not take / rejects.

    Example:
        >>> get("1f1b", num_stages=3, num_batches=4).num_ticks
        12
    """
    if name not in _CONSTRUCTORS:
        raise ValueError(f"unknown schedule {name!r}; known schedules: {SCHEDULES}")
    try:
        return _CONSTRUCTORS[name](**kwargs)
    except TypeError as e:
        raise ValueError(f"bad arguments for schedule {name!r}: {e}") from e


__all__ = [
    "BACKWARD",
    "FORWARD",
    "IDLE",
    "SCHEDULES",
    "TARGETS",
    "Schedule",
    "get",
    "gpipe",
    "one_f_one_b",
    "one_f_one_b_flush",
    "pipedream_2bw",
]
