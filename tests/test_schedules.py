"""Pipeline schedules: hand-drawn timelines, dependencies, versions, staleness, horizons."""

import matplotlib
import numpy as np
import pytest

from jaxstale import schedules as S

matplotlib.use("Agg")

# Hand-drawn (unit-time F and B, update at the end of the backward's tick, loss stage may run B the
# tick after its F, stage k does N - k forwards before its first backward).
ONE_F_ONE_B_N2 = """\
stage 0 | F0 F1 .  B0 F2 B1 F3 B2 .  B3
stage 1 | .  F0 B0 F1 B1 F2 B2 F3 B3 ."""

ONE_F_ONE_B_N4 = """\
stage 0 | F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 .  B3 .  B4 .  B5
stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 .  B4 .  B5 .
stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 .  B5 .  .
stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 .  .  ."""

GPIPE_N2_M2 = """\
stage 0 | F0.0 F0.1 .    .    B0.1 B0.0 F1.0 F1.1 .    .    B1.1 B1.0
stage 1 | .    F0.0 F0.1 B0.1 B0.0 .    .    F1.0 F1.1 B1.1 B1.0 ."""

FLUSH_N2_M3 = """\
stage 0 | F0.0 F0.1 .    B0.0 F0.2 B0.1 .    B0.2 F1.0 F1.1 .    B1.0 F1.2 B1.1 .    B1.2
stage 1 | .    F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 .    .    F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 ."""


# 2BW: the N = 2, M = 2 timeline with the version each pass uses (hand-drawn from the rule: every
# pass of b at max(b − 1, 0); stage 0 runs F2.1 after update 2 landed, reading v1 one back)
TWO_BW_N2_M2 = """\
stage 0 | F0.0v0 F0.1v0 .      B0.0v0 F1.0v0 B0.1v0 F1.1v0 B1.0v0 F2.0v1 B1.1v0 F2.1v1 B2.0v1 .      B2.1v1
stage 1 | .      F0.0v0 B0.0v0 F0.1v0 B0.1v0 F1.0v0 B1.0v0 F1.1v0 B1.1v0 F2.0v1 B2.0v1 F2.1v1 B2.1v1 ."""  # noqa: E501


def test_hand_drawn_timelines():
    assert S.render_text(S.one_f_one_b(2, 4)) == ONE_F_ONE_B_N2
    assert S.render_text(S.one_f_one_b(4, 6)) == ONE_F_ONE_B_N4
    assert S.render_text(S.gpipe(2, 2, 2)) == GPIPE_N2_M2
    assert S.render_text(S.one_f_one_b_flush(2, 2, 3)) == FLUSH_N2_M3
    assert S.render_text(S.pipedream_2bw(2, 3, 2), versions=True) == TWO_BW_N2_M2


def test_exact_tick_arrays_n4():
    s = S.one_f_one_b(4, 6)
    # steady state: F of b at stage k at tick 2b + k, B at 2b + 2N - 1 - k
    assert s.fwd_tick[:, 3].tolist() == [3, 5, 7, 9, 11, 13]
    assert s.fwd_tick[:, 0].tolist() == [0, 1, 2, 3, 8, 10]
    for k in range(4):
        assert s.bwd_tick[:, k].tolist() == [2 * b + 7 - k for b in range(6)]
    assert np.array_equal(s.update_tick, s.bwd_tick)
    assert s.table.shape == (18, 4)
    assert s.table[7].tolist() == [S.BACKWARD, S.FORWARD, S.BACKWARD, S.FORWARD]
    assert s.table_batch[7].tolist() == [0, 3, 1, 2]
    assert s.table_micro[7].tolist() == [0, 0, 0, 0]
    assert s.table_batch[4, 0] == -1 and s.table[4, 0] == S.IDLE


