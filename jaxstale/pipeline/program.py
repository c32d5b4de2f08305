"""Compile a schedule and a weight policy into a program of named arrays (host side, numpy).

Both pipeline executors run the same :class:`Program`. It cuts the schedule's timeline into
**rounds** of the steady-state period (``period`` ticks; one mini-batch per round in the steady
state): every round runs the same *template* of ops — stage, F or B, mini-batch offset ``d``
(round ``r`` runs mini-batch ``r − d``), micro-batch, whether it applies or starts an update —
with the ops of absent mini-batches masked. The padded program has the schedule's length (2BW
with ``M ≥ N``: plus idle ticks that end its last round), per-stage op order and weight
versions; the compiler replays it and checks every order, dependency and version. Per round
and template op it holds ``[rounds, ops]`` tables (``valid``, ``batch``, the stash look-back
``tau``, the prediction ``horizon`` and ``rule``, the update factor ``lr_scale``);
:meth:`Program.tick_table` is the same program per tick and stage, with the slots of in-flight
inputs, cotangents and residuals (``(b·M + m) mod capacity``, capacities from a long replay).
A pass reads its stage's stash ``tau`` pushes back (the version the schedule gives it, or with
``stash`` its forward's), predicts ``horizon`` updates with ``rule`` (0 SpecTrain, 1 NAG, 2
PipeMare), and an update is scaled by ``lr_scale`` (PipeMare's rescheduling; 1 otherwise).

Example:
    >>> from jaxstale import schedules
    >>> from jaxstale.pipeline.program import compile
    >>> prog = compile(schedules.one_f_one_b(4, 8), "stash")
    >>> prog.period, prog.num_rounds, prog.stash_capacity   # PipeDream: N − k versions
    (2, 11, (4, 3, 2, 1))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxstale import schedules as S
from jaxstale.pipeline.policies import Policy, get_policy, pipemare_lr_scale

__all__ = ["BACKWARD_MODES", "RULES", "Op", "Program", "compile"]

BACKWARD_MODES: tuple[str, ...] = ("saved", "recompute")
#: the ``rule`` codes of the program: predictor name -> int
RULES: dict[str | None, int] = {None: 0, "spectrain": 0, "nesterov": 1, "pipemare": 2}


class Op(NamedTuple):
    """One op of the round template: stage ``k``, ``kind`` (F or B), offset ``d`` (round ``r``
    runs mini-batch ``r − d``), micro-batch, and whether a backward applies the stage's update
    or starts a fresh gradient accumulation."""

    stage: int
    kind: int
    d: int
    micro: int
    update: bool
    first_micro: bool


def _template(s: S.Schedule) -> tuple[list[list[Op]], int, int]:
    """The steady-state round of ``s``'s kind: ticks of one period, batches as offsets."""
    n = s.num_stages
    ref = S.get(s.name, num_batches=3 * n + 6, **s.options)
    bs = n + 1
    t0, t1 = int(ref.micro_fwd_tick[bs, 0, 0]), int(ref.micro_fwd_tick[bs + 1, 0, 0])
    period = t1 - t0
    ticks: list[list[Op]] = []
    for t in range(t0, t1):
        row = []
        for k, op, b, m in ref.ops(t):
            upd = op == S.BACKWARD and int(ref.update_tick[b, k]) == t
            first = op == S.BACKWARD and int(ref.micro_bwd_tick[b, :, k].min()) == t
            row.append(Op(k, op, bs - b, m, upd, first))
        # periodicity: the next period is the same with every batch shifted by one
        nxt = [(k, op, bs + 1 - b, m) for k, op, b, m in ref.ops(t + period)]
        if nxt != [(o.stage, o.kind, o.d, o.micro) for o in row]:  # pragma: no cover
            raise ValueError(f"schedule {s.name!r} has no periodic steady state to run")
        ticks.append(row)
    ds = [o.d for row in ticks for o in row]
    return ticks, min(ds), max(ds)


