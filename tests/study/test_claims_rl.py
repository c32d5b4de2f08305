"""study/rl.py: RL1–RL5 judged from hand-built stale_rl folders: the declared primaries, the
non-inferiority margin and its negative control, the 1/τ law on the grid, and "not run"."""

import json

import pytest

from study import core, rl
from study.registry import claim

LRS = (1e-3, 2e-3, 4e-3, 8e-3)
NOISE = (0.0, 0.01, -0.01, 0.005, -0.005)


ARMS = ("reinforce", "is", "ppo-clip", "tis-seq", "vcpo", "m2po")


def _rows(values, delays=("constant",), arms=ARMS):
    """``values(arm, delay, tau, lr) -> reward or None (diverged)``, 5 seeds with fixed noise."""
    out = []
    for arm in arms:
        for delay in delays:
            for tau in (0, 2, 3, 4, 8, 16):
                if tau == 0 and (arm != "reinforce" or delay != "constant"):
                    continue
                for lr in LRS:
                    v = values(arm, delay, tau, lr)
                    for s, e in enumerate(NOISE):
                        r = None if v is None else min(1.0, v + e)
                        out.append({"arm": arm, "delay": delay, "tau": tau, "lr": lr, "seed": s,
                                    "final_val_reward": r, "final_test_reward": r,
                                    "mean_test_reward": None if r is None else r - 0.1,
                                    "diverged": v is None})  # fmt: skip
    return out


def _folder(root, name, rows):
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    cfg = {"symbols": 16, "lrs": list(LRS), "tolerance": 0.05,
           "arms": ["reinforce", "is", "ppo-clip", "tis-seq", "vcpo", "m2po"]}  # fmt: skip
    (d / "config.json").write_text(json.dumps({"config": cfg}))


def _world(arm, delay, tau, lr):
    """On-policy 0.95 at its best rate 2e-3; IS and sequence TIS collapse from τ = 2 at every
    rate; PPO-clip, VCPO and M2PO 0.93; the largest stable rate of REINFORCE halves as τ
    doubles (8e-3 at τ = 2 is too fast, 4e-3 the cliff... see the RL4 test)."""
    if tau == 0:
        return 0.95 if lr == 2e-3 else 0.90
    if arm in ("is", "tis-seq") and tau >= 2:  # at its best inside the grid: no edge
        return 0.25 if lr == 2e-3 else 0.20
    if arm == "reinforce":
        return 0.93 if lr <= 16e-3 / tau / 2 else 0.30
    return 0.93


def test_rl1_to_rl3_read_the_declared_primaries_in_reward_points(tmp_path):
    _folder(tmp_path, "rl-stale", _rows(_world))
    ctx = core.Context(tmp_path, quick=False)
    ev = rl.judge_is(ctx)
    assert ev.primary.mean == pytest.approx(0.68) and ev.primary.unit == "points"
    assert ev.primary.text().startswith("ppo-clip (τ=3) − is (τ=3) = +68.0 ±")
    (area,) = ev.secondary["exploratory, area under the test curve"]  # shown, decides nothing
    assert area.mean == pytest.approx(0.68) and "area under the test curve" in area.what
    assert claim("RL1").assess(ctx).verdict.startswith("held")
    assert claim("RL2").assess(ctx).verdict.startswith("held")
    # M2PO 0.93 vs on-policy 0.95: −2 + 5 points, beyond noise for non-inferiority
    m2 = rl.judge_m2po(ctx)
    assert m2.primary.mean == pytest.approx(0.03) and m2.control is not None
    assert "reinforce (τ=16)" in m2.control.what
    assert "On-policy (τ = 0): 95.0 ±" in m2.tables[0]


def test_rl1_rl2_are_untestable_where_the_uncorrected_arm_does_not_collapse(tmp_path):
    # the premise: IS (RL1) and sequence TIS (RL2) more than the margin below on-policy; here
    # they are 3 points below it while the fixes are 1 point below: the primary favours the fix
    # beyond noise, but there is no collapse for it to prevent
    def world(arm, d, tau, lr):
        if tau and lr == 2e-3:
            return 0.92 if arm in ("is", "tis-seq") else 0.94
        return _world(arm, d, tau, lr)

    _folder(tmp_path, "rl-stale", _rows(world))
    ctx = core.Context(tmp_path, quick=False)
    ev = rl.judge_is(ctx)
    assert ev.primary.mean == pytest.approx(0.02) and ev.primary.sign > 0
    assert ev.premise is not None and ev.premise.mean == pytest.approx(0.02)  # −3 + 5 points
    for name, arm in (("RL1", "is (τ=3)"), ("RL2", "tis-seq (τ=2)")):
        v = claim(name).assess(ctx)
        assert (
            v.verdict == f"untestable here (no failure to prevent: {arm} stays within the "
            "margin of on-policy)"
        ), v.verdict
        assert v.short == "untestable (no failure to prevent)"
        assert "- premise, the failure to prevent" in v.evidence and "**not shown**" in v.evidence
    # where they collapse (the default world), the premise is shown and the verdict stands
    _folder(tmp_path / "collapse", "rl-stale", _rows(_world))
    v = claim("RL1").assess(core.Context(tmp_path / "collapse", quick=False))
    assert v.verdict.startswith("held") and "- premise, the failure to prevent" in v.evidence
    assert "**not shown**" not in v.evidence


