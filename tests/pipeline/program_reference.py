"""The program compiler's replay as it was first written (one Python step per event): the oracle
that the vectorised replay in :mod:`jaxstale.pipeline.program` is checked against, table by
table and slot by slot. Slow (a minute at 27,000 mini-batches of 2BW): tests use short runs."""

from __future__ import annotations

import numpy as np

from jaxstale import schedules as S
from jaxstale.pipeline.program import Program, _capacity


def _events(ticks, rounds, nb):
    out = []
    for r in rounds:
        for row in ticks:
            out.append(
                [(o.kind, o.stage, r - o.d, o.micro, 0 <= r - o.d < nb, o.update) for o in row]
            )
    return out


def replay(s: S.Schedule, ticks, dmin: int, dmax: int):
    """``(rounds, look, in_cap, ct_cap, res_cap)``: ``look`` maps ``(kind, b, m, k)`` to the
    stash look-backs (to the schedule's version, to the forward's)."""
    n, nb, nm = s.num_stages, s.num_batches, s.num_micro
    rounds = list(range(dmin, nb + dmax))
    nupd, npush = [0] * n, [0] * n
    last_push: list[dict[int, int]] = [{0: 0} for _ in range(n)]
    look: dict[tuple[int, int, int, int], tuple[int, int]] = {}
    for row in _events(ticks, rounds, nb):
        landing = []
        for op, k, b, m, valid, upd in row:
            if op != S.FORWARD and upd:
                landing.append((k, int(valid)))
            if not valid:
                look[(op, b, m, k)] = (0, 0)
                continue
            fwd = op == S.FORWARD
            ver = int((s.fwd_version if fwd else s.bwd_version)[b, k])
            assert nupd[k] == ver + int((s.fwd_lag if fwd else s.bwd_lag)[b, m, k])
            at, vf = last_push[k], int(s.fwd_version[b, k])
            look[(op, b, m, k)] = (npush[k] - at[ver], npush[k] - at[vf])
        for k, v in landing:
            nupd[k] += v
            npush[k] += 1
            last_push[k][nupd[k]] = npush[k]
    nb_long = max(nb, 2 * (dmax - dmin) + 4)
    fl: dict[tuple[int, int, int], int] = {}
    bl: dict[tuple[int, int, int], int] = {}
    for tick, row in enumerate(_events(ticks, list(range(dmin, nb_long + dmax)), nb_long)):
        for op, k, b, m, _, _ in row:
            (fl if op == S.FORWARD else bl)[(b, m, k)] = tick
    caps = [[1] * n for _ in range(3)]  # in, ct, res
    for k in range(n):
        keys = [(b, m) for (b, m, kk) in bl if kk == k]
        for c, (src, kk) in enumerate([(fl, k - 1), (bl, k + 1), (fl, k)]):
            if not 0 <= kk < n:
                continue
            ks = [km for km in keys if (*km, kk) in src]
            caps[c][k] = _capacity(
                [(src[(b, m, kk)], bl[(b, m, k)]) for b, m in ks], [b * nm + m for b, m in ks]
            )
    return rounds, look, *caps


def look_table(prog: Program, look) -> np.ndarray:
    """``[R, J, 2]``: the look-backs of every round and template op."""
    flat = [o for row in prog.ticks for o in row]
    out = np.zeros((len(prog.rounds), len(flat), 2), np.int64)
    for j, o in enumerate(flat):
        for i, r in enumerate(prog.rounds):
            out[i, j] = look[(o.kind, int(r) - o.d, o.micro, o.stage)]
    return out


def tick_table(prog: Program) -> dict[str, np.ndarray]:
    """:meth:`Program.tick_table`, one op at a time."""
    s, n, nm = prog.schedule, prog.schedule.num_stages, prog.schedule.num_micro
    total = prog.num_rounds * prog.period
    names = ("op", "data", "micro", "in_slot", "ct_slot", "res_slot", "recv_act", "recv_ct")
    out = {k: np.zeros((total, n), np.int32) for k in (*names, "tau", "horizon", "rule")}
    out["update"] = np.zeros((total, n), np.int32)
    out["first"] = np.zeros((total, n), np.int32)
    out["lr_scale"] = np.ones((total, n), np.float32)
    out["recv_act"][:] = -1
    out["recv_ct"][:] = -1
    where = [(ti, o) for ti, row in enumerate(prog.ticks) for o in row]
    for i in range(prog.num_rounds):
        for j, (ti, o) in enumerate(where):
            t, k = i * prog.period + ti, o.stage
            if not prog.tables["valid"][i, j]:
                continue
            item = int(prog.tables["batch"][i, j]) * nm + o.micro
            out["op"][t, k] = o.kind
            out["data"][t, k] = item
            out["micro"][t, k] = o.micro
            out["in_slot"][t, k] = item % prog.in_cap[k]
            out["ct_slot"][t, k] = item % prog.ct_cap[k]
            out["res_slot"][t, k] = item % prog.res_cap[k]
            for f in ("tau", "horizon", "rule"):
                out[f][t, k] = prog.tables[f][i, j]
            out["update"][t, k] = int(o.update)
            out["first"][t, k] = int(o.first_micro)
            out["lr_scale"][t, k] = prog.tables["lr_scale"][i, j]
            if o.kind == S.FORWARD and k < n - 1 and t + 1 < total:
                out["recv_act"][t + 1, k + 1] = item % prog.in_cap[k + 1]
            if o.kind == S.BACKWARD and k > 0 and t + 1 < total:
                out["recv_ct"][t + 1, k - 1] = item % prog.ct_cap[k - 1]
    assert total >= s.num_ticks and not out["op"][s.num_ticks :].any()
    return out