class _Events(NamedTuple):
    """The events of a round program, flat in program order (round, tick of the period, op of
    the tick): each array ``[R·J]`` for ``R`` rounds and ``J`` template ops."""

    tick: np.ndarray  # global tick
    kind: np.ndarray
    stage: np.ndarray
    batch: np.ndarray  # round − offset: out of range on masked ops
    micro: np.ndarray
    valid: np.ndarray
    update: np.ndarray  # the op applies (or, masked, pushes unchanged) its stage's update


def _columns(ticks: Sequence[Sequence[Op]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The template's ops in tick order as columns: each op's tick within the period, and
    each :class:`Op` field as an int64 array."""
    flat = [(ti, o) for ti, row in enumerate(ticks) for o in row]
    col = {f: np.asarray([getattr(o, f) for _, o in flat], np.int64) for f in Op._fields}
    return np.asarray([ti for ti, _ in flat], np.int64), col


def _events(ticks: list[list[Op]], rounds: np.ndarray, nb: int) -> _Events:
    """Every op of the rounds ``rounds`` of the template ``ticks``, mini-batches ``0..nb−1``."""
    at, col = _columns(ticks)
    r = np.asarray(rounds, np.int64)[:, None] - (int(rounds[0]) if len(rounds) else 0)
    b = np.asarray(rounds, np.int64)[:, None] - col["d"][None, :]
    shape = b.shape
    return _Events(
        tick=(r * len(ticks) + at[None, :]).ravel(),
        kind=np.broadcast_to(col["kind"], shape).ravel(),
        stage=np.broadcast_to(col["stage"], shape).ravel(),
        batch=b.ravel(),
        micro=np.broadcast_to(col["micro"], shape).ravel(),
        valid=((b >= 0) & (b < nb)).ravel(),
        update=np.broadcast_to(col["update"].astype(bool), shape).ravel(),
    )


def _key_ticks(ev: _Events, kind: int, shape: tuple[int, ...]) -> np.ndarray:
    """``[nb, M, N]`` ticks of the valid ops of ``kind`` (−1 where none)."""
    out = np.full(shape, -1, np.int64)
    sel = ev.valid & (ev.kind == kind)
    out[ev.batch[sel], ev.micro[sel], ev.stage[sel]] = ev.tick[sel]
    return out


def _capacity(intervals: list[tuple[int, int]], items: list[int]) -> int:
    """Smallest slot count such that items live at the same tick (``a ≤ t ≤ z``, ends
    included) get distinct ``item % cap``.

    A sweep over the intervals' ends for each candidate (starts before ends at one tick, so an
    interval ending where another starts still holds its slot), from the most items ever live
    at once upwards: ``O(I log I)`` per candidate, where checking every start against every
    interval was ``O(I²)`` (hours for a 9,000-batch schedule).
    """
    events = sorted([(a, 0, i) for i, (a, _) in enumerate(intervals)]
                    + [(z, 1, i) for i, (_, z) in enumerate(intervals)])  # fmt: skip
    live = most = 0
    for _, end, _ in events:
        live += -1 if end else 1
        most = max(most, live)
    cap = max(most, 1)
    while True:
        held: set[int] = set()
        for _, end, i in events:
            slot = items[i] % cap
            if end:
                held.discard(slot)
            elif slot in held:
                break
            else:
                held.add(slot)
        else:
            return cap
        cap += 1


class _Replay:
    """Host replay of the masked round program: stash look-backs, slot capacities and the
    checks, in array operations over all events at once (27,000 mini-batches of 2BW at N = 8
    are 3.5 million events: a Python step per event took a minute)."""

    def __init__(self, s: S.Schedule, ticks: list[list[Op]], dmin: int, dmax: int):
        n, nb, nm = s.num_stages, s.num_batches, s.num_micro
        self.rounds = np.arange(dmin, nb + dmax)
        ev = _events(ticks, self.rounds, nb)
        # 1. per-stage order of the valid ops == the schedule's
        for k in range(n):
            sel = ev.valid & (ev.stage == k)
            got = np.stack([ev.kind[sel], ev.batch[sel], ev.micro[sel]], axis=1)
            on = s.table[:, k] != S.IDLE
            want = np.stack([s.table[on, k], s.table_batch[on, k], s.table_micro[on, k]], axis=1)
            if got.shape != want.shape or not np.array_equal(got, want):  # pragma: no cover
                raise ValueError(f"round program does not reproduce schedule {s.name!r}")
        # 2. dependencies (strictly earlier tick): a forward after the previous stage's, a
        #    backward after the next stage's (the last stage's after its own forward)
        ft = _key_ticks(ev, S.FORWARD, (nb, nm, n))
        bt = _key_ticks(ev, S.BACKWARD, (nb, nm, n))
        if not (ft[..., :-1] < ft[..., 1:]).all():  # pragma: no cover
            raise ValueError("round program violates a forward dependency")
        if not ((bt[..., 1:] < bt[..., :-1]).all() and (ft[..., -1] < bt[..., -1]).all()):
            raise ValueError("round program violates a backward dependency")  # pragma: no cover
        # 3. current versions (updates land at the tick's end) and stash look-backs: pushes
        #    since the last push of the version a pass reads (pushes include the masked updates,
        #    which push unchanged weights)
        look_flat = np.zeros((len(ev.tick), 2), np.int64)  # to the schedule's, the forward's
        for k in range(n):
            on = np.flatnonzero(ev.valid & (ev.stage == k))
            pushes = ev.update & (ev.kind == S.BACKWARD) & (ev.stage == k)
            push_ticks, landed = ev.tick[pushes], ev.valid[pushes]
            t, b, m = ev.tick[on], ev.batch[on], ev.micro[on]
            fwd = ev.kind[on] == S.FORWARD
            ver = np.where(fwd, s.fwd_version[b, k], s.bwd_version[b, k])
            lag = np.where(fwd, s.fwd_lag[b, m, k], s.bwd_lag[b, m, k])
            nupd = np.searchsorted(push_ticks[landed], t, side="left")  # valid updates before t
            if not np.array_equal(nupd, ver + lag):  # pragma: no cover
                raise ValueError("round program: a pass reads another version than its schedule's")
            npush = np.searchsorted(push_ticks, t, side="left")
            # the push that left version v current: the last push (landed by t) with v valid
            # updates up to it
            versions = np.cumsum(landed)

            def last_push(v: np.ndarray) -> np.ndarray:
                return np.minimum(npush, np.searchsorted(versions, v, side="right"))

            vf = s.fwd_version[b, k]
            look = np.stack([npush - last_push(ver), npush - last_push(vf)], axis=1)
            # the mesh pushes valid updates only: the same look-backs there, because masked
            # updates precede a stage's first valid one
            if not np.array_equal(look, np.stack([nupd - ver, nupd - vf], axis=1)):
                raise ValueError(
                    "round program: a masked update between valid ones"
                )  # pragma: no cover
            look_flat[on] = look
        #: ``[R, J, 2]``: per round and template op, the look-backs (zero on masked ops)
        self.look = look_flat.reshape(len(self.rounds), -1, 2)
        # 4. slot capacities, from a run of the same round program long enough to hold its
        #    ramp-up, a steady state and its drain: slots are items modulo the capacity, and a
        #    longer steady state only shifts items, so it asks for no more slots
        nb_long = 2 * (dmax - dmin) + 4
        long = _events(ticks, np.arange(dmin, nb_long + dmax), nb_long)
        fl: dict[tuple[int, int, int], int] = {}
        bl: dict[tuple[int, int, int], int] = {}
        for tick, kind, k, b, m in zip(
            long.tick.tolist(), long.kind.tolist(), long.stage.tolist(), long.batch.tolist(),
            long.micro.tolist(), strict=True,
        ):  # fmt: skip
            (fl if kind == S.FORWARD else bl)[(b, m, k)] = tick
        self.in_cap = [1] * n  # stage k input: from the F at k-1 to the B at k
        self.ct_cap = [1] * n  # cotangent into stage k: from the B at k+1 to the B at k
        self.res_cap = [1] * n  # saved forward residuals of stage k: from its F to its B
        for k in range(n):
            keys = [(b, m) for (b, m, kk) in bl if kk == k]
            for caps, src, kk in ((self.res_cap, fl, k), (self.in_cap, fl, k - 1),
                                  (self.ct_cap, bl, k + 1)):  # fmt: skip
                if 0 <= kk < n:
                    ks = [km for km in keys if (*km, kk) in src]
                    caps[k] = _capacity(
                        [(src[(b, m, kk)], bl[(b, m, k)]) for b, m in ks],
                        [b * nm + m for b, m in ks],
                    )


class Program(NamedTuple):
    """A schedule and a weight policy compiled for the executors (see the module docstring).

    Attributes:
        schedule: the executed schedule (its flush counterpart for a ``flush`` policy).
        policy: the :class:`~jaxstale.pipeline.policies.Policy`.
        backward: ``"saved"`` (the forward's residuals are kept; the backward weights enter
            where the weights themselves are residuals) or ``"recompute"`` (the stage forward is
            recomputed at the backward weights): how a backward runs at other weights than its
            forward's.
        ticks: the round template, one tuple of :class:`Op` per tick of the period.
        rounds: ``[R]`` round ids.
        tables: name -> ``[R, J]`` arrays, one column per template op in tick order.
        in_cap: per stage, slots of in-flight stage inputs.
        ct_cap: per stage, slots of received cotangents.
        res_cap: per stage, slots of saved forward residuals.
        stash_capacity: per stage, weight versions kept (1: no stash).
    """

    schedule: S.Schedule
    policy: Policy
    backward: str
    ticks: tuple[tuple[Op, ...], ...]
    rounds: np.ndarray
    tables: dict[str, np.ndarray]
    in_cap: tuple[int, ...]
    ct_cap: tuple[int, ...]
    res_cap: tuple[int, ...]
    stash_capacity: tuple[int, ...]

    @property
    def period(self) -> int:
        """Ticks per round."""
        return len(self.ticks)

    @property
    def num_rounds(self) -> int:
        """Rounds of a full run."""
        return len(self.rounds)

    @property
    def saves_residuals(self) -> bool:
        """Whether forwards keep their residuals for the backward (``backward="saved"``; with
        ``"recompute"`` a stashing policy's backward recomputes its forward at the stashed
        version — the forward's own, so the same gradient, bit for bit on XLA:CPU in the tests —
        and keeps no residuals)."""
        return self.backward == "saved"

    @property
    def stashes(self) -> bool:
        """Whether passes read a stash of versions (``stash``, or a schedule such as ``2bw``)."""
        return self.policy.stash or max(self.stash_capacity) > 1

    @property
    def predicts_back(self) -> bool:
        """Whether a predicting pass reads a looked-back version (a prediction on ``2bw``)."""
        return self.policy.predict is not None and int(self.tables["tau"].max(initial=0)) > 0

    @property
    def rescales(self) -> bool:
        """Whether updates are scaled (PipeMare's learning-rate rescheduling)."""
        return self.policy.lr_anneal is not None

    @property
    def structure(self) -> tuple[Any, ...]:
        """Everything about this program that decides an executor's compiled code (its tables
        are data): the schedule's kind and sizes, the round template, the slot capacities,
        stashing, prediction (and PipeMare's decay), residuals and rescheduling. Both executors
        key their compile caches on it (with the stages, optimizer and loss they run), so runs
        of one structure share a compiled round."""
        s, pol = self.schedule, self.policy
        return (
            s.name,
            s.num_stages,
            s.num_micro,
            self.ticks,
            self.in_cap,
            self.ct_cap,
            self.res_cap,
            self.stash_capacity,
            self.stashes,
            pol.predict is not None,
            pol.decay if pol.predict == "pipemare" else None,
            self.saves_residuals,
            self.rescales,
        )

    def tick_table(self) -> dict[str, np.ndarray]:
        """The program per tick and stage: name -> ``[ticks, N]`` int32 arrays: ``op`` (0 idle or
        masked, 1 F, 2 B), ``data`` (``b·M + m``), ``micro``, the op's ``in_slot`` /
        ``ct_slot`` / ``res_slot``, ``recv_act`` / ``recv_ct`` (the slot the activation /
        cotangent arriving from stage ``k ∓ 1`` is filed into, −1: none), ``tau``, ``horizon``,
        ``rule``, ``update``, ``first``; and ``lr_scale``, float32 (1 where no update)."""
        s, n, nm = self.schedule, self.schedule.num_stages, self.schedule.num_micro
        total = self.num_rounds * self.period
        names = ("op", "data", "micro", "in_slot", "ct_slot", "res_slot", "recv_act", "recv_ct")
        out = {k: np.zeros((total, n), np.int32) for k in (*names, "tau", "horizon", "rule")}
        out["update"] = np.zeros((total, n), np.int32)
        out["first"] = np.zeros((total, n), np.int32)
        out["lr_scale"] = np.ones((total, n), np.float32)
        out["recv_act"][:] = -1
        out["recv_ct"][:] = -1
        ti, col = _columns(self.ticks)
        i, j = np.nonzero(self.tables["valid"])  # one op per stage and tick: no index repeats
        t, k, kind = i * self.period + ti[j], col["stage"][j], col["kind"][j]
        item = self.tables["batch"][i, j].astype(np.int64) * nm + col["micro"][j]
        caps = {c: np.asarray(getattr(self, c), np.int64) for c in ("in_cap", "ct_cap", "res_cap")}
        out["op"][t, k] = kind
        out["data"][t, k] = item
        out["micro"][t, k] = col["micro"][j]
        for slot, cap in (("in_slot", "in_cap"), ("ct_slot", "ct_cap"), ("res_slot", "res_cap")):
            out[slot][t, k] = item % caps[cap][k]
        for f in ("tau", "horizon", "rule", "lr_scale"):
            out[f][t, k] = self.tables[f][i, j]
        out["update"][t, k] = col["update"][j]
        out["first"][t, k] = col["first_micro"][j]
        send = (kind == S.FORWARD) & (k < n - 1) & (t + 1 < total)
        out["recv_act"][t[send] + 1, k[send] + 1] = item[send] % caps["in_cap"][k[send] + 1]
        send = (kind == S.BACKWARD) & (k > 0) & (t + 1 < total)
        out["recv_ct"][t[send] + 1, k[send] - 1] = item[send] % caps["ct_cap"][k[send] - 1]
        # the schedule's length; 2BW with M >= N ends its last round with idle ticks
        assert total >= s.num_ticks and not out["op"][s.num_ticks :].any()
        return out


def recompute_refusal(policy: str | Policy, schedule: str | None = None) -> str | None:
    """Why ``backward="recompute"`` is refused for ``policy`` (on ``schedule``, a schedule
    kind: the policy's own if it has one), or None where it is allowed. On 2BW's double buffer a
    recomputed backward does not read the version its forward read (measured: it parts from the
    saved backward, and the executors from each other)."""
    pol = get_policy(policy)
    if (pol.schedule or schedule) != "2bw":
        return None
    return (
        f"backward='recompute' is not available for {pol.name!r}: on 2BW's double buffer a "
        "recomputed backward does not read the version its forward read; use 'saved'"
    )


def compile(
    schedule: S.Schedule,
    policy: str | Policy,
    *,
    backward: str = "saved",
    target: str | None = None,
) -> Program:
    """Compile ``schedule`` and ``policy`` (a registered name or a ``Policy``) into the
    executors' :class:`Program`; ``backward`` is ``"saved"`` or ``"recompute"``, ``target``
    overrides the policy's. A ``flush`` policy runs the schedule's flush counterpart, a policy
    with a ``schedule`` that kind. ``TypeError`` / ``ValueError`` on bad arguments."""
    if not isinstance(schedule, S.Schedule):
        raise TypeError(f"schedule must be a jaxstale.schedules.Schedule, got {type(schedule)}")
    pol = get_policy(policy)
    if target is not None:
        if target not in S.TARGETS:
            raise ValueError(f"unknown target {target!r}; choose one of {S.TARGETS}")
        pol = pol._replace(target=target)
    if backward not in BACKWARD_MODES:
        raise ValueError(f"backward must be one of {BACKWARD_MODES}, got {backward!r}")
    if backward == "recompute" and (why := recompute_refusal(pol, schedule.name)):
        raise ValueError(why)
    if pol.flush and (schedule.fwd_staleness.any() or schedule.bwd_staleness.any()):
        schedule = S.gpipe(schedule.num_stages, schedule.num_batches, schedule.num_micro)
    if pol.schedule is not None and pol.schedule != schedule.name:
        n, nm = schedule.num_stages, schedule.num_micro
        kw = {} if pol.schedule == "1f1b" else {"num_micro": nm if nm >= max(n - 1, 2) else n}
        schedule = S.get(pol.schedule, num_stages=n, num_batches=schedule.num_batches, **kw)
    ticks, dmin, dmax = _template(schedule)
    rep = _Replay(schedule, ticks, dmin, dmax)
    nb, n = schedule.num_batches, schedule.num_stages
    fh, bh = schedule.horizons(pol.target)
    flat = [o for row in ticks for o in row]
    r = np.asarray(rep.rounds)[:, None]
    b = r - np.asarray([o.d for o in flat])[None, :]
    valid = (b >= 0) & (b < nb)
    bc = np.clip(b, 0, nb - 1)
    ks = np.asarray([o.stage for o in flat])[None, :]
    is_f = np.asarray([o.kind == S.FORWARD for o in flat])[None, :]
    if pol.predict == "pipemare":  # the backward moved back by the updates since its forward
        gap = schedule.bwd_version - schedule.fwd_version
        hor = np.where(is_f, 0, gap[bc, ks])
    else:
        hor = np.where(is_f, fh[bc, ks], bh[bc, ks])
    if not pol.predict_backward:
        hor = np.where(is_f, hor, 0)
    if pol.predict is None:
        hor = np.zeros_like(hor)
    # stash look-backs: the schedule's version, or with stash the forward's for the backward
    look = rep.look
    tau = np.where(is_f | (not pol.stash), look[..., 0], look[..., 1])
    tau = np.where(valid, tau, 0)
    # a prediction from a looked-back version extrapolates that version's own last update, the
    # difference of it and the version before it (kernel.lookback_weights): one more slot
    back = int(pol.predict is not None and tau.max(initial=0) > 0)
    capacity = tuple(1 + back + int(tau[:, ks[0] == k].max(initial=0)) for k in range(n))
    scale = np.ones(b.shape, np.float32)
    if pol.lr_anneal is not None:
        warmup = max(1, round(pol.lr_anneal * nb))
        upd = np.asarray([o.update for o in flat])[None, :] & valid
        factor = pipemare_lr_scale(schedule.fwd_staleness[bc, ks], bc, warmup)
        scale = np.where(upd, factor, 1.0).astype(np.float32)
    tables = {
        "valid": valid,
        "batch": b.astype(np.int32),
        "horizon": np.where(valid, hor, 0).astype(np.int32),
        "tau": tau.astype(np.int32),
        "rule": np.full(b.shape, RULES[pol.predict], np.int32),
        "lr_scale": scale,
    }
    return Program(
        schedule=schedule,
        policy=pol,
        backward=backward,
        ticks=tuple(tuple(row) for row in ticks),
        rounds=np.asarray(rep.rounds),
        tables=tables,
        in_cap=tuple(rep.in_cap),
        ct_cap=tuple(rep.ct_cap),
        res_cap=tuple(rep.res_cap),
        stash_capacity=capacity,
    )