def test_rl3_reads_the_authors_m2po_where_its_run_exists(tmp_path):
    _folder(tmp_path, "rl-stale", _rows(_world))
    ctx = core.Context(tmp_path, quick=False)
    assert not any("adaptive clip" in k for k in rl.judge_m2po(ctx).secondary)
    # rl-m2po: the authors' clip collapses at τ = 16, with the dual clip it holds (0.93)
    world = lambda arm, d, tau, lr: (
        0.1 if arm == "m2po-clip" and tau == 16 else _world(arm, d, tau, lr)
    )
    _folder(tmp_path, "rl-m2po", _rows(world, arms=("reinforce", "m2po-clip", "m2po-clip-dual")))
    ev = rl.judge_m2po(core.Context(tmp_path, quick=False))
    (bare,) = ev.secondary["M2PO's adaptive clip (its authors' code) within the margin"]
    (dual,) = ev.secondary["M2PO's adaptive clip with a dual clip within the margin"]
    assert "m2po-clip (τ=16)" in bare.what and bare.mean < 0 < dual.mean
    declared = claim("RL3").secondaries  # with both runs, every declared label is written
    assert all(any(k.startswith(x) for k in ev.secondary) for x in declared)
    v = claim("RL3").assess(core.Context(tmp_path, quick=False))
    assert v.verdict.startswith("held with reversals"), v.verdict


def test_a_collapsed_seed_counts_at_chance(tmp_path):
    world = lambda arm, d, tau, lr: None if arm == "is" and tau == 3 else _world(arm, d, tau, lr)
    _folder(tmp_path, "rl-stale", _rows(world))
    rows = core.Context(tmp_path, quick=False).rows("rl-stale")
    assert {r["reward_chance"] for r in rows} == {1 / 17}  # from config.json's symbols
    d = rl.judge_is(core.Context(tmp_path, quick=False)).primary
    assert d.n == 0 and sum(d.itt) / len(d.itt) == pytest.approx(0.93 - 1 / 17, abs=1e-9)


def test_rl4_fits_the_slope_of_the_cliff_inside_the_grid(tmp_path):
    # REINFORCE's cliff, the largest rate ≤ 8e-3/τ: τ = 2, 3, 4, 8 at 4e-3, 2e-3, 2e-3 and the
    # grid's smallest 1e-3 (a measurement: the cliff is in [1e-3, 2e-3)); τ = 16 none (censored)
    _folder(tmp_path, "rl-stale", _rows(_world))
    v = rl.judge_law(core.Context(tmp_path, quick=False))
    assert v.verdict == "held (slope -0.94)"  # least squares over log2 τ = 1, 1.58, 2, 3
    assert rl.law_slope([(2, 4e-3), (4, 2e-3), (8, 1e-3)]) == pytest.approx(-1.0)
    assert "| reinforce |" in v.tables[0]
    flat = lambda arm, d, tau, lr: 0.94 if tau else _world(arm, d, tau, lr)
    _folder(tmp_path / "flat", "rl-stale", _rows(flat))
    got = rl.judge_law(core.Context(tmp_path / "flat", quick=False)).verdict
    assert got.startswith("untestable here")  # every cliff at the grid's top: no slope


def test_rl5_pairs_in_flight_with_off_by_tau(tmp_path):
    world = lambda arm, d, tau, lr: _world(arm, d, tau, lr) + (0.02 if d == "inflight" else 0)
    _folder(tmp_path, "rl-inflight", _rows(world, delays=("constant", "inflight")))
    ev = rl.judge_inflight(core.Context(tmp_path, quick=False))
    assert ev.primary.mean == pytest.approx(0.02) and "area under the test curve" in ev.primary.what
    assert "reinforce (τ=8, in-flight)" in ev.primary.text()
    (final,) = ev.secondary["in-flight − off-by-τ final reward"]
    assert final.mean == pytest.approx(0.02) and "final test reward" in final.what


def test_the_rl_claims_are_not_run_without_their_folders(tmp_path):
    for c in rl.RL_CLAIMS:
        assert c.assess(core.Context(tmp_path, quick=False)).verdict == "not run", c.id
