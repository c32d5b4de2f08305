"""study/language.py: the language-model claims judged from hand-built run
folders (test loss in nats, lower is better): the loss reading of differences, selection and
cells, the non-inferiority margin, the difference of two gaps, the fraction-closed trend, the
expected effect taken from the runs, and the moonshot's target."""

import json
import math

import numpy as np
import pytest

import study as claims
from study import language
from study.verdicts import contrast

SEEDS = 5
JITTER = np.array([0.0, 0.004, -0.004, 0.002, -0.002])  # one seed's luck, shared by its arms


def _losses(base, noise=0.0):
    return [base + j + noise * k for k, j in enumerate(JITTER)]


def _prows(cells, lrs=(0.003,)):
    """Pipeline rows: {(method, stages): per-seed test losses (None: diverged)}; validation
    loss = test loss + 0.01 at every rate, other rates 0.1 worse (never selected)."""
    rows = []
    for (m, n), vals in cells.items():
        for i, lr in enumerate(lrs):
            for s, v in enumerate(vals):
                bad = v is None
                rows.append({"method": m, "stages": n, "model": "gpt-cpu", "lr": lr, "seed": s,
                             "diverged": bad, "final_val_loss": None if bad else v + 0.01 + 0.1 * i,
                             "final_test_loss": None if bad else v + 0.1 * i})  # fmt: skip
    return rows


def _drows(cells):
    """Constant-delay rows: {(method, τ): per-seed test losses}."""
    return [
        {"method": m, "delay": str(t), "model": "gpt-cpu", "lr": 0.003, "seed": s,
         "diverged": False, "final_val_loss": v + 0.01, "final_test_loss": v}
        for (m, t), vals in cells.items() for s, v in enumerate(vals)
    ]  # fmt: skip


def _folder(root, name, rows, **config):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps({"rows": rows}))
    (d / "config.json").write_text(json.dumps({"config": {"dataset": "shakespeare", **config}}))


def _ctx(root):
    return claims.Context(root, quick=False)


def test_a_loss_difference_is_in_nats_and_selection_takes_the_lowest_validation_loss(tmp_path):
    rows = _prows({("sync", 8): _losses(1.9), ("vanilla", 8): _losses(2.1)}, lrs=(0.003, 0.01))
    pick = claims.selected(rows, knob=("lr",), method="vanilla", stages=8)
    assert {r["lr"] for r in pick} == {0.003}  # the lower validation loss, not the higher
    d = claims.diff(pick, claims.selected(rows, knob=("lr",), method="sync", stages=8), "v", "s")
    assert d.unit == "nats" and d.scale == 1.0
    assert d.text().startswith("v − s = +0.200 ± 0.000 nats (5 seeds, beyond noise)")
    assert claims.cell(pick).startswith("2.100 ±")
    assert d.b_error == pytest.approx(1.9)  # a loss is its own "error"


def test_a_diverged_seed_scores_log_v_in_intention_to_treat(tmp_path):
    vals = _losses(2.1)
    vals[4] = None
    rows = _prows({("sync", 8): _losses(1.9), ("vanilla", 8): vals})
    for r in rows:
        r["dataset"] = "shakespeare"
    a = [r for r in rows if r["method"] == "vanilla"]
    b = [r for r in rows if r["method"] == "sync"]
    d = claims.diff(a, b, "vanilla", "sync")
    assert d.n == 4 and d.chance == pytest.approx(math.log(83))
    assert max(d.itt) == pytest.approx(math.log(83) - b[4]["final_test_loss"])
    assert "at chance, 4.42 nats" in d.text()


def test_contrast_is_the_per_seed_combination_with_an_offset():
    def arm(vals):
        return [{"seed": s, "diverged": False, "final_test_loss": v} for s, v in enumerate(vals)]

    a1, a0, m1, m0 = (
        arm([2.5, 2.6, 2.4]),
        arm([2.0, 2.1, 2.0]),
        arm([1.7, 1.8, 1.7]),
        arm([1.65, 1.75, 1.68]),
    )
    from jaxstale import tasks

    d = contrast([(1, a1), (-1, a0), (-1, m1), (1, m0)], "A", "M", lambda r: 9.0,
                 tasks.language_model(83))  # fmt: skip
    assert d.values == pytest.approx((0.45, 0.45, 0.38))
    d = contrast([(1, a0), (-1, a1)], "A", "M", lambda r: 9.0, tasks.language_model(83),
                 offset=0.05)  # fmt: skip
    assert d.values == pytest.approx((-0.45, -0.45, -0.35))


