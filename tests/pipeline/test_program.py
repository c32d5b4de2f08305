"""The program compiler: one program, its tables and its per-tick view, against the schedule."""

import numpy as np
import pytest

from jaxstale import pipeline, schedules
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
    # a stash recomputes its forward at the stashed version (tests/pipeline/test_recompute.py)
    assert not compile(s, "stash", backward="recompute").saves_residuals
    with pytest.raises(TypeError, match="Schedule"):
        compile("1f1b", "vanilla")


@pytest.mark.parametrize("n, m", [(1, 2), (2, 2), (3, 2), (4, 4), (8, 8)])
def test_2bw_program_reads_the_double_buffered_version(n, m):
    """The round template accepts 2BW's steady state (the compiler replays and checks orders,
    dependencies and versions); forwards and backwards read the stash as far back as their lag."""
    s = schedules.pipedream_2bw(n, 6, m)
    prog = compile(s, "2bw")
    assert prog.schedule is s and prog.period == 2 * m and prog.stash_capacity == (2,) * n
    t = prog.tick_table()
    # the schedule's length, plus idle ticks ending the last round when M >= N
    assert t["op"].shape[0] in (s.num_ticks, s.num_ticks + 2 * (m - n + 1))
    assert not t["op"][s.num_ticks :].any()
    for tick in range(s.num_ticks):
        for k, op, b, mm in s.ops(tick):
            hit = np.flatnonzero((t["op"][:, k] == op) & (t["data"][:, k] == b * m + mm))
            lag = (s.fwd_lag if op == schedules.FORWARD else s.bwd_lag)[b, mm, k]
            assert len(hit) == 1 and t["tau"][hit[0], k] == lag
    assert (t["update"].sum(axis=0) == 6).all()  # one update per mini-batch per stage
    assert (t["first"].sum(axis=0) == 6).all()
    assert (compile(s, "vanilla").tick_table()["tau"] == t["tau"]).all()  # the schedule's rule


def test_pipemare_tables_by_hand():
    """N = 3, 6 mini-batches, T = 6: stage 0's updates are scaled by τ^(−p), τ = min(b, 2),
    p = 1 − (b + 1)/6; stage 1 (τ ≤ 1) and the loss stage (τ = 0) by 1; the backward moves back
    by the updates since its forward (N − 1 − k in the steady state)."""
    s = schedules.one_f_one_b(3, 6)
    pol = pipeline.POLICIES["pipemare"]._replace(lr_anneal=1.0)
    t = compile(s, pol).tick_table()
    scale = {k: [] for k in range(3)}
    for tick, k in zip(*np.nonzero(t["update"]), strict=True):
        scale[int(k)].append(float(t["lr_scale"][tick, k]))
    want0 = [1.0, 1.0, 2**-0.5, 2 ** (-1 / 3), 2 ** (-1 / 6), 1.0]
    np.testing.assert_allclose(scale[0], want0, rtol=1e-6)
    assert scale[1] == scale[2] == [1.0] * 6
    assert (t["lr_scale"][t["update"] == 0] == 1.0).all()
    bwd = t["op"] == schedules.BACKWARD
    assert (t["rule"][t["op"] > 0] == 2).all() and (t["horizon"][~bwd] == 0).all()
    for k in range(3):
        steady = [b for b in range(2, 6)]
        got = [int(t["horizon"][(t["data"][:, k] == b) & bwd[:, k], k][0]) for b in steady]
        assert got == [2 - k] * len(steady)
    # T as a fraction of the run: the registered 0.14 rounds to one update here (no scaling)
    assert (compile(s, "pipemare").tick_table()["lr_scale"] == 1.0).all()


def test_the_program_carries_one_structural_key_for_both_executors():
    """Programs that compile alike share a key; any change to the compiled code changes it."""
    a = compile(schedules.one_f_one_b(4, 8), "stash")
    assert a.structure == compile(schedules.one_f_one_b(4, 8), "stash").structure
    assert a.structure == compile(schedules.one_f_one_b(4, 12), "stash").structure
    others = [
        compile(schedules.one_f_one_b(4, 8), "vanilla"),
        compile(schedules.one_f_one_b(4, 8), "nesterov"),
        compile(schedules.one_f_one_b(2, 8), "stash"),
        compile(schedules.one_f_one_b(4, 8), "vanilla", backward="recompute"),
    ]
    assert len({a.structure, *(p.structure for p in others)}) == 1 + len(others)
    hash(a.structure)


def _capacity_by_definition(intervals, items):
    """The definition: at every start tick, the live items' residues are distinct."""
    cap = 1
    while True:
        if all(
            len({it % cap for (a, z), it in zip(intervals, items, strict=True) if a <= t0 <= z})
            == sum(a <= t0 <= z for a, z in intervals)
            for t0, _ in intervals
        ):
            return cap
        cap += 1


def test_slot_capacity_is_the_definitions_smallest():
    """The sweep gives the brute-force definition's answer, ends included (an interval ending
    at the tick another starts still holds its slot)."""
    from jaxstale.pipeline.program import _capacity

    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(1, 12))
        starts = rng.integers(0, 20, k)
        intervals = [(int(a), int(a + rng.integers(0, 6))) for a in starts]
        items = rng.permutation(40)[:k].tolist()
        assert _capacity(intervals, items) == _capacity_by_definition(intervals, items)
    assert _capacity([(0, 2), (2, 4)], [0, 1]) == 2  # they share tick 2
    assert _capacity([(0, 1), (2, 4)], [0, 1]) == 1
    assert _capacity([], []) == 1


def _schedules():
    for n in (1, 2, 3, 4, 8):
        for nb in sorted({1, 2, n, 3 * n + 1, 40}):
            yield schedules.one_f_one_b(n, nb)
            yield schedules.gpipe(n, nb, max(n // 2, 1))
            yield schedules.one_f_one_b_flush(n, nb, n)
            yield schedules.pipedream_2bw(n, nb, max(n - 1, 1))
            if n > 1:
                yield schedules.pipedream_2bw(n, nb, n + 1)


def test_the_replay_in_arrays_is_the_replay_one_event_at_a_time():
    """The compiler's array replay gives what stepping through the events one at a time gives
    (tests/pipeline/program_reference.py): every look-back, slot capacity (the reference reads
    them from a run as long as the schedule; the compiler from a short one: a longer steady
    state asks for no more slots) and the per-tick table, for every kind, depth and length."""
    from jaxstale.pipeline.program import _Replay, _template
    from tests.pipeline import program_reference as ref

    cases = 0
    for s in _schedules():
        ticks, dmin, dmax = _template(s)
        rep = _Replay(s, ticks, dmin, dmax)
        rounds, look, *caps = ref.replay(s, ticks, dmin, dmax)
        assert rep.rounds.tolist() == rounds
        assert [rep.in_cap, rep.ct_cap, rep.res_cap] == caps, (s.name, s.num_stages, s.num_batches)
        for policy in ("vanilla", "stash", "nesterov", "pipemare"):
            prog = compile(s, policy)
            if prog.schedule is not s:
                continue
            np.testing.assert_array_equal(rep.look, ref.look_table(prog, look))
            want, got = ref.tick_table(prog), prog.tick_table()
            assert want.keys() == got.keys()
            for name in want:
                assert got[name].dtype == want[name].dtype
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            cases += 1
    assert cases > 300