@pytest.mark.parametrize(
    "sched",
    [
        S.one_f_one_b(1, 3),
        S.one_f_one_b(2, 5),
        S.one_f_one_b(4, 9),
        S.one_f_one_b(8, 12),
        S.gpipe(3, 3, 4),
        S.gpipe(1, 2, 1),
        S.one_f_one_b_flush(4, 3, 4),
        S.one_f_one_b_flush(4, 2, 2),
        S.one_f_one_b_flush(3, 2, 6),
        S.pipedream_2bw(1, 3, 2),
        S.pipedream_2bw(4, 4, 3),
        S.pipedream_2bw(4, 3, 6),
        S.pipedream_2bw(3, 3, 3, delay=0),
    ],
    ids=lambda s: f"{s.name}-N{s.num_stages}-M{s.num_micro}-{s.options.get('delay', '')}",
)
def test_dependencies_and_tables(sched):
    s = sched
    n, nb, nm = s.num_stages, s.num_batches, s.num_micro
    f, bw = s.micro_fwd_tick, s.micro_bwd_tick
    assert (f >= 0).all() and (bw >= 0).all()
    assert (f[..., 1:] > f[..., :-1]).all()  # F(b,k) after F(b,k-1)
    assert (bw[..., :-1] > bw[..., 1:]).all()  # B(b,k) after B(b,k+1)
    assert (bw[..., -1] > f[..., -1]).all()  # loss stage: B after its F
    # the table lists every pass exactly once, at its tick
    count = 0
    for t in range(s.num_ticks):
        for k, op, b, m in s.ops(t):
            tick = f[b, m, k] if op == S.FORWARD else bw[b, m, k]
            assert tick == t
            count += 1
    assert count == 2 * n * nb * nm
    # one update per mini-batch per stage, in order
    assert (np.diff(s.update_tick, axis=0) > 0).all()
    # versions: the number of updates applied strictly before the pass's tick (2BW: minus lag)
    for b in range(nb):
        for k in range(n):
            for m in range(nm):
                cur_f = np.sum(s.update_tick[:, k] < f[b, m, k])
                cur_b = np.sum(s.update_tick[:, k] < bw[b, m, k])
                assert s.fwd_version[b, k] + s.fwd_lag[b, m, k] == cur_f
                assert s.bwd_version[b, k] + s.bwd_lag[b, m, k] == cur_b
    if s.name != "2bw" or not s.options["delay"]:
        assert (s.fwd_lag == 0).all() and (s.bwd_lag == 0).all()
    # the kind rebuilds from its options
    assert (S.get(s.name, num_batches=nb, **s.options).table == s.table).all()
    assert (s.fwd_staleness >= 0).all() and (s.bwd_staleness >= 0).all()
    assert s.target_version.tolist() == [[b] * n for b in range(nb)]
    # the round-trip target: b plus the later updates that landed by stage 0's last backward
    end = bw[:, :, 0].max(axis=1)
    for b in range(nb):
        for k in range(n):
            later = np.sum((np.arange(nb) > b) & (s.update_tick[:, k] <= end[b]))
            assert s.roundtrip_target[b, k] == b + later


def test_version_counts_without_the_pairwise_arrays():
    """The sorted-search counts equal the pairwise ones for any update order (the schedules
    here update in order; a shuffled order takes the block-wise path)."""
    from jaxstale.schedules.timeline import _later_landed, _updates_before

    rng = np.random.default_rng(0)
    for shuffled in (False, True):
        u = np.sort(rng.choice(5000, size=(1500, 3), replace=False), axis=0)
        if shuffled:
            u = rng.permuted(u, axis=0)
        ticks = rng.integers(0, 5000, size=(1500, 2, 3))
        end = rng.integers(0, 5000, size=1500)
        want = (u[None, None, :, :] < ticks[:, :, None, :]).sum(axis=2)
        np.testing.assert_array_equal(_updates_before(u, ticks), want)
        later = np.arange(1500)[None, :, None] > np.arange(1500)[:, None, None]
        want = (later & (u[None, :, :] <= end[:, None, None])).sum(axis=1)
        np.testing.assert_array_equal(_later_landed(u, end), want)