def test_lm1_the_gap_growing_with_depth_held_and_a_flat_gap_untestable(tmp_path):
    cells = {("sync", 4): _losses(1.9), ("sync", 8): _losses(1.9),
             ("vanilla", 4): _losses(2.0, 0.001), ("vanilla", 8): _losses(2.3)}  # fmt: skip
    _folder(tmp_path, "lm-depth", _prows(cells))
    v = claims.claim("LM1").assess(_ctx(tmp_path))
    assert v.verdict == "held", v.evidence
    assert "slope of vanilla − sync against log2 N (N = 4, 8) = +0.29" in v.evidence
    assert "nats per doubling of N" in v.evidence
    flat = [0.001, -0.001, 0.002, -0.002, 0.0]  # the same gap at both depths, up to noise
    cells[("vanilla", 8)] = [v + f for v, f in zip(cells[("vanilla", 4)], flat, strict=True)]
    _folder(tmp_path, "lm-depth", _prows(cells))
    v = claims.claim("LM1").assess(_ctx(tmp_path))
    assert v.verdict.startswith("suggestive (for the claim: the gap at each")


def test_lm2_matches_within_the_margin_and_fails_beyond_it(tmp_path):
    cells = {("sync", 8): _losses(1.9), ("asyncpp", 8): _losses(1.92),
             ("vanilla", 8): _losses(2.3)}  # fmt: skip
    _folder(tmp_path, "lm-asyncpp", _prows(cells))
    v = claims.claim("LM2").assess(_ctx(tmp_path))
    assert v.verdict == "held", v.evidence
    assert "sync (N=8) + 0.05 − asyncpp (N=8) (non-inferiority, margin 0.05 nats) = +0.030" in (
        v.evidence
    )
    assert "expected 0.050 nats (the paper's, as is" in v.evidence
    cells[("asyncpp", 8)] = _losses(2.0)  # 0.1 nats worse: beyond the margin
    _folder(tmp_path, "lm-asyncpp", _prows(cells))
    assert claims.claim("LM2").assess(_ctx(tmp_path)).verdict == "did not hold"


def test_lm3_and_lm6_read_the_policies_paired_with_the_depth_runs_seeds(tmp_path):
    _folder(tmp_path, "lm-depth", _prows({("sync", 8): _losses(1.9), ("vanilla", 8): _losses(2.3)}))
    pol = {("stash", 8): _losses(2.2), ("2bw", 8): _losses(1.91), ("pipemare", 8): _losses(2.4)}
    _folder(tmp_path, "lm-policies", _prows(pol))
    v3 = claims.claim("LM3").assess(_ctx(tmp_path))
    assert v3.verdict == "held", v3.evidence
    assert "2bw − vanilla — for the claim" in v3.evidence
    v6 = claims.claim("LM6").assess(_ctx(tmp_path))  # PipeMare 0.2 worse than stashing
    assert v6.verdict.startswith("did not hold"), v6.evidence
    assert "pipemare − vanilla — **against the claim**" in v6.evidence


def test_lm2_lm3_lm6_are_read_at_the_4k_rung_once_it_finished(tmp_path):
    """Issue 52: the declared primaries, re-measured at 4k updates, decide the verdicts there;
    the 1k primary stays in the evidence as the early-training rung; the headline's regime
    is the rung's."""
    _folder(tmp_path, "lm-depth", _prows({("sync", 8): _losses(1.9), ("vanilla", 8): _losses(2.3)}))
    pol = {("stash", 8): _losses(2.2), ("2bw", 8): _losses(1.91), ("pipemare", 8): _losses(2.4)}
    _folder(tmp_path, "lm-policies", _prows(pol))
    cells = {("sync", 8): _losses(1.9), ("asyncpp", 8): _losses(1.92), ("vanilla", 8): _losses(2.3)}
    _folder(tmp_path, "lm-asyncpp", _prows(cells))
    assert claims.claim("LM3").assess(_ctx(tmp_path)).verdict == "held"
    # at 4k: 2BW 0.1 nats behind sync (beyond the margin), PipeMare within stashing's margin
    ladder = {("sync", 8): _losses(1.6), ("vanilla", 8): _losses(2.1), ("stash", 8): _losses(2.08),
              ("2bw", 8): _losses(1.7), ("pipemare", 8): _losses(2.09)}  # fmt: skip
    rows = [{**r, "steps": 4000, "batch_size": 16} for r in _prows(ladder)]
    _folder(tmp_path, "lm-ladder-4k", rows)
    ctx = _ctx(tmp_path)
    v3 = claims.claim("LM3").assess(ctx)
    assert v3.verdict == "did not hold", v3.evidence
    assert "- read at the `lm-ladder-4k` rung (gpt-cpu (415 k parameters), 4.1 M tokens" in (
        v3.evidence
    )
    assert "the early-training rung, 1k updates (not in the verdict): sync (N=8) + 0.05 − 2bw " \
        "(N=8) (non-inferiority, margin 0.05 nats) = +0.040" in v3.evidence  # fmt: skip
    v6 = claims.claim("LM6").assess(ctx)  # vanilla passes stash's margin too: no sensitivity
    assert v6.verdict.startswith("untestable here (no assay sensitivity"), v6.evidence
    from study import headline

    assert headline.regime_of(ctx, claims.claim("LM3")).endswith("4.1 M tokens")
    assert claims.claim("LM2").assess(ctx).verdict == "held"  # its rung has not run: 1k
    assert "read at the" not in claims.claim("LM2").assess(ctx).evidence
    rows = [{**r, "steps": 4000, "batch_size": 16} for r in _prows({**cells, ("asyncpp", 8):
                                                                   _losses(2.0)})]  # fmt: skip
    _folder(tmp_path, "lm-ladder-4k-asyncpp", rows)
    v2 = claims.claim("LM2").assess(_ctx(tmp_path))
    assert v2.verdict == "did not hold" and "`lm-ladder-4k-asyncpp` rung" in v2.evidence


