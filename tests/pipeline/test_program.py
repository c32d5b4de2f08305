"""The program compiler: one program, its tables and its per-tick view, against the schedule."""

import numpy as np
import pytest

from jaxstale import schedules
from jaxstale.pipeline import compile


@pytest.mark.parametrize("n", [2, 4, 8])
def test_tick_table_is_the_schedule(n):
    s = schedules.one_f_one_b(n, 3 * n)
    prog = compile(s, "stash")
    t = prog.tick_table()
    # the padded round program has the schedule's length and per-stage op order
    assert t["op"].shape == (s.num_ticks, n)
    for k in range(n):
        got = [
            (int(op), int(d)) for op, d in zip(t["op"][:, k], t["data"][:, k], strict=False) if op
        ]
        want = [
            (int(op), int(b))
            for op, b in zip(s.table[:, k], s.table_batch[:, k], strict=False)
            if op
        ]
        assert got == want
    # stash look-back: PipeDream keeps N - k versions at stage k (current one included)
    assert [int(t["tau"][:, k].max()) + 1 for k in range(n)] == s.max_versions.tolist()
    assert prog.stash_capacity == tuple(s.max_versions.tolist())
    # one update per mini-batch per stage
    assert (t["update"].sum(axis=0) == s.num_batches).all()
    # every activation / cotangent that is sent is received exactly once (except the ends)
    assert (t["recv_act"] >= 0).sum() == s.num_batches * (n - 1)
    assert (t["recv_ct"] >= 0).sum() == s.num_batches * (n - 1)


def test_horizons_are_target_minus_version_and_rules_are_data():
    s = schedules.one_f_one_b(4, 12)
    f, b = s.horizons("roundtrip")
    prog = compile(s, "nesterov")  # its target: the round trip
    t = prog.tick_table()
    for tick in range(s.num_ticks):
        for k in range(4):
            op, bb = s.table[tick, k], s.table_batch[tick, k]
            if not op:
                continue
            # the program's ticks may run a warm-up forward later: find the op by (b, stage)
            hit = np.flatnonzero((t["op"][:, k] == op) & (t["data"][:, k] == bb))
            assert len(hit) == 1
            want = f[bb, k] if op == schedules.FORWARD else b[bb, k]
            assert t["horizon"][hit[0], k] == want and t["rule"][hit[0], k] == 1
    v2 = compile(s, "spectrain-v2").tick_table()  # forward only, sequential target
    assert (v2["horizon"][v2["op"] == schedules.BACKWARD] == 0).all()
    assert (v2["rule"] == 0).all()
    assert (compile(s, "vanilla").tick_table()["horizon"] == 0).all()


@pytest.mark.parametrize("n, m", [(2, 4), (4, 4), (8, 8)])
def test_gpipe_efficiency_is_theory(n, m):
    prog = compile(schedules.gpipe(n, 3, m), "sync")
    busy = (prog.tick_table()["op"] != 0).sum()
    assert busy / (n * prog.schedule.num_ticks) == pytest.approx(m / (m + n - 1))


def test_flush_policy_replaces_a_stale_schedule_and_saves_residuals_where_asked():
    s = schedules.one_f_one_b(3, 5)
    assert compile(s, "sync").schedule.name == "gpipe"
    assert compile(schedules.gpipe(3, 5, 1), "sync").schedule.name == "gpipe"
    assert compile(s, "vanilla").saves_residuals  # default backward="saved"
    assert not compile(s, "vanilla", backward="recompute").saves_residuals
    assert compile(s, "stash", backward="recompute").saves_residuals  # stash always does
    with pytest.raises(TypeError, match="Schedule"):
        compile("1f1b", "vanilla")