@pytest.mark.parametrize("name,kw", [("gpipe", {"num_micro": 3}), ("1f1b-flush", {"num_micro": 5})])
def test_flush_schedules_are_staleness_free(name, kw):
    s = S.get(name, num_stages=4, num_batches=3, **kw)
    assert (s.fwd_staleness == 0).all() and (s.bwd_staleness == 0).all()
    f, b = s.horizons("roundtrip")
    assert (f == 0).all() and (b == 0).all()  # both targets coincide with a flush


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_one_f_one_b_staleness_sequential_target(n):
    nb = 3 * n
    s = S.one_f_one_b(n, nb)
    k = np.arange(n)
    for b in range(n - 1, nb):  # steady state
        assert s.fwd_staleness[b].tolist() == (n - 1 - k).tolist()
        assert s.bwd_staleness[b].tolist() == [0] * n
    for b in range(n - 1):  # warm-up: forwards see version 0
        assert s.fwd_version[b].tolist() == [max(0, b - (n - 1 - kk)) for kk in k]
    # PipeDream's stash depth: stage k keeps N - k versions
    assert s.max_versions.tolist() == (n - k).tolist()


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_spectrain_lab_horizons_roundtrip_target(n):
    """The SpecTrain lab's fwd s = ⌊k/2⌋+N−k−1, bwd s = ⌊k/2⌋ hold exactly in the steady state."""
    nb = 4 * n
    s = S.one_f_one_b(n, nb)
    f, b = s.horizons("roundtrip")
    k = np.arange(n)
    lab_f, lab_b = k // 2 + n - k - 1, k // 2
    steady = range(n - 1, nb - n)  # after warm-up, before cool-down
    for bb in steady:
        assert f[bb].tolist() == lab_f.tolist()
        assert b[bb].tolist() == lab_b.tolist()
    # the "start of stage 0's backward tick" convention would give ⌈k/2⌉ instead: different at odd k
    start = np.array(
        [[np.sum(s.update_tick[:, kk] < s.bwd_tick[bb, 0]) for kk in range(n)] for bb in steady]
    )
    assert (start - s.bwd_version[list(steady)] == (k + 1) // 2).all()


def test_lab_table_n4():
    s = S.one_f_one_b(4, 10)
    f, b = s.horizons("roundtrip")
    assert list(zip(f[5].tolist(), b[5].tolist(), strict=True)) == [(3, 0), (2, 0), (2, 1), (1, 1)]


@pytest.mark.parametrize("n, m", [(1, 1), (2, 2), (3, 2), (4, 4), (4, 7), (8, 7)])
def test_2bw_versions_are_the_papers_rule(n, m):
    """Every pass of b at every stage uses max(b − 1, 0): one update stale, two versions kept,
    the older one read at most one push back; the update of b lands at its last backward."""
    nb = 6
    s = S.pipedream_2bw(n, nb, m)
    rule = np.maximum(np.arange(nb) - 1, 0)[:, None]
    assert (s.fwd_version == rule).all() and (s.bwd_version == rule).all()
    assert s.fwd_staleness.tolist() == s.bwd_staleness.tolist() == [[0] * n] + [[1] * n] * 5
    assert set(np.unique(s.fwd_lag)) <= {0, 1} and (s.bwd_lag[1:] == 1).all()
    assert s.max_versions.tolist() == [2] * n
    assert (s.update_tick == s.micro_bwd_tick.max(axis=1)).all()
    # no flush: after the warm-up every stage is busy at every tick until the cool-down
    k0 = s.table[:, 0]
    first_b, last_f = np.argmax(k0 == S.BACKWARD), np.flatnonzero(k0 == S.FORWARD)[-1]
    assert (k0[first_b:last_f] != S.IDLE).all()


def test_2bw_delay_zero_is_the_flush_and_bad_arguments():
    s, f = S.pipedream_2bw(4, 3, 5, delay=0), S.one_f_one_b_flush(4, 3, 5)
    for name in ("table", "table_batch", "table_micro", "fwd_version", "bwd_version"):
        assert (getattr(s, name) == getattr(f, name)).all()
    assert S.get("2bw", num_stages=2, num_batches=2).num_micro == 2  # default M = N
    with pytest.raises(ValueError, match="num_micro >= num_stages - 1"):
        S.pipedream_2bw(4, 3, 2)
    with pytest.raises(ValueError, match="delay"):
        S.pipedream_2bw(2, 3, 2, delay=2)


def test_get_and_errors():
    assert S.get("1f1b", num_stages=2, num_batches=2).name == "1f1b"
    with pytest.raises(ValueError, match="known schedules"):
        S.get("pipedream-2bw", num_stages=2, num_batches=2)
    with pytest.raises(ValueError, match="bad arguments"):
        S.get("1f1b", num_stages=2, num_batches=2, num_micro=3)
    with pytest.raises(ValueError, match="num_stages"):
        S.one_f_one_b(0, 3)
    with pytest.raises(ValueError, match="num_micro"):
        S.gpipe(2, 3, 0)
    with pytest.raises(TypeError, match="num_batches"):
        S.gpipe(2, 2.5, 1)
    with pytest.raises(ValueError, match="unknown target"):
        S.one_f_one_b(2, 2).horizons("future")


def test_render(tmp_path):
    s = S.one_f_one_b(4, 6)
    path = tmp_path / "gantt.png"
    fig = S.render(s, str(path))
    assert path.stat().st_size > 1000
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 2 * 4 * 6
    assert "F4\nv1" in texts  # stage 0 runs F4 with version 1
    assert S.render_text(s, versions=True).splitlines()[0].startswith("stage 0 | F0v0 F1v0")


def test_a_long_schedule_builds_in_memory_linear_in_its_length():
    """27,000 mini-batches at N = 8 once took 11.9 GiB ([nb, nb, N] comparisons); the arrays a
    schedule keeps are O(nb · N · M), and so is what building it allocates."""
    import tracemalloc

    tracemalloc.start()
    s = S.one_f_one_b(8, 4000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert s.num_batches == 4000
    assert peak < 64 * 2**20, peak  # pairwise: 4000² × 8 booleans = 122 MiB per array


def _max_versions_by_definition(s):
    """Per stage and tick, the set of live versions: the current one and every version an
    in-flight pass used (forward at or before the tick, backward not before it)."""
    out = []
    for k in range(s.num_stages):
        most = 1
        for t in range(s.num_ticks):
            live = {int(np.sum(s.update_tick[:, k] < t))}
            inflight = (s.micro_fwd_tick[..., k] <= t) & (t <= s.micro_bwd_tick[..., k])
            live |= set(np.repeat(s.fwd_version[:, k], s.num_micro)[inflight.ravel()].tolist())
            most = max(most, len(live))
        out.append(most)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_max_versions_is_the_definition_for_every_kind(n):
    for nb in (1, 2, n + 1, 3 * n + 2):
        for s in (
            S.one_f_one_b(n, nb),
            S.gpipe(n, nb, 3),
            S.one_f_one_b_flush(n, nb, 2),
            S.pipedream_2bw(n, nb, max(n - 1, 1)),
            S.pipedream_2bw(n, nb, n + 2),
        ):
            assert s.max_versions.tolist() == _max_versions_by_definition(s), (s.name, n, nb)