def test_a_non_inferiority_test_the_negative_control_passes_is_untestable(tmp_path):
    """Issue 52: LM6's test had no assay sensitivity — vanilla passed it against stashing
    better than PipeMare did. The control (vanilla) must fail the test the method passes."""
    _folder(tmp_path, "lm-depth", _prows({("sync", 8): _losses(1.9), ("vanilla", 8): _losses(2.3)}))
    pol = {("stash", 8): _losses(2.28), ("pipemare", 8): _losses(2.29)}  # vanilla 0.02 above stash
    _folder(tmp_path, "lm-policies", _prows(pol))
    v6 = claims.claim("LM6").assess(_ctx(tmp_path))
    assert (
        v6.verdict == "untestable here (no assay sensitivity: vanilla (N=8) passes the same test)"
    )
    assert "negative control (vanilla (N=8): should fail the same test)" in v6.evidence
    assert "**it passes too**" in v6.evidence
    pol[("stash", 8)] = _losses(2.2)  # vanilla 0.1 above stash: the control fails the test
    pol[("pipemare", 8)] = _losses(2.21)
    _folder(tmp_path, "lm-policies", _prows(pol))
    v6 = claims.claim("LM6").assess(_ctx(tmp_path))
    assert v6.verdict == "held" and "**it passes too**" not in v6.evidence, v6.evidence


def test_lm3_does_not_pair_the_policies_with_depth_rows_of_another_budget(tmp_path):
    _folder(tmp_path, "lm-depth", _prows({("sync", 8): _losses(1.9), ("vanilla", 8): _losses(2.3)}),
            steps=3000)  # fmt: skip
    pol = {("stash", 8): _losses(2.2), ("2bw", 8): _losses(1.91), ("pipemare", 8): _losses(2.4)}
    _folder(tmp_path, "lm-policies", _prows(pol), steps=1000)
    v3 = claims.claim("LM3").assess(_ctx(tmp_path))
    assert "sync (N=8)" not in v3.evidence and "2bw − vanilla" not in v3.evidence
    assert (
        "- `lm-depth`'s rows not read with `lm-policies`'s: its configuration differs outside "
        "methods, policies, schedules, stages (steps 1000 → 3000); a seed pairs across runs of "
        "one set-up only"
    ) in v3.evidence
    assert v3.verdict == "not run"  # sync and vanilla are in the other run
    # fields that decide which cells run, never their numbers, may differ
    _folder(tmp_path, "lm-policies", _prows(pol), steps=3000, seeds=10, seed_mode="sequential")
    assert claims.claim("LM3").assess(_ctx(tmp_path)).verdict == "held"


def _delays(gap1, gap4, gap16, closed, base):
    cells = {("stale", 0): _losses(base)}
    for t, g, c in ((1, gap1, closed[0]), (4, gap4, closed[1]), (16, gap16, closed[2])):
        cells[("stale", t)] = _losses(base + g)
        cells[("predicted", t)] = _losses(base + g * (1 - c))
    return _drows(cells)


def test_lm4_is_a_difference_of_gaps_and_lm5_takes_its_expected_effect_from_the_runs(tmp_path):
    _folder(tmp_path, "lm-delay-adamw", _delays(0.4, 0.7, 1.2, (0.6, 0.3, 0.1), 1.9))
    _folder(tmp_path, "lm-delay-muon", _delays(0.05, 0.5, 1.4, (0.5, 0.4, 0.2), 1.7))
    v4 = claims.claim("LM4").assess(_ctx(tmp_path))
    assert v4.verdict == "held", v4.evidence
    assert "AdamW's gap (τ=1) − Muon's gap (τ=1) = +0.350" in v4.evidence
    assert "AdamW's mean gap at τ = 1 is 8.0× Muon's" in v4.evidence
    assert "at the other delays (not in the verdict):" in v4.evidence  # Muon loses more at 16
    v5 = claims.claim("LM5").assess(_ctx(tmp_path))
    assert v5.verdict == "held", v5.evidence
    assert "Muon stale (τ=4) − predicted (τ=4) = +0.200" in v5.evidence
    want = language.closed_fraction(4) * 0.5  # marin's fraction × this task's gap at τ = 4
    assert f"expected {want:.3f} nats (from this task's runs" in v5.evidence
    assert "the fraction closed shrinks as τ grows — for the claim" in v5.evidence


def test_lm4_pairs_the_two_optimizers_gaps_only_under_one_set_up(tmp_path):
    _folder(tmp_path, "lm-delay-adamw", _delays(0.4, 0.7, 1.2, (0.6, 0.3, 0.1), 1.9), steps=1000)
    _folder(tmp_path, "lm-delay-muon", _delays(0.05, 0.5, 1.4, (0.5, 0.4, 0.2), 1.7), steps=2000,
            optimizer="muon")  # fmt: skip
    v4 = claims.claim("LM4").assess(_ctx(tmp_path))
    assert "Muon's gap (τ=1) =" not in v4.evidence and "× Muon's" not in v4.evidence
    assert "its configuration differs outside optimizer, lrs, delays (steps 1000 → 2000)" in (
        v4.evidence
    )
    assert v4.verdict == "not run"  # its primary pairs a seed across the two runs


def test_closed_fraction_interpolates_marins_figures_in_log2_tau():
    assert language.closed_fraction(2) == pytest.approx(0.53)
    assert language.closed_fraction(8) == pytest.approx(0.45)
    assert language.closed_fraction(4) == pytest.approx(0.49)
    assert language.closed_fraction(1) == pytest.approx(0.53)  # held outside the range


def test_the_lm_moonshot_needs_the_best_light_policy_within_002_nats(tmp_path):
    cells = {("sync", 16): _losses(1.9), ("vanilla", 16): _losses(2.4),
             ("2bw", 16): _losses(1.915), ("pipemare", 16): _losses(2.2)}  # fmt: skip
    _folder(tmp_path, "lm-deep", _prows(cells))
    v = language.judge_moonshot(_ctx(tmp_path))
    assert v.verdict == "reached", v.evidence
    assert "best on validation 2bw" in v.evidence and "target ≤ 0.02 nats" in v.evidence
    cells[("2bw", 16)] = _losses(1.95)
    _folder(tmp_path, "lm-deep", _prows(cells))
    v = language.judge_moonshot(_ctx(tmp_path))
    assert v.verdict == "not reached"
    assert "not reached, the upper bound above it by 0.0300" in v.evidence
    # a mean gap under the target whose 95 % interval reaches above it is not a target met
    cells[("2bw", 16)] = [1.9 + d for d in (0.0, 0.05, -0.03, 0.04, -0.04)]
    _folder(tmp_path, "lm-deep", _prows(cells))
    v = language.judge_moonshot(_ctx(tmp_path))
    assert "mean gap 0.0040 (95 % upper bound 0.0" in v.evidence and v.verdict == "not reached"


def test_the_report_lists_the_lm_claims_and_says_how_losses_are_read(tmp_path):
    text = claims.report(_ctx(tmp_path), tmp_path / "docs" / "claims.md")
    for cid in ("LM1", "LM2", "LM3", "LM4", "LM5", "LM6", "LM-M"):
        assert f"[{cid}](#{cid.lower()})" in text
    assert "test loss in nats per character" in text
    assert "non-inferiority test with a declared margin δ = 0.05 nats" in text


def test_every_lm_verdict_says_which_regime_it_speaks_for():
    """Issue 52: the headline names the model, its size, the tokens and tokens per parameter,
    and "early training" below 5 tokens per parameter (the n-gram regime of the 1k rows)."""
    early = [{"model": "gpt-cpu", "steps": 1000, "batch_size": 16}]
    assert language.regime(early) == (
        "regime: gpt-cpu (415 k parameters), 1.02 M tokens, 2.5 tokens per parameter, "
        "early training"
    )
    rung = [*early, {"model": "gpt-cpu", "steps": 4000, "batch_size": 16}]
    assert language.regime(rung).endswith("4.1 M tokens, 9.9 tokens per parameter")
    assert language.regime([{"model": "mlp", "steps": 10, "batch_size": 4}]) == ""
